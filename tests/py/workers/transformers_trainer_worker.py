"""Hugging Face's Trainer with dtcore (dtcore.integrations.transformers) against the stock Trainer (torch DDP).

    transformers_trainer_worker.py OUT           2 ranks, torchrun-style env: each rank writes OUT/report_<rank>.json
    transformers_trainer_worker.py OUT launched  2 ranks under `accelerate launch`: dtcore at zero=2, as in the first
                                                 job; each rank writes OUT/launched_<rank>.json
    transformers_trainer_worker.py OUT alone     1 process, after the first job: its checkpoints resumed at one
                                                 process (and two refused); writes OUT/alone.json

The runs, on a GPT-2 of a small config built from it (no download), a deterministic dataset of token
ids and the same seed: the stock Trainer, with a checkpoint every 5 steps; dtcore at zero=0 (with
torch DDP's options in TrainingArguments); dtcore at zero=2 and at zero=3, each with a checkpoint
every 5 steps, then evaluate and save_model (loaded back with from_pretrained); then from
checkpoint-5 (mid-epoch): dtcore at zero=2 from zero=2's, at zero=1 and zero=3 from zero=2's (other
stages), and at zero=2 from the stock Trainer's (optimizer.pt); the stock Trainer and dtcore at zero=2
with gradient accumulation; the stock Trainer and dtcore at zero=2 with bf16=True; dtcore at zero=3 with
load_best_model_at_end. Each logs its loss at every step (logging_steps=1) and clips gradients (max_grad_norm).
"""

import json
import logging
import os
import sys
import warnings

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments, get_linear_schedule_with_warmup
from transformers import Trainer as StockTrainer

import dtcore
from dtcore.integrations.transformers import CHECKPOINT_FOLDER, DtcorePlugin, Trainer

STEPS, SAVE_EVERY, SEQ, VOCAB = 20, 5, 16, 96
CONFIG = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32)


