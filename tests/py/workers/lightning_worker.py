"""One rank of Lightning's Trainer with dtcore's strategy, against Lightning's DDPStrategy on the same data.

    lightning_worker.py compare DIR   (torchrun-style env, 2 ranks) DDP vs dtcore zero=0, zero=2 (gradient
                                      accumulation and clipping), zero=3, zero=2 under manual optimization;
                                      then zero=1 fit with a checkpoint
                                      each epoch, and a new Trainer resuming from the first one; the same
                                      from DDPStrategy's checkpoint file, resumed at zero=2
    lightning_worker.py resume DIR    (1 rank, SLURM-style env) the 2-rank checkpoint resumed at zero=2 on the
                                      whole batch; DDP vs zero=2 under bf16-mixed, bf16-true and 64-true
    lightning_worker.py launcher      (started alone) Trainer(devices=2) starts the second rank itself; then DDP

Every fit is followed by trainer.validate. Each run prints one JSON line: every training_step's loss on
this rank, by fit.
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import dtcore
from dtcore.integrations.lightning import DtcoreStrategy

BATCH = 8  # per rank
EPOCH = 2 * BATCH * 5  # samples: 5 steps an epoch at 2 ranks
ENVIRONMENTS: list[str] = []  # Lightning's cluster environment of each fit
TRAINERS: list[L.Trainer] = []
VALIDATED: list[float] = []
LOGGED: list[float] = []  # the last step's train_loss, as logged with sync_dist=True


class Net(L.LightningModule):
    """A few Linear layers with a frozen one and a buffer; AdamW over two groups with a per-step SequentialLR."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.frozen = torch.nn.Linear(16, 16).requires_grad_(False)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32))
        self.head = torch.nn.Linear(32, 4)
        self.register_buffer("scale", torch.tensor(0.5))
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.frozen(x) * self.scale + x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.losses.append(loss.item())
        self.log("train_loss", loss, sync_dist=True)  # the strategy's reduce: averaged over the ranks
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)

    def on_train_end(self) -> None:
        self.gathered = self.all_gather(torch.tensor([float(self.global_rank)])).flatten().tolist()
        # sync_grads=True: each rank's input gets the sum over ranks of its row's gradient (1 + 2)
        x = torch.ones(1, requires_grad=True)
        (self.all_gather(x, sync_grads=True).sum() * (self.global_rank + 1)).backward()
        self.gathered_grad = x.grad.item()

    def configure_optimizers(self):
        # Two groups, and a warmup then a decay: SequentialLR steps its inner schedulers, which hold the
        # optimizer given (under ZeRO the ShardedOptimizer must take their learning rates too).
        groups = [{"params": self.body.parameters()}, {"params": self.head.parameters(), "lr": 0.01}]
        opt = torch.optim.AdamW(groups, lr=0.02, weight_decay=0.01)
        warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
        decay = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
        sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, decay], milestones=[2])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ManualNet(Net):
    """Net under manual optimization: its own backward, clipping and steps."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt, sched = self.optimizers(), self.lr_schedulers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.losses.append(loss.item())
        self.log("train_loss", loss, sync_dist=True)
        opt.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=0.05, gradient_clip_algorithm="norm")
        opt.step()
        sched.step()


def loader(samples: int, batch: int = BATCH) -> DataLoader:
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(samples, 16, generator=g), torch.randint(0, 4, (samples,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch)  # Lightning adds the DistributedSampler


def fit(
    strategy, devices=2, ckpt_path=None, callbacks=(), batch=BATCH, samples=2 * BATCH * 40, net=Net, **trainer_args
):
    """The losses of every training_step on this rank (trainer.validate's loss afterwards in VALIDATED)."""
    model = net()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_args,
    )
    trainer.fit(model, loader(samples, batch), ckpt_path=ckpt_path)
    ENVIRONMENTS.append(type(trainer.strategy.cluster_environment).__name__)
    TRAINERS.append(trainer)
    LOGGED.append(float(trainer.callback_metrics["train_loss"]))
    (metrics,) = trainer.validate(model, loader(2 * BATCH * 3, batch), verbose=False)  # the model fit() left
    VALIDATED.append(metrics["val_loss"])
    return model.losses


