"""init() right after shutdown(), on one fixed port, many times: dtcore against torch.distributed.

    python benchmarks/churn.py [--cycles 200] [--world 2]

Each rank runs the cycles in one process: init (timeout 10 s) on the same MASTER_PORT, one
all_reduce, shutdown; torch.distributed does init_process_group("gloo") / all_reduce /
destroy_process_group on the same port. Reported: cycles that failed (and the first error), and
the slowest rank's init time per cycle (median, 90th percentile, max, and how many took over 1 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import free_port, rank_env


def worker(flavor: str, cycles: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    times, errors = [], []
    for _ in range(cycles):
        start = time.perf_counter()
        try:
            if flavor == "dtcore":
                import dtcore

                dtcore.init(timeout=10)
                times.append(time.perf_counter() - start)
                dtcore.all_reduce(torch.ones(4))
                dtcore.shutdown()
            else:
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
                times.append(time.perf_counter() - start)
                dist.all_reduce(torch.ones(4))
                dist.destroy_process_group()
        except Exception as e:
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            times.append(float("nan"))
            try:
                if flavor == "dtcore":
                    import dtcore

                    dtcore.shutdown(barrier=False)
                elif dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
    print(json.dumps({"times": times, "errors": errors}), flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    print(f"{args.cycles} cycles, world {args.world}, one fixed port per flavor\n")
    print("| flavor | failed cycles | init median | p90 | max | inits over 1 s | first error |")
    print("|---|---|---|---|---|---|---|")
    for flavor in ("dtcore", "torch"):
        port = free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", flavor, str(args.cycles)],
                env=rank_env(r, args.world, port, DTCORE_LOG_LEVEL="error"),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for r in range(args.world)
        ]
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=args.cycles * 30 + 60)
            results.append(json.loads(next(x for x in out.splitlines() if x.startswith("{"))))
        per_cycle = [max(r["times"][i] for r in results) for i in range(args.cycles)]
        failed = sum(1 for t in per_cycle if t != t)  # nan: a rank failed that cycle
        ok = sorted(t for t in per_cycle if t == t)
        errors = [e for r in results for e in r["errors"]]
        p90 = ok[int(len(ok) * 0.9) - 1] if ok else float("nan")
        print(
            f"| {flavor} | {failed} | {statistics.median(ok):.3f} s | {p90:.3f} s | {max(ok):.3f} s | "
            f"{sum(t > 1 for t in ok)} | {errors[0] if errors else '-'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
