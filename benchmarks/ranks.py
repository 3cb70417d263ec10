"""Starting a benchmark's ranks: real processes on loopback, with the variables torchrun sets.

Imported by the benchmark scripts (`python benchmarks/bench_*.py` puts this folder on sys.path).
The launcher variables to clean and the torchrun variables come from the tests' own helpers
(tests/py/launch_helpers.py, standard library only), so that both clean the same list.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests" / "py"))
from launch_helpers import free_port, torchrun_style, without_launcher_vars

__all__ = ["clean_env", "free_port", "rank_env"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without launcher variables, one thread per process, dtcore's warnings only."""
    env = without_launcher_vars(os.environ)
    env.update(OMP_NUM_THREADS="1", DTCORE_LOG_LEVEL="warn")
    env.update(extra)
    return env


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """The environment of one rank of a single-node job on loopback, as torchrun would set it."""
    return clean_env(**torchrun_style(rank, world, port), **extra)