def compare(folder: Path) -> dict:
    out = {}
    out["ddp"] = fit(DDPStrategy(), max_steps=20)
    out["zero0"] = fit(DtcoreStrategy(zero=0), max_steps=20)
    out["logged"] = LOGGED[:]  # DDP's, dtcore's
    out["gathered"] = [(m.gathered, m.gathered_grad) for m in (t.lightning_module for t in TRAINERS)]
    clipped = dict(max_steps=20, accumulate_grad_batches=2, gradient_clip_val=0.05)
    out["ddp_acc"] = fit(DDPStrategy(), **clipped)
    out["zero2_acc"] = fit(DtcoreStrategy(zero=2), **clipped)
    out["zero3"] = fit("dtcore_zero3", max_steps=20)
    out["validated"] = VALIDATED[:]  # ddp, zero0, ddp_acc, zero2_acc, zero3
    out["ddp_manual"] = fit(DDPStrategy(), max_steps=10, net=ManualNet)
    out["zero2_manual"] = fit(DtcoreStrategy(zero=2), max_steps=10, net=ManualNet)
    # Resume: 2 epochs of 5 steps uninterrupted (a checkpoint each epoch), then a new Trainer from the first.
    epoch = dict(max_epochs=2, samples=EPOCH)
    saver = ModelCheckpoint(dirpath=folder, filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    out["full"] = fit(DtcoreStrategy(zero=1), callbacks=[saver], **epoch)
    out["resumed"] = fit(DtcoreStrategy(zero=1), ckpt_path=str(folder / "epoch=0.ckpt"), **epoch)
    out["checkpoint_is_dir"] = (folder / "epoch=0.ckpt" / "manifest.json").is_file()
    # A file DDPStrategy saved, resumed by dtcore (zero=2: its whole optimizer state cut into shards).
    files = ModelCheckpoint(dirpath=folder / "ddp", filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    out["ddp_full"] = fit(DDPStrategy(), callbacks=[files], **epoch)
    out["ddp_resumed"] = fit(DtcoreStrategy(zero=2), ckpt_path=str(folder / "ddp" / "epoch=0.ckpt"), **epoch)
    return out


def launcher() -> dict:
    zero0 = fit(DtcoreStrategy(), max_steps=5)
    ddp = fit(DDPStrategy(), max_steps=5)  # in the same processes: the launcher started them once
    return {"zero0": dtcore.gather_object(zero0), "ddp": dtcore.gather_object(ddp)}


def main() -> None:
    mode = sys.argv[1]
    if mode == "compare":
        result = compare(Path(sys.argv[2]))
    elif mode == "resume":
        ckpt = str(Path(sys.argv[2]) / "epoch=0.ckpt")
        # The whole batch of both ranks on one: the same averaged gradient, so the same losses (averaged).
        resumed = fit(DtcoreStrategy(zero=2), devices=1, ckpt_path=ckpt, batch=2 * BATCH, samples=EPOCH, max_epochs=2)
        TRAINERS[-1].save_checkpoint(Path(sys.argv[2]) / "after_fit.ckpt")  # once fit() has unwrapped the model
        result = {"resumed": resumed, "saved_after_fit": (Path(sys.argv[2]) / "after_fit.ckpt/manifest.json").is_file()}
        for precision in ("bf16-mixed", "bf16-true", "64-true"):  # Lightning's precision plugins, at zero=2
            for name, strategy in (("ddp", DDPStrategy()), ("zero2", DtcoreStrategy(zero=2))):
                result[f"{name} {precision}"] = fit(strategy, devices=1, precision=precision, max_steps=5)
    else:
        result = launcher()
    result["environments"] = ENVIRONMENTS
    result["launcher"] = dtcore.get_context().launcher
    result["rank"] = dtcore.get_context().rank
    if mode != "launcher" or result["rank"] == 0:  # the ranks Lightning starts share its stdout
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
