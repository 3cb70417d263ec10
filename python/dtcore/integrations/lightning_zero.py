"""What ZeRO changes under Lightning's Trainer (lightning.py's DtcoreStrategy with zero>=1).

- The optimizers configure_optimizers returned become dtcore.ShardedOptimizers of the same class,
  groups and hyperparameters, and the LR schedulers set the learning rates of those instead.
- The precision plugin: Lightning's own, checked; under zero>=2 its clipping is dtcore's, since each
  rank holds only its shard of the gradients there (.grad is None) and Lightning's clip_grad_norm_
  over .grad would find nothing to clip.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

import dtcore

# The precision plugins whose work the strategy leaves untouched (autocast, casting the module).
PRECISIONS = (Precision, DoublePrecision, HalfPrecision, MixedPrecision)


def sharded_optimizers(
    model: dtcore.DistributedModel, optimizers: list[torch.optim.Optimizer], scheduler_configs: list[Any]
) -> list[torch.optim.Optimizer]:
    """`optimizers` as ShardedOptimizers of `model`; the schedulers in `scheduler_configs` follow them."""
    sharded = [_sharded(model, opt) for opt in optimizers]
    for config in scheduler_configs:
        for old, new in zip(optimizers, sharded):
            if config.scheduler.optimizer is old:
                _point_scheduler(config.scheduler, new)
    return sharded


def _sharded(model: dtcore.DistributedModel, optimizer: torch.optim.Optimizer) -> dtcore.ShardedOptimizer:
    """The same optimizer class, groups and hyperparameters, stepping this rank's shard."""
    cls = type(optimizer)
    accepted = inspect.signature(cls).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    # The very group dicts: every key a scheduler added (initial_lr, max_lr, ...) stays, and a learning rate set
    # on them through the optimizer given (SequentialLR's and ChainedScheduler's inner schedulers, a reference
    # the LightningModule kept) is the ShardedOptimizer's. (fp32 masters for bf16/fp16 parameters; fp32 and
    # 64-true's fp64 ones are stepped as they are.)
    return dtcore.ShardedOptimizer(model, cls, params=optimizer.param_groups, **defaults)


class _ShardAwareClipping:
    """Mixed into the precision plugin under zero>=2, where .grad is None and each rank holds a shard."""

    def clip_grad_by_norm(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        if isinstance(optimizer, dtcore.ShardedOptimizer):
            dtcore.clip_grad_norm_(optimizer.model, clip_val)  # the global norm over the model's shards
        else:  # an optimizer of whole gradients (the plugin was given to another strategy since)
            super().clip_grad_by_norm(optimizer, clip_val)  # type: ignore[misc]

    def clip_grad_by_value(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        raise dtcore.ConfigError(
            f"gradient_clip_algorithm='value' (gradient_clip_val={clip_val}) with DtcoreStrategy(zero>=2): the "
            "gradients are sharded (.grad is None), so there is nothing of them to clip by value. Fix: "
            "gradient_clip_algorithm='norm' (clipped over the shards), or zero=1."
        )


_shard_aware: dict[type, type] = {}


def checked_precision(plugin: Precision, zero: int) -> Precision:
    """`plugin` if DtcoreStrategy(zero=`zero`) runs it right, made to clip by shards under zero>=2;
    else a ConfigError naming it and the precision to choose."""
    if type(plugin) not in PRECISIONS and type(plugin) not in _shard_aware.values():
        raise dtcore.ConfigError(
            f"DtcoreStrategy cannot run the precision plugin {type(plugin).__name__}. Fix: Trainer(precision=...) one "
            "of '32-true', '64-true', 'bf16-true', '16-true', 'bf16-mixed', '16-mixed'."
        )
    if isinstance(plugin, MixedPrecision) and plugin.scaler is not None and zero >= 1:
        raise dtcore.ConfigError(
            f"precision='16-mixed' with DtcoreStrategy(zero={zero}): its GradScaler unscales and checks each .grad, "
            "which ZeRO's optimizer does not step from. Fix: precision='bf16-mixed' (no scaler), or zero=0."
        )
    if zero >= 2 and type(plugin) in PRECISIONS:
        cls = type(plugin)
        if cls not in _shard_aware:
            # Same qualname: Lightning keys the plugin's state in checkpoints by it.
            _shard_aware[cls] = type(cls.__name__, (_ShardAwareClipping, cls), {"__qualname__": cls.__qualname__})
        plugin.__class__ = _shard_aware[cls]  # as Lightning's own LightningOptimizer takes an optimizer's class
    return plugin


def _point_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """`scheduler` (and those it steps: SequentialLR's, ChainedScheduler's) sets `optimizer`'s learning rates
    from now on. torch's schedulers mark their optimizer's step to warn when scheduler.step() comes first; the
    new one's step is marked alike."""
    scheduler.optimizer = optimizer
    for inner in getattr(scheduler, "_schedulers", ()):  # torch's composite schedulers keep them there
        _point_scheduler(inner, optimizer)
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return
    owner = weakref.ref(optimizer)  # no cycle through the bound method, as torch's own marking

    def marked(*args: Any, **kwargs: Any) -> Any:
        opt = owner()
        opt._opt_called = True  # type: ignore[union-attr]
        return type(opt).step(opt, *args, **kwargs)

    marked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = marked  # type: ignore[method-assign]
