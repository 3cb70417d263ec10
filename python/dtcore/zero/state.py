"""ShardedOptimizer's state in torch's own format, gathered from the shards and cut back into them.

torch's format: {"state": {index: {key: tensor}}, "param_groups": [{..., "params": [index, ...]}]},
indices numbering the parameters group after group, as a torch optimizer over the whole model
would number them. Per-element state (AdamW's exp_avg, exp_avg_sq) is gathered bucket by bucket
into whole tensors shaped like the parameter; scalar state (step) is each parameter's own (a
skipped parameter's step lags), read on every rank from the parameter's local tensor there (a piece
or a proxy, see ShardedOptimizer). A parameter never stepped has no entry, as in torch. A master
copy (parameters not in master_dtype) rides along under "dtcore_master", so that a resumed bf16 run
keeps its fp32 weights. Loading accepts this format from any world size, or
from a plain torch optimizer of the same class: the shards are cut anew, with no offline step.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context

# `opt` is a ShardedOptimizer and `piece` one of its _Piece: not imported, as optimizer.py imports
# this module.
ShardedOptimizer = Any
_Piece = Any

MASTER_KEY = "dtcore_master"


def _numbered(opt: ShardedOptimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def param_groups_packed(opt: ShardedOptimizer) -> list[dict[str, Any]]:
    """param_groups packed as torch packs them (parameters as indices): torch's own code does it."""
    return torch.optim.Optimizer.state_dict(opt)["param_groups"]


def _copied(value: Any, device: torch.device | None = None) -> Any:
    """A scalar state entry, copied so that the saved and the live state never share a tensor."""
    return value.to(device, copy=True) if isinstance(value, torch.Tensor) else value


def _split(opt: ShardedOptimizer, local: torch.Tensor) -> tuple[list[str], list[str]]:
    """(per-element keys, scalar keys) of one inner tensor's state; ConfigError for any other shape."""
    assert opt._inner is not None
    per_element, scalar = [], []
    for key, value in opt._inner.state.get(local, {}).items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            scalar.append(key)
        elif value.dim() == 1 and value.numel() == local.numel():
            per_element.append(key)
        else:
            raise _C.ConfigError(
                f"{opt._optimizer_class.__name__} keeps state '{key}' of shape {tuple(value.shape)} for a piece of "
                f"{local.numel()} elements: it is not elementwise, and its state cannot be sharded. Fix: use it "
                "with dtcore.wrap(model) (zero=0) and no ShardedOptimizer."
            )
    return per_element, scalar


def gather_state(opt: ShardedOptimizer) -> dict[str, Any]:
    """Every rank gets the whole state (a collective: every rank must call it)."""
    state: dict[int, dict[str, Any]] = {}
    if opt._inner is None:  # not stepped yet: a state loaded meanwhile is still whole, on every rank
        pending = opt._pending_state or {}
        state = {int(i): {k: _copied(v) for k, v in entry.items()} for i, entry in pending.items()}
        return {"state": state, "param_groups": param_groups_packed(opt)}
    if not opt._inner.state:
        return {"state": state, "param_groups": param_groups_packed(opt)}
    index = {id(p): i for i, p in enumerate(_numbered(opt))}
    keys: set[str] = set()  # the same on every rank: every parameter has a local tensor on each
    for local in (t for locals_ in opt._locals_of.values() for t in locals_):
        keys.update(_split(opt, local)[0])
    if _any_rank_has_master(opt):
        keys.add(MASTER_KEY)
    communicator = get_context().communicator
    by_bucket: list[list[_Piece]] = [[] for _ in opt._buckets]
    for piece in opt._pieces:
        by_bucket[piece.bucket].append(piece)
    for b, (bucket, pieces) in enumerate(zip(opt._buckets, by_bucket, strict=True)):
        for key in sorted(keys):  # the same collectives in the same order on every rank
            dtype = _dtype_of(opt, key, pieces, bucket.dtype)
            mine = torch.zeros(bucket.shard.shard_numel, dtype=dtype, device=bucket.device)  # (S,)
            for piece in pieces:
                value = _value(opt, piece, key)
                if value is not None:  # None: never stepped
                    mine.narrow(0, piece.shard_offset, piece.numel).copy_(value)
            whole = torch.empty(bucket.shard.padded_numel, dtype=dtype, device=bucket.device)  # (N * S,)
            communicator.all_gather(whole, mine, f"optimizer state {b + 1}/{len(opt._buckets)}").wait()
            for _, offset, numel, param in bucket.whole:
                i = index.get(id(param))
                if i is None or _scalars(opt, param) is None:
                    continue  # reduced, not optimized; or never stepped: no state, as in torch
                own = opt.model.dtype_of(param)
                if key == MASTER_KEY and stepped_dtype(own, opt._master_dtype) == own:
                    continue
                entry = state.setdefault(i, {})
                entry[key] = whole.narrow(0, offset, numel).view(opt.model.shape_of(param)).clone()
    for p in _numbered(opt):
        for key, value in (_scalars(opt, p) or {}).items():
            state.setdefault(index[id(p)], {})[key] = _copied(value)
    return {"state": state, "param_groups": param_groups_packed(opt)}


