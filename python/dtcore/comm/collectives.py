"""Collectives on the job's communicator, and the main-process helpers.

All of them wait with the context's timeout (or the one given) and raise dtcore.CommError, naming
the operation, its sequence number and the rank, instead of hanging.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


def is_main_process() -> bool:
    """True on global rank 0 (before init(): when the launcher says this is rank 0)."""
    if is_initialized():
        return get_context().rank == 0
    return _C.read_world().rank == 0


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. to download or preprocess), then the others do."""
    main = is_main_process()
    if not main:
        barrier()
    try:
        yield
    finally:
        if main:
            barrier()
