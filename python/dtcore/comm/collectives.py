"""Collectives on the job's communicator, and the main-process helpers.

All of them wait with the context's timeout (or the one given) and raise dtcore.CommError, naming
the operation, its sequence number and the rank, instead of hanging.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context, is_initialized


def _wait(work: _C.Work, timeout: float | None) -> None:
    work.wait(None if timeout is None else float(timeout))


def barrier(timeout: float | None = None) -> None:
    """Blocks until every rank reaches the barrier."""
    _wait(get_context().communicator.barrier(), timeout)


def all_reduce(tensor: torch.Tensor, op: str = "sum", *, async_op: bool = False, timeout: float | None = None):
    """In place: `tensor` becomes the reduction over ranks; op is "sum", "avg", "max" or "min".

    Returns `tensor`, or with async_op=True a work handle whose `.wait()` completes it.
    """
    work = get_context().communicator.all_reduce(tensor, op)
    if async_op:
        return work
    _wait(work, timeout)
    return tensor


def broadcast(tensor: torch.Tensor, src: int = 0, *, async_op: bool = False, timeout: float | None = None):
    """In place: every rank's `tensor` becomes rank `src`'s."""
    work = get_context().communicator.broadcast(tensor, src)
    if async_op:
        return work
    _wait(work, timeout)
    return tensor


@torch.no_grad()
def broadcast_tensors(tensors: list[torch.Tensor], src: int = 0, communicator: Any = None) -> None:
    """Rank `src`'s values into every rank's tensors, one broadcast per dtype and device; on
    `communicator` (a subgroup's, `src` its rank there) instead of the job's when given."""
    comm = communicator if communicator is not None else get_context().communicator
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        flat = torch.cat([t.reshape(-1) for t in group])  # (sum of numels,)
        _wait(comm.broadcast(flat, src), None)
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def all_gather(tensor: torch.Tensor, *, timeout: float | None = None) -> torch.Tensor:
    """Every rank's `tensor`, stacked: a new tensor of shape (world_size, *tensor.shape) whose row r
    is rank r's (torch's all_gather_into_tensor into a (world_size, ...) output). Every rank passes
    the same shape and dtype; `.flatten(0, 1)` concatenates instead."""
    ctx = get_context()
    src = tensor.contiguous()
    out = torch.empty((ctx.world_size, *src.shape), dtype=src.dtype, device=src.device)
    _wait(ctx.communicator.all_gather(out.view(-1), src.view(-1)), timeout)  # the communicator's buffers are flat
    return out


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, timeout: float | None = None) -> torch.Tensor:
    """Reduces `tensor` over ranks and returns this rank's block of it, a new tensor: rank r gets
    rows r*k .. (r+1)*k - 1 of dim 0, with k = tensor.shape[0] / world_size (torch's
    reduce_scatter_tensor). op is "sum", "avg", "max" or "min"."""
    ctx = get_context()
    world = ctx.world_size
    if tensor.dim() == 0 or tensor.shape[0] % world != 0:
        raise _C.ConfigError(
            f"reduce_scatter: dim 0 of the tensor (shape {tuple(tensor.shape)}) must divide into world_size={world} "
            f"blocks on rank {ctx.rank}. Fix: pad dim 0 to a multiple of {world}, or use all_reduce."
        )
    src = tensor.contiguous()
    out = torch.empty((src.shape[0] // world, *src.shape[1:]), dtype=src.dtype, device=src.device)
    _wait(ctx.communicator.reduce_scatter(out.view(-1), src.view(-1), op), timeout)
    return out


def gather_object(obj: Any, *, timeout: float | None = None) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank: for metrics and small summaries.

    `obj` travels as JSON (numbers, strings, booleans, None, lists and dicts with string keys;
    a tuple comes back as a list), never pickled, so nothing a rank sends runs code on another.
    """
    ctx = get_context()
    try:
        text = json.dumps(obj)
    except (TypeError, ValueError) as e:
        raise _C.ConfigError(
            f"gather_object: rank {ctx.rank} passed a {type(obj).__name__} that JSON cannot carry ({e}). "
            "Fix: pass numbers, strings, lists and dicts, e.g. {'loss': loss.item()} instead of a tensor."
        ) from None
    data = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
    # Two gathers: the lengths, then every rank's bytes padded to the longest.
    lengths = all_gather(torch.tensor([data.numel()], dtype=torch.int64, device=ctx.device), timeout=timeout)
    longest = int(lengths.max())
    padded = torch.zeros(longest, dtype=torch.uint8, device=ctx.device)
    padded[: data.numel()] = data
    rows = all_gather(padded, timeout=timeout).cpu()
    return [json.loads(rows[r, :n].numpy().tobytes()) for r, n in enumerate(lengths.flatten().tolist())]


def is_main_process() -> bool:
    """True on global rank 0 (before init(): when the launcher says this is rank 0)."""
    if is_initialized():
        return get_context().rank == 0
    return _C.read_world().rank == 0


def is_local_main_process() -> bool:
    """True on local rank 0 of each node (before init(): when the launcher says so)."""
    if is_initialized():
        return get_context().local_rank == 0
    return _C.read_world().local_rank == 0


@contextlib.contextmanager
def _leaders_first(leader: bool) -> Iterator[None]:
    """The leaders run the block first, then, after a barrier of every rank, the others do."""
    if not leader:
        barrier()
    try:
        yield
    finally:
        if leader:
            barrier()


def main_process_first() -> contextlib.AbstractContextManager[None]:
    """Rank 0 runs the block first (e.g. to download or preprocess), then the others do."""
    return _leaders_first(is_main_process())


def local_main_process_first() -> contextlib.AbstractContextManager[None]:
    """Local rank 0 of each node runs the block first (e.g. to fill a node-local cache), then the
    others do."""
    return _leaders_first(is_local_main_process())
