"""The resource checker's cost and what its bandwidth test measures, against torch.distributed.

    python benchmarks/bench_check.py [--repeats 5] [--sizes 8B:64MiB] [--sweeps 5] [--world 2] [--no-bandwidth]

1. Wall time of `python -m dtcore.check --json` on this node (interpreter start, imports and all),
   median of --repeats runs, alternating with `python -c "import torch"` (what any torch program
   pays before its first line); also the probes' own time as the report states it.
2. The distributed mode's allreduce sweep: --world ranks on loopback, each running dtcore's sweep
   (dtcore.check's own code, on dtcore's Gloo communicator) and the same sweep with
   torch.distributed.all_reduce on torch's Gloo group, alternating, --sweeps times each. Per size:
   the median over sweeps of the time (the slowest rank's mean), and busbw = bytes / time x
   2(n-1)/n. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from ranks import clean_env, free_port, rank_env


def _wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=clean_env(), capture_output=True, check=True, timeout=120)
    return time.perf_counter() - start


def single_node(repeats: int) -> tuple[list[float], list[float], list[float]]:
    walls, probes, torch_walls = [], [], []
    for _ in range(repeats):
        torch_walls.append(_wall([sys.executable, "-c", "import torch"]))
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "dtcore.check", "--json"],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        walls.append(time.perf_counter() - start)
        probes.append(json.loads(out.stdout)["elapsed_s"])
    return walls, probes, torch_walls


def torch_sweep(ctx, sizes: list[int], iters) -> list[float]:
    """The same schedule as dtcore.check.allreduce_sweep, on torch.distributed's default (Gloo) group."""
    import torch
    import torch.distributed as dist

    from dtcore.check import default_iters

    times = []
    for nbytes in sizes:
        t = torch.full((max(1, nbytes // 4),), float(ctx.rank + 1))
        dist.all_reduce(t)
        k = iters or default_iters(nbytes)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(k):
            dist.all_reduce(t)
        times.append((time.perf_counter() - start) / k)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def worker(sizes: list[int], sweeps: int, iters) -> None:
    import dtcore

    ctx = dtcore.init(backend="gloo", timeout=120)
    results = {"dtcore": [], "torch": []}
    for s in range(sweeps):
        for name in ("dtcore", "torch") if s % 2 == 0 else ("torch", "dtcore"):
            if name == "dtcore":
                rows, wrong = dtcore.check.allreduce_sweep(sizes, iters)
                assert not wrong, wrong
                results[name].append([r["time_us"] * 1e-6 for r in rows])
            else:
                results[name].append(torch_sweep(ctx, sizes, iters))
    if ctx.rank == 0:
        out = {
            name: [statistics.median(run[i] for run in runs) for i in range(len(sizes))]
            for name, runs in results.items()
        }
        sys.stdout.write(json.dumps(out) + "\n")
    dtcore.shutdown()


def distributed(world: int, sizes: list[int], sweeps: int, iters) -> dict:
    port = free_port()
    args = [sys.executable, __file__, "--worker", "--sizes", ",".join(map(str, sizes)), "--sweeps", str(sweeps)]
    if iters:
        args += ["--iters", str(iters)]
    procs = [
        subprocess.Popen(
            args,
            env=rank_env(r, world, port),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for r in range(world)
    ]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]}")
    return json.loads(outs[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="8B:64MiB")
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--no-bandwidth", dest="bandwidth", action="store_false", help="only the one-node wall time")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker([int(x) for x in args.sizes.split(",")], args.sweeps, args.iters)
        return

    from dtcore.check import size_range
    from dtcore.units import format_bytes, parse_bytes

    low, _, high = args.sizes.partition(":")
    sizes = size_range(parse_bytes(low), parse_bytes(high or low))
    walls, probes, torch_walls = single_node(args.repeats)
    print(f"## python -m dtcore.check, one node ({args.repeats} runs)\n")
    print("| | median | min | max |\n|---|---|---|---|")
    print(
        f"| wall time (process start to exit) | {statistics.median(walls):.2f} s | {min(walls):.2f} s | "
        f"{max(walls):.2f} s |"
    )
    print(
        f'| `python -c "import torch"` | {statistics.median(torch_walls):.2f} s | {min(torch_walls):.2f} s | '
        f"{max(torch_walls):.2f} s |"
    )
    print(
        f"| the probes (report's elapsed_s) | {statistics.median(probes) * 1000:.1f} ms | "
        f"{min(probes) * 1000:.1f} ms | {max(probes) * 1000:.1f} ms |\n"
    )
    if not args.bandwidth:
        return

    bw = distributed(args.world, sizes, args.sweeps, args.iters)
    n = args.world
    print(
        f"## allreduce, {n} ranks, Gloo on loopback (median time of {args.sweeps} sweeps each; "
        "busbw = bytes / time x 2(n-1)/n)\n"
    )
    print(
        "| size | dtcore.check time (us) | busbw (GB/s) | torch.distributed Gloo time (us) | busbw (GB/s) | "
        "busbw ratio |\n|---|---|---|---|---|---|"
    )
    for i, b in enumerate(sizes):
        nbytes = max(1, b // 4) * 4
        d, t = bw["dtcore"][i], bw["torch"][i]
        bus = [nbytes / x / 1e9 * 2 * (n - 1) / n for x in (d, t)]
        print(f"| {format_bytes(b)} | {d * 1e6:.1f} | {bus[0]:.4f} | {t * 1e6:.1f} | {bus[1]:.4f} | {t / d:.2f} |")


if __name__ == "__main__":
    main()
