"""dtcore.wrap against torch DDP under torch.compile: step time, overlap, gradients, recompiles.

    python benchmarks/bench_compile.py [--world 2] [--preset 20m] [--backend aot_eager] [--steps 12]
        [--warmup 3] [--batch 4] [--bucket-mb 25] [--form outer]

--world ranks (2 or 4) on loopback, Gloo, float32, the same bucket cap for both (dtcore's first
bucket 1 MB, as DDP's). Every rank holds four copies of the model (same initial weights) and runs
them alternately, step by step, so that drift and noise hit all alike:
  ddp eager            torch.nn.parallel.DistributedDataParallel
  dtcore eager         dtcore.wrap
  ddp compiled         torch.compile(DDP(m), backend=...)
  dtcore compiled      torch.compile(dtcore.wrap(m), backend=...)  (--form inner: dtcore.wrap(torch.compile(m)))
A step is forward + backward + AdamW step + zero_grad, timed after a barrier; medians over --steps
after --warmup (the first steps compile).

"First collective" is when the first gradient bucket's collective started, as a fraction of the
backward's compute (from the end of forward to the last gradient ready), read from each wrapper's
torch-DDP logging data (_get_ddp_logging_data: backward_comm_time_start and
backward_compute_time_start/end), which both record for the first 10 iterations: the median over
the timed ones among those. 0 means communication started with the backward, 1 that it waited for
the whole backward.

"Gradients" is the largest difference between the compiled wrappers' averaged gradients after the
first backward (same weights, same batch). "Recompiles" counts graphs dynamo compiled after the
warm-up (torch._dynamo's unique_graphs counter): 0 in a steady loop.

--preset: the GPT shapes of dtcore.train.config.SHAPES or llama25m (bench_reducer.py's Llama stack).
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

VARIANTS = ("ddp eager", "dtcore eager", "ddp compiled", "dtcore compiled")


def first_collective(model: torch.nn.Module) -> float | None:
    """When the first collective of the last sampled backward started, as a fraction of its compute."""
    data = model._get_ddp_logging_data()
    start, end = data.get("backward_compute_time_start", 0), data.get("backward_compute_time_end", 0)
    comm = data.get("backward_comm_time_start", 0)
    if not (start and end and comm) or end <= start:
        return None
    return (comm - start) / (end - start)


def worker(args) -> None:
    import torch._dynamo

    import dtcore

    ctx = dtcore.init(timeout=600)
    text = make_corpus()
    tokenizer = Tokenizer("char", text)
    base, block_size = make_model(args.preset, tokenizer.vocab_size)
    data = TokenData(tokenizer.encode(text), block_size, args.batch, ctx.rank, ctx.world_size, seed=0)
    mb = args.bucket_mb
    bare = {
        "ddp eager": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=mb),
        "dtcore eager": dtcore.wrap(copy.deepcopy(base), bucket_mb=mb, first_bucket_mb=1),
        "ddp compiled": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=mb),
    }
    compile_ = lambda m: torch.compile(m, backend=args.backend)  # noqa: E731
    if args.form == "outer":
        bare["dtcore compiled"] = dtcore.wrap(copy.deepcopy(base), bucket_mb=mb, first_bucket_mb=1)
    else:
        bare["dtcore compiled"] = dtcore.wrap(compile_(copy.deepcopy(base)), bucket_mb=mb, first_bucket_mb=1)
    models = dict(bare)
    models["ddp compiled"] = compile_(bare["ddp compiled"])
    if args.form == "outer":
        models["dtcore compiled"] = compile_(bare["dtcore compiled"])
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}

    times: dict[str, list[float]] = {k: [] for k in models}
    fractions: dict[str, list[float]] = {k: [] for k in models}
    grad_diff = 0.0
    graphs_after_warmup = 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            graphs_after_warmup = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        x, y = data.next_batch()
        for name, model in models.items():
            dtcore.barrier()
            start = time.perf_counter()
            model(x, y).backward()
            if step == 0 and name == "ddp compiled":
                ddp_grads = [p.grad.clone() for p in bare[name].module.parameters()]
            if step == 0 and name == "dtcore compiled":
                for p, g in zip(bare[name].module.parameters(), ddp_grads, strict=True):
                    grad_diff = max(grad_diff, (p.grad - g).abs().max().item())
            opts[name].step()
            opts[name].zero_grad()
            elapsed = time.perf_counter() - start
            if step >= args.warmup:
                times[name].append(elapsed)
                if step < 10:  # torch's logging data samples the first 10 iterations: the previous one's
                    f = first_collective(bare[name])
                    if f is not None:
                        fractions[name].append(f)
    if ctx.rank == 0:
        result = {k: statistics.median(v) for k, v in times.items()}
        result |= {f"{k} first": statistics.median(v) if v else None for k, v in fractions.items()}
        result["grad_diff"] = grad_diff
        result["recompiles"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_after_warmup
        result["params"] = num_parameters(base)
        result["buckets"] = len(bare["dtcore compiled"].bucket_params)
        result["block_size"] = block_size
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    dtcore.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="20m", choices=sorted([*SHAPES, *LLAMA]))
    ap.add_argument("--world", type=int, default=2, choices=(2, 4))
    ap.add_argument("--backend", default="aot_eager", choices=("aot_eager", "inductor"))
    ap.add_argument("--form", default="outer", choices=("outer", "inner"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="both sides' bucket cap (MB)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    flags = ["--preset", args.preset, "--backend", args.backend, "--form", args.form, "--steps", str(args.steps)]
    flags += ["--warmup", str(args.warmup), "--batch", str(args.batch), "--bucket-mb", str(args.bucket_mb)]
    r = rank0_report(__file__, args.world, ["--worker", *flags])
    form = "torch.compile(dtcore.wrap(m))" if args.form == "outer" else "dtcore.wrap(torch.compile(m))"
    print(
        f"{args.world} ranks (Gloo, 1 thread each), preset {args.preset} ({r['params'] / 1e6:.1f}M parameters, "
        f"float32), batch {args.batch}x{r['block_size']} per rank, {args.bucket_mb:g} MB buckets "
        f"({r['buckets']} for dtcore), backend {args.backend}, {form}, median of {args.steps} steps after "
        f"{args.warmup} warm-up, alternating; gradients differ by {r['grad_diff']:.2g}, "
        f"{r['recompiles']} graph(s) compiled after the warm-up"
    )
    print("| variant | step (ms) | ratio to DDP | first collective (fraction of backward) |")
    print("| --- | --- | --- | --- |")
    for name in VARIANTS:
        peer = r["ddp eager" if "eager" in name else "ddp compiled"]
        first = r[f"{name} first"]
        shown = f"{first:.2f}" if first is not None else ""
        print(f"| {name} | {1000 * r[name]:.0f} | {r[name] / peer:.3f} | {shown} |")


if __name__ == "__main__":
    main()
