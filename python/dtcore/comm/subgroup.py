"""The dtcore communicator of a torch process group: the job's for the whole job, else the group's own.

torch DDP reduces over whichever group it is given, e.g. the data-parallel replicas beside tensor
parallelism (torch.distributed.new_group, new_subgroups, a DeviceMesh's "dp" dimension). dtcore
does the same on a communicator of the group's members, built the way dtcore.init() builds the
job's (bootstrap/join.py's connect()), once per group and context, and closed by
dtcore.shutdown(). See Note [Subgroup communicators] in csrc/dtcore/comm/communicator.h.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .. import _C
from ..bootstrap import context, join
from ..bootstrap.context import get_context


def group_ranks(group: Any, what: str) -> list[int]:
    """The job ranks of torch group `group`, in group order; ConfigError naming them and this rank
    when this rank is not one of them (`what`: the call, for the message)."""
    ctx = get_context()
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        raise _C.ConfigError(
            f"{what} on rank {ctx.rank} got torch.distributed.GroupMember.NON_GROUP_MEMBER, what new_group() "
            f"returns on the ranks it leaves out: rank {ctx.rank} is not in that group. Fix: pass each rank the "
            "group it belongs to (e.g. the one new_subgroups() returns on it, or mesh['dp'].get_group())."
        )
    if not dist.is_initialized() or dist.get_rank() != ctx.rank or dist.get_world_size() != ctx.world_size:
        raise _C.ConfigError(
            f"{what} on rank {ctx.rank}: a process group needs torch.distributed set up on dtcore's job (rank "
            f"{ctx.rank} of {ctx.world_size}). Fix: call dtcore.init() with torch_distributed=True (the default) "
            "before building the group."
        )
    try:
        ranks = dist.get_process_group_ranks(group)
    except (KeyError, RuntimeError, ValueError) as e:
        raise _C.ConfigError(
            f"{what} on rank {ctx.rank}: {group!r} is not a process group of this job's torch.distributed ({e!r}). "
            "Fix: build it with torch.distributed.new_group / new_subgroups or a DeviceMesh after dtcore.init()."
        ) from None
    if ctx.rank not in ranks:
        raise _C.ConfigError(
            f"{what} on rank {ctx.rank} got a group of ranks {ranks}, which does not include rank {ctx.rank}. Fix: "
            "pass each rank the group it belongs to."
        )
    return ranks


def job_communicator(name: str) -> Any:
    """A communicator over the whole job that is not the job's own: its collectives are ordered apart
    from the job's, so that two streams of collectives issued at points that differ across ranks (zero=3's
    gathers and its reduce-scatters) never meet in one order. `name` is the same on every rank; built on
    first use, collectively, and closed by dtcore.shutdown(). A job of one rank has no peer to order
    against: the job's communicator then."""
    ctx = get_context()
    if ctx.world_size == 1:
        return ctx.communicator
    with context.lock:
        if name not in ctx.subgroups:
            ranks = list(range(ctx.world_size))
            ctx.subgroups[name] = join.connect(ctx.rendezvous, ctx.backend, ctx.device, ctx.settings, ranks, name)
        return ctx.subgroups[name][0]


def communicator_for(group: Any, what: str) -> Any:
    """The communicator that reduces over `group` (None or torch's WORLD: the job's).

    A proper subgroup's is built on first use, on its members only and collectively (each member
    must ask for its groups in the same order, as torch requires when it builds them).
    """
    ctx = get_context()
    if group is None or group is dist.group.WORLD:
        return ctx.communicator
    ranks = group_ranks(group, what)
    if ranks == list(range(ctx.world_size)):
        return ctx.communicator
    name = group.group_name  # torch's, the same on every member and never another group's
    with context.lock:
        if name not in ctx.subgroups:
            ctx.subgroups[name] = join.connect(ctx.rendezvous, ctx.backend, ctx.device, ctx.settings, ranks, name)
        return ctx.subgroups[name][0]
