"""python -m dtcore.monitor RUN_DIR: the live state of a training run (dtcore/train/monitor.py)."""

import sys

from .train.monitor import main

if __name__ == "__main__":
    sys.exit(main())
