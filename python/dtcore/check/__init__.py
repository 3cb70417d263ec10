"""The resource checker: finds what will break a distributed job before it wastes GPU hours.

    python -m dtcore.check [--json]                     # this node
    torchrun --nproc_per_node=8 -m dtcore.check         # every rank, compared and measured
    report = dtcore.check.run(); report.ok; report.failures; print(report.format())

Each item is PASS, WARN or FAIL with the value seen and, when not PASS, the fix. docs/check.md
lists the items and the JSON schema.
"""

from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Sequence

from ._report import SCHEMA, Item, Report

__all__ = ["run", "Report", "Item", "SCHEMA", "parse_size", "size_range", "DEFAULT_SIZES"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """'8', '8B', '64KiB', '64M', '1GiB' -> bytes (binary units, as nccl-tests reads them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS or int(m.group(1)) < 1:
        raise ValueError(f"'{text}' is not a size: use a positive number with an optional unit B, KiB, MiB or GiB, "
                         "e.g. 8B or 64MiB")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def size_range(low: int, high: int, factor: int = 2) -> list[int]:
    """low, low*factor, ... up to high (included), like nccl-tests' -b/-e/-f."""
    if low > high or factor < 2:
        raise ValueError(f"sizes {low}..{high} with factor {factor}: need low <= high and factor >= 2")
    out = [low]
    while out[-1] * factor <= high:
        out.append(out[-1] * factor)
    return out


DEFAULT_SIZES = size_range(8, 64 << 20)


def _launched_world(env: Mapping[str, str]) -> int:
    from .. import _C

    try:
        return _C.read_world(dict(env)).world_size
    except _C.DtcoreError:
        return 1  # the local probes report why the environment cannot be read


def run(
    *,
    env: Optional[Mapping[str, str]] = None,
    checkpoint_dir: Optional[str] = None,
    log_dir: Optional[str] = None,
    shm_path: str = "/dev/shm",
    min_free_disk_gb: float = 10.0,
    accelerate_config: Optional[str] = None,
    distributed: Optional[bool] = None,
    backend: str = "auto",
    timeout: float = 60.0,
    bandwidth: bool = True,
    sizes: Sequence[int] = DEFAULT_SIZES,
    iters: Optional[int] = None,
    preflight: bool = False,
) -> Report:
    """Runs the checker and returns its Report (the same as `python -m dtcore.check --json`).

    env: the environment to judge (default: this process's). checkpoint_dir / log_dir: where free
    disk matters (default: the working directory and DTCORE_LOG_DIR). distributed: join the other
    ranks, compare and measure (default: when the launcher started more than one process).
    backend/timeout/bandwidth/sizes/iters: the distributed mode's join and allreduce sweep.
    preflight: judge what dtcore.init() is about to do (init(preflight=True) sets it): a single
    process takes any free port, and only directories that were named are judged.
    """
    from ._local import run_local

    from .. import _guard

    env = dict(os.environ if env is None else env)
    if distributed is None:
        distributed = _launched_world(env) > 1
    if _guard.torch_mismatch() is not None:
        distributed = False  # an extension built for another torch must not run collectives; report it
    local = run_local(env=env, checkpoint_dir=checkpoint_dir, log_dir=log_dir, shm_path=shm_path,
                      min_free_disk_gb=min_free_disk_gb, accelerate_config=accelerate_config, distributed=distributed,
                      preflight=preflight)
    if not distributed:
        return local
    from ._distributed import run_distributed

    return run_distributed(local, backend=backend, timeout=timeout, bandwidth=bandwidth, sizes=sizes, iters=iters)
