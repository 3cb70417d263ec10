"""What the resource checker is asked to do: `dtcore.check.run(**options)`, written once.

The command line (`python -m dtcore.check`) fills the same fields from its flags, and
dtcore.init(preflight=True) from its own arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


def size_range(low: int, high: int, factor: int = 2) -> list[int]:
    """low, low*factor, ... up to high (included), like nccl-tests' -b/-e/-f."""
    if low > high or factor < 2:
        raise ValueError(f"sizes {low}..{high} with factor {factor}: need low <= high and factor >= 2")
    out = [low]
    while out[-1] * factor <= high:
        out.append(out[-1] * factor)
    return out


DEFAULT_SIZES = size_range(8, 64 << 20)


def default_iters(nbytes: int) -> int:
    """Timed allreduces per size when not given: 20 up to 64 KiB, 10 up to 4 MiB, 5 above."""
    return 20 if nbytes <= 64 << 10 else 10 if nbytes <= 4 << 20 else 5


@dataclasses.dataclass(frozen=True)
class Options:
    """The checker's options; every field is a keyword of dtcore.check.run()."""

    env: Mapping[str, str] | None = None
    """The environment to judge (default: this process's)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go: free disk is judged there (default: the working directory)."""
    log_dir: str | None = None
    """Where logs go, as init(log_dir=): free disk is judged there (default: the DTCORE_LOG_DIR setting)."""
    shm_path: str = "/dev/shm"
    """The shared-memory mount NCCL and DataLoader workers use."""
    min_free_disk_gb: float = 10.0
    """Warn when a checkpoint or log directory has less free disk, in GB (10^9 bytes)."""
    accelerate_config: str | None = None
    """An accelerate config file to judge (default: accelerate's default_config.yaml under accelerate launch)."""
    distributed: bool | None = None
    """Join the other ranks, compare and measure (default: when the launcher started more than one process)."""
    backend: str = "auto"
    """The backend to judge and, in the distributed mode, to join with, as init(backend=)."""
    timeout: float | None = None
    """The distributed mode's wait for the other ranks and for each collective, in seconds. None: inside a job
    that ran dtcore.init(), that job's timeout; otherwise the DTCORE_TIMEOUT setting (its default: docs/knobs.md). Under
    preflight, init()'s own timeout argument, judged as init() judges it."""
    bandwidth: bool = True
    """In the distributed mode, measure: the allreduce sweep and the ring's link test."""
    sizes: Sequence[int] = tuple(DEFAULT_SIZES)
    """Allreduce sizes of the sweep, in bytes."""
    iters: int | None = None
    """Timed allreduces per size (default: 20 up to 64 KiB, 10 up to 4 MiB, 5 above)."""
    preflight: bool = False
    """Judge what dtcore.init() is about to do (init(preflight=True) sets it): a single process takes any free
    port, and only directories that were named are judged."""
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """init()'s rank=, world_size=, ... arguments: they beat the environment here as in init()."""
