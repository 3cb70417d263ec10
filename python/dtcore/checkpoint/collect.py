"""What one rank writes of a checkpoint: the chunks of the logical tensors it holds.

See Note [Checkpoint layout] (manifest.py). A replicated tensor (the model's parameters under DDP
and ZeRO-1/2, a plain torch optimizer's state) is held whole and alike by every rank, so
the ranks split the writing: all replicated tensors, flattened and laid end to end in a fixed
order, are cut into N equal ranges, and rank r writes the parts of tensors in range r. A sharded
optimizer's state is written by the rank that owns each piece (zero/state.py: local_state). Buffers
may differ across ranks, so rank 0 writes them whole: a saved value is always one rank's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..reducer.model import DistributedModel
from ..zero import state as zero_state
from ..zero.optimizer import ShardedOptimizer
from . import values


@dataclasses.dataclass
class Chunk:
    name: str  # the logical tensor
    lo: int  # elements [lo, hi) of the flattened tensor
    hi: int
    data: torch.Tensor  # (hi - lo,) on the tensor's device, possibly a view of the live tensor


@dataclasses.dataclass
class Collected:
    tensors: dict[str, dict[str, Any]]  # name -> {"shape", "dtype"} of every logical tensor this rank writes
    chunks: list[Chunk]
    aliases: dict[str, str]  # name -> the name of the tensor it shares memory with
    optimizer: dict[str, Any] | None  # class, param_groups and scalars (JSON, tensors to `scalar_tensors`)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state_dict a checkpoint holds: no `module.` or `_orig_mod.` prefixes, so that
    the weights load into the bare model (inference without dtcore) and into any wrapper."""
    while True:
        if isinstance(model, (DistributedModel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile's wrapper
            model = model._orig_mod
        else:
            return model


def model_state(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, str]]:
    """({"model/<key>": parameter}, {"model/<key>": other state (buffers)}, aliases) of the unwrapped
    model's state_dict: a key whose tensor is another's (tied weights) is stored once and named in
    `aliases`. Buffers are apart because ranks may hold different values of them (BatchNorm's
    statistics between broadcasts, broadcast_buffers=False): they are saved whole, from rank 0."""
    module = unwrap(model)
    params = {t.untyped_storage().data_ptr() for t in module.parameters() if t.numel()}
    tensors: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for key, t in module.state_dict(keep_vars=False).items():
        name = f"model/{key}"
        identity = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and identity in seen:
            aliases[name] = seen[identity]
            continue
        seen[identity] = name
        (tensors if t.untyped_storage().data_ptr() in params else buffers)[name] = t
    return tensors, buffers, aliases


def collect(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, rank: int, world: int, scalar_tensors: list
) -> Collected:
    replicated, buffers, aliases = model_state(model)
    sharded: list[tuple[str, int, torch.Tensor, torch.Tensor]] = []  # (name, offset, values, parameter)
    meta = None
    if optimizer is not None:
        meta, opt_replicated, sharded = _optimizer_state(optimizer, rank, scalar_tensors)
        replicated.update(opt_replicated)
    out = Collected({}, [], aliases, meta)
    total = sum(t.numel() for t in replicated.values())
    begin, end = rank * total // world, (rank + 1) * total // world
    offset = 0
    for name, t in replicated.items():
        out.tensors[name] = {"shape": list(t.shape), "dtype": values.dtype_name(t.dtype)}
        lo, hi = max(begin, offset) - offset, min(end, offset + t.numel()) - offset
        if lo < hi:
            out.chunks.append(Chunk(name, lo, hi, t.detach().reshape(-1)[lo:hi]))
        offset += t.numel()
    for name, t in buffers.items():  # whole, from rank 0: see model_state
        out.tensors[name] = {"shape": list(t.shape), "dtype": values.dtype_name(t.dtype)}
        if rank == 0 and t.numel():
            out.chunks.append(Chunk(name, 0, t.numel(), t.detach().reshape(-1)))
    for name, lo, data, param in sharded:
        out.tensors[name] = {"shape": list(param.shape), "dtype": values.dtype_name(data.dtype)}
        out.chunks.append(Chunk(name, lo, lo + data.numel(), data.detach()))
    return out


def _optimizer_state(
    optimizer: torch.optim.Optimizer, rank: int, scalar_tensors: list
) -> tuple[dict[str, Any], dict[str, torch.Tensor], list[tuple[str, int, torch.Tensor, torch.Tensor]]]:
    """(meta, replicated tensors, sharded pieces) of an optimizer, in torch's state_dict numbering."""
    if isinstance(optimizer, ShardedOptimizer):
        params = zero_state._numbered(optimizer)
        groups = zero_state._groups(optimizer)
        per_element, scalars, is_replicated = zero_state.local_state(optimizer)
        kind = {"class": optimizer._optimizer_class.__name__, "zero": optimizer._model.zero}
    else:
        state_dict = optimizer.state_dict()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        groups = state_dict["param_groups"]
        per_element, scalars, is_replicated = [], {}, True
        for i, entry in state_dict["state"].items():
            for key, value in entry.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == params[int(i)].shape:
                    per_element.append((int(i), key, 0, value.reshape(-1)))
                else:
                    scalars.setdefault(int(i), {})[key] = value
        kind = {"class": type(optimizer).__name__, "zero": 0}
    meta = None
    if rank == 0:  # rank 0 writes the manifest: only its copy of the scalars is kept
        meta = {
            **kind,
            "param_shapes": [list(p.shape) for p in params],
            "param_groups": values.encode(groups, scalar_tensors, "optimizer.param_groups"),
            "scalars": {
                str(i): values.encode(entry, scalar_tensors, f"optimizer.state[{i}]") for i, entry in scalars.items()
            },
        }
    replicated: dict[str, torch.Tensor] = {}
    sharded = []
    for i, key, lo, data in per_element:
        name = f"optim/{i}/{key}"
        if is_replicated:
            replicated[name] = data.view(params[i].shape) if lo == 0 and data.numel() == params[i].numel() else data
        else:
            sharded.append((name, lo, data, params[i]))
    return meta, replicated, sharded
