"""init_worker.py started late: waits (at most 60 s) for FLAG to exist, then runs as init_worker.py TIMEOUT.

    late_init_worker.py FLAG TIMEOUT

Lets a test start a rank only once something else is in place (e.g. a stranger's connections).
"""

import runpy
import sys
import time
from pathlib import Path

flag, timeout = Path(sys.argv[1]), sys.argv[2]
end = time.monotonic() + 60
while not flag.exists() and time.monotonic() < end:
    time.sleep(0.02)
worker = str(Path(__file__).with_name("init_worker.py"))
sys.argv = [worker, timeout]
runpy.run_path(worker, run_name="__main__")
