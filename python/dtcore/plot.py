"""python -m dtcore.plot RUN_DIR: PNG plots of a training run into RUN_DIR/plots (dtcore/launch/plot.py)."""

import sys

from .launch.plot import main

if __name__ == "__main__":
    sys.exit(main())
