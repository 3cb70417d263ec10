"""`dtcore.clip_grad_norm_`: torch's clip_grad_norm_ for a wrapped model, shard-aware.

With zero=2 and zero=3 every rank holds only its shard of the reduced gradients, so the norm is its own
shards' sum of |g|^p (or max |g|), combined across ranks by one small all-reduce; every shard is
then scaled by the same factor torch would use. Otherwise each rank holds whole gradients and
torch's own function gives the global norm without any collective.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..comm.collectives import all_reduce
from ..reducer.model import DistributedModel


def clip_grad_norm_(
    model: DistributedModel | torch.nn.Module | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """Scales the gradients so that their global norm is at most max_norm; returns the norm before."""
    if not (isinstance(model, DistributedModel) and model.zero >= 2):
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)
    norm_type = float(norm_type)
    if model.zero == 3:
        shards = model.grad_shards()  # the groups with a gradient (padding zero): the same on every rank
    else:
        reducer = model._reducer
        if not reducer.plan_final:  # no reduced backward yet: no gradient, as torch's would find
            return torch.tensor(0.0)
        shards = reducer.grad_shards()
    if not shards:
        return torch.tensor(0.0)
    if norm_type == float("inf"):
        local = torch.stack([s.detach().abs().max().float() for s in shards])
        total = all_reduce(local.max().reshape(1), op="max")[0]
    else:
        local = torch.stack([torch.linalg.vector_norm(s.detach(), norm_type, dtype=torch.float32) for s in shards])
        total = all_reduce(local.pow(norm_type).sum().reshape(1), op="sum")[0].pow(1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`"
        )
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for s in shards:
        s.mul_(coef.to(s.dtype))
    return total