def stepped_dtype(param_dtype: torch.dtype, master: torch.dtype | None) -> torch.dtype:
    """The dtype a parameter of `param_dtype` is stepped in: `master` (ShardedOptimizer's master_dtype) for a
    floating parameter of less precision (bf16, fp16 under fp32), else its own. An fp64 parameter is never
    stepped in an fp32 copy: every update would be rounded."""
    if master is None or not param_dtype.is_floating_point or param_dtype == master:
        return param_dtype
    return master if torch.finfo(param_dtype).bits < torch.finfo(master).bits else param_dtype


def _scalars(opt: ShardedOptimizer, param: torch.Tensor) -> dict[str, Any] | None:
    """`param`'s scalar state, from its local tensor on this rank; None if it was never stepped (or is
    frozen: it has no local tensor)."""
    locals_ = opt._locals_of.get(id(param))
    if not locals_:
        return None
    entry = opt._inner.state.get(locals_[0])
    if not entry:
        return None
    return {k: entry[k] for k in _split(opt, locals_[0])[1]}


def _any_rank_has_master(opt: ShardedOptimizer) -> bool:
    # Decided from the parameters, the same on every rank: any optimized parameter stepped in a master copy.
    dtypes = {opt.model.dtype_of(p) for p in _numbered(opt)}
    return any(stepped_dtype(d, opt._master_dtype) != d for d in dtypes)


def _dtype_of(opt: ShardedOptimizer, key: str, pieces: list[_Piece], param_dtype: torch.dtype) -> torch.dtype:
    """The dtype every rank uses for `key` in one bucket: the master's for optimizer state."""
    if key != MASTER_KEY:
        for piece in pieces:
            value = opt._inner.state.get(piece.local, {}).get(key)
            if value is not None:
                return value.dtype  # the local tensor's: the master's, or the parameter's
    return stepped_dtype(param_dtype, opt._master_dtype)  # the same, where no piece here was stepped


def _value(opt: ShardedOptimizer, piece: _Piece, key: str) -> torch.Tensor | None:
    if key == MASTER_KEY:
        return piece.local if piece.has_master else piece.param_view
    return opt._inner.state.get(piece.local, {}).get(key)  # type: ignore[union-attr]


def check_state(opt: ShardedOptimizer, state_dict: dict[str, Any]) -> None:
    """ConfigError unless `state_dict` is torch's format for this optimizer's parameters."""
    groups = state_dict.get("param_groups")
    if not isinstance(groups, list) or not isinstance(state_dict.get("state"), dict):
        raise _C.ConfigError(
            "ShardedOptimizer.load_state_dict got a dict without 'state' and 'param_groups'. Fix: pass what "
            "ShardedOptimizer.state_dict() or a torch optimizer's state_dict() returned."
        )
    ours = [len(g["params"]) for g in opt.param_groups]
    theirs = [len(g.get("params", [])) for g in groups]
    if ours != theirs:
        raise _C.ConfigError(
            f"ShardedOptimizer.load_state_dict: the saved state has param groups of {theirs} parameters, this "
            f"optimizer {ours}. Fix: build the optimizer over the same parameters and groups as the saved one."
        )
    params = _numbered(opt)
    for i, entry in state_dict["state"].items():
        shape = opt.model.shape_of(params[int(i)])
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shape:
                raise _C.ConfigError(
                    f"ShardedOptimizer.load_state_dict: state '{key}' of parameter {i} has shape "
                    f"{tuple(value.shape)}, the parameter {tuple(shape)}. Fix: load the state saved for this model."
                )


