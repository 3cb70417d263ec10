"""ZeRO-1/2 (dtcore.wrap(zero=...) + dtcore.ShardedOptimizer) against torch DDP and torch's
ZeroRedundancyOptimizer + DDP: peak memory per rank and step time, on Gloo.

    python benchmarks/bench_zero.py memory [--world 2] [--preset 20m] [--bucket-mb 25] [--where]
    python benchmarks/bench_zero.py time [--world 2] [--preset 20m] [--steps 10] [--warmup 2] [--bucket-mb 25]

--bucket-mb is every variant's bucket cap (torch DDP's bucket_cap_mb, dtcore's bucket_mb): both
sides always run with the same one.

memory: one job per variant. Each rank records every CPU allocation and free with torch's
profiler (profile_memory=True), from before the model is built to the end of the fourth step, and
reports the peak of the bytes it holds during steps 3-4 (the steady state: dtcore's buckets are
rebuilt, and zero=2's first backward is a whole allreduce, in step 1), plus this rank's share of
the buffers every rank maps (dtcore's zero=1 buckets, rebuilt in shared memory), which the
profiler does not see. --where also lists, for rank
0, the allocations live at that peak (1 MiB and up, by the ops that made them) and the ops running
then: where the peak goes. Batch 1 x 16 tokens, so that
activations are small; AdamW with foreach=False, so that its temporaries are one parameter's,
not the whole state's. Next to the formula for fp32 AdamW with Psi parameters: DDP 16 Psi bytes,
stage 1 8 Psi + 8 Psi / N, stage 2 4 Psi + 12 Psi / N. torch DDP runs with
gradient_as_bucket_view=True, its most frugal setting.

time: one job; every rank holds all variants (same initial weights) and runs them alternately,
step by step (forward + backward + optimizer step, after a barrier); medians over --steps. Also
the process's CPU time per step (all its threads: time.process_time) and the bytes rank 0 writes
per step (/proc/self/io's wchar: Gloo's socket writes, plus the store's small heartbeats),
measured, next to DDP's.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from dtcore.train.config import SHAPES
from dtcore.train.demo.data import from_text, make_corpus
from dtcore.train.demo.gpt import GPT, num_parameters, shape

from ranks import bytes_written, rank0_report

VARIANTS = ("ddp", "ddp + ZeroRedundancyOptimizer", "dtcore zero=1", "dtcore zero=2")
_MARK = 1_234_567  # bytes of a marker allocation: where the steady state starts in the profile


def build(variant: str, base: torch.nn.Module, foreach: bool | None, bucket_mb: float = 25.0):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    import dtcore

    kw = {"lr": 1e-4, "weight_decay": 0.1, "foreach": foreach}
    if variant.startswith("ddp"):
        model = torch.nn.parallel.DistributedDataParallel(base, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
        if variant == "ddp":
            return model, torch.optim.AdamW(model.parameters(), **kw)
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **kw)
    model = dtcore.wrap(base, zero=int(variant[len("dtcore zero=")]), bucket_mb=bucket_mb, first_bucket_mb=1)
    return model, dtcore.ShardedOptimizer(model, torch.optim.AdamW, **kw)


def step(model, opt, x, y) -> None:
    model(x, y).backward()
    opt.step()
    opt.zero_grad()


def shared_buffer_bytes() -> int:
    """The bytes of the buffers this process maps that every rank of the host maps (dtcore's buckets from
    the end of the first backward: Note [Buckets in shared memory]); each holds every rank's copy. torch's
    profiler does not see them, so the memory figures add this rank's share."""
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/dtcore-" in line and "-buffer-" in line:
                lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
                total += hi - lo
    return total


def memory_worker(args) -> None:
    from torch.profiler import ProfilerActivity, profile

    import dtcore

    ctx = dtcore.init(timeout=600)
    tokenizer, data, _ = from_text(make_corpus(), "char", 16, 1, ctx.rank, ctx.world_size, seed=0)
    config = shape(SHAPES[args.preset], tokenizer.vocab_size)
    batches = [data.next_batch() for _ in range(4)]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.manual_seed(0)
        model, opt = build(args.variant, GPT(config), foreach=False, bucket_mb=args.bucket_mb)
        for i, (x, y) in enumerate(batches):
            if i == 2:
                del_me = torch.empty(_MARK, dtype=torch.uint8)
                del del_me
            step(model, opt, x, y)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    held, peak, steady = 0, 0, False
    for _, nbytes in events:
        held += nbytes
        if nbytes == _MARK:
            steady = True
        if steady:
            peak = max(peak, held)
    shared = shared_buffer_bytes() // ctx.world_size  # held through steps 3-4, unseen by the profiler
    peak, held = peak + shared, held + shared
    params = num_parameters(model.module)
    if ctx.rank == 0:
        report = {"variant": args.variant, "peak": peak, "held": held, "params": params, "shared": shared}
        if args.where:
            report["where"] = live_at_peak(prof)
        print(json.dumps(report), flush=True)
    dtcore.shutdown()


