"""One rank whose script sets up torch.distributed itself, before or after dtcore.init(); reports JSON.

    torch_first_worker.py env|tcp|accelerate|accelerate-after

env: init_process_group("gloo", init_method="env://"), from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
tcp: init_process_group("gloo", init_method="tcp://localhost:<MASTER_PORT>"), rank and world size
     from SLURM_PROCID and SLURM_NTASKS, as a script under srun does it.
accelerate: accelerate's Accelerator(cpu=True), which sets the group up.
Then dtcore.init(), an all_reduce, one step of a wrapped model checked against torch's own average
on the script's group, shutdown (the group must survive it), and a second init() on the same group.
accelerate-after: dtcore.init() first, then Accelerator(cpu=True), the all_reduce and the step.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import dtcore


def main() -> None:
    mode = sys.argv[1]
    if mode == "env":
        dist.init_process_group("gloo", init_method="env://")
    elif mode == "tcp":
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://localhost:{os.environ['MASTER_PORT']}",
            rank=int(os.environ["SLURM_PROCID"]),
            world_size=int(os.environ["SLURM_NTASKS"]),
        )
    elif mode == "accelerate":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
    ctx = dtcore.init(timeout=30)
    if mode == "accelerate-after":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
    n, r = ctx.world_size, ctx.rank
    report = {"rank": r, "world_size": n, "launcher": ctx.launcher, "owns": ctx.owns_torch_process_group, "bad": []}
    if mode.startswith("accelerate"):
        report["accelerator"] = [accelerator.process_index, accelerator.num_processes]

    x = torch.full((5,), float(r + 1))
    dtcore.all_reduce(x)
    if not torch.equal(x, torch.full((5,), n * (n + 1) / 2)):
        report["bad"].append(f"all_reduce {x.tolist()}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    wrapped = dtcore.wrap(model)
    data = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + r))
    wrapped(data).square().mean().backward()
    # The reference: this rank's own gradients, averaged by torch on the script's group.
    w1, b1, w2, b2 = reference
    torch.autograd.backward((torch.tanh(data @ w1.T + b1) @ w2.T + b2).square().mean())
    for p, q in zip(model.parameters(), reference):
        dist.all_reduce(q.grad)
        q.grad /= n
        if not torch.allclose(p.grad, q.grad, atol=1e-6):
            report["bad"].append(f"gradient differs by {(p.grad - q.grad).abs().max().item():g}")

    if mode == "accelerate-after":
        dtcore.shutdown()
        report["group_after_shutdown"] = dist.is_initialized()
        sys.stdout.write(json.dumps(report) + "\n")
        return
    dtcore.shutdown()
    report["group_after_shutdown"] = dist.is_initialized()
    y = torch.ones(3)
    dist.all_reduce(y)  # the script's group still works
    report["torch_sum_after_shutdown"] = y[0].item()

    again = dtcore.init(timeout=30)  # a second join on the same group's store
    z = torch.ones(2)
    dtcore.all_reduce(z)
    report["sum_after_second_init"] = z[0].item()
    report["second_rank"] = again.rank
    dtcore.shutdown()
    dist.destroy_process_group()
    sys.stdout.write(json.dumps(report) + "\n")  # one write: atomic on a pipe shared by ranks


if __name__ == "__main__":
    main()
