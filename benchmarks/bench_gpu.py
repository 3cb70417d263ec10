"""Training throughput on one GPU: a plain loop, torch DDP, dtcore (zero=0/1/2) and torch's
ZeroRedundancyOptimizer + DDP on the same GPT, in bf16 autocast with fp32 parameters.

    python benchmarks/bench_gpu.py [--preset gpt2] [--batch 16] [--steps 10] [--rounds 3] [--peak-tflops 989.4]
    python benchmarks/bench_gpu.py --memory [--preset gpt2] [--batch 16]

One process, world size 1 on NCCL: dtcore.init() sets up dtcore's NCCL communicator and
torch.distributed's default NCCL group on one store, so every variant runs its real collectives
(at world size 1 they move no bytes between GPUs: what is measured is each wrapper's own cost on
top of the same forward, backward and fused AdamW step). Every variant holds a copy of the same
initial weights; they run in turn, --steps steps each, --rounds times (after 3 warm-up steps
each), and each figure is the median step (forward + backward + optimizer step + zero_grad,
timed to a device synchronize).

host: the median time until step() returns, before the device is done: where it nears the step
time, the step is bound by the host's kernel launches rather than by the GPU.

tokens/s = batch x block size / median step. MFU = tokens/s x the model's training FLOPs per token
(GPT.flops_per_token: 6 per parameter plus attention) / the GPU's dense bf16 peak: 989.4 TFLOP/s
for an H100 or H200 SXM, taken from the device name, or --peak-tflops.

--memory: each variant in a fresh process of its own (so that no other variant's allocations or
frees mix in): 'state' is what it holds between steps (parameters, gradients, buckets, optimizer
state), the growth of torch.cuda.memory_allocated from before it is built to after its warm-up;
'peak' is the most allocated during its next step, from the same starting point (state plus
activations and temporaries).

Presets: those of dtcore.train.gpt.SHAPES (gpt2 is 124M parameters) and gpt2-medium (350M).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import subprocess
import sys
import time

import torch

import dtcore
from dtcore.train.gpt import GPT, SHAPES, GPTConfig, num_parameters

PRESETS = {**SHAPES, "gpt2-medium": GPTConfig(vocab_size=50304, n_layer=24, n_head=16, n_embd=1024, block_size=1024)}
VARIANTS = ("plain", "torch DDP", "dtcore", "dtcore zero=1", "dtcore zero=2", "DDP + ZeroRedundancyOptimizer")
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4}  # dense bf16, SXM
MiB = 1 << 20


def build(variant: str, base: torch.nn.Module, bucket_mb: float):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = copy.deepcopy(base)
    kw = {"lr": 1e-4, "weight_decay": 0.1, "fused": True}
    if variant == "plain":
        return model, torch.optim.AdamW(model.parameters(), **kw)
    if variant.startswith(("torch DDP", "DDP")):
        device = torch.cuda.current_device()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device], bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True
        )
        if variant == "torch DDP":
            return ddp, torch.optim.AdamW(ddp.parameters(), **kw)
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, **kw)
    stage = int(variant[-1]) if "zero=" in variant else 0
    wrapped = dtcore.wrap(model, zero=stage, bucket_mb=bucket_mb)
    if stage:
        return wrapped, dtcore.ShardedOptimizer(wrapped, torch.optim.AdamW, **kw)
    return wrapped, torch.optim.AdamW(wrapped.parameters(), **kw)


def step(model, opt, x, y) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed_step(model, opt, x, y) -> tuple[float, float]:
    """Seconds of one step, and of its host side alone (until step() returns, before the device is done)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    step(model, opt, x, y)
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return time.perf_counter() - start, host


