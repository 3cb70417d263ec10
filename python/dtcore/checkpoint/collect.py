"""What one rank writes of a checkpoint: the chunks of the logical tensors it holds.

See Note [Checkpoint layout] (manifest.py). A replicated tensor (the model's parameters under DDP
and ZeRO-1/2, a plain torch optimizer's state) is held whole and alike by every rank, so
the ranks split the writing: all replicated tensors, flattened and laid end to end in a fixed
order, are cut into N equal ranges, and rank r writes the parts of tensors in range r. A sharded
tensor is written by the rank that holds each piece, with no collective and nothing gathered: a
sharded optimizer's state (zero/state.py: local_state), and under zero=3 the parameters themselves
(each FlatGroup's shard, by its cuts: Note [Fully sharded storage] in zero/flat.py), whose shapes
come from the groups (between uses a zero=3 parameter's own data is empty). Buffers may differ
across ranks, so rank 0 writes them whole: a saved value is always one rank's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..reducer.model import DistributedModel
from ..zero import state as zero_state
from ..zero.optimizer import ShardedOptimizer
from ..zero.stage3 import FullyShardedModel
from . import values

Shape = tuple[int, ...]


@dataclasses.dataclass
class Chunk:
    name: str  # the logical tensor
    lo: int  # elements [lo, hi) of the flattened tensor
    hi: int
    data: torch.Tensor  # (hi - lo,) on the tensor's device, possibly a view of the live tensor
    source: torch.Tensor | None = None  # the tensor it is a range of, flattened (None: `data` is that tensor's own)


@dataclasses.dataclass
class Collected:
    tensors: dict[str, dict[str, Any]]  # name -> {"shape", "dtype"} of every logical tensor this rank writes
    chunks: list[Chunk]
    aliases: dict[str, str]  # name -> the name of the tensor it shares memory with
    optimizer: dict[str, Any] | None  # class, param_groups and scalars (JSON, tensors to `scalar_tensors`)


@dataclasses.dataclass
class Piece:
    """This rank's part of a sharded logical tensor: elements [lo, lo + data.numel()) of it."""

    name: str
    lo: int
    data: torch.Tensor  # (numel,)
    shape: Shape  # the whole tensor's


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


def distributed_model(model: torch.nn.Module) -> DistributedModel | None:
    """The dtcore wrapper (zero=0/1/2) under any torch.compile wrapper, if `model` is one."""
    while not isinstance(model, DistributedModel) and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        model = model._orig_mod
    return model if isinstance(model, DistributedModel) and not isinstance(model, FullyShardedModel) else None


def fully_sharded(model: torch.nn.Module, optimizer: Any = None) -> FullyShardedModel | None:
    """The zero=3 model whose shards hold `model`'s parameters (`model` itself, a wrapper of it, or its
    bare module given with its ShardedOptimizer), or None."""
    m = model
    while True:
        if isinstance(m, FullyShardedModel):
            return m
        if isinstance(m, (DistributedModel, torch.nn.parallel.DistributedDataParallel)):
            m = m.module
        elif isinstance(getattr(m, "_orig_mod", None), torch.nn.Module):
            m = m._orig_mod
        else:
            break
    if isinstance(optimizer, ShardedOptimizer) and isinstance(optimizer.model, FullyShardedModel):
        if unwrap(optimizer.model) is unwrap(model):
            return optimizer.model
    return None


def shape_getter(model: FullyShardedModel | None) -> Callable[[torch.Tensor], Shape]:
    """A parameter's whole shape: the model's record of it under zero=3 (its own data is empty between uses)."""
    if model is None:
        return lambda p: tuple(p.shape)
    return lambda p: tuple(model.shape_of(p))


