"""dtcore's integrations against the same loop written with dtcore directly: step time.

    python benchmarks/bench_integrations.py [--world 2] [--zero 2] [--preset 20m] [--steps 8] [--rounds 6]

One job of --world ranks on loopback (torchrun's variables). Every rank runs, --rounds times, in an
order that rotates each round, --steps steps of each side:
  dtcore        the hand-written loop: dtcore.wrap + dtcore.ShardedOptimizer (AdamW at zero=0) over a
                DistributedSampler'd DataLoader;
  lightning     Lightning's Trainer(strategy=DtcoreStrategy(zero=...)) over a LightningModule around the
                same model (no logger, progress bar or checkpoints);
  accelerate    dtcore.integrations.accelerate's Accelerator(dtcore_plugin=DtcorePlugin(zero=...)):
                prepare(model, optimizer, loader), accelerator.backward, step, zero_grad;
  transformers  Hugging Face's Trainer as dtcore.integrations.transformers.Trainer(dtcore_plugin=
                DtcorePlugin(zero=...)) over a module around the same model whose forward returns
                {"loss": ...}: a Dataset of dicts, the Trainer's default collator, the optimizer passed in
                with a constant LR scheduler (no clipping, logging, evaluation, checkpoints or progress bar);
  dtcore_norm   the hand-written loop, also taking the gradients' global norm at every step, as the Trainer
                does to log it (transformers 5.23: whatever max_grad_norm is).
The model is the demo GPT (--preset), AdamW (foreach=False). A step is the time from one batch's
start to the next's (data, forward, backward, optimizer step, and the integration's hooks), in wall
time and in the process's CPU time (which other processes on the machine disturb less); the first two
of each run are left out (the buckets' first plan, the optimizer's shards cut). Rank 0 prints each
side's median, and for each integration its ratio over the hand-written loop per round and the
median of those ratios; for the Trainer also over dtcore_norm (transformers_over_dtcore_norm_*).
dtcore.init() runs once per rank, first; each side's objects (the Trainers, Accelerators, wrapped models)
are built afresh each round and find that context.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time

import lightning as L
import torch
import transformers
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

import dtcore
from dtcore.integrations.accelerate import Accelerator, DtcorePlugin
from dtcore.integrations.lightning import DtcoreStrategy
from dtcore.integrations.transformers import Trainer
from dtcore.train.config import SHAPES
from dtcore.train.demo.gpt import GPT, shape

from ranks import rank0_report

VOCAB = 256
WARMUP = 2


class LitGPT(L.LightningModule):
    def __init__(self, gpt: torch.nn.Module) -> None:
        super().__init__()
        self.gpt = gpt

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.gpt(x, y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, foreach=False)


def now() -> tuple[float, float]:
    """(wall, CPU) seconds: the CPU time is this process's, all its threads (Gloo's, dtcore's) included."""
    return time.perf_counter(), time.process_time()


def steps_between(marks: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(wall, CPU) of each step from one mark to the next, the first WARMUP left out."""
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])][WARMUP:]


class Clock(L.Callback):
    """When each training batch starts, and when the fit ends."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.marks.append(now())

    def on_train_end(self, trainer, pl_module) -> None:
        self.marks.append(now())


class LMGPT(torch.nn.Module):
    """The demo GPT as the Trainer calls a model: keyword batches in, {"loss": ...} out (GPT's forward returns
    the loss alone)."""

    def __init__(self, gpt: torch.nn.Module) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.gpt(input_ids, labels)}


class TrainerClock(transformers.TrainerCallback):
    """Clock's marks from the Trainer's events: when each optimizer step starts, and when training ends. The Trainer
    takes a step's batch from its loader just before on_step_begin: one mark to the next is still one batch's data,
    forward, backward and optimizer step."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.marks.append(now())

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.marks.append(now())


class Dicts(Dataset):
    """data()'s samples as the Trainer takes them: {"input_ids", "labels"}, stacked by its default collator."""

    def __init__(self, tensors: TensorDataset) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.tensors[i]
        return {"input_ids": x, "labels": y}


def data(args) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (args.world * args.batch * (args.steps + 1), args.block + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def model(args) -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT(shape(SHAPES[args.preset], VOCAB))


def lightning_steps(args) -> list[tuple[float, float]]:
    clock = Clock()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.world,
        strategy=DtcoreStrategy(zero=args.zero),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    trainer.fit(LitGPT(model(args)), DataLoader(data(args), batch_size=args.batch))
    return steps_between(clock.marks)


def hand_steps(args, norm: bool = False) -> list[tuple[float, float]]:
    """The hand-written loop; with `norm`, also the gradients' global norm at every step, as transformers' Trainer
    takes it to log it (clip_grad_norm_ with an infinite bound) whatever max_grad_norm is."""
    ctx = dtcore.get_context()
    dataset = data(args)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=DistributedSampler(dataset, shuffle=False))
    net = dtcore.wrap(model(args), zero=args.zero)
    if args.zero:
        opt = dtcore.ShardedOptimizer(net, torch.optim.AdamW, lr=3e-4, foreach=False)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4, foreach=False)
    marks = []
    for step, (x, y) in enumerate(loader):
        marks.append(now())
        if step == args.steps:
            break
        net(x.to(ctx.device), y.to(ctx.device)).backward()
        if norm:
            dtcore.clip_grad_norm_(net, float("inf"))  # over the shards at zero>=2, as the Trainer's accelerator
        opt.step()
        opt.zero_grad()
    return steps_between(marks)


