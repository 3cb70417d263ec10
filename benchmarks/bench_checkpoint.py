"""dtcore.save_checkpoint / load_checkpoint: how long training is blocked by a save, asynchronous
against synchronous, next to torch.distributed.checkpoint (DCP) on the same state; and load time.

    python benchmarks/bench_checkpoint.py [--world 2] [--preset 20m] [--repeats 5] [--dir DIR]

One job of --world ranks on Gloo. Every rank builds the GPT preset with AdamW (two steps, so that
the optimizer holds its moments), for each variant: dtcore.wrap(zero=0) + torch AdamW, and
zero=2 + dtcore.ShardedOptimizer. Each repeat saves once synchronously and once with
async_save=True (blocked: until save_checkpoint returns; total: until the file and manifest are
written, dtcore.checkpoint.wait()), then loads the newest checkpoint. For zero=0, DCP's
synchronous dcp.save and asynchronous dcp.async_save of {model, optimizer} state_dicts run too.
Medians over the repeats, rank 0's view (every save ends in a barrier). Checkpoints go to --dir
(default: a temporary directory, removed after).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dtcore.train.config import SHAPES
from dtcore.train.demo.data import from_text, make_corpus
from dtcore.train.demo.gpt import GPT, num_parameters, shape

from ranks import rank0_report


def worker(args) -> None:
    import dtcore

    ctx = dtcore.init(timeout=600)
    block_size = SHAPES[args.preset].block_size
    tokenizer, data, _ = from_text(make_corpus(), "char", block_size, 2, ctx.rank, ctx.world_size, seed=0)
    config = shape(SHAPES[args.preset], tokenizer.vocab_size)
    report: dict = {}
    for zero in (0, 2):
        torch.manual_seed(0)
        base = GPT(config)
        model = dtcore.wrap(base, zero=zero)
        opt = (
            dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-4)
            if zero
            else torch.optim.AdamW(model.parameters(), lr=1e-4)
        )
        for _ in range(2):
            x, y = data.next_batch()
            model(x, y).backward()
            opt.step()
            opt.zero_grad()
        root = os.path.join(args.dir, f"zero{zero}")
        report[f"zero={zero}"] = measure(model, opt, root, args.repeats, dcp=zero == 0)
        if ctx.rank == 0:
            files = Path(root, "s0").iterdir()
            report[f"zero={zero}"]["bytes"] = sum(f.stat().st_size for f in files if f.suffix == ".safetensors")
        report["params"] = num_parameters(base)
    if ctx.rank == 0:
        print(json.dumps(report))
    dtcore.shutdown()


def measure(model, opt, root: str, repeats: int, dcp: bool) -> dict[str, float]:
    """Median seconds of each kind of save and of a load, over `repeats`."""
    import torch.distributed.checkpoint as torch_dcp

    import dtcore

    times: dict[str, list[float]] = {}

    def timed(name: str, fn, *a, **kw):
        dtcore.barrier()
        start = time.perf_counter()
        out = fn(*a, **kw)
        times.setdefault(name, []).append(time.perf_counter() - start)
        return out

    for i in range(repeats):
        timed("sync", dtcore.save_checkpoint, f"{root}/s{i}", model=model, optimizer=opt, step=i)
        start = time.perf_counter()
        timed(
            "async blocked", dtcore.save_checkpoint, f"{root}/a{i}", model=model, optimizer=opt, step=i, async_save=True
        )
        dtcore.checkpoint.wait()
        times.setdefault("async total", []).append(time.perf_counter() - start)
        timed("load", dtcore.load_checkpoint, f"{root}/a{i}", model=model, optimizer=opt)
        if dcp:
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            timed("dcp sync", torch_dcp.save, state, checkpoint_id=f"{root}/dcp{i}")
            future = timed("dcp async blocked", torch_dcp.async_save, state, checkpoint_id=f"{root}/dcpa{i}")
            future.result()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--preset", default="20m", choices=sorted(SHAPES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    directory = args.dir or tempfile.mkdtemp(prefix="dtcore-bench-ckpt-")
    try:
        r = rank0_report(
            __file__,
            args.world,
            ["--worker", "--preset", args.preset, "--repeats", str(args.repeats), "--dir", directory],
        )
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    print(
        f"{args.world} ranks (Gloo), GPT preset {args.preset} ({r['params'] / 1e6:.1f}M parameters, fp32, AdamW), "
        f"median of {args.repeats} saves; times in ms"
    )
    columns = (
        "checkpoint (MiB)",
        "sync save",
        "async: blocked",
        "async: total",
        "load",
        "DCP sync",
        "DCP async: blocked",
    )
    print(f"| variant | {' | '.join(columns)} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ("zero=0", "zero=2"):
        v = r[name]
        dcp = [f"{1000 * v[k]:.0f}" if k in v else "" for k in ("dcp sync", "dcp async blocked")]
        print(
            f"| {name} | {v['bytes'] / 2**20:.0f} | {1000 * v['sync']:.0f} | {1000 * v['async blocked']:.0f} | "
            f"{1000 * v['async total']:.0f} | {1000 * v['load']:.0f} | {dcp[0]} | {dcp[1]} |"
        )


if __name__ == "__main__":
    main()
