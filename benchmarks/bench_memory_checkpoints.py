"""What in-memory checkpoints (checkpoint.memory_every) cost a training step, side by side in one run.

    python benchmarks/bench_memory_checkpoints.py [--steps 300] [--steps-20m 40] [--runs 15] [--runs-20m 3]

Each run is `python -m dtcore.launch --nproc-per-node 2 --max-restarts 1 -m dtcore.train --preset tiny`
with `--checkpoint.memory_every=2`: every other step ends with a copy of the state into memory, so the
steps of one run, in the same processes, compare with and without it. A step's period is the time
from rank 0's metrics line of the step before to its own (the whole loop: the step, its loss's
all-reduce, the metrics line, and the copy that ended the step before, if any). Reported per model:
the median period of the steps that follow a copy, of those that follow none, and their ratio, over
`--runs` runs (`--runs-20m` for the 20m model; the median of the runs' ratios: on a shared 2-core
machine one run of the tiny preset moves by a few percent either way). Models: the `tiny` preset, and
the `20m` shape of the built-in GPT (19M parameters) with the tiny preset's batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ranks import clean_env

MODELS = {
    "tiny": [],
    "20m": ["--model.n_layer=6", "--model.n_head=8", "--model.n_embd=512", "--model.block_size=128"],
}
SKIP = 5  # the first steps: compilation of nothing, but allocations, the first layout of the copies


def run(tmp: Path, model: str, steps: int) -> tuple[float, float]:
    """(median period after a copy, median period after none) of one run, in seconds."""
    directory = tmp / f"{model}-{len(list(tmp.iterdir()))}"
    cmd = [sys.executable, "-m", "dtcore.launch", "--nproc-per-node", "2", "--max-restarts", "1", "--no-preflight"]
    cmd += ["--log-dir", str(directory) + "-logs", "-m", "dtcore.train", "--preset", "tiny", *MODELS[model]]
    cmd += [f"--num_iterations={steps}", f"--logging.run_dir={directory}", "--eval_every=0", "--progress=false"]
    cmd += ["--logging.plot=false", "--checkpoint.at_end=false", "--checkpoint.every=0", "--checkpoint.memory_every=2"]
    done = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"the run failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(x) for x in (directory / "metrics" / "rank0.jsonl").read_text().splitlines() if x.strip()]
    times = {x["step"]: x["time"] for x in lines if x["kind"] == "train"}
    after, without = [], []
    for step in range(SKIP + 1, steps + 1):
        if step - 1 in times and step in times:
            (after if (step - 1) % 2 == 0 else without).append(times[step] - times[step - 1])
    return statistics.median(after), statistics.median(without)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="steps of each tiny run")
    p.add_argument("--steps-20m", type=int, default=40, help="steps of each 20m run")
    p.add_argument("--runs", type=int, default=15, help="runs of the tiny preset")
    p.add_argument("--runs-20m", type=int, default=3, help="runs of the 20m model")
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = p.parse_args()
    print("| model | runs | step after a copy (ms) | step after none (ms) | cost of a copy |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        for model in args.models:
            tiny = model == "tiny"
            runs = args.runs if tiny else args.runs_20m
            results = [run(Path(tmp), model, args.steps if tiny else args.steps_20m) for _ in range(runs)]
            ratios = [a / b for a, b in results]
            a = statistics.median(r[0] for r in results)
            b = statistics.median(r[1] for r in results)
            each = ", ".join(f"{(r - 1) * 100:+.1f} %" for r in ratios)
            print(
                f"| {model} | {runs} | {a * 1000:.2f} | {b * 1000:.2f} | "
                f"**{(statistics.median(ratios) - 1) * 100:+.1f} %** ({each}) |",
                flush=True,
            )


if __name__ == "__main__":
    main()
