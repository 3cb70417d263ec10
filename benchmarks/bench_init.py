"""Start-up cost of dtcore.init() against torch.distributed.init_process_group("gloo").

    python benchmarks/bench_init.py [--worlds 2 4] [--repeats 5] [--timeout 5]

For each world size, alternating the two in one run: start N real processes on loopback with
torchrun-style variables and measure, per rank, the time from process start to init returning
(interpreter start-up and imports included) and the init call alone. A job is ready when its last
rank is, so each run reports the maximum over ranks; the table shows the median over repeats.
Then the missing-rank case: a world of 3 with 2 ranks started and the given timeout; reported is
how long after start each rank raised, and how much of that is beyond the timeout.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ranks import free_port, rank_env

WORKER = Path(__file__).with_name("init_worker.py")


def run_world(mode: str, world: int, ranks: list[int], extra: list[str], timeout: float) -> list[dict]:
    port = free_port()
    procs = []
    t0 = time.time()
    for rank in ranks:
        env = rank_env(rank, world, port, BENCH_INIT_T0=repr(t0))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), mode, *extra],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        )
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=timeout)
        line = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if not line:
            raise RuntimeError(f"{mode} world {world}: a rank printed no result (rc={p.returncode})")
        out.append(json.loads(line[-1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=5.0, help="rendezvous timeout of the missing-rank case (s)")
    args = ap.parse_args()

    modes = ["torch", "dtcore", "dtcore-only"]  # dtcore-only: init(torch_distributed=False)
    print(f"host: {socket.gethostname()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print("| world | what | from process start to init() returned (s) | init() call alone (s) | import (s) |")
    print("| --- | --- | --- | --- | --- |")
    for world in args.worlds:
        samples = {m: {"start": [], "call": [], "import": []} for m in modes}
        for _ in range(args.repeats):
            for mode in modes:  # alternating, so drift hits all alike
                res = run_world(mode, world, list(range(world)), [], timeout=120)
                samples[mode]["start"].append(max(r["from_start_s"] for r in res))
                samples[mode]["call"].append(max(r["init_s"] for r in res))
                samples[mode]["import"].append(max(r["import_s"] for r in res))
        for mode in modes:
            label = {
                "torch": "torch.distributed.init_process_group('gloo')",
                "dtcore": "dtcore.init()",
                "dtcore-only": "dtcore.init(torch_distributed=False)",
            }[mode]
            s = samples[mode]
            print(
                f"| {world} | {label} | {statistics.median(s['start']):.3f} | {statistics.median(s['call']):.3f} | "
                f"{statistics.median(s['import']):.3f} |"
            )
        ratio = statistics.median(samples["dtcore"]["start"]) / statistics.median(samples["torch"]["start"])
        print(f"| {world} | ratio dtcore / torch (from start) | {ratio:.2f} | | |")

    print()
    print(f"missing rank: world of 3, ranks 0 and 1 started, timeout {args.timeout:g} s")
    print("| run | rank | raised after (s) | beyond the timeout (s) | message |")
    print("| --- | --- | --- | --- | --- |")
    for run in range(args.repeats):
        res = run_world("dtcore-only", 3, [0, 1], [str(args.timeout)], timeout=args.timeout + 60)
        for rank, r in enumerate(res):
            assert not r["ok"], r
            beyond = r["from_start_s"] - r["import_s"] - args.timeout
            print(f"| {run} | {rank} | {r['from_start_s']:.2f} | {beyond:+.2f} | {r['error'][:80]} |")


if __name__ == "__main__":
    main()
