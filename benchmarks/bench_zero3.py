"""ZeRO-3 (dtcore.wrap(zero=3) + dtcore.ShardedOptimizer) against torch FSDP2 (fully_shard) and
dtcore's own zero=2: step time and peak memory per rank, on Gloo over loopback.

    python benchmarks/bench_zero3.py time [--world 2] [--preset 20m] [--steps 10] [--warmup 2] [--batch 4]
        [--variants fsdp2,zero3,zero2] [--no-shm] [--json PATH]
    python benchmarks/bench_zero3.py memory [--world 2] [--preset 20m] [--variants fsdp2,zero3,zero2] [--where]
        [--no-shm] [--json PATH]
    python benchmarks/bench_zero3.py large [--world 4] [--layers 20] [--width 2048] [--steps 3] [--json PATH]

The variants, each over its own copy of the same model (same initial weights), fp32 throughout:
  fsdp2  torch FSDP2: fully_shard on each transformer block, then on the root, over a CPU device
         mesh of the whole job (init_device_mesh("cpu", (world,)) on the Gloo group dtcore.init()
         set up); torch.optim.AdamW; torch.nn.utils.clip_grad_norm_ (on the DTensor gradients)
  zero3  dtcore.wrap(model, zero=3); dtcore.ShardedOptimizer(model, torch.optim.AdamW, ...);
         dtcore.clip_grad_norm_
  zero2  dtcore.wrap(model, zero=2); the same optimizer and clipping
AdamW(lr=1e-4, weight_decay=0.1, foreach=False) everywhere; clipping to norm 1.0. A step is
forward + backward + clip + optimizer step + zero_grad. --variants picks a subset (e.g.
fsdp2,zero2 where zero=3 is not there yet).

--preset names the model: the GPT shapes of dtcore.train.config.SHAPES (its units are model.blocks), or
bench_reducer's llama25m, transformers' LlamaForCausalLM with random weights (units are
model.model.layers), built by bench_reducer's make_model.

time: one job; every rank holds all the variants and runs them alternately, step by step (each
after a barrier), so that drift and noise hit all alike; medians over --steps after --warmup. Also
the process's CPU time per step (all its threads: time.process_time) and the bytes rank 0 writes
per step (/proc/self/io's wchar: Gloo's socket writes, plus the store's small heartbeats), as
bench_zero.py measures them. The ratios dtcore zero=3 / FSDP2 and dtcore zero=3 / dtcore zero=2
are the zero3 row's.

memory: one job per variant, measured as bench_zero.py does: each rank records every CPU
allocation and free with torch's profiler (profile_memory=True), from before the model is built to
the end of the fourth step, and reports the peak of the bytes it holds during steps 3-4 (the
steady state), plus its share of dtcore's buffers in shared memory, which the profiler does not
see. Batch 1 x 16 tokens, so that activations are small. Next to the formula for fp32 AdamW with
Psi parameters over N ranks: ZeRO-3 (FSDP2 and dtcore zero=3) 16 Psi / N plus two units' full
parameters and gradients (the one in use and the one prefetched; a unit is the largest block:
2 x (4 + 4) x its parameter count bytes); zero=2 4 Psi + 12 Psi / N. --where also lists, for rank
0, the allocations live at that peak (1 MiB and up, by the ops that made them).

dtcore's collectives between ranks of one host go through shared memory by default (DTCORE_SHM,
docs/knobs.md), so its "sent" reads about 0 (the store's heartbeats); FSDP2's go through Gloo's
sockets, where torch runs a reduce-scatter as a whole allreduce. --no-shm runs the job with
DTCORE_SHM=0: dtcore through Gloo's sockets too.

large: dtcore zero=3 alone, on a GPT too large for one rank's share of the machine (the default,
20 layers of width 2048, is 1.01B parameters: 16.1 GB of fp32 AdamW state, against 24 GiB for 4
ranks). It is built on the meta device and materialised unit by unit by dtcore.wrap; then --steps
AdamW steps (batch 1 x 64 tokens, clipping). Each rank's peak resident memory (ru_maxrss) after the
wrap and after the steps, next to 16 Psi / N, and the step times.

--json PATH writes the numbers (rank 0's reports, with the settings) as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from bench_reducer import LLAMA, LlamaLM, make_model
from bench_zero import _MARK, live_at_peak, shared_buffer_bytes

from dtcore.train.config import SHAPES
from dtcore.train.demo.data import TokenData, Tokenizer, from_text, make_corpus
from dtcore.train.demo.gpt import num_parameters

from ranks import bytes_written, rank0_report

LABELS = {"fsdp2": "torch FSDP2", "zero3": "dtcore zero=3", "zero2": "dtcore zero=2"}
OPTIM = {"lr": 1e-4, "weight_decay": 0.1, "foreach": False}
MAX_NORM = 1.0


def blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's transformer blocks: FSDP2's units (and the largest one is the formula's unit)."""
    if isinstance(model, LlamaLM):
        return model.lm.model.layers
    return model.blocks


