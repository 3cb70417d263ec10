"""Peak memory and step time of dtcore.checkpoint_activations policies against torch's checkpoint.

    python benchmarks/bench_activation.py [--preset 20m] [--batch 4] [--steps 10] [--warmup 2]
                                          [--dropout 0.0] [--budgets 0.5 0.75] [--threads N]

One process, one GPT (dtcore/train/demo/gpt.py), one copy of the model per variant (same weights):
  none                 no checkpointing
  torch per block      torch.utils.checkpoint.checkpoint(use_reentrant=False) around each block
  all, every:2, selective, budget:<f>   dtcore.checkpoint_activations with that policy; each budget
                       is the fraction f of the measured peak without checkpointing
  all + offload        on CUDA only: policy all with offload=True (the inputs each block keeps go to
                       pinned host memory on a side stream and come back ahead of its recompute)
A step is forward + backward (the optimizer step is the same for all and left out). Step times
are medians over --steps after --warmup, the variants taking turns step by step so that load on
the machine hits all alike.

Peak memory: on CPU, the peak bytes of tensors created during the step and alive at once
(dtcore's LiveTensorMemory, a dispatch mode that sees every operator's outputs), not counting
parameter gradients: activations saved for backward plus temporaries. It is measured in one extra
step per variant, apart from the timed ones. On CUDA (preset gpt2 in bf16 by default there):
torch.cuda.max_memory_allocated during the step minus what was allocated before it, gradients
set to None before each step so that they count alike for all.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import torch
from torch.utils.checkpoint import checkpoint

import dtcore
from dtcore.activation import LiveTensorMemory
from dtcore.train.config import SHAPES
from dtcore.train.demo.data import from_text, make_corpus
from dtcore.train.demo.gpt import GPT, num_parameters, shape

MiB = 2**20


def torch_per_block(model: GPT) -> None:
    for block in model.blocks:
        block.forward = lambda *args, _f=block.forward: checkpoint(_f, *args, use_reentrant=False)


def step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x, y).backward()


def peak_bytes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    if x.is_cuda:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model(x, y).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    model.zero_grad(set_to_none=True)
    meter = LiveTensorMemory()
    with meter:
        model(x, y).backward()
    return meter.peak_bytes(excluding=[p.grad for p in model.parameters()])


def timed(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    step(model, x, y)
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = torch.cuda.is_available()
    ap.add_argument("--preset", default="gpt2" if cuda else "20m", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--budgets", type=float, nargs="*", default=[0.5, 0.75])
    ap.add_argument("--dtype", default="bfloat16" if cuda else "float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, args.dtype)
    size = dataclasses.replace(SHAPES[args.preset], dropout=args.dropout)
    tokenizer, data, _ = from_text(make_corpus(), "char", size.block_size, args.batch, 0, 1, seed=0)
    config = shape(size, tokenizer.vocab_size, "the corpus' characters")
    torch.manual_seed(0)
    base = GPT(config).to(device=device, dtype=dtype)
    x, y = (t.to(device) for t in data.next_batch())

    variants: dict[str, torch.nn.Module] = {"none": base}
    torch_model = copy.deepcopy(base)
    torch_per_block(torch_model)
    variants["torch per block"] = torch_model
    summaries = {}
    for policy in ("all", "every:2", "selective"):
        model = copy.deepcopy(base)
        try:
            summaries[policy] = dtcore.checkpoint_activations(model, policy)
        except dtcore.ConfigError as e:  # selective on a torch older than 2.13
            print(f"{policy}: left out: {e}")
            continue
        variants[policy] = model
    if device.type == "cuda":
        variants["all + offload"] = copy.deepcopy(base)
        summaries["all + offload"] = dtcore.checkpoint_activations(variants["all + offload"], "all", offload=True)
    none_peak = peak_bytes(base, x, y)
    budgets = {}
    for fraction in args.budgets:
        name = f"budget:{fraction:g}"
        budgets[name] = int(none_peak * fraction)
        variants[name] = copy.deepcopy(base)
        summaries[name] = dtcore.checkpoint_activations(
            variants[name], f"budget:{budgets[name]}", example_inputs=(x, y)
        )

    peaks = {name: peak_bytes(m, x, y) for name, m in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.warmup + args.steps):
        for name, model in variants.items():
            elapsed = timed(model, x, y)
            if i >= args.warmup:
                times[name].append(elapsed)
    t = {name: statistics.median(v) for name, v in times.items()}

    print(
        f"GPT preset {args.preset} ({num_parameters(base) / 1e6:.1f}M parameters, {args.dtype}, dropout "
        f"{args.dropout:g}) on {device.type}, batch {args.batch}x{config.block_size}, {torch.get_num_threads()} "
        f"threads; step = forward + backward, median of {args.steps} after {args.warmup} warm-up, interleaved"
    )
    print(
        "| variant | blocks checkpointed | peak memory (MiB) | saved vs none | step (ms) | "
        "recompute overhead (ms) | note |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in variants:
        s = summaries.get(name)
        if name == "none":
            which = "0"
        elif name == "torch per block":
            which = f"{len(base.blocks)} (full)"
        else:
            modes = [b.mode for b in s.blocks]
            which = ", ".join(f"{modes.count(m)} {m}" for m in ("full", "selective") if m in modes) or "0"
        note = ""
        if name in budgets:
            note = (
                f"budget {budgets[name] / MiB:.1f} MiB, measured/budget {peaks[name] / budgets[name]:.4f}, "
                f"predicted {s.predicted_peak_bytes / MiB:.1f} MiB"
            )
        saved = 1 - peaks[name] / peaks["none"]
        print(
            f"| {name} | {which} | {peaks[name] / MiB:.1f} | {100 * saved:.0f} % | {1000 * t[name]:.0f} | "
            f"{1000 * (t[name] - t['none']):+.0f} | {note} |"
        )


if __name__ == "__main__":
    main()
