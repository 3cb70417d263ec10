"""Train a small GPT with dtcore: the main job.

    torchrun --standalone --nproc_per_node=2 examples/train_gpt.py [--preset small] [--steps 60]

Runs unchanged on GPUs (NCCL, bf16 autocast) and on CPU (Gloo). Rank 0 prints loss, tokens/s
and step time; the job fails (exit 1) if the loss did not fall.
"""

import argparse
import contextlib
import sys
import time

import torch

import dtcore
from dtcore.train.config import SHAPES
from dtcore.train.demo.data import from_text, make_corpus
from dtcore.train.demo.gpt import GPT, num_parameters, shape, uniform_loss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step (no_sync for all but the last)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()

    ctx = dtcore.init(seed=1234)
    config = SHAPES[args.preset]
    # every rank takes its own sequences of each epoch (seed: the same order of them on every rank)
    tokenizer, data, _ = from_text(make_corpus(), "char", config.block_size, args.batch, ctx.rank, ctx.world_size, 1234)
    config = shape(config, tokenizer.vocab_size)  # the characters' vocabulary where the size names none
    model = GPT(config).to(ctx.device)
    model = dtcore.wrap(model)  # parameters from rank 0; gradients averaged during backward
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    cuda = ctx.device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    if dtcore.is_main_process():
        print(
            f"gpt {args.preset}: {num_parameters(model) / 1e6:.2f}M parameters, {ctx.world_size} rank(s), "
            f"backend {ctx.backend}, {args.batch}x{config.block_size} tokens per rank per micro-batch",
            flush=True,
        )

    first = last = None
    tokens_per_step = ctx.world_size * args.accum * args.batch * config.block_size
    window, window_start = 0, time.perf_counter()
    for step in range(1, args.steps + 1):
        for micro in range(args.accum):
            x, y = (t.to(ctx.device) for t in data.next_batch())
            sync = micro == args.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync(), autocast:
                loss = model(x, y) / args.accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        reported = dtcore.all_reduce(loss.detach().float() * args.accum, op="avg").item()
        first = reported if first is None else first
        last = reported
        window += 1
        if step % args.log_every == 0 or step == args.steps:
            if cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - window_start
            if dtcore.is_main_process():
                print(
                    f"step {step:4d} | loss {reported:.3f} | {tokens_per_step * window / elapsed:8.0f} tokens/s | "
                    f"{1000 * elapsed / window:6.1f} ms/step",
                    flush=True,
                )
            window, window_start = 0, time.perf_counter()

    fell = last < first
    if dtcore.is_main_process():
        print(
            f"loss fell from {first:.3f} to {last:.3f} (uniform guess: {uniform_loss(config.vocab_size):.3f}): "
            f"{'OK' if fell else 'DID NOT FALL'}",
            flush=True,
        )
    dtcore.shutdown()
    return 0 if fell else 1


if __name__ == "__main__":
    sys.exit(main())