def largest_block(model: torch.nn.Module) -> int:
    return max(num_parameters(b) for b in blocks(model))


_mesh = None


def cpu_mesh():
    """A 1-D CPU device mesh over the whole job, on the default (Gloo) group dtcore.init() set up."""
    global _mesh
    if _mesh is None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        _mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return _mesh


def build(variant: str, base: torch.nn.Module):
    """(model, optimizer, clip) for `variant`, over `base` (which FSDP2 shards in place)."""
    import dtcore

    if variant == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = cpu_mesh()
        for block in blocks(base):
            fully_shard(block, mesh=mesh)
        fully_shard(base, mesh=mesh)
        opt = torch.optim.AdamW(base.parameters(), **OPTIM)
        return base, opt, lambda: torch.nn.utils.clip_grad_norm_(base.parameters(), MAX_NORM)
    model = dtcore.wrap(base, zero={"zero3": 3, "zero2": 2}[variant])
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, **OPTIM)
    return model, opt, lambda: dtcore.clip_grad_norm_(model, MAX_NORM)


def step(model, opt, clip, x, y) -> None:
    model(x, y).backward()
    clip()
    opt.step()
    opt.zero_grad()


def steady_peak(prof) -> tuple[int, int]:
    """(peak bytes held after the marker allocation, bytes held at the end), from the profile's memory events."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    held, peak, steady = 0, 0, False
    for _, nbytes in events:
        held += nbytes
        steady = steady or nbytes == _MARK
        if steady:
            peak = max(peak, held)
    return peak, held


def memory_worker(args) -> None:
    from torch.profiler import ProfilerActivity, profile

    import dtcore

    ctx = dtcore.init(timeout=600)
    tokenizer, data, _ = from_text(make_corpus(), "char", 16, 1, ctx.rank, ctx.world_size, seed=0)
    batches = [data.next_batch() for _ in range(4)]
    if args.variant == "fsdp2":
        cpu_mesh()  # outside the profile: the mesh is not the model's
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        base, _ = make_model(args.preset, tokenizer.vocab_size)
        params, unit = num_parameters(base), largest_block(base)
        model, opt, clip = build(args.variant, base)
        for i, (x, y) in enumerate(batches):
            if i == 2:
                del_me = torch.empty(_MARK, dtype=torch.uint8)
                del del_me
            step(model, opt, clip, x, y)
    peak, held = steady_peak(prof)
    shared = shared_buffer_bytes() // ctx.world_size  # held through steps 3-4, unseen by the profiler
    peak, held = peak + shared, held + shared
    if ctx.rank == 0:
        report = {"variant": args.variant, "peak": peak, "held": held, "params": params, "unit": unit}
        report["shared"] = shared
        if args.where:
            report["where"] = live_at_peak(prof)
        print(json.dumps(report), flush=True)
    dtcore.shutdown()


def time_worker(args) -> None:
    import dtcore

    ctx = dtcore.init(timeout=600)
    variants = args.variants.split(",")
    text = make_corpus()
    tokenizer = Tokenizer("char", text)
    base, block_size = make_model(args.preset, tokenizer.vocab_size)
    data = TokenData(tokenizer.encode(text), block_size, args.batch, ctx.rank, ctx.world_size, seed=0)
    runs = {v: build(v, copy.deepcopy(base)) for v in variants}  # fully_shard shards its copy in place
    times: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    sent: dict[str, list[int]] = {v: [] for v in variants}
    for i in range(args.warmup + args.steps):
        x, y = data.next_batch()
        for v, (model, opt, clip) in runs.items():
            dtcore.barrier()
            start, cpu_start, written = time.perf_counter(), time.process_time(), bytes_written()
            step(model, opt, clip, x, y)
            if i >= args.warmup:
                times[v].append(time.perf_counter() - start)
                cpu[v].append(time.process_time() - cpu_start)
                sent[v].append(bytes_written() - written)
    if ctx.rank == 0:
        report = {"params": num_parameters(base), "unit": largest_block(base), "block_size": block_size}
        report |= {v: statistics.median(t) for v, t in times.items()}
        report |= {f"{v} cpu": statistics.median(t) for v, t in cpu.items()}
        print(json.dumps(report | {f"{v} sent": statistics.median(b) for v, b in sent.items()}), flush=True)
    dtcore.shutdown()


def large_worker(args) -> None:
    import resource

    import dtcore
    from dtcore.train.demo.gpt import GPT, GPTConfig

    def peak_rss() -> int:  # bytes; Linux reports KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    ctx = dtcore.init(timeout=1200)
    config = GPTConfig(n_layer=args.layers, n_head=16, n_embd=args.width, block_size=64, vocab_size=64)
    with torch.device("meta"):
        base = GPT(config)
    params, unit = num_parameters(base), largest_block(base)
    start = time.perf_counter()

    def init(m: torch.nn.Module) -> None:  # torch's own initialisation, then the GPT's (std 0.02)
        m.reset_parameters()
        GPT._init(m)

    model = dtcore.wrap(base, zero=3, init=init)
    wrap_s, after_wrap = time.perf_counter() - start, peak_rss()
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, **OPTIM)
    data = torch.Generator().manual_seed(ctx.rank)
    times, losses = [], []
    for _ in range(args.steps):
        tokens = torch.randint(0, 64, (1, 65), generator=data)
        start = time.perf_counter()
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        dtcore.clip_grad_norm_(model, MAX_NORM)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peaks = dtcore.all_gather(torch.tensor([after_wrap, peak_rss()], dtype=torch.int64))  # (N, 2)
    if ctx.rank == 0:
        report = {"params": params, "unit": unit, "wrap_s": wrap_s, "times": times, "losses": losses}
        print(json.dumps(report | {"peaks": peaks.tolist()}), flush=True)
    dtcore.shutdown()


def large(args) -> dict:
    extra = ["--layers", str(args.layers), "--width", str(args.width), "--steps", str(args.steps)]
    r = launch(args, extra)
    n, psi = args.world, r["params"]
    print(
        f"{n} ranks (Gloo), GPT of {args.layers} layers x width {args.width} built on meta: {psi / 1e9:.3f}B "
        f"parameters, full fp32 AdamW state 16Ψ = {16 * psi / 2**30:.1f} GiB; 16Ψ/N = {16 * psi / n / 2**30:.2f} GiB; "
        f"a unit {r['unit'] / 1e6:.1f}M parameters; wrap (materialise + shard) {r['wrap_s']:.1f} s"
    )
    print("| rank | peak RSS after wrap (GiB) | peak RSS after the steps (GiB) | peak / (16Ψ/N) |")
    print("| --- | --- | --- | --- |")
    for rank, (wrapped, trained) in enumerate(r["peaks"]):
        print(f"| {rank} | {wrapped / 2**30:.2f} | {trained / 2**30:.2f} | {trained / (16 * psi / n):.2f} |")
    times, losses = (", ".join(f"{x:.{d}f}" for x in r[k]) for k, d in (("times", 1), ("losses", 3)))
    print(f"step times (s): {times}; losses: {losses}")
    return r


def transport(args) -> str:
    return "dtcore through shared memory" if args.shm else "dtcore through Gloo's sockets (DTCORE_SHM=0)"


def launch(args, extra: list[str]) -> dict:
    common = [args.mode, "--worker", "--preset", args.preset, *(["--where"] if args.where else [])]
    return rank0_report(__file__, args.world, [*common, *extra], **({} if args.shm else {"DTCORE_SHM": "0"}))


def formula(variant: str, params: int, unit: int, n: int) -> tuple[str, float]:
    """The variant's fp32 AdamW formula (its text, bytes) per rank."""
    if variant == "zero2":
        return "4Ψ + 12Ψ/N", 4 * params + 12 * params / n
    return "16Ψ/N + 2 units", 16 * params / n + 2 * (4 + 4) * unit


