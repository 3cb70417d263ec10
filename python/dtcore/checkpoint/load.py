"""`dtcore.load_checkpoint` and `dtcore.checkpoint.export`: any checkpoint into any world size.

Each rank reads what it needs from every file it needs (Note [Checkpoint layout]): the model
whole (it is replicated under DDP and ZeRO-1/2), or under zero=3 only the ranges of each parameter
that its shards hold (Note [Fully sharded storage] in zero/flat.py), whatever the world size and
stage the checkpoint was saved at; the optimizer's state whole, cut to this rank's shard by
ShardedOptimizer (zero/state.py). No collective is needed to read; one small exchange
checks that every rank loads the same checkpoint. Every file is checked against the manifest's
size and SHA-256 before it is opened, and it is opened by the `safetensors` library, which never
executes anything from a file: a truncated, altered or pickle-carrying file is a CheckpointError
naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from .. import _C
from ..bootstrap import context
from ..comm import agree
from ..zero import state as zero_state
from ..zero.optimizer import ShardedOptimizer
from ..zero.stage3 import FullyShardedModel
from . import manifest, values
from .collect import Shape, distributed_model, fully_sharded, persistent_buffers, shape_getter, unwrap
from .save import wait

log = logging.getLogger("dtcore")


class Reader:
    """Ranges of a checkpoint's logical tensors, read from its verified files."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.manifest = manifest.read(directory)
        self._open: dict[int, Any] = {}

    def identity(self) -> str:
        """What makes two copies of a checkpoint the same one: its step and its files' digests."""
        files = [(f["name"], f["sha256"]) for f in self.manifest["files"]]
        return hashlib.sha256(json.dumps([self.manifest["step"], files]).encode()).hexdigest()

    def file(self, index: int) -> Any:
        handle = self._open.get(index)
        if handle is None:
            entry = self.manifest["files"][index]
            path = os.path.join(self.directory, entry["name"])
            digest = _C.digest_file(path)
            if digest.bytes != entry["bytes"]:
                raise _C.CheckpointError(
                    f"checkpoint file {path} is corrupt: {digest.bytes} bytes where the manifest says {entry['bytes']} "
                    f"({'truncated' if digest.bytes < entry['bytes'] else 'grown'}). Fix: load another checkpoint."
                )
            if digest.sha256 != entry["sha256"]:
                raise _C.CheckpointError(
                    f"checkpoint file {path} is corrupt: its SHA-256 is {digest.sha256}, the manifest says "
                    f"{entry['sha256']} (the file was altered or damaged). Fix: load another checkpoint."
                )
            try:
                handle = safe_open(path, framework="pt", device="cpu")
            except (SafetensorError, OSError) as e:
                raise _C.CheckpointError(
                    f"checkpoint file {path} cannot be read: {e}. Fix: load another checkpoint."
                ) from None
            self._open[index] = handle
        return handle

    def tensor(self, key: str, index: int) -> torch.Tensor:
        """A whole tensor of file `index` (values saved by encode())."""
        return self.file(index).get_tensor(key)

    def info(self, name: str) -> dict[str, Any]:
        return self.manifest["tensors"][self.manifest["aliases"].get(name, name)]

    def copy_into(self, name: str, out: torch.Tensor) -> None:
        """`out` (shaped like the saved tensor) = the saved tensor `name`, read chunk by chunk."""
        info = self.info(name)
        flat = out.view(-1) if out.is_contiguous() else torch.empty(out.numel(), dtype=out.dtype)
        for index, lo, hi in info["chunks"]:
            key = manifest.chunk_key(self.manifest["aliases"].get(name, name), lo)
            flat[lo:hi].copy_(self.file(index).get_slice(key)[:])
        if flat.data_ptr() != out.data_ptr() or not out.is_contiguous():
            out.copy_(flat.view(out.shape))

    def read_range(self, name: str, lo: int, hi: int, out: torch.Tensor) -> None:
        """`out` (hi - lo,) = elements [lo, hi) of the flattened saved tensor `name`, read from the chunks
        that overlap them (and nothing else of the files)."""
        key = self.manifest["aliases"].get(name, name)
        for index, chunk_lo, chunk_hi in self.info(name)["chunks"]:  # sorted by lo (save.py: _check_tiled)
            a, b = max(lo, chunk_lo), min(hi, chunk_hi)
            if a < b:
                part = self.file(index).get_slice(manifest.chunk_key(key, chunk_lo))[a - chunk_lo : b - chunk_lo]
                out[a - lo : b - lo].copy_(part)

    def full(self, name: str) -> torch.Tensor:
        info = self.info(name)
        out = torch.empty(info["shape"], dtype=values.dtype_of(info["dtype"]))
        self.copy_into(name, out)
        return out


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Loads the checkpoint at `path` into `model` (and `optimizer`), at any world size.

    path: a checkpoint directory, or a directory of them (the newest complete one by step is
    taken), or a plain .safetensors file of the model's weights (e.g. from
    dtcore.checkpoint.export or another tool). strict: the model's keys and the checkpoint's must
    be the same (as torch's load_state_dict). Returns {"step", "extra", "rank_extra" (this rank's;
    None when the checkpoint was saved by another number of ranks), "path"}.
    """
    wait()  # a save in flight completes first: it may be the one to load
    path = os.fspath(path)
    ctx = context.current()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    if os.path.isfile(path) and path.endswith(".safetensors"):
        return _load_weights_file(path, model, strict, optimizer)
    reader, problem = None, ""
    try:
        reader = Reader(manifest.resolve(path))
    except _C.CheckpointError as e:
        problem = str(e)
    if world > 1:
        # The same checkpoint: the same step and files, wherever each rank finds them (in-memory checkpoints are
        # in each node's own directory).
        mine = [reader.directory, reader.identity(), reader.manifest["step"]] if reader is not None else ["", "", -1]
        seen = agree.gather([*mine, problem])
        if any(p for *_, p in seen) or len({i for _, i, _, _ in seen}) > 1:
            odd = next(r for r, (_, i, _, p) in enumerate(seen) if p or i != seen[0][1])
            what = seen[odd][3] or (
                f"it found {seen[odd][0]} (step {seen[odd][2]}), rank 0 found {seen[0][0]} (step {seen[0][2]}), and "
                "their files differ"
            )
            raise _C.CheckpointError(
                f"ranks do not see the same checkpoint at {path}: rank {odd}: {what} Fix: put checkpoints on a file "
                "system every node shares, at the same path."
            )
    if problem:
        raise _C.CheckpointError(problem)
    directory = reader.directory
    saved = reader.manifest
    wrapper = distributed_model(model)
    if wrapper is not None and wrapper.adopt_bucket_plan(saved.get("bucket_plan")):  # before the optimizer's cut
        log.info(
            "buckets as the checkpoint's bucket_mb='auto' plan (%d), not measured again", len(wrapper.bucket_params)
        )
    sharded = fully_sharded(model, optimizer)
    if sharded is not None:
        _load_sharded_model(reader, sharded, strict)
    else:
        _load_model(reader, model, strict)
    if optimizer is not None:
        _load_optimizer(reader, optimizer, shape_getter(sharded))
    rank_extra = None
    if saved["world_size"] == world:
        rank_extra = values.decode(saved["rank_extra"][rank], lambda key: reader.tensor(key, rank))
    elif any(v is not None for v in saved["rank_extra"]):
        log.warning(
            "checkpoint %s was saved by %d ranks and is loaded by %d: each rank's own values (rank_extra, e.g. its "
            "RNG states) cannot be given back, so they are None; the model, optimizer and extra are restored.",
            directory,
            saved["world_size"],
            world,
        )
    return {
        "step": saved["step"],
        "extra": values.decode(saved["extra"], lambda key: reader.tensor(key, 0)),
        "rank_extra": rank_extra,
        "path": directory,
    }


def _load_model(reader: Reader, model: torch.nn.Module, strict: bool) -> None:
    module = unwrap(model)
    target = module.state_dict()
    _refuse_bare_sharded(module, target)
    saved = _saved_model_keys(reader)
    _check_keys(reader.directory, set(target), saved, strict)
    with torch.no_grad():
        for key, tensor in target.items():
            if key not in saved:
                continue
            _check_shape(
                f"checkpoint {reader.directory}", key, reader.info(f"model/{key}")["shape"], tuple(tensor.shape)
            )
            reader.copy_into(f"model/{key}", tensor)


def _load_sharded_model(reader: Reader, model: FullyShardedModel, strict: bool) -> None:
    """A zero=3 model: each rank reads only the ranges its shards hold of each parameter (by its
    groups' cuts), whatever layout saved them; buffers (and parameters in no unit) whole. Nothing is
    gathered: the parameters' own data is empty between uses (Note [Fully sharded storage])."""
    module = unwrap(model)
    params = list(module.named_parameters(remove_duplicate=False))
    buffers = persistent_buffers(module)
    saved = _saved_model_keys(reader)
    _check_keys(reader.directory, {k for k, _ in params} | {k for k, _ in buffers}, saved, strict)
    for unit in model.units:
        unit.free()  # a unit gathered now would keep the old values until freed
    done: set[int] = set()  # a tied parameter is read once, under its first key the checkpoint has
    with torch.no_grad():
        for key, p in params:
            if key not in saved or id(p) in done:
                continue
            done.add(id(p))
            name = f"model/{key}"
            found = model.group_of(p)
            if found is None:  # in no unit (ignored): whole
                _check_shape(f"checkpoint {reader.directory}", key, reader.info(name)["shape"], tuple(p.shape))
                reader.copy_into(name, p)
                continue
            group, i = found
            _check_shape(f"checkpoint {reader.directory}", key, reader.info(name)["shape"], group.shapes[i])
            for cut in group.cuts:
                if cut.param == i:
                    out = group.shard.narrow(0, cut.shard_offset, cut.numel)
                    reader.read_range(name, cut.param_offset, cut.param_offset + cut.numel, out)
        for key, b in buffers:
            if key in saved:
                _check_shape(
                    f"checkpoint {reader.directory}", key, reader.info(f"model/{key}")["shape"], tuple(b.shape)
                )
                reader.copy_into(f"model/{key}", b)


def _saved_model_keys(reader: Reader) -> set[str]:
    names = (*reader.manifest["tensors"], *reader.manifest["aliases"])
    return {n.removeprefix("model/") for n in names if n.startswith("model/")}


def _check_shape(where: str, key: str, saved: list[int] | Shape, ours: Shape) -> None:
    """`where`: "checkpoint <directory>" or a weights file's path."""
    if list(saved) != list(ours):
        raise _C.CheckpointError(
            f"{where}: '{key}' has shape {list(saved)} there and "
            f"{list(ours)} in the model. Fix: build the model with the configuration it was saved with."
        )


def _refuse_bare_sharded(module: torch.nn.Module, target: dict[str, torch.Tensor]) -> None:
    """The bare module of a zero=3 model, given without its wrapper: its state_dict holds gathered copies,
    so a load into them would change nothing. Refused, naming a parameter."""
    for key, p in module.named_parameters():
        value = target.get(key)
        if p.numel() == 0 and value is not None and value.numel():
            raise _C.CheckpointError(
                f"the model given holds zero=3 shards (parameter '{key}' of shape {list(value.shape)} has no values "
                "of its own between uses), and neither its wrapper nor its ShardedOptimizer was given: the load "
                "could not reach the shards. Fix: pass model= the model dtcore.wrap(..., zero=3) returned."
            )


def _check_keys(directory: str, ours: set[str], theirs: set[str], strict: bool) -> None:
    missing, unexpected = sorted(ours - theirs), sorted(theirs - ours)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"the model has {len(missing)} key(s) the checkpoint lacks: {', '.join(missing[:5])}")
        if unexpected:
            parts.append(f"the checkpoint has {len(unexpected)} the model lacks: {', '.join(unexpected[:5])}")
        raise _C.CheckpointError(
            f"checkpoint {directory} does not fit the model: {'; '.join(parts)}. Fix: load it into the model it was "
            "saved from, or pass strict=False to load the keys both have."
        )


