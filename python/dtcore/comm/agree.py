"""The one "same on every rank?" exchange, and what is built on it.

    gather(value)               every rank's JSON value, in rank order, on every rank
    check_same(lines, ...)      ConfigError on every rank when a rank's lines differ from rank 0's,
                                naming the odd ranks and each one's first difference
    maximum(values)             the elementwise maximum over the ranks

Each is a collective: every rank of the job calls it at the same point. They run on the job's
communicator (CUDA buffers with NCCL) and wait with its timeout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context


def _bytes(data: bytes, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(data or b"\0"), dtype=torch.uint8).to(device)[: len(data)]


def gather(value: Any) -> list[Any]:
    """Every rank's `value` (anything json.dumps takes), in rank order, on every rank."""
    ctx = get_context()
    data = json.dumps(value).encode()
    length = torch.tensor([len(data)], dtype=torch.int64, device=ctx.device)
    ctx.communicator.all_reduce(length, "max").wait()
    n = int(length.item())
    mine = torch.zeros(n, dtype=torch.uint8, device=ctx.device)
    mine[: len(data)] = _bytes(data, ctx.device)
    everyone = torch.empty(n * ctx.world_size, dtype=torch.uint8, device=ctx.device)
    ctx.communicator.all_gather(everyone, mine).wait()
    rows = everyone.cpu().view(ctx.world_size, n)
    return [json.loads(bytes(row.tolist()).rstrip(b"\0").decode()) for row in rows]


def check_same(lines: Sequence[str], *, what: str, item: str, fix: str, communicator: Any = None) -> None:
    """ConfigError on every rank when any rank's `lines` differ from rank 0's; among the members of
    `communicator` (a subgroup's, ranks named by their job rank) instead of the job when given.

    Cheap when they agree (one all-gather of a 32-byte digest per rank); otherwise rank 0's lines
    are broadcast so that each odd rank names its first difference. The message reads
    "<what> differs across ranks: rank 1 has other <item>s than rank 0. First difference, <item>
    #i: rank 0 has '...', rank 1 has '...'. Fix: <fix>".
    """
    ctx = get_context()
    comm = communicator if communicator is not None else ctx.communicator
    world, rank, device = comm.size, comm.rank, ctx.device
    if world == 1:
        return
    text = "\n".join(lines)
    digest = _bytes(hashlib.sha256(text.encode()).digest(), device)
    gathered = torch.empty(32 * world, dtype=torch.uint8, device=device)
    comm.all_gather(gathered, digest).wait()
    digests = gathered.view(world, 32).cpu()
    odd = [r for r in range(world) if not torch.equal(digests[r], digests[0])]
    if not odd:
        return
    length = torch.tensor([len(text.encode()) if rank == 0 else 0], dtype=torch.int64, device=device)
    comm.broadcast(length, 0).wait()
    buffer = (
        _bytes(text.encode(), device)
        if rank == 0
        else torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    )
    if buffer.numel():
        comm.broadcast(buffer, 0).wait()
    reference = bytes(buffer.cpu().tolist()).decode().split("\n") if buffer.numel() else []
    named = comm.ranks  # messages name job ranks
    first, odd = named[0], [named[r] for r in odd]
    where = ""
    if ctx.rank in odd:
        mine = list(lines)
        for i in range(max(len(mine), len(reference))):
            a = reference[i] if i < len(reference) else "<none>"
            b = mine[i] if i < len(mine) else "<none>"
            if a != b:
                where = f" First difference, {item} #{i}: rank {first} has '{a}', rank {ctx.rank} has '{b}'."
                break
    many = len(odd) > 1
    raise _C.ConfigError(
        f"{what} differs across ranks: rank{'s' if many else ''} {', '.join(map(str, odd))} "
        f"ha{'ve' if many else 's'} other {item}s than rank {first}.{where} Fix: {fix}"
    )


def maximum(values: Sequence[float]) -> list[float]:
    """The elementwise maximum of `values` over the ranks (float64): a plan every rank makes alike."""
    ctx = get_context()
    t = torch.tensor(list(values), dtype=torch.float64, device=ctx.device)
    if ctx.world_size > 1 and t.numel():
        ctx.communicator.all_reduce(t, "max").wait()
    return t.cpu().tolist()
