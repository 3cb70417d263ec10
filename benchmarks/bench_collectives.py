"""dtcore's collectives on one host against torch's Gloo: torch.distributed on Gloo and dtcore side
by side in one job, twice: dtcore through shared memory (Note [Collectives through shared memory]),
then through Gloo (DTCORE_SHM=0; Note [Reduce-scatter on Gloo]). Through shared memory, the
all-reduce also runs on a tensor in a buffer every rank maps (Note [Buffers in shared memory]),
where the reducer keeps its buckets.

    python benchmarks/bench_collectives.py [--world 2] [--op all_reduce|reduce_scatter|all_gather]
                                           [--numel 8388608] [--iters 10]

In each job the variants take turns, each call after a barrier; medians over --iters of the wall
time and of the CPU time the process spent (all its threads: the caller's, Gloo's, the kernel's
socket work), which on a busy host is what the collective takes from the training loop. torch's
reduce-scatter on Gloo is an allreduce of the whole input; its all-to-all of the shards summed
after it is shown too. The results are compared across variants.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ranks import rank0_report

OPS = ("all_reduce", "reduce_scatter", "all_gather")


def worker(args) -> None:
    import torch.distributed as dist

    import dtcore

    ctx = dtcore.init(timeout=600)
    n = ctx.world_size
    numel = args.numel // n * n
    comm = ctx.communicator
    x = torch.randn(numel) * (ctx.rank + 1)
    if args.op == "all_reduce":
        buf = x.clone()

        def prepare() -> None:
            buf.copy_(x)

        calls = {
            "torch Gloo all_reduce": lambda: dist.all_reduce(buf),
            "dtcore": lambda: comm.all_reduce(buf, "sum").wait(),
        }
        shared = comm.shared_buffer(4 * numel)  # None through Gloo
        if shared is not None:  # Note [Buffers in shared memory]: in place, no copy through the exchange
            in_buffer = shared.view(torch.float32)

            def prepare() -> None:
                buf.copy_(x)
                in_buffer.copy_(x)

            calls["dtcore, in a shared buffer"] = lambda: comm.all_reduce(in_buffer, "sum").wait()
        outputs = {v: in_buffer if v == "dtcore, in a shared buffer" else buf for v in calls}
    elif args.op == "reduce_scatter":
        out = torch.empty(numel // n)

        def prepare() -> None:
            pass

        def all_to_all() -> None:
            received = torch.empty_like(x)
            dist.all_to_all_single(received, x)
            torch.sum(received.view(n, -1), 0, out=out)

        calls = {
            "torch Gloo reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, x),
            "torch all-to-all + sum": all_to_all,
            "dtcore": lambda: comm.reduce_scatter(out, x, "sum").wait(),
        }
        outputs = {v: out for v in calls}
    else:
        part = x[: numel // n]
        out = torch.empty(numel)

        def prepare() -> None:
            pass

        calls = {
            "torch Gloo all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, part),
            "dtcore": lambda: comm.all_gather(out, part).wait(),
        }
        outputs = {v: out for v in calls}
    wall: dict[str, list[float]] = {v: [] for v in calls}
    cpu: dict[str, list[float]] = {v: [] for v in calls}
    results: dict[str, torch.Tensor] = {}
    for i in range(args.iters + 2):
        for v, call in calls.items():
            prepare()
            dtcore.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            call()
            if i >= 2:
                wall[v].append(time.perf_counter() - start)
                cpu[v].append(time.process_time() - cpu_start)
            results[v] = outputs[v].clone()
    first = next(iter(results.values()))
    agree = all(torch.allclose(r, first, rtol=1e-5, atol=1e-4) for r in results.values())
    if ctx.rank == 0:
        report = {"variants": list(calls), "agree": agree, "shared_memory": comm.shared_memory}
        report |= {f"{v} wall": statistics.median(t) for v, t in wall.items()}
        report |= {f"{v} cpu": statistics.median(t) for v, t in cpu.items()}
        print(json.dumps(report))
    dtcore.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--op", choices=OPS, default="all_reduce")
    ap.add_argument("--numel", type=int, default=8 << 20, help="elements of each rank's buffer (float32)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    n = args.world
    flags = ["--worker", "--op", args.op, "--numel", str(args.numel), "--iters", str(args.iters)]
    jobs = {"shared memory": rank0_report(__file__, n, flags), "Gloo": rank0_report(__file__, n, flags, DTCORE_SHM="0")}
    assert jobs["shared memory"]["shared_memory"] and not jobs["Gloo"]["shared_memory"], jobs
    print(
        f"{n} ranks (1 thread each), {args.op} (sum) of {args.numel} float32 per rank, median of {args.iters} calls, "
        f"alternating; results agree: {all(r['agree'] for r in jobs.values())}"
    )
    print("| job: dtcore through | variant | wall (ms) | ratio | CPU, rank 0 (ms) | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for job, r in jobs.items():
        variants = r["variants"]
        base_wall, base_cpu = r[f"{variants[0]} wall"], r[f"{variants[0]} cpu"]
        for v in variants:
            w, c = r[f"{v} wall"], r[f"{v} cpu"]
            print(f"| {job} | {v} | {1000 * w:.1f} | {w / base_wall:.3f} | {1000 * c:.1f} | {c / base_cpu:.3f} |")


if __name__ == "__main__":
    main()
