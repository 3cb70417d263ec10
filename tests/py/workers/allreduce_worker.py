"""One rank: init, all-reduce float32 / bfloat16 / int64 with every op, the other collectives and the
main-process helpers, collectives of several chunks through shared memory and of tensors in a shared
buffer, check, report JSON."""

import json
import os
import sys
import time

T0 = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dtcore  # noqa: E402


def gathers(ctx) -> list[str]:
    """all_gather, reduce_scatter, gather_object and the local-main helpers."""
    n, r = ctx.world_size, ctx.rank
    bad = []
    g = dtcore.all_gather(torch.tensor([[r, 10 * r]], dtype=torch.int64).t())  # (2, 1), not contiguous
    if g.shape != (n, 2, 1) or g[:, 1, 0].tolist() != [10 * q for q in range(n)]:
        bad.append(f"all_gather {g.tolist()}")
    # rank r contributes (r + 1) * [[0, 1], [2, 3], ...]: row q of the sum is [2q, 2q + 1] * n(n+1)/2
    rs = dtcore.reduce_scatter(torch.arange(2.0 * n).reshape(n, 2) * (r + 1))
    if not torch.equal(rs, torch.tensor([[2.0 * r, 2.0 * r + 1]]) * (n * (n + 1) / 2)):
        bad.append(f"reduce_scatter {rs.tolist()}")
    rs = dtcore.reduce_scatter(torch.full((3 * n,), float(r)), op="avg")
    if not torch.equal(rs, torch.full((3,), (n - 1) / 2)):
        bad.append(f"reduce_scatter avg {rs.tolist()}")
    bad += in_place_gather(ctx)
    bad += reduce_scatter_paths(ctx)
    objects = dtcore.gather_object({"rank": r, "loss": 0.5 * r, "tags": ["é"] * r})  # lengths differ by rank
    if objects != [{"rank": q, "loss": 0.5 * q, "tags": ["é"] * q} for q in range(n)]:
        bad.append(f"gather_object {objects}")
    if dtcore.is_local_main_process() != (ctx.local_rank == 0):
        bad.append("is_local_main_process")
    with dtcore.local_main_process_first():
        entered = time.time()
        time.sleep(0.05 if ctx.local_rank == 0 else 0.0)
        left = time.time()
    spans = dtcore.gather_object([ctx.local_rank, entered, left])
    leaders_left = max(s[2] for s in spans if s[0] == 0)
    if any(s[1] < leaders_left for s in spans if s[0] != 0):
        bad.append(f"local_main_process_first: a rank entered before every local main left {spans}")
    return bad


def reduce_scatter_paths(ctx) -> list[str]:
    """reduce_scatter on Gloo (Note [Reduce-scatter on Gloo]): two in flight at once, sum / max / min,
    an output that is this rank's shard of the input, and one that overlaps the input elsewhere."""
    n, r, k = ctx.world_size, ctx.rank, 1 << 12
    comm = ctx.communicator
    position = torch.arange(1.0, n * k + 1)  # rank q sends (q + 1) * position
    mine = position.narrow(0, r * k, k)
    expected = {"sum": mine * (n * (n + 1) / 2), "max": mine * n, "min": mine.clone()}
    bad = []
    outs = {op: torch.full((k,), -1.0) for op in expected}
    works = [comm.reduce_scatter(outs[op], position * (r + 1), op) for op in expected]
    for work in works:
        work.wait()
    wrong = [op for op in outs if not torch.equal(outs[op], expected[op])]
    bad += [f"reduce_scatter {op}, in flight: {outs[op][:4].tolist()}" for op in wrong]
    for name, place in (("own shard", r), ("another shard", (r + 1) % n)):
        x = position * (r + 1)
        out = x.narrow(0, place * k, k)
        comm.reduce_scatter(out, x, "sum").wait()
        if not torch.equal(out, expected["sum"]):
            bad.append(f"reduce_scatter into {name} of its input: {out[:4].tolist()}")
    return bad