def profile(runs: dict, batches: list, steps: int = 3) -> None:
    """torch.profiler's busiest host-side operators over a few steps of each variant."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for variant, (model, opt) in runs.items():
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(steps):
                step(model, opt, *batches[i % len(batches)])
            torch.cuda.synchronize()
        print(f"\n### {variant}: {steps} steps, by host time spent in the operator itself")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


def setup(args) -> tuple[GPT, GPTConfig, list[tuple[torch.Tensor, torch.Tensor]]]:
    """dtcore on NCCL at world size 1, the base model, and a few batches to take in turn."""
    ctx = dtcore.init()
    if ctx.backend != "nccl":
        raise SystemExit(f"dtcore chose {ctx.backend!r}, not NCCL: is this dtcore built with NCCL?")
    config = PRESETS[args.preset]
    torch.manual_seed(0)
    base = GPT(dataclasses.replace(config, dropout=0.0)).cuda()
    batches = []
    for _ in range(4):  # the figures do not depend on the values
        x = torch.randint(0, config.vocab_size, (args.batch, config.block_size), device="cuda")
        batches.append((x, torch.roll(x, -1, 1)))
    return base, config, batches


def memory_of(args) -> None:
    """One variant in this process: its state and peak, as a JSON line."""
    base, _, batches = setup(args)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model, opt = build(args.memory_of, base, args.bucket_mb)
    for i in range(args.warmup):
        step(model, opt, *batches[i % len(batches)])
    torch.cuda.synchronize()
    state = torch.cuda.memory_allocated() - before
    torch.cuda.reset_peak_memory_stats()
    step(model, opt, *batches[0])
    torch.cuda.synchronize()
    print(json.dumps({"state": state, "peak": torch.cuda.max_memory_allocated() - before}))
    dtcore.shutdown()


def memory(args) -> None:
    rows = {}
    for variant in args.variants:
        cmd = [sys.executable, __file__, "--memory-of", variant, "--preset", args.preset, "--batch", str(args.batch)]
        cmd += ["--bucket-mb", str(args.bucket_mb), "--warmup", str(args.warmup)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{out.stderr[-3000:]}")
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"GPT {args.preset}, bf16 autocast, fp32 parameters, fused AdamW, batch {args.batch}, {args.bucket_mb:g} MiB "
        f"buckets; {torch.cuda.get_device_name()}, world size 1; each variant in a process of its own"
    )
    print("| variant | state (MiB) | peak (MiB) |")
    print("| --- | --- | --- |")
    for variant, r in rows.items():
        print(f"| {variant} | {r['state'] / MiB:,.0f} | {r['peak'] / MiB:,.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="gpt2", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="every wrapper's bucket cap (MiB)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    ap.add_argument("--memory", action="store_true", help="each variant's memory, in a process of its own")
    ap.add_argument("--memory-of", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help="then each variant's busiest host-side operators")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA GPU; benchmarks/bench_reducer.py and bench_zero.py run on CPU.")
    if args.memory_of:
        return memory_of(args)
    if args.memory:
        return memory(args)
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    base, config, batches = setup(args)
    tokens = args.batch * config.block_size

    runs = {}
    for variant in args.variants:
        runs[variant] = build(variant, base, args.bucket_mb)
        for i in range(args.warmup):
            step(*runs[variant], *batches[i % len(batches)])
    times: dict[str, list[float]] = {v: [] for v in args.variants}
    hosts: dict[str, list[float]] = {v: [] for v in args.variants}
    for _ in range(args.rounds):
        for variant, (model, opt) in runs.items():
            for i in range(args.steps):
                seconds, host = timed_step(model, opt, *batches[i % len(batches)])
                times[variant].append(seconds)
                hosts[variant].append(host)

    flops = base.flops_per_token()
    print(
        f"GPT {args.preset} ({num_parameters(base) / 1e6:.1f}M parameters), bf16 autocast, fp32 parameters, "
        "fused AdamW, "
        f"batch {args.batch}x{config.block_size} = {tokens} tokens/step, {args.bucket_mb:g} MiB buckets; {name}, "
        f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, world size 1; median of "
        f"{args.rounds}x{args.steps} steps, variants in turn"
    )
    print(f"peak for MFU: {peak} TFLOP/s dense bf16" if peak else "MFU: unknown GPU, pass --peak-tflops")
    print("| variant | step (ms) | vs plain | tokens/s | MFU | host (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    plain = statistics.median(times["plain"]) if "plain" in times else None
    for variant in args.variants:
        t = statistics.median(times[variant])
        rate = tokens / t
        mfu = f"{100 * rate * flops / (peak * 1e12):.1f} %" if peak else "n/a"
        ratio = f"{t / plain:.3f}" if plain else "n/a"
        host = 1000 * statistics.median(hosts[variant])
        print(f"| {variant} | {1000 * t:.1f} | {ratio} | {rate:,.0f} | {mfu} | {host:.1f} |")
    if args.profile:
        profile(runs, batches)
    dtcore.shutdown()


if __name__ == "__main__":
    main()
