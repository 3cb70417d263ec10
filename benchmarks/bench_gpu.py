"""Training throughput on one GPU: a plain loop, torch DDP, dtcore (zero=0/1/2) and torch's
ZeroRedundancyOptimizer + DDP on the same GPT, in bf16 autocast with fp32 parameters; eager, or
compiled with torch.compile beside `python -m dtcore.train`.

    python benchmarks/bench_gpu.py [--preset gpt2] [--batch 16] [--steps 10] [--rounds 3] [--peak-tflops 989.4]
    python benchmarks/bench_gpu.py --memory [--preset gpt2] [--batch 16]
    python benchmarks/bench_gpu.py --compiled [--preset gpt2] [--batch 32] [--trainer-steps 40 --out DIR]

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

--compiled: the variants "plain compiled" (torch.compile(model), nanoGPT's loop), "torch DDP
compiled" (torch.compile(DDP(model))) and "dtcore compiled" (dtcore.wrap(model).compile(), in place, as
the Trainer compiles), with --compile-backend (inductor) and TF32 allowed as the Trainer allows it;
each wrapper's "vs plain" is against the plain compiled loop. Each variant's model is of a class of its
own: dynamo keys its compiled graphs by the forward's code, and a model whose class matched an earlier
variant's would run that variant's graph (the plain loop's, not split at bucket boundaries) instead of
compiling its own. Every variant compiles once, in its warm-up.

--trainer-steps N (with --compiled): then `python -m dtcore.train --preset aggressive` (--trainer-preset)
for N steps in a process of its own, with this run's micro-batch as device_batch_size and total_batch_size
(one micro-batch per step, the plain loop's step), no evaluation and no checkpoint, on a generated text;
its run directory is DIR/trainer_<preset>. Its tokens/s is read from its metrics file, the median after
its first --warmup + 2 steps (the first compiles): "step" counts the trainer's step time as it logs it
(forward, backward, clipping, optimizer step), "period" the time from one metrics line to the next (adding
the step's small all-reduce, its metrics line and progress). Both against the plain compiled loop.

--device cpu (with --compiled, e.g. --preset tiny --compile-backend aot_eager --trainer-preset tiny):
the same code on the CPU, fp32 and Gloo, to check the script where there is no GPU; no figure of it is
a GPU's.

Presets: the sizes of dtcore.train.config.SHAPES (gpt2 is 124M parameters, GPT-2's vocabulary padded to
50304 as the GPU presets of dtcore.train have it) and gpt2-medium (350M).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import dtcore
from dtcore.train import config as train_config
from dtcore.train.config import SHAPES
from dtcore.train.demo.data import make_corpus
from dtcore.train.demo.gpt import GPT, GPTConfig, num_parameters, shape

from ranks import clean_env

# Random tokens stand in for text: a size that names no vocabulary gets the byte tokenizer's (256).
PRESETS = {name: shape(size, 256) for name, size in SHAPES.items()}
PRESETS["gpt2-medium"] = GPTConfig(vocab_size=50304, n_layer=24, n_head=16, n_embd=1024, block_size=1024)
VARIANTS = ("plain", "torch DDP", "dtcore", "dtcore zero=1", "dtcore zero=2", "DDP + ZeroRedundancyOptimizer")
COMPILED = ("plain compiled", "torch DDP compiled", "dtcore compiled")
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4}  # dense bf16, SXM
MiB = 1 << 20


def build(variant: str, base: torch.nn.Module, bucket_mb: float, backend: str = "inductor"):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    compiled = variant.endswith(" compiled")
    variant = variant.removesuffix(" compiled")
    model = copy.deepcopy(base)
    if compiled:  # a class of its own, so that dynamo compiles this variant's graphs (see --compiled above)
        model.__class__ = type(f"{type(base).__name__}_{variant.replace(' ', '_')}", (type(base),), {})
    kw = {"lr": 1e-4, "weight_decay": 0.1, "fused": True}
    if variant == "plain":
        opt = torch.optim.AdamW(model.parameters(), **kw)
        return (torch.compile(model, backend=backend) if compiled else model), opt
    if variant.startswith(("torch DDP", "DDP")):
        cuda = next(base.parameters()).is_cuda
        ddp = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[torch.cuda.current_device()] if cuda else None,
            bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=True,
        )
        if variant == "torch DDP":
            opt = torch.optim.AdamW(ddp.parameters(), **kw)
            return (torch.compile(ddp, backend=backend) if compiled else ddp), opt
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, **kw)
    stage = int(variant[-1]) if "zero=" in variant else 0
    wrapped = dtcore.wrap(model, zero=stage, bucket_mb=bucket_mb)
    if compiled:
        wrapped.compile(backend=backend)  # in place, as dtcore.Trainer compiles (training.compile)
    if stage:
        return wrapped, dtcore.ShardedOptimizer(wrapped, torch.optim.AdamW, **kw)
    return wrapped, torch.optim.AdamW(wrapped.parameters(), **kw)


def step(model, opt, x, y) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16) if x.is_cuda else contextlib.nullcontext():
        loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_step(model, opt, x, y) -> tuple[float, float]:
    """Seconds of one step, and of its host side alone (until step() returns, before the device is done)."""
    synchronize(x.device)
    start = time.perf_counter()
    step(model, opt, x, y)
    host = time.perf_counter() - start
    synchronize(x.device)
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
    """dtcore at world size 1 (NCCL on the GPU, Gloo with --device cpu), the base model, and a few batches
    to take in turn."""
    ctx = dtcore.init(backend="auto" if args.device == "cuda" else "gloo")
    if args.device == "cuda" and ctx.backend != "nccl":
        raise SystemExit(f"dtcore chose {ctx.backend!r}, not NCCL: is this dtcore built with NCCL?")
    device = torch.device(args.device)
    config = PRESETS[args.preset]
    torch.manual_seed(0)
    base = GPT(dataclasses.replace(config, dropout=0.0)).to(device)
    batches = []
    for _ in range(4):  # the figures do not depend on the values
        x = torch.randint(0, config.vocab_size, (args.batch, config.block_size), device=device)
        batches.append((x, torch.roll(x, -1, 1)))
    return base, config, batches


def memory_of(args) -> None:
    """One variant in this process: its state and peak, as a JSON line."""
    base, _, batches = setup(args)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model, opt = build(args.memory_of, base, args.bucket_mb, args.compile_backend)
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
        cmd += [
            "--bucket-mb",
            str(args.bucket_mb),
            "--warmup",
            str(args.warmup),
            "--compile-backend",
            args.compile_backend,
        ]
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


def trainer_run(args, config: GPTConfig, base: GPT) -> dict:
    """`python -m dtcore.train --preset <args.trainer_preset>` for args.trainer_steps steps in a process of its
    own, shaped as this run's plain loop (see --trainer-steps above); its medians from its metrics file."""
    preset = train_config.from_preset(args.trainer_preset).model
    shape = {k: getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")}
    theirs = {k: getattr(preset, k) for k in shape}
    if shape != theirs:  # vocab_size 0: the tokenizer's
        print(f"note: --trainer-preset {args.trainer_preset}'s model {theirs} is not --preset {args.preset}'s {shape}")
    run_dir = os.path.abspath(os.path.join(args.out, f"trainer_{args.trainer_preset}"))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")  # enough sequences of block_size bytes for an epoch of many batches
        with open(corpus, "w") as f:
            f.write(make_corpus(chars=max(2_000_000, 64 * args.batch * (config.block_size + 1))))
        cmd = [sys.executable, "-m", "dtcore.train", "--preset", args.trainer_preset, f"--data.path={corpus}"]
        cmd += [f"--logging.run_dir={run_dir}", f"--training.num_iterations={args.trainer_steps}"]
        cmd += [f"--training.device_batch_size={args.batch}", f"--training.total_batch_size={args.batch}"]
        cmd += ["--training.compile=true", f"--training.compile_backend={args.compile_backend}"]
        cmd += ["--training.eval_every=0", "--checkpoint.at_end=false", "--checkpoint.every=0"]
        cmd += [
            "--logging.progress=false",
            "--logging.plot=false",
            "--logging.tensorboard=false",
            "--logging.mlflow=false",
        ]
        cmd += [f"--parallel.bucket_mb={args.bucket_mb}"]
        if args.peak_tflops:
            cmd.append(f"--logging.peak_tflops={args.peak_tflops}")
        env = clean_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)))
        started = time.monotonic()
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.trainer_timeout)
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")[-4000:]
            raise SystemExit(
                f"python -m dtcore.train ran past --trainer-timeout {args.trainer_timeout:g} s; its last output:\n"
                + (tail.decode(errors="replace") if isinstance(tail, bytes) else tail)
            ) from None
        seconds = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"python -m dtcore.train failed ({out.returncode}):\n{out.stderr[-4000:]}")
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    with open(os.path.join(run_dir, "metrics", "rank0.jsonl")) as f:
        lines = [line for line in map(json.loads, f) if line["kind"] == "train"]
    skip = args.warmup + 2  # the first step compiles
    if len(lines) <= skip + 1:
        raise SystemExit(f"--trainer-steps {args.trainer_steps}: at least {skip + 2} steps, to skip the first {skip}")
    kept = lines[skip:]
    periods = [b["time"] - a["time"] for a, b in zip(lines[skip - 1 :], kept)]
    mfus = [line["mfu"] for line in kept if line["mfu"] is not None]
    return {
        "command": " ".join(a if not a.startswith("--data.path=") else "--data.path=TEXT" for a in cmd[1:]),
        "step_s": statistics.median(line["step_time_s"] for line in kept),
        "period_s": statistics.median(periods),
        "tokens": kept[0]["tokens"],
        "logged_mfu": statistics.median(mfus) if mfus else None,
        "flops_per_token": run["model_flops_per_token"],
        "same_flops": run["model_flops_per_token"] == base.flops_per_token(),
        "seconds": seconds,
        "steps": len(kept),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="gpt2", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: 16; 32 with --compiled)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="every wrapper's bucket cap (MiB)")
    ap.add_argument("--variants", nargs="*", default=None, choices=VARIANTS + COMPILED, help="default: by mode")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    ap.add_argument("--memory", action="store_true", help="each variant's memory, in a process of its own")
    ap.add_argument("--memory-of", choices=VARIANTS + COMPILED, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help="then each variant's busiest host-side operators")
    ap.add_argument(
        "--compiled", action="store_true", help="the compiled variants (default variants: " + ", ".join(COMPILED) + ")"
    )
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile's backend for compiled variants")
    ap.add_argument("--trainer-steps", type=int, default=0, help="with --compiled: also python -m dtcore.train")
    ap.add_argument("--trainer-preset", default="aggressive", choices=sorted(train_config.PRESETS))
    ap.add_argument("--trainer-timeout", type=float, default=300.0, help="seconds the trainer's run may take")
    ap.add_argument("--out", default="runs/bench_gpu", help="where the trainer's run directory goes")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: check the script without a GPU")
    args = ap.parse_args()
    args.batch = args.batch or (32 if args.compiled else 16)
    args.variants = args.variants or list(COMPILED if args.compiled else VARIANTS)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "bench_gpu.py needs a CUDA GPU (--device cpu checks the script on the CPU); benchmarks/bench_reducer.py "
            "and bench_zero.py measure on CPU."
        )
    if args.trainer_steps and "plain compiled" not in args.variants:
        raise SystemExit("--trainer-steps compares with the plain compiled loop: add --compiled (or that variant).")
    if args.memory_of:
        return memory_of(args)
    if args.memory:
        if args.device != "cuda":
            raise SystemExit("--memory measures CUDA's allocator: it needs --device cuda.")
        return memory(args)
    cuda = args.device == "cuda"
    name = torch.cuda.get_device_name() if cuda else "CPU"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    if any(v in COMPILED for v in args.variants) and cuda:  # as dtcore.Trainer allows on CUDA
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    base, config, batches = setup(args)
    tokens = args.batch * config.block_size

    runs = {}
    for variant in args.variants:
        runs[variant] = build(variant, base, args.bucket_mb, args.compile_backend)
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
    compiled = (
        f", compiled with torch.compile(backend={args.compile_backend!r})" if set(args.variants) & set(COMPILED) else ""
    )
    nccl = f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if cuda else "Gloo"
    print(
        f"GPT {args.preset} ({num_parameters(base) / 1e6:.1f}M parameters, vocabulary {config.vocab_size}), "
        f"{'bf16 autocast' if cuda else 'fp32'}, fp32 parameters, fused AdamW{compiled}, "
        f"batch {args.batch}x{config.block_size} = {tokens} tokens/step, {args.bucket_mb:g} MiB buckets; {name}, "
        f"torch {torch.__version__}, {nccl}, world size 1; median of {args.rounds}x{args.steps} steps, variants in turn"
    )
    print(f"peak for MFU: {peak} TFLOP/s dense bf16" if peak else "MFU: unknown device, pass --peak-tflops")
    print("| variant | step (ms) | vs plain | tokens/s | MFU | host (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")

    def mfu(rate: float) -> str:
        return f"{100 * rate * flops / (peak * 1e12):.1f} %" if peak else "n/a"

    medians = {v: statistics.median(times[v]) for v in args.variants}
    for variant in args.variants:
        t = medians[variant]
        plain = medians.get("plain compiled" if variant in COMPILED else "plain")  # compiled against compiled
        ratio = f"{t / plain:.3f}" if plain else "n/a"
        host = 1000 * statistics.median(hosts[variant])
        print(f"| {variant} | {1000 * t:.1f} | {ratio} | {tokens / t:,.0f} | {mfu(tokens / t)} | {host:.1f} |")
    if args.profile:
        profile(runs, batches)
    if args.trainer_steps:
        runs.clear()  # the trainer's process needs the memory
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        r = trainer_run(args, config, base)
        plain = tokens / medians["plain compiled"]
        step_rate, period_rate = r["tokens"] / r["step_s"], r["tokens"] / r["period_s"]
        logged = f"{100 * r['logged_mfu']:.1f} %" if r["logged_mfu"] is not None else "n/a"
        print(
            f"\n`python {r['command']}`: {r['steps']} steps after its first {args.warmup + 2} "
            f"({r['seconds']:.0f} s in all, compilation included); MFU as it logs it: {logged}"
            + ("" if r["same_flops"] else f"; its FLOPs per token {r['flops_per_token']:.4g}, not this model's")
        )
        print("| run | step (ms) | tokens/s | MFU | vs plain compiled |")
        print("| --- | --- | --- | --- | --- |")
        t = medians["plain compiled"]
        print(f"| plain compiled (this process) | {1000 * t:.1f} | {plain:,.0f} | {mfu(plain)} | 1.000 |")
        for what, seconds, rate in (("step", r["step_s"], step_rate), ("period", r["period_s"], period_rate)):
            row = f"| dtcore.train --preset {args.trainer_preset}, {what} | {1000 * seconds:.1f} | {rate:,.0f} |"
            print(f"{row} {mfu(rate)} | {rate / plain:.3f} |")
    dtcore.shutdown()


if __name__ == "__main__":
    main()