def chunked_paths(ctx) -> list[str]:
    """Buffers of several chunks of the shared-memory exchange (a slot holds 1 MiB: Note [Collectives
    through shared memory]), of sizes that split unevenly over the ranks, against the sum computed here
    from every rank's input. Every rank holds the same bits; at 2 ranks they are the exact sum."""
    n, r = ctx.world_size, ctx.rank
    comm = ctx.communicator
    inputs = [torch.randn(300_001, generator=torch.Generator().manual_seed(100 + q)) for q in range(n)]
    total = torch.stack(inputs).sum(0)
    close = torch.equal if n <= 2 else lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    bad = []
    x = inputs[r].clone()
    comm.all_reduce(x, "sum").wait()
    if not close(x, total):
        bad.append(f"chunked all_reduce sum: max error {(x - total).abs().max().item()}")
    if not torch.equal(dtcore.all_gather(x), x.expand(n, -1)):
        bad.append("chunked all_reduce: the ranks hold different bits")
    x = inputs[r].clone()
    comm.all_reduce(x, "max").wait()
    if not torch.equal(x, torch.stack(inputs).amax(0)):
        bad.append("chunked all_reduce max")
    # bfloat16: summed in float32 and rounded once, within one rounding of the exact sum
    h = inputs[r].bfloat16()
    comm.all_reduce(h, "avg").wait()
    exact = torch.stack([t.bfloat16().float() for t in inputs]).mean(0)
    if not torch.allclose(h.float(), exact, rtol=2**-7, atol=1e-6):
        bad.append(f"chunked bfloat16 avg: max error {(h.float() - exact).abs().max().item()}")
    k = 200_003  # per shard: two chunks of a slot split n ways
    big = [torch.randn(n * k, generator=torch.Generator().manual_seed(200 + q)) for q in range(n)]
    out = torch.empty(k)
    comm.reduce_scatter(out, big[r], "sum").wait()
    if not close(out, torch.stack(big).sum(0).narrow(0, r * k, k)):
        bad.append("chunked reduce_scatter")
    gathered = torch.empty(n * k)
    comm.all_gather(gathered, big[r].narrow(0, 0, k)).wait()
    if not torch.equal(gathered, torch.cat([b.narrow(0, 0, k) for b in big])):
        bad.append("chunked all_gather")
    b = inputs[r].clone()
    comm.broadcast(b, n - 1).wait()
    if not torch.equal(b, inputs[n - 1]):
        bad.append("chunked broadcast")
    empty = torch.empty(0)
    comm.all_reduce(empty, "sum").wait()  # no data, still a step every rank takes
    return bad


