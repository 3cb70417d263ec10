"""Reduce-scatter on Gloo: dtcore's (Note [Reduce-scatter on Gloo]) against torch's
`reduce_scatter_tensor` (an allreduce of the whole input) and torch's all-to-all of the shards
summed after it, all on the same Gloo job.

    python benchmarks/bench_collectives.py [--world 2] [--numel 8388608] [--iters 10]

One job; the three variants take turns, each call after a barrier; medians over --iters. Also
what each allocates beside its output while in flight (the all-to-all: the whole input; dtcore:
nothing at 2 ranks, else the whole input) and the bytes rank 0 writes per call (/proc/self/io's wchar).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ranks import bytes_written, rank0_report

VARIANTS = ("torch reduce_scatter_tensor", "all-to-all + sum", "dtcore reduce_scatter")


def worker(args) -> None:
    import torch.distributed as dist

    import dtcore

    ctx = dtcore.init(timeout=600)
    n = ctx.world_size
    numel = args.numel // n * n
    x = torch.randn(numel) * (ctx.rank + 1)
    out = torch.empty(numel // n)

    def torch_rs() -> None:
        dist.reduce_scatter_tensor(out, x)

    def all_to_all() -> None:
        received = torch.empty_like(x)
        dist.all_to_all_single(received, x)
        torch.sum(received.view(n, -1), 0, out=out)

    def dtcore_rs() -> None:
        ctx.communicator.reduce_scatter(out, x, "sum").wait()

    calls = dict(zip(VARIANTS, (torch_rs, all_to_all, dtcore_rs), strict=True))
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    sent: dict[str, list[int]] = {v: [] for v in VARIANTS}
    results: dict[str, torch.Tensor] = {}
    for i in range(args.iters + 2):
        for v, call in calls.items():
            dtcore.barrier()
            start, written = time.perf_counter(), bytes_written()
            call()
            if i >= 2:
                times[v].append(time.perf_counter() - start)
                sent[v].append(bytes_written() - written)
            results[v] = out.clone()
    agree = all(torch.allclose(results[v], results[VARIANTS[0]], rtol=1e-5, atol=1e-4) for v in VARIANTS)
    if ctx.rank == 0:
        report = {v: statistics.median(t) for v, t in times.items()}
        print(json.dumps(report | {f"{v} sent": statistics.median(b) for v, b in sent.items()} | {"agree": agree}))
    dtcore.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--numel", type=int, default=8 << 20, help="elements of each rank's input (float32)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    n = args.world
    r = rank0_report(__file__, n, ["--worker", "--numel", str(args.numel), "--iters", str(args.iters)])
    shard_mib = args.numel // n * 4 / 2**20
    extra = {VARIANTS[0]: "", VARIANTS[1]: f"{n * shard_mib:.1f}", VARIANTS[2]: f"{(n != 2) * n * shard_mib:.1f}"}
    print(
        f"{n} ranks (Gloo, 1 thread each), reduce-scatter (sum) of {args.numel} float32 per rank, median of "
        f"{args.iters} calls, alternating; results agree: {r['agree']}"
    )
    print("| variant | time (ms) | ratio to torch | receive buffer (MiB) | sent per call, rank 0 (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    base = r[VARIANTS[0]]
    for v in VARIANTS:
        print(f"| {v} | {1000 * r[v]:.1f} | {r[v] / base:.3f} | {extra[v]} | {r[f'{v} sent'] / 2**20:.1f} |")


if __name__ == "__main__":
    main()
