"""One rank of `python -m dtcore.check` in the distributed mode, started by tests/py/test_check.py.

CHECK_FAKE_TORCH=<version> on a rank makes that rank a node with another torch and a dtcore built
for it (a version mismatch across ranks, consistent on the rank itself); the rest of argv goes to
the checker's command line.
"""

import os
import sys

import torch

import dtcore._build_info
import dtcore.check.__main__ as cli

if os.environ.get("CHECK_FAKE_TORCH"):
    torch.__version__ = dtcore._build_info.torch_version = os.environ["CHECK_FAKE_TORCH"]
sys.exit(cli.main(sys.argv[1:]))