def memory(args, variants: list[str]) -> dict:
    n = args.world
    reports = {v: launch(args, ["--variant", v]) for v in variants}
    r0 = next(iter(reports.values()))
    psi, unit = r0["params"], r0["unit"]
    zero3 = formula("zero3", psi, unit, n)[1]
    print(
        f"{n} ranks (Gloo), preset {args.preset} ({psi / 1e6:.2f}M parameters, largest block {unit / 1e6:.2f}M), "
        f"fp32 AdamW (foreach=False), batch 1x16, peak bytes held in steps 3-4, {transport(args)}"
    )
    print(
        f"ZeRO-3 formula: 16Ψ/N = {16 * psi / n / 2**20:.1f} MiB, "
        f"+ 2 units (2 x 8 bytes x largest block) = {zero3 / 2**20:.1f} MiB"
    )
    print("| variant | peak (MiB) | formula | formula (MiB) | peak / formula | peak / ZeRO-3 formula |")
    print("| --- | --- | --- | --- | --- | --- |")
    for v, r in reports.items():
        text, value = formula(v, psi, unit, n)
        r["formula"] = value
        print(
            f"| {LABELS[v]} | {r['peak'] / 2**20:.1f} | {text} | {value / 2**20:.1f} | {r['peak'] / value:.3f} | "
            f"{r['peak'] / zero3:.3f} |"
        )
    for v, r in reports.items():
        if r.get("where"):
            w = r["where"]
            print(f"\n{LABELS[v]}, rank 0, live at the peak (running: {w['running']}):")
            for row in w["live"]:
                print(f"  {row['MiB']:7.1f} MiB in {row['count']:3d}: {row['made by']}")
    return reports


