"""Uneven inputs: torch's Join context manager (torch.distributed.algorithms.Join) with a dtcore
model as its Joinable, as torch DDP's `model.join()`.

Note [Shadowed collectives]
A rank that ran out of data leaves its loop and waits in Join's __exit__, where it issues, each
time the others run an iteration, the same collectives on each channel in the same order:

  rank with data (forward, then backward)        joined rank (Join's loop, then _JoinHook.main_hook)
  all_reduce(1): "not joined" (Join's own)       all_reduce(0) (Join's own)
  all_reduce(synced): will a backward reduce?    all_reduce(0): should_sync = result != 0
  if synced and buffers are broadcast:
    all_reduce(MAX of rank): buffers' source     all_reduce(MAX of -1)
    broadcast of the buffers from it             the same broadcast
  backward: each bucket's all_reduce or hook     Reducer.shadow_backward(): the same on zeros
    (and, first time, the bucket rebuild)          (and the rebuild, if the others do theirs)

The first three and the hooks' collectives use the join process group (torch.distributed's default
group, which dtcore.init sets up); the broadcasts and bucket all_reduces use dtcore's communicator.
Buffers come from the highest rank still with data (rank 0's may be stale). Gradients are averaged
over the initial world size (joined ranks add zeros), or with divide_by_initial_world_size=False
over the ranks still with data. When every rank has joined, the last to join (highest rank among
them) broadcasts its parameters, and buffers when they are broadcast, so that all ranks end equal.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, JoinHook, _JoinConfig

from .. import _C
from ..comm.collectives import broadcast_tensors
from .comm_hooks import require_default_group


def _common_rank(model: Any, candidate: bool) -> int:
    """The highest rank among the candidates, agreed over the join group (a rank in that group)."""
    group = model.join_process_group
    rank = torch.tensor([dist.get_rank(group) if candidate else -1], device=model.join_device)
    dist.all_reduce(rank, op=dist.ReduceOp.MAX, group=group)
    return int(rank.item())


def _requires_sync(model: Any, synced: bool) -> Any:
    """How many ranks' coming backward reduces: 1 from each rank with data that syncs (async), 0 from joined ones."""
    flag = torch.tensor([1.0 if synced else 0.0], device=model.join_device)
    return flag, dist.all_reduce(flag, group=model.join_process_group, async_op=True)


class _JoinHook(JoinHook):
    """A joined rank's half of each iteration and the final sync; see Note [Shadowed collectives]."""

    def __init__(self, model: Any, divide_by_initial_world_size: bool) -> None:
        model._reducer.check_joinable()
        model._log_uneven_input_join()  # as torch DDP's logging data
        if model._buffer_hook is not None:
            raise _C.ConfigError(
                "join() on a model with a buffer communication hook is not supported (nor by torch DDP): a joined "
                "rank cannot shadow the hook's collectives. Fix: drop _register_buffer_comm_hook, or give every rank "
                "the same number of batches."
            )
        if not divide_by_initial_world_size and model._comm_hook is not None:
            raise _C.ConfigError(
                "join(divide_by_initial_world_size=False) with a communication hook: the hook averages the "
                "gradients itself (torch DDP ignores the flag then). Fix: keep divide_by_initial_world_size=True, or "
                "divide inside the hook."
            )
        model._divide_by_initial_world_size = divide_by_initial_world_size
        self.model = model

    def main_hook(self) -> None:
        model = self.model
        flag, work = _requires_sync(model, False)
        work.wait()
        should_sync = flag.item() != 0
        model.require_forward_param_sync = should_sync
        if not should_sync:
            return
        buffers = model._synced_buffers if model.forward_sync_buffers else []
        if buffers:
            broadcast_tensors(buffers, _common_rank(model, False), model._comm)
        model._reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        model = self.model
        src = _common_rank(model, is_last_joiner)
        tensors = [p.detach() for _, p in model._named_parameters()]  # the ignored ones are the module's own
        broadcast_tensors(tensors + (model._synced_buffers if model.forward_sync_buffers else []), src, model._comm)


class Uneven:
    """torch DDP's Joinable members, on DistributedModel (which supplies `_reducer`, `module`, `device`,
    `forward_sync_buffers`, `_named_parameters` and `_synced_buffers`)."""

    _join_config = _JoinConfig.construct_disabled_join_config()  # set by Join on the instance
    _divide_by_initial_world_size = True

    def join(
        self, divide_by_initial_world_size: bool = True, enable: bool = True, throw_on_early_termination: bool = False
    ) -> Join:
        """As torch DDP's: `with model.join():` lets ranks with fewer batches finish without a hang."""
        return Join(
            [self],
            enable,
            throw_on_early_termination,
            divide_by_initial_world_size=divide_by_initial_world_size,
        )

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _JoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> Any:
        require_default_group("join()")
        return self.process_group  # as torch DDP's: the group the model reduces over

    def _join_before_forward(self, synced: bool) -> int:
        """A rank with data, in a join context: its forward's half (Note [Shadowed collectives]); returns the
        rank to take buffers from (0 outside a join context)."""
        if not self._join_config.enable:
            return 0
        work = Join.notify_join_context(self)
        _requires_sync(self, synced)  # not waited for, as torch DDP: the joined ranks read it
        if synced and not self._divide_by_initial_world_size:
            if work is None:
                raise _C.ConfigError(
                    "join(divide_by_initial_world_size=False) needs the count of ranks with data, which only the "
                    "first Joinable of a Join context receives. Fix: list this model first in Join([...])."
                )
            work.wait()
            self._reducer.set_divisor(int(work.result()[0].item()))
        if synced and self.forward_sync_buffers and self._synced_buffers:
            return _common_rank(self, True)
        return 0
