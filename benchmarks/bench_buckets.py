"""bucket_mb="auto" against fixed bucket sizes: step time of dtcore.wrap at each.

    python benchmarks/bench_buckets.py [--world 2] [--preset 20m] [--steps 15] [--warmup 3] [--batch 4]
        [--sizes 1 5 25 100]

--world ranks (2 or 4) on loopback, Gloo, float32. Every rank holds one copy of the model per
variant (same initial weights): dtcore.wrap with bucket_mb = each of --sizes (MiB, first bucket
1 MiB as by default) and bucket_mb="auto" (Note [Buckets that size themselves]), run alternately,
step by step, so that drift and noise hit all alike. A step is forward + backward + AdamW step +
zero_grad, timed after a barrier; medians over --steps after --warmup (auto's plan is chosen at
the end of its first backward). The report gives each variant's step, its ratio to the best fixed
size and to 25 MiB (torch DDP's default), the buckets it has, and auto's plan: the fitted cost of an
all-reduce and the communication it expects to leave after the backward.

--preset: the GPT shapes of dtcore.train.config.SHAPES or llama25m (bench_reducer.py's Llama stack).
--no-shm: DTCORE_SHM=0, so that Gloo moves the bytes over loopback TCP instead of shared memory: an
all-reduce then costs several times more, as between hosts, and where the buckets are cut matters.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch
from bench_reducer import LLAMA, make_model

from dtcore.train.config import SHAPES
from dtcore.train.demo.data import TokenData, Tokenizer, make_corpus
from dtcore.train.demo.gpt import num_parameters

from ranks import rank0_report


def worker(args) -> None:
    import dtcore

    ctx = dtcore.init(timeout=600)
    text = make_corpus()
    tokenizer = Tokenizer("char", text)
    base, block_size = make_model(args.preset, tokenizer.vocab_size)
    data = TokenData(tokenizer.encode(text), block_size, args.batch, ctx.rank, ctx.world_size, seed=0)
    models = {f"{size:g} MiB": dtcore.wrap(copy.deepcopy(base), bucket_mb=size) for size in args.sizes}
    models["auto"] = dtcore.wrap(copy.deepcopy(base), bucket_mb="auto")
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    for step in range(args.warmup + args.steps):
        x, y = data.next_batch()
        for name, model in models.items():
            dtcore.barrier()
            start = time.perf_counter()
            model(x, y).backward()
            opts[name].step()
            opts[name].zero_grad()
            if step >= args.warmup:
                times[name].append(time.perf_counter() - start)
    if ctx.rank == 0:
        result = {k: statistics.median(v) for k, v in times.items()}
        result["buckets"] = {k: len(m.bucket_params) for k, m in models.items()}
        result["auto_info"] = models["auto"]._reducer.auto_plan_info()
        result["auto_sizes"] = [
            sum(models["auto"]._trainable[i].nbytes for i in b) / 2**20 for b in models["auto"].bucket_params
        ]
        result["params"] = num_parameters(base)
        result["block_size"] = block_size
        sys.stdout.write(json.dumps({"result": result}) + "\n")
        sys.stdout.flush()
    dtcore.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="20m", choices=sorted([*SHAPES, *LLAMA]))
    ap.add_argument("--world", type=int, default=2, choices=(2, 4))
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--sizes", type=float, nargs="+", default=[1.0, 5.0, 25.0, 100.0])
    ap.add_argument("--no-shm", action="store_true", help="DTCORE_SHM=0: Gloo over loopback TCP")
    ap.add_argument("--json", action="store_true", help="print rank 0's result as one JSON line")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    flags = ["--preset", args.preset, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    flags += ["--batch", str(args.batch), "--sizes", *[str(s) for s in args.sizes]]
    extra = {"DTCORE_SHM": "0"} if args.no_shm else {}
    r = rank0_report(__file__, args.world, ["--worker", *flags], **extra)["result"]
    if args.json:
        print(json.dumps(r))
        return
    fixed = {k: v for k, v in r.items() if k.endswith(" MiB")}
    best = min(fixed, key=fixed.get)
    info = r["auto_info"]
    transport = ", Gloo over TCP (DTCORE_SHM=0)" if args.no_shm else ""
    print(
        f"{args.world} ranks (Gloo, 1 thread each), preset {args.preset} ({r['params'] / 1e6:.1f}M parameters, "
        f"float32), batch {args.batch}x{r['block_size']} per rank{transport}, median of {args.steps} steps after "
        f"{args.warmup} warm-up, alternating. auto: an all-reduce {info['alpha_us']:.0f} us + "
        f"{info['us_per_mib']:.0f} us/MiB, "
        f"first backward {info['backward_ms']:.0f} ms, {info['exposed_ms']:.2f} ms expected exposed "
        f"(25 MiB: {info['default_exposed_ms']:.2f} ms); bucket sizes (MiB) "
        f"{', '.join(f'{s:.2f}' for s in r['auto_sizes'])}"
    )
    print("| bucket_mb | buckets | step (ms) | vs best fixed | vs 25 MiB |")
    print("| --- | --- | --- | --- | --- |")
    for name in [*fixed, "auto"]:
        ratio_25 = r[name] / r["25 MiB"] if "25 MiB" in r else float("nan")
        print(
            f"| {name}{' (best fixed)' if name == best else ''} | {r['buckets'][name]} | {1000 * r[name]:.0f} | "
            f"{r[name] / r[best]:.3f} | {ratio_25:.3f} |"
        )


if __name__ == "__main__":
    main()