def timing(args, variants: list[str]) -> dict:
    extra = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)]
    r = launch(args, [*extra, "--variants", ",".join(variants)])
    print(
        f"{args.world} ranks (Gloo, 1 thread each), preset {args.preset} ({r['params'] / 1e6:.2f}M parameters, fp32), "
        f"batch {args.batch}x{r['block_size']} per rank, median of {args.steps} steps after {args.warmup} warm-up, "
        f"alternating, {transport(args)}; step = forward + backward + clip + AdamW + zero_grad"
    )
    print("| variant | step (ms) | ratio to FSDP2 | ratio to dtcore zero=2 | CPU (ms) | sent per step, rank 0 (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for v in variants:
        to_fsdp = f"{r[v] / r['fsdp2']:.3f}" if "fsdp2" in r else ""
        to_zero2 = f"{r[v] / r['zero2']:.3f}" if "zero2" in r else ""
        cpu, mib = 1000 * r[f"{v} cpu"], r[f"{v} sent"] / 2**20
        print(f"| {LABELS[v]} | {1000 * r[v]:.0f} | {to_fsdp} | {to_zero2} | {cpu:.0f} | {mib:.1f} |")
    if "zero3" in r:
        for peer in ("fsdp2", "zero2"):
            if peer in r:
                r[f"zero3 / {peer}"] = r["zero3"] / r[peer]
                print(f"dtcore zero=3 / {LABELS[peer]}: {r['zero3'] / r[peer]:.3f}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("memory", "time", "large"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--preset", default="20m", choices=sorted([*SHAPES, *LLAMA]))
    ap.add_argument("--variants", default=",".join(LABELS), help=f"comma-separated, of {', '.join(LABELS)}")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--layers", type=int, default=20, help="large: the GPT's layers")
    ap.add_argument("--width", type=int, default=2048, help="large: the GPT's width (n_embd)")
    ap.add_argument("--where", action="store_true", help="memory: list what is live at each variant's peak")
    ap.add_argument(
        "--shm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="dtcore's collectives through shared memory on one host (DTCORE_SHM=auto); --no-shm: through Gloo's "
        "sockets, as FSDP2's",
    )
    ap.add_argument("--json", metavar="PATH", help="write the numbers to PATH as JSON")
    ap.add_argument("--variant", choices=sorted(LABELS), help=argparse.SUPPRESS)  # memory worker's one
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(LABELS))
    if unknown or not variants:
        ap.error(f"--variants: unknown {unknown}; choose from {', '.join(LABELS)}")
    args.variants = ",".join(variants)
    workers = {"memory": memory_worker, "time": time_worker, "large": large_worker}
    if args.worker:
        return workers[args.mode](args)
    if args.mode == "large" and args.steps == 10:  # time's default: a few steps are enough here
        args.steps = 3
    results = {"memory": memory, "time": timing, "large": lambda a, _: large(a)}[args.mode](args, variants)
    if args.json:
        settings = {
            "mode": args.mode,
            "world": args.world,
            "preset": args.preset,
            "variants": variants,
            "shm": args.shm,
        }
        if args.mode == "time":
            settings |= {"steps": args.steps, "warmup": args.warmup, "batch": args.batch}
        with open(args.json, "w") as f:
            json.dump(settings | {"results": results}, f, indent=2)


if __name__ == "__main__":
    main()