def _load_optimizer(reader: Reader, optimizer: torch.optim.Optimizer, shape_of: Any) -> None:
    """`shape_of(parameter)`: its whole shape (collect.shape_getter: from its group under zero=3)."""
    meta = reader.manifest["optimizer"]
    if meta is None:
        raise _C.CheckpointError(
            f"checkpoint {reader.directory} holds no optimizer state. Fix: load it without optimizer=."
        )
    sharded = isinstance(optimizer, ShardedOptimizer)
    ours = optimizer.optimizer_class.__name__ if sharded else type(optimizer).__name__
    if meta["class"] != ours:
        raise _C.CheckpointError(
            f"checkpoint {reader.directory} holds the state of a {meta['class']}, and the optimizer given is a "
            f"{ours}. Fix: build the optimizer of the saved class."
        )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if [list(shape_of(p)) for p in params] != meta["param_shapes"]:
        raise _C.CheckpointError(
            f"checkpoint {reader.directory}: the optimizer was saved over {len(meta['param_shapes'])} parameters of "
            f"other shapes than the {len(params)} given. Fix: build the optimizer over the same parameters and groups."
        )
    state: dict[int, dict[str, Any]] = {}
    for i, entry in meta["scalars"].items():
        state[int(i)] = values.decode(entry, lambda key: reader.tensor(key, 0))
    for name in reader.manifest["tensors"]:
        if not name.startswith("optim/"):
            continue
        _, i, key = name.split("/", 2)
        if key == zero_state.MASTER_KEY and not sharded:
            continue  # a plain optimizer steps the parameters themselves
        state.setdefault(int(i), {})[key] = reader.full(name)
    groups = values.decode(meta["param_groups"], lambda key: reader.tensor(key, 0))
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _load_weights_file(
    path: str, model: torch.nn.Module, strict: bool, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """A plain safetensors file of the model's weights (no optimizer, no step). Into a zero=3 model each
    rank reads only the ranges its shards hold (safetensors' get_slice), never a whole tensor."""
    sharded = fully_sharded(model, optimizer)
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            keys = set(f.keys())
            if sharded is not None:
                _load_sharded_weights(path, f, keys, sharded, strict)
            else:
                module = unwrap(model)
                target = module.state_dict()
                _refuse_bare_sharded(module, target)
                _check_keys(path, set(target), keys, strict)
                with torch.no_grad():
                    for key, tensor in target.items():
                        if key in keys:
                            value = f.get_tensor(key)
                            _check_shape(path, key, tuple(value.shape), tuple(tensor.shape))
                            tensor.copy_(value)
    except SafetensorError as e:
        raise _C.CheckpointError(f"{path} cannot be read as safetensors: {e}. Fix: load another file.") from None
    return {"step": None, "extra": None, "rank_extra": None, "path": path}


def _load_sharded_weights(path: str, f: Any, keys: set[str], model: FullyShardedModel, strict: bool) -> None:
    module = unwrap(model)
    params = list(module.named_parameters(remove_duplicate=False))
    buffers = persistent_buffers(module)
    _check_keys(path, {k for k, _ in params} | {k for k, _ in buffers}, keys, strict)
    for unit in model.units:
        unit.free()  # a unit gathered now would keep the old values until freed
    done: set[int] = set()
    with torch.no_grad():
        for key, p in params:
            if key not in keys or id(p) in done:
                continue
            done.add(id(p))
            found = model.group_of(p)
            where = f.get_slice(key)
            shape = tuple(where.get_shape())
            _check_shape(path, key, shape, tuple(p.shape) if found is None else found[0].shapes[found[1]])
            if found is None:
                p.copy_(f.get_tensor(key))
                continue
            group, i = found
            for cut in group.cuts:
                if cut.param == i:
                    out = group.shard.narrow(0, cut.shard_offset, cut.numel)
                    out.copy_(read_flat(where, shape, cut.param_offset, cut.param_offset + cut.numel))
        for key, b in buffers:
            if key in keys:
                value = f.get_tensor(key)
                _check_shape(path, key, tuple(value.shape), tuple(b.shape))
                b.copy_(value)


def read_flat(where: Any, shape: Shape, lo: int, hi: int, prefix: tuple = ()) -> torch.Tensor:
    """Elements [lo, hi) of the flattened tensor `where[prefix]` (a safetensors slice; `shape` is that
    of `where[prefix]` less the prefix's dimensions of size 1), (hi - lo,): the rows wholly inside the
    range in one read, the partial rows at its ends by recursing into them, so nothing outside it is read."""
    if len(shape) <= 1:
        return where[prefix + ((slice(lo, hi),) if shape else ())].reshape(-1)
    inner = 1
    for n in shape[1:]:
        inner *= n
    first, last = lo // inner, (hi - 1) // inner  # the rows the range touches
    if first == last:
        return read_flat(where, shape[1:], lo - first * inner, hi - first * inner, prefix + (slice(first, first + 1),))
    parts = []
    whole_from, whole_to = first, last + 1  # rows read whole: [whole_from, whole_to)
    if lo % inner:
        parts.append(read_flat(where, shape[1:], lo % inner, inner, prefix + (slice(first, first + 1),)))
        whole_from += 1
    tail = None
    if hi % inner:
        tail = read_flat(where, shape[1:], 0, hi % inner, prefix + (slice(last, last + 1),))
        whole_to -= 1
    if whole_from < whole_to:
        parts.append(where[prefix + (slice(whole_from, whole_to),)].reshape(-1))
    if tail is not None:
        parts.append(tail)
    return torch.cat(parts)


def export(path: str | os.PathLike, out: str | os.PathLike) -> str:
    """The model's weights of the checkpoint at `path` as one plain safetensors file `out`, for use
    without dtcore (safetensors.torch.load_file(out) -> the bare model's state_dict). Returns out."""
    reader = Reader(manifest.resolve(os.fspath(path)))
    names = [n for n in (*reader.manifest["tensors"], *reader.manifest["aliases"]) if n.startswith("model/")]
    tensors = [(n.removeprefix("model/"), reader.full(n)) for n in names]
    _C.write_safetensors(os.fspath(out), tensors, {"format": "pt"})
    return os.fspath(out)
