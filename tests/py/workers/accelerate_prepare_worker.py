"""dtcore behind accelerate's prepare, against accelerate's own torch DDP path on the same data.

Each rank writes its report to OUT/<mode>_<rank>.json.

    accelerate_prepare_worker.py train OUT   2 ranks under `accelerate launch`: accelerate's DDP, then
                                             dtcore at zero=0..3; save_state in the zero=2 run at step 10
    accelerate_prepare_worker.py resume OUT  1 process: load_state of that save, steps 10..19; two refusals

Every run: gradient_accumulation_steps=2 through accelerator.accumulate, clip_grad_norm_, AdamW with
two param groups and an LR scheduler built before prepare, a frozen layer and a buffer the forward
updates; activation checkpointing of the two blocks at zero=1 and zero=3. Each micro-step's global
batch is the same whatever the number of ranks (each rank takes its slice), and the loss reported
is its mean over the whole batch.
"""

import json
import os
import sys
import warnings

import accelerate
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import dtcore
from dtcore.integrations.accelerate import CHECKPOINT_PREFIX, Accelerator, DtcorePlugin

STEPS, SAVE_AT, BATCH = 20, 10, 8


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 32)
        self.fc2 = torch.nn.Linear(32, 32)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(torch.tanh(self.fc1(h)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)
        self.blocks = torch.nn.ModuleList([Block(), Block()])  # what activation checkpointing recomputes
        self.frozen = torch.nn.Linear(32, 32)
        self.frozen.requires_grad_(False)
        self.out = torch.nn.Linear(32, 4)
        self.register_buffer("seen", torch.zeros(()))  # forwards so far: saved, loaded, broadcast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen += 1
        h = torch.tanh(self.inp(x)) * (1 + 0.01 * self.seen.clamp(max=5))
        for block in self.blocks:
            h = block(h)
        return self.out(torch.tanh(self.frozen(h)) + h)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)


