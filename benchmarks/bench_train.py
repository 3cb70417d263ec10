"""The trainer's overhead and its preemption save: `python -m dtcore.train` against a plain loop.

    python benchmarks/bench_train.py [--preset tiny] [--steps 200] [--ranks 2] [--repeats 3] [--preempt 5]

The plain loop is one process stepping the same GPT with the same batches, AdamW and clipping,
no dtcore at all, started as the trainer's ranks are (a fresh process, one thread).
The trainer's figures are read from rank 0's metrics file, median over the
steps after the first 10: its own step time (forward, backward, optimizer step: what it logs as
step_time_s) and the step period from one metrics line to the next, which adds everything else
the loop does per step (the all-reduce of loss and flags, the metrics line, TensorBoard scalars
when installed). tokens/s is the whole job's tokens per step over the period.

--preempt N: N times, 2 ranks of the tiny preset with ZeRO-2 get SIGTERM on rank 1 after step 5;
the figure is the time from the signal to a complete checkpoint that rank 1 logs.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dtcore.train import config
from dtcore.train.demo import data
from dtcore.train.demo.gpt import GPT, shape

from ranks import clean_env, free_port, rank_env

QUIET = ["--eval_every=0", "--checkpoint.at_end=false", "--progress=false", "--logging.plot=false"]


def plain_loop(preset: str, steps: int) -> tuple[float, float]:
    """(median step time in s, tokens/s) of a single-process loop over the preset's model and batches,
    in a fresh process with the trainer's ranks' environment (clean_env: one thread)."""
    cmd = [sys.executable, __file__, "--plain-worker", "--preset", preset, f"--steps={steps}"]
    out = subprocess.run(cmd, env=clean_env(), check=True, capture_output=True, text=True, timeout=3600).stdout
    median, rate = json.loads(out.splitlines()[-1])
    return median, rate


def plain_worker(preset: str, steps: int) -> None:
    c = config.from_preset(preset)
    torch.manual_seed(c.training.seed)
    tokenizer, train, _ = data.build(c.data, c.model.block_size, c.training.device_batch_size, 0, 1, c.training.seed)
    model = GPT(shape(c.model, tokenizer.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=c.optim.lr, betas=(c.optim.beta1, c.optim.beta2))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = train.next_batch()
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times[10:])
    print(json.dumps([median, c.training.device_batch_size * c.model.block_size / median]))


def trainer(preset: str, steps: int, ranks: int) -> tuple[float, float, float]:
    """(median step time, median step period, job tokens/s over the period) of `torchrun -m dtcore.train`."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
        cmd += ["-m", "dtcore.train", "--preset", preset, f"--num_iterations={steps}", *QUIET]
        cmd += [f"--logging.run_dir={run_dir}"]
        subprocess.run(cmd, env=clean_env(), check=True, capture_output=True, timeout=3600)
        lines = [json.loads(line) for line in (Path(run_dir) / "metrics" / "rank0.jsonl").read_text().splitlines()]
    train = [line for line in lines if line["kind"] == "train"]
    periods = [b["time"] - a["time"] for a, b in zip(train[10:], train[11:])]
    period = statistics.median(periods)
    job_tokens = train[-1]["tokens"] * ranks
    return statistics.median(t["step_time_s"] for t in train[10:]), period, job_tokens / period


def preempt_once() -> float:
    """Seconds from SIGTERM on rank 1 of 2 to its complete checkpoint, as rank 1 logs them."""
    with tempfile.TemporaryDirectory() as run_dir:
        port = free_port()
        cmd = [sys.executable, "-m", "dtcore.train", "--preset", "tiny", "--zero=2", "--num_iterations=100000"]
        cmd += [*QUIET, f"--logging.run_dir={run_dir}"]
        procs = [
            subprocess.Popen(cmd, env=rank_env(r, 2, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(2)
        ]
        try:
            metrics = Path(run_dir) / "metrics" / "rank1.jsonl"
            deadline = time.monotonic() + 300
            while not metrics.exists() or metrics.read_text().count("\n") < 5:
                if time.monotonic() > deadline:
                    raise SystemExit("rank 1 did not reach step 5 in 300 s")
                time.sleep(0.01)
            procs[1].send_signal(signal.SIGTERM)
            outs = [p.communicate(timeout=300)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    found = re.search(r"complete ([0-9.]+) s after the signal", outs[1])
    if found is None or [p.returncode for p in procs] != [75, 75]:
        raise SystemExit(f"no preemption save: exit codes {[p.returncode for p in procs]}\n{outs[1][-2000:]}")
    return float(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", choices=list(config.PRESETS))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--preempt", type=int, default=0, metavar="N", help="repeats of the preemption measurement")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of plain loop, 1 rank, N ranks, alternated")
    ap.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_worker:
        return plain_worker(args.preset, args.steps)
    worlds = sorted({1, args.ranks})
    plain: list[tuple[float, float]] = []
    runs: dict[int, list[tuple[float, float, float]]] = {n: [] for n in worlds}
    for _ in range(args.repeats):  # alternated, so that a shared machine's load weighs on each alike
        plain.append(plain_loop(args.preset, args.steps))
        for n in worlds:
            runs[n].append(trainer(args.preset, args.steps, n))
    plain_step, plain_rate = (statistics.median(x[i] for x in plain) for i in range(2))
    print(f"preset {args.preset}, {args.steps} steps, median after the first 10, median of {args.repeats} rounds")
    print("| run | step time | step period | tokens/s | tokens/s / plain loop's |\n|---|---|---|---|---|")
    cell = f"{1000 * plain_step:.2f} ms"
    print(f"| plain loop, 1 process | {cell} | {cell} | {plain_rate:,.0f} | 1.00 |")
    for n in worlds:
        step, period, rate = (statistics.median(x[i] for x in runs[n]) for i in range(3))
        row = f"| dtcore.train, {n} rank(s) | {1000 * step:.2f} ms | {1000 * period:.2f} ms | {rate:,.0f} |"
        print(f"{row} {rate / plain_rate:.2f} |")
    if args.preempt:
        seconds = [preempt_once() for _ in range(args.preempt)]
        print(f"SIGTERM on rank 1 of 2 to a complete checkpoint: median {statistics.median(seconds):.3f} s of", seconds)


if __name__ == "__main__":
    main()
