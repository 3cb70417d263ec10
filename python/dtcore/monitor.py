"""python -m dtcore.monitor RUN_DIR: the live state of a training run (dtcore/train/rundir/monitor.py)."""

import sys

from .train.rundir.monitor import main

if __name__ == "__main__":
    sys.exit(main())