def run(accelerator, first: int, last: int, save_dir: str | None = None, load_dir: str | None = None) -> dict:
    torch.manual_seed(0)
    model = Net()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.2 * s))
    model, opt, sched = accelerator.prepare(model, opt, sched)
    if load_dir is not None:
        accelerator.load_state(load_dir)
    n, r = dtcore.get_context().world_size, dtcore.get_context().rank
    mine = slice(r * BATCH // n, (r + 1) * BATCH // n)
    losses, norms = [], []
    for step in range(first, last):
        if save_dir is not None and step == SAVE_AT:
            accelerator.save_state(save_dir)
        x, y = batch(step)
        with accelerator.accumulate(model):
            loss = F.mse_loss(model(x[mine]), y[mine])
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
            opt.step()
            if accelerator.sync_gradients:
                sched.step()
            opt.zero_grad()
        losses.append(dtcore.all_reduce(loss.detach().clone(), op="avg").item())
    state = accelerator.get_state_dict(model)
    return {
        "model": model,
        "losses": losses,
        "norms": norms,
        "state": {k: v.detach().clone() for k, v in state.items()},
        "optimizer": type(opt.optimizer).__name__,
        "scheduler_follows": sched.scheduler.optimizer is opt.optimizer,
        "lr": opt.param_groups[0]["lr"],
        "checkpointed": ["forward" in vars(b) for b in accelerator.unwrap_model(model).blocks],
    }


def tools(accelerator, result: dict, out: str, name: str) -> list[str]:
    """unwrap_model, get_state_dict and save_model on a dtcore model."""
    bad = []
    model = result["model"]
    if accelerator.unwrap_model(model) is not model.module:
        bad.append(f"{name}: unwrap_model did not return the plain module")
    if sorted(result["state"]) != sorted(Net().state_dict()):
        bad.append(f"{name}: get_state_dict keys {sorted(result['state'])}")
    accelerator.save_model(model, os.path.join(out, name))
    accelerator.wait_for_everyone()
    saved = load_file(os.path.join(out, name, "model.safetensors"))
    for k, v in result["state"].items():
        if k not in saved or not torch.equal(saved[k], v):
            bad.append(f"{name}: save_model's {k} is missing or differs from get_state_dict's")
    return bad


def ours(zero: int) -> Accelerator:
    # Activation checkpointing leaves gradients bit for bit as they were: tried at zero=1 and zero=3.
    plugin = DtcorePlugin(zero=zero, activation_checkpointing="all" if zero in (1, 3) else None)
    return Accelerator(dtcore_plugin=plugin, gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)


def train(out: str) -> dict:
    first = ours(0)  # before accelerate's own: the state it sets up is what accelerate launch gave dtcore
    report = {"distributed_type": str(first.distributed_type), "num_processes": first.num_processes}
    stock = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    ddp = run(stock, 0, STEPS)
    report["ddp"] = {"model": type(ddp["model"]).__name__, "losses": ddp["losses"], "norms": ddp["norms"]}
    bad = []
    for zero in (0, 1, 2, 3):
        accelerator = first if zero == 0 else ours(zero)  # one model each: save_state saves every prepared one
        save = os.path.join(out, "state") if zero == 2 else None
        result = run(accelerator, 0, STEPS, save_dir=save)
        bad += tools(accelerator, result, out, f"saved{zero}")
        diff = max((result["state"][k] - ddp["state"][k]).abs().max().item() for k in ddp["state"])
        report[f"zero{zero}"] = {
            "model": type(result["model"]).__name__,
            "losses": result["losses"],
            "norms": result["norms"],
            "optimizer": result["optimizer"],
            "scheduler_follows": result["scheduler_follows"],
            "lr": result["lr"],
            "checkpointed": result["checkpointed"],
            "state_max_diff": diff,
        }
    report["saved"] = sorted(os.listdir(os.path.join(out, "state")))
    report["bad"] = bad
    return report


def resume(out: str) -> dict:
    accelerator = ours(2)
    result = run(accelerator, SAVE_AT, STEPS, load_dir=os.path.join(out, "state"))
    errors = {}
    try:  # only the whole model's norm exists when its gradients are sharded
        accelerator.clip_grad_norm_(list(result["model"].parameters())[:1], 1.0)
    except dtcore.ConfigError as e:
        errors["clip_some"] = str(e)
    try:  # a zero=2 model has no .grad to clip by value
        accelerator.clip_grad_value_(result["model"].parameters(), 1.0)
    except dtcore.ConfigError as e:
        errors["clip_value"] = str(e)
    # accelerate's free_memory() (between two trainings) forgets the model; training it again still clips its
    # shards: the norm is dtcore's, not accelerate's 0 over .grad that are None
    accelerator.free_memory()
    model = result["model"]
    model(torch.ones(2, 16)).square().mean().backward()
    errors["norm_after_free_memory"] = float(accelerator.clip_grad_norm_(model.parameters(), 1e9))
    try:  # LBFGS's update is not elementwise: it cannot be sharded
        net = Net()
        ours(1).prepare(net, torch.optim.LBFGS(net.parameters()))
    except dtcore.ConfigError as e:
        errors["lbfgs"] = str(e)
    return {
        "num_processes": accelerator.num_processes,
        "losses": result["losses"],
        "lr": result["lr"],
        "checkpoint": os.path.isfile(os.path.join(out, "state", f"{CHECKPOINT_PREFIX}0", "manifest.json")),
        "errors": errors,
    }


def main() -> None:
    # torch's warnings that a scheduler's optimizer was not seen stepping: the scheduler must follow the
    # ShardedOptimizer that replaced the optimizer it was built over.
    warnings.filterwarnings("error", message=r".*lr_scheduler\.step\(\)")
    mode, out = sys.argv[1], sys.argv[2]
    report = train(out) if mode == "train" else resume(out)
    rank = dtcore.get_context().rank
    # A file per rank: under accelerate launch the ranks share one stdout, where lines can interleave.
    with open(os.path.join(out, f"{mode}_{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)
    dtcore.shutdown()


if __name__ == "__main__":
    main()
