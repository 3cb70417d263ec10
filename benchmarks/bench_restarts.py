"""Restarts after a killed rank: `python -m dtcore.launch --max-restarts 3 -m dtcore.train`, trial after trial.

    python benchmarks/bench_restarts.py [--trials 20] [--preset tiny] [--steps 30] [--seed 0] [--nodes 1]
                                        [-- ARGS...]

Each trial launches 2 ranks of `python -m dtcore.train --preset P` with a checkpoint every step
(ARGS are passed to dtcore.train after that, e.g. --parallel.zero=2, or --checkpoint.every=0
--checkpoint.memory_every=1 for in-memory checkpoints instead), waits until a random rank has
logged a random step, SIGKILLs that rank, and lets the launcher restart the job. With --nodes N,
N launchers of 2 ranks each are started on this host as the nodes of one job (`--nnodes N
--node-rank k`, on this host's routable address), and a trial SIGKILLs a whole node instead: a
random node other than node 0 (which serves the rendezvous store), its launcher and its ranks, when
its first rank has logged a random step; then it starts that node's command again. Reported per
trial: the launcher's exit status, the restarts, the seconds from the kill to the first step
completed after it (the "restart" line rank 0 writes then), the steps lost (the last step logged
before the kill less the step the job resumed from), whether every step's loss equals an
uninterrupted run's bit for bit, and what the trial left in /dev/shm. The uninterrupted run is
launched the same way once, first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ranks import clean_env, free_port, routable_address

QUIET = ["--eval_every=0", "--progress=false", "--logging.plot=false", "--checkpoint.every=1"]


def launch(run: Path, args: argparse.Namespace, restarts: int, node: int = 0, port: int = 0) -> subprocess.Popen:
    """One launcher: the job's only one, or node `node` of args.nodes (their store on `port`)."""
    cmd = [sys.executable, "-m", "dtcore.launch", "--nproc-per-node", "2", "--max-restarts", str(restarts)]
    if args.nodes > 1:
        cmd += ["--nnodes", str(args.nodes), "--node-rank", str(node), "--master-addr", args.address]
        cmd += ["--master-port", str(port)]
    cmd += ["--no-preflight", "--log-dir", str(run.parent / f"{run.name}-logs{node}"), "-m", "dtcore.train"]
    cmd += ["--preset", args.preset, f"--num_iterations={args.steps}", f"--logging.run_dir={run}", *QUIET]
    return subprocess.Popen(
        cmd + args.extra, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def launch_all(run: Path, args: argparse.Namespace, restarts: int) -> list[subprocess.Popen]:
    port = free_port()
    return [launch(run, args, restarts, node, port) for node in range(args.nodes)]


def ranks(args: argparse.Namespace) -> range:
    return range(2 * args.nodes)


def lines(run: Path, rank: int) -> list[dict]:
    try:
        text = (run / "metrics" / f"rank{rank}.jsonl").read_text()
    except OSError:
        return []
    return [json.loads(x) for x in text.split("\n")[:-1] if x.strip()]


def losses(run: Path) -> dict[int, float]:
    return {x["step"]: x["loss"] for x in lines(run, 0) if x["kind"] == "train"}


def children(launcher: int) -> dict[int, list[bytes]]:
    """{pid: environment} of the launcher's children (its ranks: torch's agent runs in the launcher)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == launcher:
            found[int(stat.parent.name)] = env
    return found


def rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of `rank` of the first attempt among the launcher's children."""
    for pid, env in children(launcher).items():
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RESTART_COUNT=0" in env:
            return pid
    return None


def shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def trial(run: Path, args: argparse.Namespace, rank: int, step: int, reference: dict[int, float]) -> dict:
    """Kills `rank` when it has logged `step` (with --nodes: the node of `rank`, launcher and ranks, then starts
    that node's command again)."""
    before = shm()
    port = free_port()
    nodes = [launch(run, args, 3, node, port) for node in range(args.nodes)]
    node = rank // 2
    p = nodes[node]
    killed_at = None
    while p.poll() is None and killed_at is None:
        if any(x.get("step") == step for x in lines(run, rank)):
            pid = rank_pid(p.pid, rank)
            if pid is None:
                sys.exit(f"trial: rank {rank} of launcher {p.pid} not found among its children")
            last = max(x["step"] for r in ranks(args) for x in lines(run, r) if x["kind"] == "train")
            if args.nodes > 1:  # the whole node: its launcher first (it would restart its ranks), then they
                victims = list(children(p.pid))
                os.kill(p.pid, signal.SIGKILL)
                for victim in victims:
                    os.kill(victim, signal.SIGKILL)
                killed_at = time.time()
                p.wait(timeout=60)
                nodes[node] = launch(run, args, 3, node, port)  # its command, started again
            else:
                os.kill(pid, signal.SIGKILL)
                killed_at = time.time()
        time.sleep(0.01)
    codes = [launcher.wait(timeout=600) for launcher in nodes]
    code = max(codes, key=abs)
    restarts = [x for x in lines(run, 0) if x["kind"] == "restart"]
    out = {"rank": rank, "kill_step": step, "exit": code, "restarts": len(restarts)}
    if restarts and killed_at is not None:
        first = restarts[0]
        out["recover_s"] = first["time"] - killed_at
        out["steps_lost"] = max(0, last - first["resumed_from_step"])
    out["bitwise"] = losses(run) == reference
    deadline = time.monotonic() + 5  # in-memory checkpoints go once the launcher has exited: allow the reaper that
    while shm() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    out["left_in_dev_shm"] = sorted(shm() - before)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1, help="launchers of 2 ranks each, as the nodes of one job")
    p.add_argument("--json", help="also write the trials here")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="more arguments for dtcore.train")
    args = p.parse_args()
    args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra  # ... -- --checkpoint.every=0
    args.address = routable_address() if args.nodes > 1 else None
    if args.nodes > 1 and args.address is None:
        sys.exit("--nodes needs an address of this host other than loopback (a job of several nodes refuses it)")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-restarts-") as tmp:
        ref_run = Path(tmp) / "reference"
        if any(ref.wait(timeout=600) != 0 for ref in launch_all(ref_run, args, restarts=0)):
            sys.exit("the uninterrupted run failed: see its logs")
        reference = losses(ref_run)
        results = []
        print("| trial | rank | step | exit | restarts | kill to next step (s) | steps lost | bitwise | /dev/shm |")
        print("|---|---|---|---|---|---|---|---|---|")
        for t in range(args.trials):
            rank = rng.randrange(2, 2 * args.nodes) if args.nodes > 1 else rng.randrange(2)  # node 0: the store's
            step = rng.randrange(2, args.steps - 1)
            r = trial(Path(tmp) / f"trial{t}", args, rank, step, reference)
            results.append(r)
            recover = f"{r['recover_s']:.2f}" if "recover_s" in r else "-"
            shm_left = ", ".join(r["left_in_dev_shm"]) or "nothing"
            print(
                f"| {t + 1} | {rank} | {step} | {r['exit']} | {r['restarts']} | {recover} | "
                f"{r.get('steps_lost', '-')} | {'yes' if r['bitwise'] else 'NO'} | {shm_left} |",
                flush=True,
            )
    recovered = [r["recover_s"] for r in results if "recover_s" in r]
    print(
        f"\n{sum(r['exit'] == 0 for r in results)}/{len(results)} finished with exit 0; kill to the next step: median "
        f"{statistics.median(recovered):.2f} s (max {max(recovered):.2f}); steps lost at most "
        f"{max(r.get('steps_lost', 0) for r in results)}; bitwise equal to the uninterrupted run: "
        f"{sum(r['bitwise'] for r in results)}/{len(results)}; trials leaving anything in /dev/shm: "
        f"{sum(bool(r['left_in_dev_shm']) for r in results)}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
