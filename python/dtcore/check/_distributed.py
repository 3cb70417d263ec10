"""Distributed mode: every rank probes itself, the job joins, and rank 0 reports the whole.

Under `torchrun --nproc_per_node=N -m dtcore.check` each rank first runs its local probes, then
joins the job with a fingerprint smaller than init()'s (so that differing versions are reported
instead of refused), gathers every rank's report, compares what must be equal, summarizes each
node, and measures the job's backend: an allreduce sweep (algbw and busbw as nccl-tests define
them) and point-to-point transfers between ring neighbours, pair by pair, that name slow links,
ranks and nodes.
"""

from __future__ import annotations

import contextlib
import datetime
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .. import _C
from ..bootstrap import fingerprint
from ..bootstrap.context import Context, get_context
from ..bootstrap.join import joined_for_check
from ..comm import agree
from ._options import Options, default_iters
from ._report import Item, Report, rank_ranges, worst


def _split_fix(error: BaseException) -> tuple[str, str]:
    text = str(error) if isinstance(error, _C.DtcoreError) else f"{type(error).__name__}: {str(error).splitlines()[0]}"
    message, _, fix = text.partition(" Fix: ")
    return message, fix or "see the message; `python -m dtcore.check` on the failing rank tells more."


def _consistency(reports: list[dict]) -> list[Item]:
    items = []
    for fact in fingerprint.FACTS:
        key, title, fix = fact.key, fact.title, fact.fix
        by_value: dict[str, list[int]] = {}
        for r in reports:
            by_value.setdefault(str(r["facts"].get(key, "")), []).append(r["world"]["rank"])
        if len(by_value) == 1:
            value = next(iter(by_value))
            items.append(Item.make(f"consistency.{key}", title, "PASS", value or "none", "same on every rank"))
            continue
        majority = max(by_value, key=lambda v: len(by_value[v]))
        hosts = {r["world"]["rank"]: r["host"] for r in reports}
        odd = [
            f"rank(s) {rank_ranges(ranks)} ({', '.join(sorted({hosts[x] for x in ranks}))}) have '{v or 'none'}'"
            for v, ranks in by_value.items()
            if v != majority
        ]
        status = fact.severity
        items.append(
            Item.make(
                f"consistency.{key}",
                title,
                status,
                " vs ".join(sorted(v or "none" for v in by_value)),
                f"{'; '.join(odd)}; the other {len(by_value[majority])} rank(s) have '{majority or 'none'}'.",
                fix.format(value=majority),
            )
        )
    return items


def _other_ranks(reports: list[dict]) -> list[Item]:
    """Non-PASS items of ranks 1.. that rank 0 does not share, attributed by rank and host."""
    seen = {(i["id"], i["status"], i["value"]) for i in reports[0]["items"]}
    out = []
    for r in reports[1:]:
        rank = r["world"]["rank"]
        for i in r["items"]:
            if i["status"] != "PASS" and (i["id"], i["status"], i["value"]) not in seen:
                out.append(
                    Item.make(
                        f"ranks.{rank}.{i['id']}",
                        f"rank {rank} ({r['host']}): {i['title']}",
                        i["status"],
                        i["value"],
                        i["message"],
                        i["fix"],
                    )
                )
    return out


def _nodes(reports: list[dict]) -> tuple[list[dict], list[Item]]:
    nodes: dict[str, list[dict]] = {}
    for r in reports:
        nodes.setdefault(r["host"], []).append(r)
    summaries, items = [], []
    for host, rs in nodes.items():
        ranks = [r["world"]["rank"] for r in rs]
        devices = rs[0]["gpus"].get("devices", [])
        gpus = f"{len(devices)} x {devices[0]['name']}" if devices else "no GPU"
        statuses = [i["status"] for r in rs for i in r["items"]]
        counts = {s: statuses.count(s) for s in ("WARN", "FAIL")}
        status = worst(statuses)
        summaries.append({"host": host, "ranks": ranks, "gpus": gpus, "status": status, **counts})
        message = "" if status == "PASS" else "see the items of these ranks above"
        fix = "" if status == "PASS" else "fix the failures and warnings listed for this node's ranks."
        items.append(
            Item.make(
                f"nodes.{host}",
                host,
                status,
                f"ranks {rank_ranges(ranks)}, {gpus}, {counts['FAIL']} failure(s), {counts['WARN']} warning(s)",
                message,
                fix,
            )
        )
    sizes = {len(v) for v in nodes.values()}
    if len(sizes) > 1:
        items.append(
            Item.make(
                "nodes.balance",
                "ranks per node",
                "WARN",
                ", ".join(f"{h}: {len(v)}" for h, v in nodes.items()),
                "nodes run different numbers of ranks; the job's pace is set by the busiest node.",
                "start the same number of processes on every node.",
            )
        )
    return summaries, items