def scatter_state(opt: ShardedOptimizer, state_dict: dict[str, Any]) -> None:
    """Cuts a whole state into this rank's pieces (kept until the pieces exist, at the first step)."""
    check_state(opt, state_dict)
    for group, saved in zip(opt.param_groups, state_dict["param_groups"], strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})
    opt._pending_state = state_dict["state"]
    if opt._inner is not None:
        apply_pending(opt)


def apply_pending(opt: ShardedOptimizer) -> None:
    saved = opt._pending_state
    opt._pending_state = None
    if not saved:
        return
    assert opt._inner is not None
    index = {id(p): i for i, p in enumerate(_numbered(opt))}
    opt._inner.state.clear()
    for piece in opt._pieces:
        entry = saved.get(index[id(piece.param)])
        if piece.has_master:  # saved, or else the parameter itself: a stale master would undo the load
            if entry is not None and MASTER_KEY in entry:
                piece.local.copy_(entry[MASTER_KEY].reshape(-1).narrow(0, piece.param_offset, piece.numel))
            else:
                piece.local.copy_(piece.param_view)
        if entry is None:
            continue
        opt._inner.state[piece.local] = _cut(entry, piece.local, piece.param_offset)
    for param, proxy in opt._proxies:  # a proxy keeps its parameter's scalars
        entry = saved.get(index[id(param)])
        if entry is not None:
            opt._inner.state[proxy] = _cut(entry, proxy, 0)


def _cut(entry: dict[str, Any], local: torch.Tensor, param_offset: int) -> dict[str, Any]:
    """One parameter's whole state cut to `local`, its elements [param_offset, + local.numel())."""
    out = {}
    for key, value in entry.items():
        if key == MASTER_KEY:
            continue
        if isinstance(value, torch.Tensor) and value.dim() > 0:  # per element
            piece = value.reshape(-1).narrow(0, param_offset, local.numel())
            out[key] = piece.to(device=local.device, dtype=local.dtype, copy=True)
        else:
            out[key] = _copied(value, local.device)
    return out


def local_state(
    opt: ShardedOptimizer,
) -> tuple[list[tuple[int, str, int, torch.Tensor]], dict[int, dict[str, Any]], bool]:
    """What this rank holds of the state, without any collective: for checkpoints that write each
    rank's shard only (dtcore.save_checkpoint).

    Returns (per_element, scalars, replicated): per_element lists (parameter index, key, offset in the
    flattened parameter, values (numel,)) for every piece's per-element state and master copy;
    scalars maps each stepped parameter's index to its scalar state (known on every rank, from
    its piece or proxy); replicated is False when each rank returned its own pieces. Before the first step the
    pieces do not exist yet: a state loaded then is still whole (`_pending_state`), the same on every
    rank, and is returned whole, at offset 0, with replicated True.
    """
    index = {id(p): i for i, p in enumerate(_numbered(opt))}
    per_element: list[tuple[int, str, int, torch.Tensor]] = []
    scalars: dict[int, dict[str, Any]] = {}
    if opt._inner is None:
        for i, entry in (opt._pending_state or {}).items():
            for key, value in entry.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    per_element.append((int(i), key, 0, value.reshape(-1)))
                else:
                    scalars.setdefault(int(i), {})[key] = value
        return per_element, scalars, True
    for piece in opt._pieces:
        entry = opt._inner.state.get(piece.local)
        if not entry:
            continue
        i = index[id(piece.param)]
        for key in _split(opt, piece.local)[0]:
            per_element.append((i, key, piece.param_offset, entry[key]))
        if piece.has_master:
            per_element.append((i, MASTER_KEY, piece.param_offset, piece.local))
    for p in _numbered(opt):
        values = _scalars(opt, p)
        if values is not None:
            scalars[index[id(p)]] = values
    return per_element, scalars, False
