"""One rank of a 4-rank job: dtcore.DistributedDataParallel over proper subgroups, against torch DDP.

    subgroup_worker.py compare          prints {case: result} as JSON
    subgroup_worker.py die TIMEOUT      rank 2 (of group {0,2}) exits after wrapping; the others train

compare: the data-parallel pairs {0,2} and {1,3} (torch.distributed.new_group), a 2-D DeviceMesh's
"dp" dimension (the same pairs, other torch groups) and new_subgroups' {0,1} and {2,3}: each
rank's gradients from dtcore and from torch DDP over the same torch group and data, parameters
and a buffer as broadcast from the group's first rank; the refusal of a group this rank is not in;
and what shutdown leaves of the subgroups' communicators.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import dtcore
from dtcore import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    """Two layers and a buffer whose value is the rank that made it (broadcast from the group's first)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        torch.manual_seed(rank)  # every rank starts different: the broadcast is what makes them equal
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.register_buffer("made_by", torch.tensor([float(rank)]))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def grads_of(model_cls, group, rank: int, data: torch.Tensor, **kwargs) -> tuple[list[list[float]], float, list]:
    """Two steps of SGD under `model_cls` over `group`: the last gradients, the buffer, the first weight."""
    model = model_cls(Net(rank), **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        model(data * (step + 1)).pow(2).sum().backward()
        opt.step()
    grads = [p.grad.flatten().tolist() for p in model.module.parameters()]
    return grads, float(model.module.made_by.item()), model.module.fc1.weight.flatten()[:3].tolist()


def compare(rank: int, group, label: str) -> dict:
    """dtcore and torch DDP over the same torch group, on data that differs between groups."""
    ranks = dist.get_process_group_ranks(group)
    data = torch.full((3, 4), float(ranks[0] + 1)) + rank * 0.25  # per group, and per rank within it
    mine, buffer, weight = grads_of(DDP, group, rank, data, process_group=group)
    theirs, torch_buffer, torch_weight = grads_of(
        torch.nn.parallel.DistributedDataParallel, group, rank, data, process_group=group
    )
    diff = max(abs(a - b) for g, h in zip(mine, theirs) for a, b in zip(g, h))
    return {
        "case": label,
        "ranks": ranks,
        "diff": diff,
        "grad0": mine[0][:4],
        "buffer": [buffer, torch_buffer],
        "weight_diff": max(abs(a - b) for a, b in zip(weight, torch_weight)),
    }


def main_compare(ctx) -> dict:
    rank = ctx.rank
    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank builds both, in the same order
    mine = pairs[rank % 2]
    result = {"pairs": compare(rank, mine, "new_group")}
    comm = ctx.subgroups[mine.group_name][0]
    result["communicator"] = {"ranks": comm.ranks, "rank": comm.rank, "size": comm.size}

    from torch.distributed.device_mesh import init_device_mesh

    dp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["dp"]
    model = DDP(Net(rank), device_mesh=dp)
    result["mesh"] = compare(rank, dp.get_group(), "mesh")
    result["mesh"]["device_mesh"] = model.device_mesh is dp and model.process_group is dp.get_group()
    subgroup, _ = dist.new_subgroups(group_size=2)
    result["new_subgroups"] = compare(rank, subgroup, "new_subgroups")

    try:
        DDP(Net(rank), process_group=pairs[1 - rank % 2])  # the other pair's group: NON_GROUP_MEMBER here
        result["refused"] = None
    except dtcore.ConfigError as e:
        result["refused"] = str(e)

    built = dict(ctx.subgroups)
    dtcore.shutdown()
    closed = []
    for comm, _health in built.values():
        try:
            comm.barrier().wait()
            closed.append(False)
        except dtcore.CommError as e:
            closed.append("closed" in str(e))
    result["shutdown"] = {"groups": len(built), "closed": closed, "left": len(ctx.subgroups)}
    return result


def main_die(ctx, timeout: float) -> dict:
    rank = ctx.rank
    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    model = DDP(Net(rank), process_group=pairs[rank % 2])
    if rank == 2:
        os._exit(0)  # die without a word, as a killed process does
    start = time.monotonic()
    try:
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
        result = {"ok": True}
    except Exception as e:  # the class is what is tested
        result = {"ok": False, "type": type(e).__name__, "message": str(e)}
    result["seconds"] = time.monotonic() - start
    return result


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "compare":
        ctx = dtcore.init(timeout=60)
        result = main_compare(ctx)
    else:
        timeout = float(sys.argv[2])
        ctx = dtcore.init(timeout=timeout)
        result = main_die(ctx, timeout)
    result["rank"] = ctx.rank
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    if mode != "compare":
        dtcore.shutdown(barrier=False)  # rank 2 is gone: no job-wide barrier to wait out
        os._exit(0)
