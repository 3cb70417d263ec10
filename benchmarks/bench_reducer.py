"""Step time of dtcore.wrap against torch DDP (Gloo), and what dtcore's hooks cost.

    python benchmarks/bench_reducer.py [--world 2] [--preset 20m] [--steps 20] [--warmup 3] [--batch 4] [--find-unused]
    python benchmarks/bench_reducer.py --world1 [--preset 20m] [--steps 30]

--world ranks (2 or 4) on loopback, float32, the same bucket size for both (--bucket-mb, 25 MB
by default; dtcore's first bucket 1 MB, as DDP's). Every rank holds five copies of the model (same
initial weights) and runs the variants alternately, step by step, so that drift and noise hit all
alike:
  ddp               torch.nn.parallel.DistributedDataParallel on the Gloo default group
  dtcore            dtcore.wrap
  ddp no overlap    DDP's backward inside no_sync(), then one allreduce of all gradients
  dtcore no overlap the same with dtcore.wrap and dtcore.all_reduce
  compute only      dtcore.wrap's backward inside no_sync(), no communication
A step is forward + backward + AdamW step + zero_grad, timed after a barrier; medians over
--steps after --warmup. zero_grad sets the gradients to None (torch's default);
--no-set-to-none zeroes them in place instead. "Hidden" is how much of the no-overlap variant's
communication time the overlapping variant hid: (no overlap - overlap) / (no overlap - compute),
compute being the step with no communication at all, timed in the same run. "CPU" is the
process's CPU time per step (all its threads, Gloo's and the kernel's work for its sockets
included: time.process_time), so "CPU - compute's CPU" is what communicating cost the rank in
CPU time. Where the ranks' compute threads fill every core (2 ranks, 1 thread each, 2 cores),
that CPU time cannot overlap anything, and compute + it bounds any overlapping variant's step.

--preset names the model: the GPT shapes of dtcore.train.config.SHAPES (20m: 6 layers of width 512), or
llama25m, a Llama block stack built from transformers' LlamaConfig (4 layers of width 768, SwiGLU
MLP of 2048, grouped-query attention with 4 key/value heads, RMSNorm, rotary positions, untied
head; random weights, nothing downloaded): wider and shallower, with other layer types. Each rank
trains on its own sequences of make_corpus()'s text, by character.

--find-unused: ddp and dtcore with find_unused_parameters=True (each forward's graph search, and
dtcore's function the outputs pass through: Note [Outputs the loss does not use]).

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

from dtcore.train.config import SHAPES
from dtcore.train.demo.data import TokenData, Tokenizer, make_corpus
from dtcore.train.demo.gpt import GPT, num_parameters, shape

from ranks import rank0_report


def flat_allreduce_avg(params, reduce) -> None:
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])  # (total,)
    reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


LLAMA = {
    "llama25m": dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=12, num_key_value_heads=4
    )
}
BLOCK_SIZE = 128  # the Llama presets' sequence length, as the 20m GPT's


class LlamaLM(torch.nn.Module):
    """transformers' LlamaForCausalLM (random weights) with the GPT's interface: model(x, y) -> loss."""

    def __init__(self, preset: str, vocab_size: int) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=vocab_size, max_position_embeddings=BLOCK_SIZE, attn_implementation="sdpa", **LLAMA[preset]
        )
        self.lm = LlamaForCausalLM(config)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=idx).logits  # (B, T, vocab)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_model(preset: str, vocab_size: int) -> tuple[torch.nn.Module, int]:
    """The preset's model for a tokenizer of `vocab_size` tokens (a GPT shape's own vocabulary where it
    names one), seeded alike on every rank, and its sequence length."""
    torch.manual_seed(0)
    if preset in LLAMA:
        return LlamaLM(preset, vocab_size), BLOCK_SIZE
    return GPT(shape(SHAPES[preset], vocab_size)), SHAPES[preset].block_size


def worker(args) -> None:
    import torch.distributed as dist

    import dtcore

    ctx = dtcore.init(timeout=600)
    text = make_corpus()
    tokenizer = Tokenizer("char", text)
    base, block_size = make_model(args.preset, tokenizer.vocab_size)
    data = TokenData(tokenizer.encode(text), block_size, args.batch, ctx.rank, ctx.world_size, seed=0)
    mb, unused = args.bucket_mb, args.find_unused
    models = {
        "ddp": torch.nn.parallel.DistributedDataParallel(
            copy.deepcopy(base), bucket_cap_mb=mb, find_unused_parameters=unused
        ),
        "dtcore": dtcore.wrap(copy.deepcopy(base), bucket_mb=mb, first_bucket_mb=1, find_unused_parameters=unused),
        "ddp no overlap": torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=mb),
        "dtcore no overlap": dtcore.wrap(copy.deepcopy(base), bucket_mb=mb, first_bucket_mb=1),
        "compute only": dtcore.wrap(copy.deepcopy(base)),  # backward inside no_sync, no communication
    }
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}

    def ddp_reduce(flat):
        dist.all_reduce(flat)
        flat.div_(ctx.world_size)

    def dtcore_reduce(flat):
        dtcore.all_reduce(flat, op="avg")

    times: dict[str, list[float]] = {k: [] for k in models}
    cpu: dict[str, list[float]] = {k: [] for k in models}
    for step in range(args.warmup + args.steps):
        x, y = data.next_batch()
        for name, model in models.items():
            dtcore.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
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
            opts[name].zero_grad(set_to_none=args.set_to_none)
            elapsed = time.perf_counter() - start
            if step >= args.warmup:
                times[name].append(elapsed)
                cpu[name].append(time.process_time() - cpu_start)
    if ctx.rank == 0:
        result = {k: statistics.median(v) for k, v in times.items()}
        result |= {f"{k} cpu": statistics.median(v) for k, v in cpu.items()}
        result["params"] = num_parameters(base)
        result["buckets"] = len(models["dtcore"].bucket_params)
        result["block_size"] = block_size
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    dtcore.shutdown()


def world1(args) -> None:
    import dtcore

    dtcore.init(timeout=600)
    text = make_corpus()
    tokenizer = Tokenizer("char", text)
    base, block_size = make_model(args.preset, tokenizer.vocab_size)
    data = TokenData(tokenizer.encode(text), block_size, args.batch, rank=0, world=1, seed=0)
    variants = {
        "plain module": copy.deepcopy(base),
        "dtcore.wrap (25 MB buckets)": dtcore.wrap(copy.deepcopy(base), bucket_mb=25),
        "dtcore.wrap (one parameter per bucket)": dtcore.wrap(
            copy.deepcopy(base), bucket_mb=1e-6, first_bucket_mb=1e-6
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for step in range(3 + args.steps):
        x, y = data.next_batch()
        for name, model in variants.items():
            loss = model(x, y)
            start = time.perf_counter()
            loss.backward()
            elapsed = time.perf_counter() - start
            model.zero_grad(set_to_none=args.set_to_none)
            if step >= 3:
                times[name].append(elapsed)
    plain = statistics.median(times["plain module"])
    print(
        f"world size 1, GPT preset {args.preset} ({num_parameters(base) / 1e6:.1f}M parameters), "
        f"batch {args.batch}x{block_size}, set_to_none={args.set_to_none}, median of {args.steps} backward passes"
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
    ap.add_argument("--preset", default="20m", choices=sorted([*SHAPES, *LLAMA]))
    ap.add_argument("--world", type=int, default=2, choices=(2, 4))
    ap.add_argument("--set-to-none", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="both sides' bucket cap (MB)")
    ap.add_argument("--world1", action="store_true")
    ap.add_argument(
        "--find-unused",
        action="store_true",
        help="ddp and dtcore with find_unused_parameters=True (the graph search, the outputs' function)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.world1:
        return world1(args)

    flags = ["--preset", args.preset, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    flags += ["--batch", str(args.batch), "--set-to-none" if args.set_to_none else "--no-set-to-none"]
    flags += ["--bucket-mb", str(args.bucket_mb)] + (["--find-unused"] if args.find_unused else [])
    r = rank0_report(__file__, args.world, ["--worker", *flags])
    compute = r["compute only"]
    print(
        f"{args.world} ranks (Gloo, 1 thread each), preset {args.preset} ({r['params'] / 1e6:.1f}M parameters, "
        f"float32), batch {args.batch}x{r['block_size']} per rank, {args.bucket_mb:g} MB buckets "
        f"({r['buckets']} for dtcore), {'find_unused_parameters=True, ' if args.find_unused else ''}"
        f"zero_grad(set_to_none={args.set_to_none}), median of {args.steps} steps after {args.warmup} warm-up, "
        "alternating"
    )
    print("| variant | step (ms) | ratio to DDP | communication hidden | CPU (ms) | CPU - compute's (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in ("ddp", "dtcore", "ddp no overlap", "dtcore no overlap", "compute only"):
        ratio = r[name] / (r["ddp"] if "no overlap" not in name else r["ddp no overlap"])
        hidden = ""
        if name in ("ddp", "dtcore"):
            no_overlap = r[f"{name} no overlap"]
            if no_overlap > compute:
                hidden = f"{100 * (no_overlap - r[name]) / (no_overlap - compute):.0f} %"
        cpu, extra = 1000 * r[f"{name} cpu"], 1000 * (r[f"{name} cpu"] - r["compute only cpu"])
        print(f"| {name} | {1000 * r[name]:.0f} | {ratio:.3f} | {hidden} | {cpu:.0f} | {extra:+.0f} |")
    for name in ("ddp", "dtcore"):
        bound = compute + r[f"{name} cpu"] - r["compute only cpu"]
        share = bound / r["ddp"]
        print(f"{name}: compute + its communication's CPU = {1000 * bound:.0f} ms ({share:.3f} of DDP's step)")


if __name__ == "__main__":
    main()
