"""One rank of `python -m dtcore.check` in the distributed mode, started by tests/py/test_check.py.

CHECK_FAKE_TORCH=<version> on a rank makes that rank report another torch (a version mismatch
injected on one rank); the rest of argv goes to the checker's command line.
"""

import os
import sys

import torch

import dtcore.check.__main__ as cli

if os.environ.get("CHECK_FAKE_TORCH"):
    torch.__version__ = os.environ["CHECK_FAKE_TORCH"]
sys.exit(cli.main(sys.argv[1:]))