def live_at_peak(prof) -> dict:
    """The allocations live at the peak after the marker, 1 MiB and up, grouped by the ops that made them
    (innermost first), with the op stack running at the peak: where the peak goes."""
    from torch._C._profiler import _EventType

    def walk(events):
        for e in events:
            yield e
            yield from walk(e.children)

    def ops(e) -> str:
        names = []
        while e is not None and len(names) < 4:
            names.append(e.name)
            e = e.parent
        return " < ".join(names)

    allocs = sorted(
        (e for e in walk(prof.profiler.kineto_results.experimental_event_tree()) if e.tag == _EventType.Allocation),
        key=lambda e: e.start_time_ns,
    )
    live: dict[int, tuple[int, str]] = {}
    held, peak, steady, at_peak, running = 0, -1, False, {}, ""
    for e in allocs:
        size = e.extra_fields.alloc_size
        held += size
        if size > 0:
            live[e.extra_fields.ptr] = (size, ops(e.parent))
        else:
            live.pop(e.extra_fields.ptr, None)
        steady = steady or size == _MARK
        if steady and held > peak:
            peak, at_peak, running = held, dict(live), ops(e.parent)
    groups: dict[str, list[int]] = {}
    for size, where in at_peak.values():
        groups.setdefault(where if size >= 2**20 else "(under 1 MiB each)", []).append(size)
    rows = sorted(((sum(v), len(v), k) for k, v in groups.items()), reverse=True)
    return {"running": running, "live": [{"MiB": round(b / 2**20, 1), "count": n, "made by": k} for b, n, k in rows]}


def time_worker(args) -> None:
    import dtcore

    ctx = dtcore.init(timeout=600)
    block_size = SHAPES[args.preset].block_size
    tokenizer, data, _ = from_text(make_corpus(), "char", block_size, args.batch, ctx.rank, ctx.world_size, seed=0)
    config = shape(SHAPES[args.preset], tokenizer.vocab_size)
    torch.manual_seed(0)
    base = GPT(config)
    runs = {v: build(v, copy.deepcopy(base), foreach=None, bucket_mb=args.bucket_mb) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    sent: dict[str, list[int]] = {v: [] for v in VARIANTS}
    for i in range(args.warmup + args.steps):
        x, y = data.next_batch()
        for v, (model, opt) in runs.items():
            dtcore.barrier()
            start, cpu_start, written = time.perf_counter(), time.process_time(), bytes_written()
            step(model, opt, x, y)
            if i >= args.warmup:
                times[v].append(time.perf_counter() - start)
                cpu[v].append(time.process_time() - cpu_start)
                sent[v].append(bytes_written() - written)
    if ctx.rank == 0:
        report = {v: statistics.median(t) for v, t in times.items()} | {"params": num_parameters(base)}
        report |= {f"{v} cpu": statistics.median(t) for v, t in cpu.items()}
        print(json.dumps(report | {f"{v} sent": statistics.median(b) for v, b in sent.items()}))
    dtcore.shutdown()


def launch(args, extra: list[str]) -> dict:
    common = [args.mode, "--worker", "--preset", args.preset, "--bucket-mb", str(args.bucket_mb)]
    if args.where:
        common.append("--where")
    return rank0_report(__file__, args.world, [*common, *extra])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("memory", "time"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--preset", default="20m", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--variant", default=VARIANTS[0])
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="every variant's bucket cap (MiB)")
    ap.add_argument("--where", action="store_true", help="memory: list what is live at each variant's peak")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return memory_worker(args) if args.mode == "memory" else time_worker(args)
    n = args.world
    if args.mode == "memory":
        print(
            f"{n} ranks (Gloo), GPT preset {args.preset}, fp32 AdamW (foreach=False), peak bytes held in steps 3-4, "
            f"buckets {args.bucket_mb:g} MiB"
        )
        print("| variant | peak (MiB) | formula (MiB) | peak / formula |")
        print("| --- | --- | --- | --- |")
        where = {}
        for v in VARIANTS:
            r = launch(args, ["--variant", v])
            where[v] = r.get("where")
            psi = r["params"]
            per_psi = {"ddp": 16, "dtcore zero=1": 8 + 8 / n, "dtcore zero=2": 4 + 12 / n}.get(v)
            formula = f"{per_psi * psi / 2**20:.1f}" if per_psi else ""
            ratio = f"{r['peak'] / (per_psi * psi):.3f}" if per_psi else ""
            print(f"| {v} | {r['peak'] / 2**20:.1f} | {formula} | {ratio} |")
        for v, w in where.items():
            if w:
                print(f"\n{v}, rank 0, live at the peak (running: {w['running']}):")
                for row in w["live"]:
                    print(f"  {row['MiB']:7.1f} MiB in {row['count']:3d}: {row['made by']}")
        return
    r = launch(args, ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)])
    print(
        f"{n} ranks (Gloo, 1 thread each), GPT preset {args.preset} ({r['params'] / 1e6:.1f}M parameters, fp32), "
        f"batch {args.batch}x{SHAPES[args.preset].block_size} per rank, median of {args.steps} steps, alternating, "
        f"buckets {args.bucket_mb:g} MiB"
    )
    print(
        "| variant | step (ms) | ratio to ZeroRedundancyOptimizer | CPU (ms) | sent per step, rank 0 (MiB) | "
        "ratio to DDP |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    zro, ddp_sent = r["ddp + ZeroRedundancyOptimizer"], r["ddp sent"]
    for v in VARIANTS:
        mib = r[f"{v} sent"] / 2**20
        cpu, to_ddp = 1000 * r[f"{v} cpu"], r[f"{v} sent"] / ddp_sent
        print(f"| {v} | {1000 * r[v]:.0f} | {r[v] / zro:.3f} | {cpu:.0f} | {mib:.1f} | {to_ddp:.3f} |")


if __name__ == "__main__":
    main()
