"""Fault scenarios, side by side: what dtcore does and what torch.distributed alone does.

    python benchmarks/faults.py [--repeats 3] [--timeout 5] [--only die,stop,...]

Each scenario starts real ranks on loopback (Gloo, CPU), injects one fault, and reports for the
surviving ranks: the outcome (the exception's class and the gist of its message, an abort by
signal, a wrong result, or a hang the driver had to kill), and the time from the collective's
start to the error, median over the repeats. The torch column runs the same work with
torch.distributed (init_process_group("gloo", timeout=T), dist.all_reduce, DDP) and nothing else.
The mismatch scenarios also run as "dtcore-nocheck": DTCORE_CHECK_COLLECTIVES=0, as on NCCL, where
no check runs before each call; the ranks go on all-reducing small tensors every 20 ms after the
mismatched call, and the time is to the first error (the heartbeat's finding).
Results: docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from ranks import free_port, rank_env

# name: (world, what it does)
SCENARIOS = {
    "die": (3, "rank 2 exits (as if killed) before an all_reduce"),
    "stop": (3, "rank 2 is stopped (SIGSTOP) before an all_reduce"),
    "stall": (3, "rank 2 sleeps past the timeout instead of joining an all_reduce"),
    "die-backward": (3, "rank 2 exits before a backward of 8 gradient buckets"),
    "size": (2, "rank 1 all-reduces float32[500], rank 0 float32[1000]"),
    "dtype": (2, "rank 1 all-reduces int32[1000], rank 0 float32[1000]"),
    "op": (2, "rank 1 all-reduces with max, rank 0 with sum"),
}


SCENARIOS_OF_2 = [name for name, (world, _) in SCENARIOS.items() if world == 2]


def worker(flavor: str, scenario: str, timeout: float) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if flavor.startswith("dtcore"):
        import dtcore

        dtcore.init(timeout=timeout)
        all_reduce = lambda t, op="sum": dtcore.all_reduce(t, op=op)  # noqa: E731
        barrier = dtcore.barrier
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
        all_reduce = lambda t, op="sum": dist.all_reduce(t, op=ops[op])  # noqa: E731
        barrier = dist.barrier
    model = None
    if scenario == "die-backward":
        net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])  # 256 KiB a layer
        if flavor.startswith("dtcore"):
            model = dtcore.wrap(net, bucket_mb=0.25, first_bucket_mb=0.25)
        else:
            model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
    barrier()
    if rank == 2:
        if scenario == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if scenario == "stall":
            time.sleep(timeout + 10)
        os._exit(0)
    t = torch.ones(1000)
    op = "sum"
    if rank == 1 and scenario == "size":
        t = torch.ones(500)
    if rank == 1 and scenario == "dtype":
        t = torch.ones(1000, dtype=torch.int32)
    if rank == 1 and scenario == "op":
        op = "max"
    start = time.monotonic()
    out: dict = {"rank": rank}
    try:
        if model is not None:
            model(torch.ones(4, 256)).sum().backward()
            out["result"] = "ok"
        else:
            all_reduce(t, op)
            expected = 1.0 if (scenario, rank, op) == ("op", 1, "max") else 2.0 if scenario in SCENARIOS_OF_2 else 3.0
            out["result"] = "right" if float(t[0]) == expected else f"WRONG ({float(t[0])} for {expected})"
            while flavor == "dtcore-nocheck" and time.monotonic() < start + 3 * timeout:
                all_reduce(torch.ones(4))  # until the heartbeat's finding fails one
                time.sleep(0.02)
    except Exception as e:
        out["type"] = type(e).__name__
        out["message"] = str(e)
    out["seconds"] = time.monotonic() - start
    print(json.dumps(out), flush=True)
    os._exit(0)  # no teardown: it may hang on a broken group, and is not what is measured


def gist(message: str) -> str:
    """The part of an error that says who and why, in a table cell."""
    for key in ("root cause: ", "the ranks called different collectives", "Received data size", "Timed out"):
        if key in message:
            line = message[message.index(key) :].splitlines()[0]
            return line[:90]
    return message.splitlines()[0][:90] if message else ""


def run_once(flavor: str, scenario: str, timeout: float) -> list[dict]:
    world = SCENARIOS[scenario][0]
    port = free_port()
    check = {"DTCORE_CHECK_COLLECTIVES": "0"} if flavor == "dtcore-nocheck" else {}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", flavor, scenario, str(timeout)],
            env=rank_env(r, world, port, DTCORE_LOG_LEVEL="error", **check),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for r in range(world)
    ]
    survivors = procs[:2]
    limit = time.monotonic() + timeout * 3 + 30
    results = []
    for r, p in enumerate(survivors):
        try:
            out, err = p.communicate(timeout=max(1.0, limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            results.append({"rank": r, "outcome": f"hang (killed at {timeout * 3 + 30:.0f} s)"})
            continue
        line = next((x for x in out.splitlines() if x.startswith("{")), None)
        if p.returncode < 0 or line is None:
            why = f"abort (signal {-p.returncode})" if p.returncode < 0 else f"exit {p.returncode}"
            last = next((x for x in reversed(err.splitlines()) if "Error" in x or "terminate" in x), "")
            results.append({"rank": r, "outcome": f"{why}: {last[:80]}"})
            continue
        j = json.loads(line)
        if "type" in j:
            j["outcome"] = f"{j['type']}: {gist(j['message'])}"
            if "result" in j:
                j["outcome"] += f" (the mismatched call's result: {j['result']})"
        else:
            j["outcome"] = f"no error, result {j['result']}"
        results.append(j)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    return results


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    args = ap.parse_args()
    print(f"timeout T = {args.timeout:g} s, {args.repeats} runs each; times: median (min-max) over surviving ranks\n")
    print("| scenario | flavor | outcome on the survivors | time to error |")
    print("|---|---|---|---|")
    for scenario in args.only.split(","):
        flavors = ("dtcore", "dtcore-nocheck", "torch") if scenario in SCENARIOS_OF_2 else ("dtcore", "torch")
        for flavor in flavors:
            outcomes, times = {}, []
            for _ in range(args.repeats):
                for j in run_once(flavor, scenario, args.timeout):
                    outcomes[j["outcome"]] = outcomes.get(j["outcome"], 0) + 1
                    if "type" in j:
                        times.append(j["seconds"])
            cell = "<br>".join(f"{n}x {o}" for o, n in sorted(outcomes.items(), key=lambda kv: -kv[1]))
            when = f"{statistics.median(times):.1f} s ({min(times):.1f}-{max(times):.1f})" if times else "-"
            print(f"| {scenario}: {SCENARIOS[scenario][1]} | {flavor} | {cell} | {when} |", flush=True)


if __name__ == "__main__":
    main()