def shared_buffer_paths(ctx) -> tuple[bool, list[str]]:
    """All-reduce of tensors in a buffer every rank maps (Note [Buffers in shared memory]): in place when
    every rank's tensor is at the same place, through the exchange's slots when a rank's is elsewhere
    or private, always the sum computed here from every rank's input, with the same bits on every rank.
    Returns whether the communicator offered a buffer, and what was wrong."""
    n, r = ctx.world_size, ctx.rank
    comm = ctx.communicator
    k, pad = 300_001, 64  # several slots' worth, split unevenly over the ranks
    buf = comm.shared_buffer(4 * (k + pad))
    if buf is None:
        return False, []
    bad = []
    floats = buf.view(torch.float32)
    if buf.numel() != 4 * (k + pad) or floats.count_nonzero().item() != 0:
        bad.append("shared_buffer: not the size asked for, or not zeroed")
    inputs = [torch.randn(k, generator=torch.Generator().manual_seed(300 + q)) for q in range(n)]
    total = torch.stack(inputs).sum(0)
    close = torch.equal if n <= 2 else lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    cases = {
        "in place": lambda: floats.narrow(0, 0, k),
        "at another offset on each rank": lambda: floats.narrow(0, 16 * r, k),
        "private on rank 0": lambda: torch.empty(k) if r == 0 else floats.narrow(0, 0, k),
    }
    for name, where in cases.items():
        x = where()
        x.copy_(inputs[r])
        comm.all_reduce(x, "sum").wait()
        if not close(x, total):
            bad.append(f"shared buffer, {name}: max error {(x - total).abs().max().item()}")
        if not torch.equal(dtcore.all_gather(x), x.expand(n, -1)):
            bad.append(f"shared buffer, {name}: the ranks hold different bits")
    x = floats.narrow(0, pad, k)  # avg, and a part of the buffer not starting at its beginning
    x.copy_(inputs[r])
    comm.all_reduce(x, "avg").wait()
    if not torch.allclose(x, total / n, rtol=1e-6, atol=1e-6):
        bad.append("shared buffer, avg")
    # In place with parts of no element on some ranks, none at all, and other dtypes (exact sums).
    for dtype, count in ((torch.int64, 5), (torch.bfloat16, 1000), (torch.float32, 0)):
        t = buf.narrow(0, 0, count * torch.tensor([], dtype=dtype).element_size()).view(dtype)
        values = torch.arange(count) % 16  # small integers: exact in bfloat16 too
        t.copy_(values * (r + 1))
        comm.all_reduce(t, "sum").wait()
        if not torch.equal(t, (values * (n * (n + 1) // 2)).to(dtype)):
            bad.append(f"shared buffer, {count} of {dtype}: {t[:5].tolist()}")
    # One /dev/shm cannot hold 64 TiB: rank 0 cannot reserve it, so no rank gets a buffer, and the name
    # is gone; the collectives go on.
    if comm.shared_buffer(1 << 46) is not None:
        bad.append("shared_buffer: 64 TiB given")
    if r == 0 and [f for f in os.listdir("/dev/shm") if f.startswith(f"dtcore-{os.getpid()}-buffer")]:
        bad.append("shared_buffer: a name left in /dev/shm")
    return True, bad


def in_place_gather(ctx) -> list[str]:
    """all_gather whose input is this rank's chunk of its output (ZeRO's flat parameters): right values;
    an input that overlaps the output anywhere else is refused."""
    n, r, k = ctx.world_size, ctx.rank, 1 << 16
    bad = []
    flat = torch.zeros(n * k)
    flat.narrow(0, r * k, k).fill_(r + 1.0)
    ctx.communicator.all_gather(flat, flat.narrow(0, r * k, k), "in place").wait()
    if not torch.equal(flat, torch.arange(1.0, n + 1).repeat_interleave(k)):
        bad.append(f"in-place all_gather {flat.unique().tolist()}")
    if n == 1:
        return bad
    try:
        ctx.communicator.all_gather(flat, flat.narrow(0, ((r + 1) % n) * k, k))
        bad.append("an overlapping all_gather input that is not this rank's chunk was accepted")
    except dtcore.ConfigError as e:
        if "output.narrow(0, rank * n, n)" not in str(e):
            bad.append(f"overlap refused without the fix: {e}")
    return bad


def main() -> None:
    log_dir = sys.argv[1] if len(sys.argv) > 1 else None
    ctx = dtcore.init(timeout=60, log_dir=log_dir, seed=7)
    init_s = time.perf_counter() - T0
    n, r = ctx.world_size, ctx.rank
    bad = []

    # seeded with seed + rank: the first draw is that generator's first draw
    draw = torch.rand(1).item()
    if draw != torch.rand(1, generator=torch.Generator().manual_seed(7 + r)).item():
        bad.append("seed is not seed + rank")

    # float32: sum of (r + 1) * [1..1000] -> n(n+1)/2 * [1..1000]
    base = torch.arange(1, 1001, dtype=torch.float32)
    x = base * (r + 1)
    dtcore.all_reduce(x, op="sum")
    if not torch.equal(x, base * (n * (n + 1) / 2)):
        bad.append("float32 sum")
    x = torch.full((257,), float(r))
    dtcore.all_reduce(x, op="avg")
    if not torch.allclose(x, torch.full((257,), (n - 1) / 2)):
        bad.append("float32 avg")
    x = torch.full((257,), float(r))
    work = dtcore.all_reduce(x, op="avg", async_op=True)
    while not work.is_completed():  # polling alone must deliver the final, divided result
        time.sleep(0.001)
    if not torch.allclose(x, torch.full((257,), (n - 1) / 2)):
        bad.append("float32 avg polled")

    # bfloat16: small integers are exact
    y = torch.full((33,), float(r + 1), dtype=torch.bfloat16)
    dtcore.all_reduce(y, op="sum")
    if not torch.equal(y, torch.full((33,), float(n * (n + 1) // 2), dtype=torch.bfloat16)):
        bad.append("bfloat16 sum")
    y = torch.full((33,), float(2 * r), dtype=torch.bfloat16)
    dtcore.all_reduce(y, op="avg")
    if not torch.equal(y, torch.full((33,), float(n - 1), dtype=torch.bfloat16)):
        bad.append("bfloat16 avg")

    # int64: values beyond float precision must survive
    big = 2**53 + 1
    z = torch.tensor([big + r, -r, r], dtype=torch.int64)
    dtcore.all_reduce(z, op="sum")
    if z.tolist() != [n * big + n * (n - 1) // 2, -n * (n - 1) // 2, n * (n - 1) // 2]:
        bad.append(f"int64 sum {z.tolist()}")
    z = torch.tensor([r, -r], dtype=torch.int64)
    dtcore.all_reduce(z, op="max")
    if z.tolist() != [n - 1, 0]:
        bad.append("int64 max")
    z = torch.tensor([r, -r], dtype=torch.int64)
    dtcore.all_reduce(z, op="min")
    if z.tolist() != [0, -(n - 1)]:
        bad.append("int64 min")

    # broadcast from the last rank, and torch.distributed on the same world
    b = torch.full((5,), float(r))
    dtcore.broadcast(b, src=n - 1)
    if not torch.equal(b, torch.full((5,), float(n - 1))):
        bad.append("broadcast")
    d = torch.tensor([float(r)])
    dist.all_reduce(d)
    if d.item() != n * (n - 1) / 2:
        bad.append("dist.all_reduce")
    bad += gathers(ctx)
    bad += chunked_paths(ctx)
    shared_buffer, wrong = shared_buffer_paths(ctx)
    bad += wrong
    dtcore.barrier()

    report = {
        "rank": r,
        "world_size": n,
        "launcher": ctx.launcher,
        "bad": bad,
        "init_s": init_s,
        "local_rank": ctx.local_rank,
        "log_file": ctx.log_file,
        "seed_draw": draw,
        "shared_memory": ctx.communicator.shared_memory,
        "shared_buffer": shared_buffer,
    }
    sys.stdout.write(json.dumps(report) + "\n")  # one write: atomic on a pipe shared by ranks
    sys.stdout.flush()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