def persistent_buffers(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(state_dict key, buffer) of every buffer state_dict holds (not the non-persistent ones), with
    duplicates, in named_buffers order."""
    out = []
    for prefix, m in module.named_modules(remove_duplicate=False):
        skip = m._non_persistent_buffers_set  # torch keeps the names there; state_dict reads it too
        for name, b in m._buffers.items():
            if b is not None and name not in skip:
                out.append((f"{prefix}.{name}" if prefix else name, b))
    return out


def _first(name: str, t: torch.Tensor, seen: dict[tuple, str], aliases: dict[str, str]) -> bool:
    """Whether `t` is stored under `name`: False when a tensor stored before is the same memory (a tied
    weight), which `aliases` then names."""
    identity = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
    if t.numel() and identity in seen:
        aliases[name] = seen[identity]
        return False
    seen[identity] = name
    return True


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
        if _first(name, t, seen, aliases):
            (tensors if t.untyped_storage().data_ptr() in params else buffers)[name] = t
    return tensors, buffers, aliases


def sharded_model_state(
    model: FullyShardedModel,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, str], list[Piece], dict[str, torch.dtype]]:
    """model_state's (replicated, buffers, aliases) of a zero=3 model, plus this rank's pieces of its
    sharded parameters and their dtypes (the shards': the parameters' own), with no collective and
    nothing gathered. Keys are those of the unwrapped module's state_dict, found without calling it
    (its hooks gather every parameter): a tied parameter is stored under its first key. Parameters in
    no unit (ignored ones) are whole on every rank: replicated."""
    module = unwrap(model)
    replicated: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    pieces: list[Piece] = []
    dtypes: dict[str, torch.dtype] = {}
    first: dict[int, str] = {}  # id(parameter) -> the name it is stored under
    for key, p in module.named_parameters(remove_duplicate=False):
        name = f"model/{key}"
        if id(p) in first:
            aliases[name] = first[id(p)]
            continue
        first[id(p)] = name
        found = model.group_of(p)
        if found is None:
            replicated[name] = p.detach()
            continue
        group, i = found
        dtypes[name] = group.dtype
        pieces.append(Piece(name, 0, group.shard[:0], group.shapes[i]))  # names the tensor on every rank
        for cut in group.cuts:
            if cut.param == i:
                pieces.append(
                    Piece(name, cut.param_offset, group.shard.narrow(0, cut.shard_offset, cut.numel), group.shapes[i])
                )
    buffers: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    for key, t in persistent_buffers(module):
        name = f"model/{key}"
        if _first(name, t, seen, aliases):
            buffers[name] = t.detach()
    return replicated, buffers, aliases, pieces, dtypes


def collect(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, rank: int, world: int, scalar_tensors: list
) -> Collected:
    sharded_model = fully_sharded(model, optimizer)
    sharded: list[Piece] = []
    dtypes: dict[str, torch.dtype] = {}
    if sharded_model is None:
        replicated, buffers, aliases = model_state(model)
    else:
        replicated, buffers, aliases, sharded, dtypes = sharded_model_state(sharded_model)
    meta = None
    if optimizer is not None:
        meta, opt_replicated, opt_sharded = _optimizer_state(
            optimizer, rank, scalar_tensors, shape_getter(sharded_model)
        )
        replicated.update(opt_replicated)
        sharded += opt_sharded
    out = Collected({}, [], aliases, meta)
    total = sum(t.numel() for t in replicated.values())
    begin, end = rank * total // world, (rank + 1) * total // world
    offset = 0
    for name, t in replicated.items():
        out.tensors[name] = {"shape": list(t.shape), "dtype": values.dtype_name(t.dtype)}
        lo, hi = max(begin, offset) - offset, min(end, offset + t.numel()) - offset
        if lo < hi:
            out.chunks.append(Chunk(name, lo, hi, t.detach().reshape(-1)[lo:hi], t))
        offset += t.numel()
    for name, t in buffers.items():  # whole, from rank 0: see model_state
        out.tensors[name] = {"shape": list(t.shape), "dtype": values.dtype_name(t.dtype)}
        if rank == 0 and t.numel():
            out.chunks.append(Chunk(name, 0, t.numel(), t.detach().reshape(-1), t))
    for piece in sharded:
        dtype = dtypes.get(piece.name, piece.data.dtype)
        out.tensors[piece.name] = {"shape": list(piece.shape), "dtype": values.dtype_name(dtype)}
        if piece.data.numel():
            out.chunks.append(Chunk(piece.name, piece.lo, piece.lo + piece.data.numel(), piece.data.detach()))
    return out


def optimizer_meta(optimizer: torch.optim.Optimizer, model: torch.nn.Module, scalar_tensors: list) -> dict[str, Any]:
    """Rank 0's part of a manifest for `optimizer` (class, hyperparameters, scalar state; its tensors
    appended to `scalar_tensors`), as collect() gives it: what an in-memory checkpoint records each step."""
    meta, _, _ = _optimizer_state(optimizer, 0, scalar_tensors, shape_getter(fully_sharded(model, optimizer)))
    return meta


def param_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's param_groups as torch's state_dict packs them (parameters as indices, numbered group
    after group), without packing its state."""
    if isinstance(optimizer, ShardedOptimizer):
        return zero_state.param_groups_packed(optimizer)
    packed, index = [], 0
    for group in optimizer.param_groups:
        entry = {key: value for key, value in group.items() if key != "params"}
        entry["params"] = list(range(index, index + len(group["params"])))
        index += len(group["params"])
        packed.append(entry)
    return packed


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The tensors of an optimizer's state that this rank holds (a sharded optimizer's pieces and their
    state), without copying any."""
    if optimizer is None:
        return []
    if isinstance(optimizer, ShardedOptimizer):
        per_element, _, _ = zero_state.local_state(optimizer)
        return [data for *_, data in per_element]
    return [v for entry in optimizer.state.values() for v in entry.values() if isinstance(v, torch.Tensor)]


def _optimizer_state(
    optimizer: torch.optim.Optimizer, rank: int, scalar_tensors: list, shape_of: Callable[[torch.Tensor], Shape]
) -> tuple[dict[str, Any], dict[str, torch.Tensor], list[Piece]]:
    """(meta, replicated tensors, sharded pieces) of an optimizer, in torch's state_dict numbering.
    `shape_of` gives a parameter's whole shape (see shape_getter)."""
    if isinstance(optimizer, ShardedOptimizer):
        params = optimizer.numbered_params
        groups = zero_state.param_groups_packed(optimizer)
        per_element, scalars, is_replicated = zero_state.local_state(optimizer)
        kind = {"class": optimizer.optimizer_class.__name__, "zero": optimizer.model.zero}
    else:
        state_dict = optimizer.state_dict()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        groups = param_groups(optimizer)
        per_element, scalars, is_replicated = [], {}, True
        for i, entry in state_dict["state"].items():
            for key, value in entry.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.dim() > 0
                    and tuple(value.shape) == shape_of(params[int(i)])
                ):
                    per_element.append((int(i), key, 0, value))  # itself, not flattened: a copy if non-contiguous
                else:
                    scalars.setdefault(int(i), {})[key] = value
        kind = {"class": type(optimizer).__name__, "zero": 0}
    shapes = [shape_of(p) for p in params]
    meta = None
    if rank == 0:  # rank 0 writes the manifest: only its copy of the scalars is kept
        meta = {
            **kind,
            "param_shapes": [list(s) for s in shapes],
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
            whole = lo == 0 and data.numel() == _numel(shapes[i])
            replicated[name] = data.reshape(shapes[i]) if whole else data
        else:
            sharded.append(Piece(name, lo, data, shapes[i]))
    return meta, replicated, sharded


def _numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
