"""One rank: dtcore under a real accelerate.Accelerator (MULTI_CPU), against one process on the whole batch.

First dtcore.wrap + accelerator.prepare(optimizer): accumulate, no_sync, trigger_sync_in_backward;
then accelerator.prepare(model) and dtcore.wrap in either order, which are refused.
"""

import copy
import json

import torch
import torch.nn.functional as F
from accelerate import Accelerator

import dtcore


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def grads_match(model: torch.nn.Module, reference: torch.nn.Module, what: str) -> list[str]:
    bad = []
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6):
            bad.append(f"{what}: {name} max diff {(p.grad - q.grad).abs().max().item():.3g}")
    return bad


def train(accelerator: Accelerator, ctx) -> dict:
    n, r = ctx.world_size, ctx.rank
    torch.manual_seed(r)  # rank-dependent: wrapping broadcasts rank 0's
    model = dtcore.wrap(mlp())
    reference = copy.deepcopy(model.module)
    opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    shard = slice(r * 8 // n, (r + 1) * 8 // n)
    data = torch.Generator().manual_seed(3)
    bad, syncs = [], 0
    for step in range(4):  # gradient_accumulation_steps=2: steps 1 and 3 reduce
        x, y = torch.randn(8, 16, generator=data), torch.randn(8, 4, generator=data)
        with accelerator.accumulate(model):
            accelerator.backward(F.mse_loss(model(x[shard]), y[shard]))
            (F.mse_loss(reference(x), y) / 2).backward()  # accelerator.backward divides by the accumulation steps
            if accelerator.sync_gradients:
                syncs += 1
                bad += grads_match(model.module, reference, f"accumulate step {step}")
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            ref_opt.step()
            ref_opt.zero_grad()
    # Two forwards under no_sync, the second backward reduces the sum (accelerate's documented recipe).
    xa, xb = torch.randn(8, 16, generator=data), torch.randn(8, 16, generator=data)
    y = torch.randn(8, 4, generator=data)
    with accelerator.no_sync(model):
        loss_a = F.mse_loss(model(xa[shard]), y[shard])
        loss_b = F.mse_loss(model(xb[shard]), y[shard])
    accelerator.backward(loss_a)
    with accelerator.trigger_sync_in_backward(model):
        accelerator.backward(loss_b)
    ((F.mse_loss(reference(xa), y) + F.mse_loss(reference(xb), y)) / 2).backward()
    bad += grads_match(model.module, reference, "trigger_sync_in_backward")
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    theirs = mine.clone()
    dtcore.broadcast(theirs, src=0)
    if not torch.equal(mine, theirs):
        bad.append("parameters differ across ranks")
    if accelerator.unwrap_model(model) is not model.module:
        bad.append("unwrap_model did not return the plain module")
    return {"bad": bad, "syncs": syncs, "reductions": model._reducer.reductions}


def stack(accelerator: Accelerator) -> dict:
    errors = {}
    prepared = accelerator.prepare(mlp())  # accelerate wraps it in torch DDP
    try:
        dtcore.wrap(prepared)
    except dtcore.ConfigError as e:
        errors["wrap_prepared"] = str(e)
    try:
        accelerator.prepare(dtcore.wrap(mlp()))
    except dtcore.ConfigError as e:
        errors["prepare_wrapped"] = str(e)
    return {"errors": errors, "prepared": type(prepared).__name__}


def main() -> None:
    ctx = dtcore.init(timeout=60)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    report = {"rank": ctx.rank, "distributed_type": str(accelerator.distributed_type)}
    report.update(train(accelerator, ctx))
    report.update(stack(accelerator))
    print(json.dumps(report), flush=True)
    dtcore.shutdown()


if __name__ == "__main__":
    main()