def accelerate_steps(args) -> list[tuple[float, float]]:
    accelerator = Accelerator(dtcore_plugin=DtcorePlugin(zero=args.zero))
    net = model(args)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, foreach=False)
    net, opt, loader = accelerator.prepare(net, opt, DataLoader(data(args), batch_size=args.batch))
    marks = []
    for step, (x, y) in enumerate(loader):
        marks.append(now())
        if step == args.steps:
            break
        accelerator.backward(net(x, y))
        opt.step()
        opt.zero_grad()
    return steps_between(marks)


def transformers_steps(args) -> list[tuple[float, float]]:
    cpu = not torch.cuda.is_available()
    clock = TrainerClock()
    net = LMGPT(model(args))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, foreach=False)
    # The others step no scheduler: a constant one (the Trainer points it at the ShardedOptimizer at zero>=1).
    constant = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    with tempfile.TemporaryDirectory() as out:  # nothing is saved there (save_strategy="no")
        training_args = transformers.TrainingArguments(
            output_dir=out,
            use_cpu=cpu,
            ddp_backend="gloo" if cpu else None,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            max_grad_norm=0,  # no clipping, as the other sides
            # No shuffling, as the other sides (the Trainer's default shuffles): accelerate deals consecutive batches
            # to the ranks, the hand-written loop's samples at --batch 1. The tokens are random, so the order would
            # not change a step's time anyway.
            train_sampling_strategy="sequential",
            dataloader_num_workers=0,
            dataloader_pin_memory=False,  # the other sides' loaders do not pin
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=net,
            args=training_args,
            train_dataset=Dicts(data(args)),
            optimizers=(opt, constant),
            callbacks=[clock],
            dtcore_plugin=DtcorePlugin(zero=args.zero),
        )
        # disable_tqdm's stand-in prints the train() summary on rank 0: stdout is this script's report.
        trainer.remove_callback(transformers.PrinterCallback)
        trainer.train()
    # The Trainer trained through dtcore: a dtcore model, a ShardedOptimizer under accelerate's wrapper at zero>=1.
    sharded = isinstance(trainer.optimizer.optimizer, dtcore.ShardedOptimizer)
    if not isinstance(trainer.model_wrapped, dtcore.DistributedModel) or sharded != (args.zero >= 1):
        raise SystemExit(
            f"the Trainer trained {type(trainer.model_wrapped).__name__} with "
            f"{type(trainer.optimizer.optimizer).__name__} at zero={args.zero}, not through dtcore"
        )
    return steps_between(clock.marks)


def worker(args) -> None:
    dtcore.init(timeout=600)  # the integrations' init() then find this context, with the same world
    runs = {
        "dtcore": hand_steps,
        "lightning": lightning_steps,
        "accelerate": accelerate_steps,
        "transformers": transformers_steps,
        "dtcore_norm": functools.partial(hand_steps, norm=True),
    }
    names = list(runs)
    medians: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}  # per round: (wall, CPU)
    for round_ in range(args.rounds):
        first = round_ % len(names)
        for name in names[first:] + names[:first]:  # each goes first in turn
            steps = runs[name](args)
            medians[name].append(tuple(statistics.median(s[i] for s in steps) for i in (0, 1)))
    if dtcore.get_context().rank == 0:
        # A ratio per round (the sides ran minutes apart at most), then their median: a machine whose load
        # changes from one round to the next moves the sides of a round alike.
        report: dict = {}
        for i, what in enumerate(("wall", "cpu")):
            for name, rounds in medians.items():
                report[f"{name}_{what}_ms"] = round(statistics.median(r[i] for r in rounds) * 1e3, 2)
            # Each integration against the loop; the Trainer also against the loop that takes the norm as it does.
            pairs = [(name, "dtcore") for name in names[1:]] + [("transformers", "dtcore_norm")]
            for name, base in pairs:
                ratios = [theirs[i] / own[i] for theirs, own in zip(medians[name], medians[base])]
                label = name if base == "dtcore" else f"{name}_over_{base}"
                report[f"{label}_{what}_ratio"] = round(statistics.median(ratios), 4)
                report[f"{label}_{what}_ratios"] = [round(r, 3) for r in ratios]
        print(json.dumps({**report, **vars(args)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--preset", default="20m", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank per step")
    parser.add_argument("--block", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        del args.worker
        worker(args)
        return
    flags = [f"--{k}={v}" for k, v in vars(args).items() if k != "worker"]
    print(json.dumps(rank0_report(__file__, args.world, [*flags, "--worker"])))


if __name__ == "__main__":
    main()
