"""python -m dtcore.monitor RUN_DIR: the live state of a training run (dtcore/launch/monitor.py)."""

import sys

from .launch.monitor import main

if __name__ == "__main__":
    sys.exit(main())