def _sync(ctx: Context) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def sweep(sizes: Sequence[int], iters: int | None) -> tuple[list[dict], list[int]]:
    """Allreduce (sum, float32) of each size: time per op (slowest rank), algbw, busbw; and the
    sizes whose result was wrong on any rank."""
    ctx = get_context()
    n = ctx.world_size
    comm = ctx.communicator
    expected = n * (n + 1) / 2
    gpu = ctx.device.type == "cuda"
    times, wrong, counts = [], [], []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        counts.append(count)
        t = torch.empty(count, dtype=torch.float32, device=ctx.device)
        t.fill_(ctx.rank + 1)
        comm.all_reduce(t, "sum").wait()
        wrong.append(0.0 if bool((t == expected).all()) else 1.0)
        k = iters or default_iters(nbytes)
        for _ in range(5 if gpu else 1):  # warm-up, as nccl-tests does
            comm.all_reduce(t, "sum").wait()
        comm.barrier().wait()
        _sync(ctx)
        start = time.perf_counter()
        if gpu:
            # Back to back on one stream, as nccl-tests times them: waiting on each would add the
            # host's polling delay to every op.
            works = [comm.all_reduce(t, "sum") for _ in range(k)]
            works[-1].wait()
        else:
            for _ in range(k):  # Gloo's wait blocks without polling; ops on one tensor run in turn
                comm.all_reduce(t, "sum").wait()
        _sync(ctx)
        times.append((time.perf_counter() - start) / k)
    slowest = torch.tensor(times + wrong, dtype=torch.float64, device=ctx.device)
    comm.all_reduce(slowest, "max").wait()
    merged = slowest.cpu().tolist()
    results = []
    for nbytes, count, seconds in zip(sizes, counts, merged[: len(sizes)]):
        algbw = count * 4 / seconds / 1e9
        results.append(
            {
                "bytes": count * 4,
                "count": count,
                "iters": iters or default_iters(nbytes),
                "time_us": seconds * 1e6,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (n - 1) / n,
            }
        )
    return results, [b for b, w in zip(sizes, merged[len(sizes) :]) if w > 0]


