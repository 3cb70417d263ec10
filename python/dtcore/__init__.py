"""dtcore: distributed training that starts right or says exactly why not.

import dtcore
ctx = dtcore.init()          # under torchrun, SLURM, mpirun, accelerate, or alone
dtcore.all_reduce(t, op="avg")
model = dtcore.wrap(model)   # gradients averaged across ranks during backward
dtcore.checkpoint_activations(model, "budget:2GB", example_inputs=batch)  # recompute in backward
dtcore.save_checkpoint(path, model=model, optimizer=opt, step=step)  # reshards at load
dtcore.Trainer(model, optimizer, train_data, dtcore.TrainConfig()).fit()  # or python -m dtcore.train

The areas behind the public names (bootstrap, comm, reducer, zero, checkpoint, train, ...) are
imported on first use (PEP 562), so that `python -m dtcore.check` loads only what it runs; see
Note [The checker without torch's Python] in _guard.py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _guard

_mismatch = _guard.prepare()  # loads torch (or, for the checker, only its libraries) before _C
if _mismatch is not None and not _guard.running_checker():
    raise ImportError(_mismatch)  # before _C: a mismatched torch fails here, clearly

try:
    # _logging joins Python's logging to the C++ sinks; check registers itself as init(preflight=True)'s probes.
    from . import _logging, check, units  # noqa: F401
    from ._C import CheckpointError, CommError, ConfigError, DtcoreError, RendezvousError, __version__
except ImportError as e:  # only `python -m dtcore.check` gets here with a mismatch: it reports it
    if _mismatch is None:
        raise
    _guard.load_error = f"{_mismatch} (loading dtcore._C failed: {e})"

# Each public name, and the area (subpackage) that defines it.
_LAZY = {
    **dict.fromkeys(("CheckpointSummary", "checkpoint_activations"), "activation"),
    **dict.fromkeys(("Context", "get_context", "init", "is_initialized", "shutdown"), "bootstrap"),
    **dict.fromkeys(("load_checkpoint", "save_checkpoint"), "checkpoint"),
    **dict.fromkeys(
        (
            "all_gather",
            "all_reduce",
            "barrier",
            "broadcast",
            "gather_object",
            "is_local_main_process",
            "is_main_process",
            "local_main_process_first",
            "main_process_first",
            "reduce_scatter",
        ),
        "comm",
    ),
    **dict.fromkeys(("DistributedDataParallel", "DistributedModel"), "reducer"),
    **dict.fromkeys(("TrainConfig", "Trainer"), "train"),
    **dict.fromkeys(("FullyShardedModel", "ShardedOptimizer", "clip_grad_norm_", "wrap"), "zero"),
}
_AREAS = ("activation", "bootstrap", "checkpoint", "comm", "launch", "reducer", "train", "zero")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _AREAS:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'dtcore' has no attribute '{name}'")
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_AREAS))


if TYPE_CHECKING:  # what editors and type checkers see: every name, as if imported eagerly
    from .activation import CheckpointSummary, checkpoint_activations
    from .bootstrap import Context, get_context, init, is_initialized, shutdown
    from .checkpoint import load_checkpoint, save_checkpoint
    from .comm import (
        all_gather,
        all_reduce,
        barrier,
        broadcast,
        gather_object,
        is_local_main_process,
        is_main_process,
        local_main_process_first,
        main_process_first,
        reduce_scatter,
    )
    from .reducer import DistributedDataParallel, DistributedModel
    from .train import TrainConfig, Trainer
    from .zero import FullyShardedModel, ShardedOptimizer, clip_grad_norm_, wrap

__all__ = [
    "__version__",
    "Context",
    "init",
    "get_context",
    "is_initialized",
    "shutdown",
    "barrier",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "gather_object",
    "is_main_process",
    "main_process_first",
    "is_local_main_process",
    "local_main_process_first",
    "wrap",
    "check",
    "units",
    "DistributedModel",
    "FullyShardedModel",
    "DistributedDataParallel",
    "ShardedOptimizer",
    "clip_grad_norm_",
    "save_checkpoint",
    "load_checkpoint",
    "checkpoint",
    "checkpoint_activations",
    "Trainer",
    "TrainConfig",
    "CheckpointSummary",
    "DtcoreError",
    "ConfigError",
    "RendezvousError",
    "CommError",
    "CheckpointError",
]
