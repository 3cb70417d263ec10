"""A zero=2 model's `.grad` is None after backward (its gradients live in shards), so a plain torch
optimizer stepping it would skip every parameter without a word. Refused at its step instead,
through torch's global optimizer pre-step hook; dtcore.ShardedOptimizer (marked `_dtcore_sharded`)
passes.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.optim.optimizer as _torch_optimizer

from .. import _C

# id(parameter) -> (a weak reference to it, its name). By id: tensors compare elementwise, so they
# cannot be dictionary keys; the weak reference drops the entry with the parameter.
_sharded: dict[int, tuple[weakref.ref, str]] = {}
_hook: Any = None


def guard(module: torch.nn.Module) -> None:
    """Marks `module`'s parameters as sharded (zero=2)."""
    global _hook
    for name, p in module.named_parameters():
        key = id(p)
        _sharded[key] = (weakref.ref(p, lambda _, key=key: _sharded.pop(key, None)), name)
    if _hook is None:
        _hook = _torch_optimizer.register_optimizer_step_pre_hook(_refuse_plain_step)


def _refuse_plain_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if getattr(optimizer, "_dtcore_sharded", False) or not _sharded:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            ref, name = _sharded.get(id(p), (None, ""))
            if ref is not None and ref() is p:
                kind = type(optimizer).__name__
                raise _C.ConfigError(
                    f"{kind}.step() on parameter '{name}' of a model wrapped with zero=2: its gradients live in "
                    f"shards (.grad is None), so this optimizer would change nothing. Fix: opt = "
                    f"dtcore.ShardedOptimizer(model, torch.optim.{kind}, ...), or wrap with zero=0 to keep whole "
                    "gradients."
                )
