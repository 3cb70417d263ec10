"""One rank: uneven inputs under model.join(), dtcore.DistributedDataParallel against torch DDP's join
on the same data. Rank r has 3 + 2r batches.

join_worker.py    per case: the largest gradient and final parameter/buffer differences from torch DDP's
"""

import copy
import json
import sys

import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default

import dtcore


def model_with_buffers() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train(model, rank: int, divide: bool) -> list[list[torch.Tensor]]:
    """The gradients of each of this rank's steps, inside model.join(); SGD steps in between."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    with model.join(divide_by_initial_world_size=divide):
        for step in range(3 + 2 * rank):
            x, y = batch(step, rank)
            F.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
    return grads


def state(model) -> list[torch.Tensor]:
    return [t.detach().clone() for t in list(model.module.parameters()) + list(model.module.buffers())]


def main() -> None:
    ctx = dtcore.init(timeout=60)
    report: dict = {"rank": ctx.rank, "grad_diff": {}, "final_diff": {}, "steps": {}}
    for case, divide, hook, find_unused in (
        ("default", True, None, False),
        ("divide_by_initial_world_size=False", False, None, False),
        ("allreduce_hook", True, default.allreduce_hook, False),
        # The joined rank also matches the used map the others sum.
        ("find_unused_parameters", True, None, True),
    ):
        torch.manual_seed(0)
        module = model_with_buffers()
        reference = copy.deepcopy(module)
        model = dtcore.DistributedDataParallel(module, find_unused_parameters=find_unused)
        theirs = torch.nn.parallel.DistributedDataParallel(reference, find_unused_parameters=find_unused)
        if hook is not None:
            model.register_comm_hook(None, hook)
            theirs.register_comm_hook(None, hook)
        mine = train(model, ctx.rank, divide)
        ref = train(theirs, ctx.rank, divide)
        report["steps"][case] = len(mine)
        report["grad_diff"][case] = max((a - b).abs().max().item() for ga, gb in zip(mine, ref) for a, b in zip(ga, gb))
        report["final_diff"][case] = max((a - b).abs().max().item() for a, b in zip(state(model), state(theirs)))
        # After join, every rank holds the last joiner's model.
        flat = torch.cat([t.flatten() for t in state(model)])
        first = flat.clone()
        dtcore.broadcast(first, src=0)
        report.setdefault("same_on_every_rank", {})[case] = torch.equal(flat, first)
    try:
        dtcore.wrap(torch.nn.Linear(2, 2), zero=1).join()
    except dtcore.ConfigError as e:
        report["zero_refused"] = str(e)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
