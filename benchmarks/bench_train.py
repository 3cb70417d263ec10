"""The trainer's overhead: `python -m dtcore.train` on 1 and N ranks against a plain loop.

    python benchmarks/bench_train.py [--preset tiny] [--steps 200] [--ranks 2]

The plain loop is one process stepping the same GPT with the same batches, AdamW and clipping,
no dtcore at all. The trainer's figures are read from its metrics files (median over the steps
after the first 10): step time of rank 0, and tokens/s of the whole job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dtcore.train import config, data
from dtcore.train.gpt import GPT, GPTConfig

from ranks import clean_env


def plain_loop(preset: str, steps: int) -> tuple[float, float]:
    """(median step time in s, tokens/s) of a single-process loop over the preset's model and batches."""
    c = config.from_preset(preset)
    torch.manual_seed(c.training.seed)
    tokenizer, train, _ = data.build(c.data, c.model.block_size, c.training.device_batch_size, 0, 1, c.training.seed)
    model = GPT(GPTConfig(**dataclasses.asdict(c.model), vocab_size=tokenizer.vocab_size))
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
    return median, c.training.device_batch_size * c.model.block_size / median


def trainer(preset: str, steps: int, ranks: int) -> tuple[float, float]:
    """(median step time of rank 0, median job tokens/s) of `torchrun -m dtcore.train` on `ranks` ranks."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
        cmd += ["-m", "dtcore.train", "--preset", preset, f"--num_iterations={steps}", "--eval_every=0"]
        cmd += ["--checkpoint.at_end=false", "--progress=false", f"--logging.run_dir={run_dir}"]
        subprocess.run(cmd, env=clean_env(), check=True, capture_output=True, timeout=3600)
        lines = [json.loads(line) for line in (Path(run_dir) / "metrics" / "rank0.jsonl").read_text().splitlines()]
    train = [line for line in lines if line["kind"] == "train"][10:]
    return statistics.median(t["step_time_s"] for t in train), statistics.median(t["tokens_per_s"] for t in train)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", choices=list(config.PRESETS))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as each rank of the trainer runs (OMP_NUM_THREADS=1)
    rows = [("plain loop, 1 process", *plain_loop(args.preset, args.steps))]
    rows += [(f"dtcore.train, {n} rank(s)", *trainer(args.preset, args.steps, n)) for n in sorted({1, args.ranks})]
    print(f"preset {args.preset}, {args.steps} steps, median after the first 10")
    print("| run | step time | tokens/s |\n|---|---|---|")
    for name, step, rate in rows:
        print(f"| {name} | {1000 * step:.2f} ms | {rate:,.0f} |")


if __name__ == "__main__":
    main()
