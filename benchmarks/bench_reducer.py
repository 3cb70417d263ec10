"""Step time of dtcore.wrap against torch DDP (Gloo), and what dtcore's hooks cost.

    python benchmarks/bench_reducer.py [--preset 20m] [--steps 20] [--warmup 3] [--batch 4]
    python benchmarks/bench_reducer.py --world1 [--preset 20m] [--steps 30]

Two ranks on loopback, float32, the same bucket size for both (25 MB, first bucket 1 MB). Every
rank holds four copies of the model (same initial weights) and runs the variants alternately,
step by step, so that drift and noise hit all alike:
  ddp               torch.nn.parallel.DistributedDataParallel on the Gloo default group
  dtcore            dtcore.wrap
  ddp no overlap    DDP's backward inside no_sync(), then one allreduce of all gradients
  dtcore no overlap the same with dtcore.wrap and dtcore.all_reduce
A step is forward + backward + AdamW step, timed after a barrier; medians over --steps after
--warmup. "Hidden" is how much of the no-overlap variant's communication time the overlapping
variant hid: (no overlap - overlap) / (no overlap - compute), compute being the backward with no
communication at all, timed in the same run.

--world1: one process; backward time of the plain model against dtcore.wrap (default buckets and
one parameter per bucket), which is the bookkeeping the hooks add.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch

from dtcore.train.gpt import GPT, SHAPES, CharData, make_corpus, num_parameters

from ranks import rank0_report


def flat_allreduce_avg(params, reduce) -> None:
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])  # (total,)
    reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def worker(args) -> None:
    import torch.distributed as dist

    import dtcore

    ctx = dtcore.init(timeout=600)
    config = SHAPES[args.preset]
    data = CharData(make_corpus(), config.block_size, seed=ctx.rank)
    torch.manual_seed(0)
    base = GPT(config)
    models = {
        "ddp": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25),
        "dtcore": dtcore.wrap(copy.deepcopy(base), bucket_mb=25, first_bucket_mb=1),
        "ddp no overlap": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25),
        "dtcore no overlap": dtcore.wrap(copy.deepcopy(base), bucket_mb=25, first_bucket_mb=1),
        "compute only": dtcore.wrap(copy.deepcopy(base)),  # backward inside no_sync, no communication
    }
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}

    def ddp_reduce(flat):
        dist.all_reduce(flat)
        flat.div_(ctx.world_size)

    def dtcore_reduce(flat):
        dtcore.all_reduce(flat, op="avg")

    times: dict[str, list[float]] = {k: [] for k in models}
    for step in range(args.warmup + args.steps):
        x, y = data.batch(args.batch, torch.device("cpu"))
        for name, model in models.items():
            dtcore.barrier()
            start = time.perf_counter()
            if name in ("ddp", "dtcore"):
                model(x, y).backward()
            else:
                with model.no_sync():
                    model(x, y).backward()
                if name == "ddp no overlap":
                    flat_allreduce_avg(list(model.parameters()), ddp_reduce)
                elif name == "dtcore no overlap":
                    flat_allreduce_avg(list(model.parameters()), dtcore_reduce)
            opts[name].step()
            opts[name].zero_grad(set_to_none=False)
            elapsed = time.perf_counter() - start
            if step >= args.warmup:
                times[name].append(elapsed)
    if ctx.rank == 0:
        result = {k: statistics.median(v) for k, v in times.items()}
        result["params"] = num_parameters(base)
        result["buckets"] = len(models["dtcore"].bucket_params)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    dtcore.shutdown()


def world1(args) -> None:
    import dtcore

    dtcore.init(timeout=600)
    config = SHAPES[args.preset]
    data = CharData(make_corpus(), config.block_size, seed=0)
    torch.manual_seed(0)
    base = GPT(config)
    variants = {
        "plain module": copy.deepcopy(base),
        "dtcore.wrap (25 MB buckets)": dtcore.wrap(copy.deepcopy(base)),
        "dtcore.wrap (one parameter per bucket)": dtcore.wrap(
            copy.deepcopy(base), bucket_mb=1e-6, first_bucket_mb=1e-6
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for step in range(3 + args.steps):
        x, y = data.batch(args.batch, torch.device("cpu"))
        for name, model in variants.items():
            loss = model(x, y)
            start = time.perf_counter()
            loss.backward()
            elapsed = time.perf_counter() - start
            model.zero_grad(set_to_none=False)
            if step >= 3:
                times[name].append(elapsed)
    plain = statistics.median(times["plain module"])
    print(
        f"world size 1, GPT preset {args.preset} ({num_parameters(base) / 1e6:.1f}M parameters), "
        f"batch {args.batch}x{config.block_size}, median of {args.steps} backward passes"
    )
    print("| variant | buckets | backward (ms) | added (ms) | added per bucket (us) |")
    print("| --- | --- | --- | --- | --- |")
    for name, model in variants.items():
        t = statistics.median(times[name])
        buckets = len(model.bucket_params) if hasattr(model, "bucket_params") else 0
        per = f"{1e6 * (t - plain) / buckets:.0f}" if buckets else ""
        print(f"| {name} | {buckets} | {1000 * t:.1f} | {1000 * (t - plain):+.1f} | {per} |")
    dtcore.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="20m", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--world1", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.world1:
        return world1(args)

    flags = ["--preset", args.preset, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    r = rank0_report(__file__, 2, ["--worker", *flags, "--batch", str(args.batch)])
    compute = r["compute only"]
    print(
        f"2 ranks (Gloo, 1 thread each), GPT preset {args.preset} ({r['params'] / 1e6:.1f}M parameters, float32), "
        f"batch {args.batch}x{SHAPES[args.preset].block_size} per rank, {r['buckets']} dtcore bucket(s), "
        f"median of {args.steps} steps after {args.warmup} warm-up, alternating"
    )
    print("| variant | step (ms) | ratio to DDP | communication hidden |")
    print("| --- | --- | --- | --- |")
    for name in ("ddp", "dtcore", "ddp no overlap", "dtcore no overlap", "compute only"):
        ratio = r[name] / (r["ddp"] if "no overlap" not in name else r["ddp no overlap"])
        hidden = ""
        if name in ("ddp", "dtcore"):
            no_overlap = r[f"{name} no overlap"]
            if no_overlap > compute:
                hidden = f"{100 * (no_overlap - r[name]) / (no_overlap - compute):.0f} %"
        print(f"| {name} | {1000 * r[name]:.0f} | {ratio:.3f} | {hidden} |")


if __name__ == "__main__":
    main()
