"""One rank: torch's communication hooks on dtcore.DistributedDataParallel against torch DDP with the
same hook on the same data.

comm_hook_worker.py hooks    every hook; per hook the largest gradient difference from torch DDP's
comm_hook_worker.py never    a hook whose future never completes (timeout 3 s): the error and its time
"""

import copy
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local_sgd
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

import dtcore

STEPS = 4


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def power_state():
    # start at iteration 2: the first two steps all-reduce, the next ones compress (rank 1 matrices)
    return powersgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2, min_compression_rate=0.5
    )


def cases(subgroup):
    """name -> (state factory, hook); a fresh state for each model."""
    return {
        "allreduce_hook": (lambda: None, default.allreduce_hook),
        "fp16_compress_hook": (lambda: None, default.fp16_compress_hook),
        "bf16_compress_hook": (lambda: None, default.bf16_compress_hook),
        "fp16_compress_wrapper": (power_state, default.fp16_compress_wrapper(powersgd.powerSGD_hook)),
        "bf16_compress_wrapper": (power_state, default.bf16_compress_wrapper(powersgd.powerSGD_hook)),
        "powerSGD_hook": (power_state, powersgd.powerSGD_hook),
        "batched_powerSGD_hook": (power_state, powersgd.batched_powerSGD_hook),
        "post_localSGD_hook": (
            lambda: local_sgd.PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=2),
            local_sgd.post_localSGD_hook,
        ),
        "builtin ALLREDUCE": (None, dist.BuiltinCommHookType.ALLREDUCE),
        "builtin FP16_COMPRESS": (None, dist.BuiltinCommHookType.FP16_COMPRESS),
    }


def register(model, make_state, hook, torch_ddp: bool) -> None:
    if make_state is None:
        model._register_builtin_comm_hook(hook)
    elif torch_ddp:  # past torch DDP's check that refuses bf16 hooks without CUDA: its reducer runs them as is
        dist._register_comm_hook(model.reducer, make_state(), hook)
    else:
        model.register_comm_hook(make_state(), hook)


def train(model, rank: int, errors: list | None = None) -> list[list[torch.Tensor]]:
    """The gradients of each step, SGD steps in between; with `errors`, an exception a hook raised ends the
    run and is recorded there."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(STEPS):
        x, y = batch(step, rank)
        try:
            F.mse_loss(model(x), y).backward()
        except Exception as e:
            if errors is None:
                raise
            errors.append(f"{type(e).__name__} at step {step}")
            break
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return grads


def max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for ga, gb in zip(a, b) for x, y in zip(ga, gb))


def hooks(rank: int) -> dict:
    subgroup, _ = dist.new_subgroups(group_size=1)  # post-localSGD: each rank alone after its start
    report: dict = {"diff": {}, "errors": {}, "buckets": []}
    for name, (make_state, hook) in cases(subgroup).items():
        torch.manual_seed(0)
        module = mlp()
        reference = copy.deepcopy(module)
        model = dtcore.DistributedDataParallel(module)
        register(model, make_state, hook, torch_ddp=False)
        theirs = torch.nn.parallel.DistributedDataParallel(reference)
        register(theirs, make_state, hook, torch_ddp=True)
        errors: list = [], []
        mine, ref = train(model, rank, errors[0]), train(theirs, rank, errors[1])
        report["diff"][name] = max_diff(mine, ref) if len(mine) == len(ref) else float("inf")
        report["errors"][name] = errors

    # allreduce_hook against dtcore's own reduction: equal, over several buckets; and what a hook sees.
    torch.manual_seed(0)
    plain, hooked = mlp(), mlp()
    hooked.load_state_dict(plain.state_dict())
    plain = dtcore.wrap(plain, bucket_mb=0.0001, first_bucket_mb=0.0001)
    hooked = dtcore.wrap(hooked, bucket_mb=0.0001, first_bucket_mb=0.0001)
    params = list(hooked.parameters())

    def recording_hook(state, bucket):
        state.append(
            {
                "index": bucket.index(),
                "is_last": bucket.is_last(),
                "params": [next(i for i, p in enumerate(params) if p is q) for q in bucket.parameters()],
                "shapes_match": [
                    list(g.shape) == list(q.shape) for g, q in zip(bucket.gradients(), bucket.parameters())
                ],
                "numel": bucket.buffer().numel(),
            }
        )
        return default.allreduce_hook(None, bucket)

    hooked.register_comm_hook(report["buckets"], recording_hook)
    mine, base = train(hooked, rank), train(plain, rank)
    report["equal_to_no_hook"] = all(torch.equal(a, b) for ga, gb in zip(mine, base) for a, b in zip(ga, gb))
    report["bucket_params"] = plain.bucket_params
    try:
        hooked.register_comm_hook(None, default.allreduce_hook)
    except dtcore.ConfigError as e:
        report["twice"] = str(e)
    return report


def never(rank: int) -> dict:
    model = dtcore.DistributedDataParallel(mlp())
    model.register_comm_hook(None, lambda state, bucket: torch.futures.Future())
    x, y = batch(0, rank)
    start = time.monotonic()
    try:
        F.mse_loss(model(x), y).backward()
        return {"error": None}
    except dtcore.CommError as e:
        return {"error": str(e), "seconds": time.monotonic() - start}


def main() -> None:
    mode = sys.argv[1]
    ctx = dtcore.init(timeout=3 if mode == "never" else 60)
    report = {"rank": ctx.rank, **(hooks(ctx.rank) if mode == "hooks" else never(ctx.rank))}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dtcore.shutdown(barrier=mode != "never")


if __name__ == "__main__":
    main()
