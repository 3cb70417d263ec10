"""python -m dtcore.plot RUN_DIR: PNG plots of a training run into RUN_DIR/plots (dtcore/train/rundir/plot.py)."""

import sys

from .train.rundir.plot import main

if __name__ == "__main__":
    sys.exit(main())