class Tokens(torch.utils.data.Dataset):
    """n sequences of token ids, the same on every rank and in every run: each its own arithmetic pattern."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i += self.offset
        ids = (torch.arange(SEQ) * (i % 7 + 1) + i) % VOCAB
        return {"input_ids": ids, "labels": ids.clone()}


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    # No dropout: the comparison is of the reduction, not of RNG streams.
    return GPT2LMHeadModel(GPT2Config(**CONFIG, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def arguments(out: str, save: bool, **more) -> TrainingArguments:
    return TrainingArguments(
        **more,
        output_dir=out,
        use_cpu=True,
        ddp_backend="gloo",
        per_device_train_batch_size=4,  # 2 ranks: 8 a step, 10 steps an epoch of 80
        per_device_eval_batch_size=4,
        max_steps=STEPS,
        learning_rate=3e-3,
        warmup_steps=3,
        max_grad_norm=0.5,
        logging_steps=1,
        save_strategy="steps" if save else "no",
        save_steps=SAVE_EVERY,
        report_to="none",
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def own_optimizer(net: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """An optimizer and scheduler a script builds itself, as arguments() would have the Trainer build them."""
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.0)
    return optimizer, get_linear_schedule_with_warmup(optimizer, 3, STEPS)


def losses(trainer, after: int = 0) -> list[float]:
    """The loss of each step past `after` (a resumed run's log_history starts with its checkpoint's)."""
    return [e["loss"] for e in trainer.state.log_history if "loss" in e and e["step"] > after]


def resume(out: str, name: str, checkpoint: str, zero: int, train: Tokens, **more) -> list[float]:
    args = arguments(os.path.join(out, name), False, **more)
    trainer = Trainer(model=model(), args=args, train_dataset=train, dtcore_plugin=DtcorePlugin(zero=zero))
    trainer.train(resume_from_checkpoint=checkpoint)
    return losses(trainer, after=SAVE_EVERY)


def sharded(out: str, zero: int, train: Tokens, evaluation: Tokens) -> dict:
    """dtcore at `zero` with checkpoints; then evaluate, and save_model loaded back by from_pretrained."""
    run = os.path.join(out, f"zero{zero}")
    plugin = DtcorePlugin(zero=zero)
    trainer = Trainer(
        model=model(), args=arguments(run, True), train_dataset=train, eval_dataset=evaluation, dtcore_plugin=plugin
    )
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(os.path.join(out, f"saved{zero}"))
    dtcore.barrier()
    saved = GPT2LMHeadModel.from_pretrained(os.path.join(out, f"saved{zero}")).state_dict()
    trained = trainer.accelerator.get_state_dict(trainer.model_wrapped)  # whole, also where zero=3 shards them
    checkpoint = os.path.join(run, f"checkpoint-{SAVE_EVERY}")
    return {
        "losses": losses(trainer),
        "model": type(trainer.model_wrapped).__name__,
        "optimizer": type(trainer.optimizer.optimizer).__name__,
        "eval_loss": metrics["eval_loss"],
        "saved_mismatched": [k for k, v in trained.items() if not torch.equal(v, saved[k])],
        "checkpoint5": sorted(os.listdir(checkpoint)),
        "dtcore_manifest": os.path.isfile(os.path.join(checkpoint, CHECKPOINT_FOLDER, "manifest.json")),
    }


def launched(out: str, train: Tokens) -> None:
    """dtcore at zero=2 under `accelerate launch`, as the first job's zero=2 run (without its checkpoints)."""
    trainer = Trainer(
        model=model(),
        args=arguments(os.path.join(out, "launched"), False),
        train_dataset=train,
        dtcore_plugin=DtcorePlugin(zero=2),
    )
    trainer.train()
    report = {
        "losses": losses(trainer),
        "model": type(trainer.model_wrapped).__name__,
        "optimizer": type(trainer.optimizer.optimizer).__name__,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "num_processes": trainer.accelerator.num_processes,
        "accelerate_env": sorted(k for k in os.environ if k.startswith("ACCELERATE_")),
    }
    with open(os.path.join(out, f"launched_{dtcore.get_context().rank}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)


class Records(logging.Handler):
    """The WARNING records of dtcore's Trainer integration."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


ONE_PROCESS = dict(gradient_accumulation_steps=2)  # at one process, the global batch of 2 ranks' 4 each: 8


def alone(out: str, train: Tokens) -> None:
    """One process, from the 2-rank job's checkpoints (global batch 8 = 2 x 4 there): refused with
    gradient_accumulation_steps=1 (a global batch of 4) and with an epoch of other steps; with
    gradient_accumulation_steps=2, zero=2's checkpoint at zero=2, and zero=3's (its weights only in its dtcore
    folder) at zero=0."""
    warnings = Records()
    logging.getLogger("dtcore.integrations.transformers").addHandler(warnings)
    checkpoint = {zero: os.path.join(out, f"zero{zero}", f"checkpoint-{SAVE_EVERY}") for zero in (2, 3)}
    report = {"world_size": dtcore.init().world_size, "refused": {}}
    refusals = {
        "batch": (checkpoint[2], train, {}),
        "epoch": (os.path.join(out, "zero2", f"checkpoint-{3 * SAVE_EVERY}"), Tokens(84), ONE_PROCESS),
    }
    for name, (folder, data, more) in refusals.items():
        try:
            resume(out, f"alone_refused_{name}", folder, 2, data, **more)
        except dtcore.ConfigError as e:
            report["refused"][name] = str(e)
    report["zero2"] = resume(out, "alone2", checkpoint[2], 2, train, **ONE_PROCESS)
    report["zero3"] = resume(out, "alone3", checkpoint[3], 0, train, **ONE_PROCESS)
    report["warnings"] = warnings.messages
    with open(os.path.join(out, "alone.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)


def main() -> None:
    out = sys.argv[1]
    train, evaluation = Tokens(80), Tokens(16, offset=1000)
    mode = sys.argv[2] if len(sys.argv) > 2 else "compare"
    if mode != "compare":
        {"launched": launched, "alone": alone}[mode](out, train)
        dtcore.shutdown()
        return
    report = {}

    stock = StockTrainer(model=model(), args=arguments(os.path.join(out, "ddp"), True), train_dataset=train)
    stock.train()
    report["ddp"] = {"losses": losses(stock), "model": type(stock.model_wrapped).__name__}

    # torch DDP's options in TrainingArguments reach dtcore.wrap through the plugin
    args = arguments(os.path.join(out, "zero0"), False, ddp_find_unused_parameters=True, ddp_bucket_cap_mb=1)
    zero0 = Trainer(model=model(), args=args, train_dataset=train)
    zero0.train()
    plugin = zero0.dtcore_plugin
    report["zero0"] = {
        "losses": losses(zero0),
        "model": type(zero0.model_wrapped).__name__,
        "plugin": [plugin.zero, plugin.find_unused_parameters, plugin.bucket_mb],
    }

    for zero in (2, 3):
        report[f"zero{zero}"] = sharded(out, zero, train, evaluation)

    # Gradient accumulation: the Trainer's own, with no_sync on all but the last micro-batch. The optimizer and its
    # scheduler are the script's own (Trainer(optimizers=...)): at zero=2 the scheduler must follow the
    # ShardedOptimizer that replaces the optimizer it was built over.
    accumulate = dict(gradient_accumulation_steps=2)
    net = model()
    stock = StockTrainer(
        model=net,
        args=arguments(os.path.join(out, "ddp_acc"), False, **accumulate),
        train_dataset=train,
        optimizers=own_optimizer(net),
    )
    stock.train()
    args = arguments(os.path.join(out, "zero2_acc"), False, **accumulate)
    net = model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        zero2 = Trainer(
            model=net, args=args, train_dataset=train, dtcore_plugin=DtcorePlugin(zero=2), optimizers=own_optimizer(net)
        )
        zero2.train()
    report["accumulate"] = {
        "ddp": losses(stock),
        "zero2": losses(zero2),
        "scheduler_over": type(zero2.lr_scheduler.optimizer).__name__,
        "warned": [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)],
    }

    # bf16 autocast (CPU), the stock Trainer's torch DDP against dtcore at zero=2
    bf16 = {}
    for name, cls, kwargs in (("ddp", StockTrainer, {}), ("zero2", Trainer, {"dtcore_plugin": DtcorePlugin(zero=2)})):
        args = arguments(os.path.join(out, f"{name}_bf16"), False, bf16=True)
        trainer = cls(model=model(), args=args, train_dataset=train, **kwargs)
        trainer.train()
        bf16[name] = losses(trainer)
    report["bf16"] = bf16

    # load_best_model_at_end at zero=3, told that the highest loss is best: the first checkpoint's weights come back
    # (from its dtcore folder, the model alone: save_only_model)
    best = dict(eval_strategy="steps", eval_steps=SAVE_EVERY, load_best_model_at_end=True, greater_is_better=True)
    args = arguments(os.path.join(out, "best3"), True, metric_for_best_model="eval_loss", save_only_model=True, **best)
    zero3 = Trainer(
        model=model(), args=args, train_dataset=train, eval_dataset=evaluation, dtcore_plugin=DtcorePlugin(zero=3)
    )
    zero3.train()
    report["best"] = {
        "evaluated": [e["eval_loss"] for e in zero3.state.log_history if "eval_loss" in e],
        "checkpoint": os.path.basename(zero3.state.best_model_checkpoint),
        "eval_loss": zero3.evaluate()["eval_loss"],
        "checkpoint5": sorted(os.listdir(os.path.join(out, "best3", f"checkpoint-{SAVE_EVERY}"))),
    }

    checkpoint = os.path.join(out, "zero2", f"checkpoint-{SAVE_EVERY}")
    report["resumed"] = {
        "zero2": resume(out, "resumed2", checkpoint, 2, train),
        "zero1": resume(out, "resumed1", checkpoint, 1, train),
        "zero3": resume(out, "resumed3", checkpoint, 3, train),
        "zero2_from_ddp": resume(out, "resumed_ddp", os.path.join(out, "ddp", f"checkpoint-{SAVE_EVERY}"), 2, train),
    }

    rank = dtcore.get_context().rank
    with open(os.path.join(out, f"report_{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)
    dtcore.shutdown()


if __name__ == "__main__":
    main()
