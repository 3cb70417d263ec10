"""`dtcore.wrap()`: the one entry point for every ZeRO stage.

zero=0|1|2 give a DistributedModel (reducer/model.py: whole parameters on every rank, gradients
averaged in buckets during backward); zero=3 a FullyShardedModel (stage3.py: parameters sharded,
gathered unit by unit). Each option belongs to the stages that use it; one given to a stage that
would ignore it is refused, naming the option and the stage.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .. import _C
from ..reducer.model import DistributedModel
from .stage3 import FullyShardedModel

_BUCKETED = frozenset(inspect.signature(DistributedModel).parameters) - {"module"}
_SHARDED = frozenset(inspect.signature(FullyShardedModel).parameters) - {"module"}


def wrap(model: torch.nn.Module, *, zero: int = 0, **options: Any) -> DistributedModel:
    """After `loss.backward()`, every parameter's gradient is the average over ranks.

    zero=0 (default): whole gradients on every rank; 1: optimizer state sharded; 2: gradients too;
    3: parameters too, gathered per unit while it runs (models larger than one device). Step
    zero>=1 with dtcore.ShardedOptimizer. Parameters and buffers are broadcast from rank 0 first;
    buffers again before each forward. Use `with model.no_sync():` to accumulate locally over
    micro-batches. The keyword arguments are DistributedModel's (zero=0|1|2) or
    FullyShardedModel's (zero=3); their docstrings say what each does.
    """
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise _C.ConfigError(
            f"dtcore.wrap(zero={zero!r}) is not a ZeRO stage dtcore offers. Fix: pass zero=0 (whole gradients and "
            "optimizer state on every rank), 1 (optimizer state sharded), 2 (gradients sharded too) or 3 (parameters "
            "sharded too)."
        )
    accepted = _SHARDED if zero == 3 else _BUCKETED - {"zero"}
    foreign = sorted(set(options) - accepted)
    if foreign:
        known = _SHARDED if zero != 3 else _BUCKETED - {"zero"}
        what = "zero=3's" if zero != 3 else "zero=0/1/2's (bucket_mb sizes buckets; zero=3 reduces by unit)"
        fix = (
            "drop them, or pass zero=3"
            if zero != 3
            else "drop them (units= sets what is gathered and reduced together)"
        )
        unknown = [o for o in foreign if o not in known]
        if unknown:
            raise TypeError(f"dtcore.wrap() got unexpected keyword argument(s) {', '.join(unknown)}")
        raise _C.ConfigError(f"dtcore.wrap(zero={zero}) with {', '.join(foreign)}: {what} option(s). Fix: {fix}.")
    if zero == 3:
        return FullyShardedModel(model, **options)
    return DistributedModel(model, zero=zero, **options)


def _signature() -> inspect.Signature:
    """wrap's keywords, declared once in the two constructors (help(dtcore.wrap) and editors show them)."""
    params = [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="torch.nn.Module")]
    seen = {"module"}
    for cls in (DistributedModel, FullyShardedModel):
        for name, p in inspect.signature(cls).parameters.items():
            if name not in seen:
                seen.add(name)
                params.append(p)
    return inspect.Signature(params, return_annotation=DistributedModel)


wrap.__signature__ = _signature()  # type: ignore[attr-defined]