def ring_rounds(n: int) -> list[list[tuple[int, int]]]:
    """The ring's links (r, r+1) in rounds where no rank is in two pairs, so that each pair is
    measured alone: a slow link then shows as that pair's figure, not as the pace of the ring."""
    edges = [(r, (r + 1) % n) for r in range(n if n > 2 else 1)]
    rounds = [edges[0 : (n // 2) * 2 : 2], edges[1 : (n // 2) * 2 : 2]]
    if n % 2:
        rounds.append([edges[-1]])
    return [r for r in rounds if r]


def _wait_all(ctx: Context, works: list, what: str) -> None:
    """Bounded waits on torch.distributed work: Gloo's wait takes a timeout; on NCCL the host
    polls completion (wait() there only orders streams) until the deadline."""
    deadline = time.monotonic() + ctx.timeout
    for w in works:
        if ctx.backend == "gloo":
            w.wait(datetime.timedelta(seconds=ctx.timeout))
            continue
        while not w.is_completed():
            if time.monotonic() > deadline:
                raise _C.CommError(
                    f"{what} did not complete within {ctx.timeout:.0f} s on rank {ctx.rank}. Fix: a "
                    "peer has probably stalled or died; look at the lowest failing rank first."
                )
            time.sleep(0)


def _links(ctx: Context, nbytes: int, iters: int) -> list[list[float]]:
    """GB/s each rank measured to its ring neighbours, both directions at once: matrix[r][p]."""
    n, r = ctx.world_size, ctx.rank
    send = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
    recv = torch.empty_like(send)
    seen = torch.zeros(n, n, dtype=torch.float64, device=ctx.device)
    for pairs in ring_rounds(n):
        partner = next((b if a == r else a for a, b in pairs if r in (a, b)), None)
        ctx.communicator.barrier().wait()
        if partner is None:
            continue
        for _ in range(2):  # warm-up: connections are made lazily
            _wait_all(ctx, [dist.isend(send, partner), dist.irecv(recv, partner)], f"link test {r}<->{partner}")
        _sync(ctx)
        start = time.perf_counter()
        for _ in range(iters):
            _wait_all(ctx, [dist.isend(send, partner), dist.irecv(recv, partner)], f"link test {r}<->{partner}")
        _sync(ctx)
        seen[r, partner] = send.numel() * 4 * iters / (time.perf_counter() - start) / 1e9
    ctx.communicator.all_reduce(seen, "sum").wait()
    return seen.cpu().tolist()


def _link_items(links: list[dict]) -> list[Item]:
    """Links far slower (under half) than the median of their kind, intra- or inter-node."""
    items = []
    for kind in ("intra-node", "inter-node"):
        group = [link for link in links if link["kind"] == kind]
        if not group:
            continue
        median = statistics.median(link["gbps"] for link in group)
        slow = [link for link in group if link["gbps"] < 0.5 * median]
        value = f"{len(group)} link(s), median {median:.2f} GB/s, slowest {min(x['gbps'] for x in group):.2f} GB/s"
        if not slow:
            items.append(Item.make(f"bandwidth.{kind}", f"{kind} links", "PASS", value))
            continue
        named = "; ".join(
            f"rank {x['src']} ({x['src_host']}) <-> rank {x['dst']} ({x['dst_host']}): {x['gbps']:.2f} GB/s"
            for x in slow
        )
        items.append(
            Item.make(
                f"bandwidth.{kind}",
                f"{kind} links",
                "WARN",
                value,
                f"under half the median of {kind} links: {named}.",
                "check those hosts' network (link speed, NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME picking a slow "
                "interface, a busy or throttled node) before a long job runs at their pace.",
            )
        )
    return items


def _failed(local: Report, item: Item, started: float) -> Report:
    """This rank's own report and what stopped the distributed part."""
    elapsed = local.elapsed_s + time.perf_counter() - started
    return Report(**{**local.__dict__, "items": local.items + [item], "mode": "distributed", "elapsed_s": elapsed})


def run_distributed(local: Report, o: Options) -> Report:
    """Joins the job (or uses the running context), then compares and measures; a rank that cannot
    finish reports why as a FAIL item, never as a traceback."""
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        try:
            ctx = stack.enter_context(joined_for_check(o.backend, o.timeout))  # shut down at the end if made here
        except _C.DtcoreError as e:
            message, fix = _split_fix(e)
            item = Item.make("distributed.join", "joining the job", "FAIL", type(e).__name__, message, fix)
            return _failed(local, item, started)
        try:
            return _joined(local, o, ctx, started)
        except Exception as e:  # a peer died or stalled mid-test
            message, fix = _split_fix(e)
            item = Item.make("distributed.collectives", "check collectives", "FAIL", type(e).__name__, message, fix)
            return _failed(local, item, started)


def _joined(local: Report, o: Options, ctx: Context, started: float) -> Report:
    local.world = dict(local.world or {}, rank=ctx.rank, world_size=ctx.world_size)
    reports = agree.gather(local.to_dict())
    items = list(local.items)
    items.append(
        Item.make("distributed.join", "joining the job", "PASS", f"{ctx.world_size} rank(s), backend {ctx.backend}")
    )
    items += _consistency(reports)
    items += _other_ranks(reports)
    nodes, node_items = _nodes(reports)
    items += node_items
    bw = None
    if o.bandwidth and ctx.world_size > 1:
        results, wrong = sweep(o.sizes, o.iters)
        hosts = [r["host"] for r in reports]
        ring_bytes = min(max(o.sizes), 16 << 20)
        # The link test sends point to point, through torch.distributed's default group, which a job may
        # not have (init(torch_distributed=False)): then it is not run, and an item says so.
        seen = _links(ctx, ring_bytes, o.iters or default_iters(ring_bytes)) if dist.is_initialized() else None
        links = []
        for a, b in (pair for pairs in ring_rounds(ctx.world_size) for pair in pairs if seen is not None):
            gbps = min(seen[a][b], seen[b][a])  # the slower end's view of the pair
            links.append(
                {
                    "src": a,
                    "dst": b,
                    "src_host": hosts[a],
                    "dst_host": hosts[b],
                    "gbps": gbps,
                    "kind": "intra-node" if hosts[a] == hosts[b] else "inter-node",
                }
            )
        bw = {
            "op": "allreduce",
            "dtype": "float32",
            "backend": ctx.backend,
            "world_size": ctx.world_size,
            "results": results,
            "ring_bytes": ring_bytes,
            "links": links,
        }
        peak = max(results, key=lambda x: x["busbw_gbps"])
        if wrong:
            items.append(
                Item.make(
                    "bandwidth.allreduce",
                    "allreduce",
                    "FAIL",
                    f"wrong at {', '.join(map(str, wrong))} B",
                    "the allreduce returned wrong values: data is corrupted in transit.",
                    "run the check again; if it repeats, test the hosts' network and memory.",
                )
            )
        else:
            items.append(
                Item.make(
                    "bandwidth.allreduce",
                    "allreduce",
                    "PASS",
                    f"busbw {peak['busbw_gbps']:.3f} GB/s at {peak['bytes']} B, "
                    f"{results[0]['time_us']:.1f} us at {results[0]['bytes']} B",
                    "results verified",
                )
            )
        if seen is None:
            items.append(
                Item.make(
                    "bandwidth.links",
                    "ring links",
                    "PASS",
                    "not measured",
                    "the job runs without torch.distributed (init(torch_distributed=False)), whose point-to-point "
                    "sends the link test uses",
                )
            )
        items += _link_items(links)
    return Report(
        items=items,
        host=local.host,
        mode="distributed",
        elapsed_s=local.elapsed_s + time.perf_counter() - started,
        world=local.world,
        backend=ctx.backend,
        facts=local.facts,
        gpus=local.gpus,
        ranks=[
            {
                "rank": r["world"]["rank"],
                "host": r["host"],
                "local_rank": r["world"].get("local_rank"),
                "status": r["status"],
                "counts": r["counts"],
            }
            for r in reports
        ],
        nodes=nodes,
        bandwidth=bw,
    )
