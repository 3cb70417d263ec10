"""dtcore: distributed training that starts right or says exactly why not.

import dtcore
ctx = dtcore.init()          # under torchrun, SLURM, mpirun, accelerate, or alone
dtcore.all_reduce(t, op="avg")
model = dtcore.wrap(model)   # gradients averaged across ranks during backward
dtcore.checkpoint_activations(model, "budget:2GB", example_inputs=batch)  # recompute in backward
dtcore.save_checkpoint(path, model=model, optimizer=opt, step=step)  # reshards at load
dtcore.Trainer(model, optimizer, train_data, dtcore.TrainConfig()).fit()  # or python -m dtcore.train
"""

from . import _guard

_mismatch = _guard.torch_mismatch()
if _mismatch is not None and not _guard.running_checker():
    raise ImportError(_mismatch)  # before _C: a mismatched torch fails here, clearly

try:
    # _logging joins Python's logging to the C++ sinks; check registers itself as init(preflight=True)'s probes.
    from . import _logging, check, units  # noqa: F401
    from ._C import CheckpointError, CommError, ConfigError, DtcoreError, RendezvousError, __version__
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
except ImportError as e:  # only `python -m dtcore.check` gets here with a mismatch: it reports it
    if _mismatch is None:
        raise
    _guard.load_error = f"{_mismatch} (loading dtcore._C failed: {e})"

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
