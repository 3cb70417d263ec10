"""Starting a benchmark's ranks: real processes on loopback, with the variables torchrun sets.

Imported by the benchmark scripts (`python benchmarks/bench_*.py` puts this folder on sys.path).
"""

from __future__ import annotations

import os
import socket

# Variables of any launcher, and dtcore's own, that must not leak from the caller's environment.
_LAUNCHER_PREFIXES = ("DTCORE_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "ACCELERATE_")
_LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without launcher variables, one thread per process, dtcore's warnings only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_VARS}
    env.update(OMP_NUM_THREADS="1", DTCORE_LOG_LEVEL="warn")
    env.update(extra)
    return env


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """The environment of one rank of a single-node job on loopback, as torchrun would set it."""
    return clean_env(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **extra,
    )
