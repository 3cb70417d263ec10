"""init() right after shutdown(), on one fixed port, many times: dtcore against torch.distributed.

    python benchmarks/churn.py [--cycles 200] [--world 2]

Each rank runs the cycles in one process: init (timeout 10 s) on the same MASTER_PORT, one
all_reduce, shutdown; torch.distributed does init_process_group("gloo") / all_reduce /
destroy_process_group on the same port. Reported: cycles that failed (and the first error), and
the slowest rank's init time per cycle (median, 90th percentile, max, and how many took over 1 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from ranks import free_port, rank_env


def worker(flavor: str, cycles: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    times, errors = [], []  # times: the init time of each cycle, nan where the cycle failed
    for _ in range(cycles):
        start = time.perf_counter()
        try:
            if flavor == "dtcore":
                import dtcore

                dtcore.init(timeout=10)
                took = time.perf_counter() - start
                dtcore.all_reduce(torch.ones(4))
                dtcore.shutdown()
            else:
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
                took = time.perf_counter() - start
                dist.all_reduce(torch.ones(4))
                dist.destroy_process_group()
            times.append(took)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            times.append(math.nan)
            try:
                if flavor == "dtcore":
                    import dtcore

                    dtcore.shutdown(barrier=False)
                elif dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
    print(json.dumps({"times": times, "errors": errors}), flush=True)


def run_flavor(flavor: str, cycles: int, world: int) -> list[dict]:
    """Every rank's result, under one deadline for all; SystemExit naming the rank when one printed
    none (it crashed, or was killed at the deadline with the sessions of all ranks)."""
    port, limit = free_port(), cycles * 30 + 60
    with contextlib.ExitStack() as stack:
        # Output to files, not pipes: no rank blocks on a full pipe while another one is waited for.
        outs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(world)]
        errs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(world)]
        procs: list[subprocess.Popen] = []
        late = False
        try:
            for r in range(world):
                procs.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--worker", flavor, str(cycles)],
                        env=rank_env(r, world, port, DTCORE_LOG_LEVEL="error"),
                        stdout=outs[r],
                        stderr=errs[r],
                        start_new_session=True,
                    )
                )
            deadline = time.monotonic() + limit
            for p in procs:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            late = True
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        results = []
        for r, p in enumerate(procs):
            outs[r].seek(0)
            errs[r].seek(0)
            line = next((x for x in outs[r].read().splitlines() if x.startswith("{")), None)
            if line is None:
                when = f", killed at the {limit} s deadline" if late else ""
                last = " | ".join(errs[r].read().strip().splitlines()[-5:]) or "nothing on stderr"
                raise SystemExit(f"{flavor}: rank {r} printed no result (rc={p.returncode}{when}): {last}")
            results.append(json.loads(line))
        return results


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
        results = run_flavor(flavor, args.cycles, args.world)
        # A cycle's time is its slowest rank's; nan (failed) when any rank failed it.
        per_cycle = [[r["times"][i] for r in results] for i in range(args.cycles)]
        per_cycle = [math.nan if any(math.isnan(t) for t in ts) else max(ts) for ts in per_cycle]
        ok = sorted(t for t in per_cycle if not math.isnan(t))
        failed = len(per_cycle) - len(ok)
        errors = [e for r in results for e in r["errors"]]
        if ok:
            p90 = ok[max(0, int(len(ok) * 0.9) - 1)]
            stats = f"{statistics.median(ok):.3f} s | {p90:.3f} s | {max(ok):.3f} s"
        else:  # every cycle failed
            stats = "- | - | -"
        print(
            f"| {flavor} | {failed} | {stats} | {sum(t > 1 for t in ok)} | {errors[0] if errors else '-'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
