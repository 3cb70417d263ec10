"""One rank: DistributedModel against one process on the whole batch.

    wrap_worker.py parity BUCKET_MB   # rank-dependent init, no_sync over 4 micro-batches, BatchNorm buffers
    wrap_worker.py mismatch           # rank 1 builds a different model
"""

import contextlib
import copy
import json
import sys

import torch
import torch.nn.functional as F

import dtcore
from dtcore._distributed_model import DistributedModel


def mlp(hidden: int = 64) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 8))


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors])


def same_as_rank0(tensors) -> bool:
    mine = flat(tensors)
    theirs = mine.clone()
    dtcore.broadcast(theirs, src=0)
    return torch.equal(mine, theirs)


def parity(ctx, bucket_mb: float) -> list:
    n, r = ctx.world_size, ctx.rank
    bad = []
    torch.manual_seed(100 + r)  # different on every rank: wrapping must broadcast rank 0's
    model = DistributedModel(mlp(), bucket_mb=bucket_mb, first_bucket_mb=min(bucket_mb, 1.0))
    if not same_as_rank0(model.module.parameters()):
        bad.append("parameters not broadcast at wrap")
    reference = copy.deepcopy(model.module)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(7)
    for step in range(3):
        for micro in range(4):  # the first 3 accumulate locally, the 4th reduces the sum
            x, y = torch.randn(8, 32, generator=data), torch.randn(8, 8, generator=data)
            shard = slice(r * 8 // n, (r + 1) * 8 // n)
            with model.no_sync() if micro < 3 else contextlib.nullcontext():
                F.mse_loss(model(x[shard]), y[shard]).backward()
            F.mse_loss(reference(x), y).backward()
        for (name, p), q in zip(model.module.named_parameters(), reference.parameters()):
            if not torch.allclose(p.grad, q.grad, rtol=1.3e-6, atol=5e-5):
                bad.append(f"step {step}: {name} max diff {(p.grad - q.grad).abs().max().item():.3g}")
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)
        ref_opt.zero_grad()
    if not same_as_rank0(model.module.parameters()):
        bad.append("parameters differ across ranks after training")

    # BatchNorm: running statistics follow rank 0's, broadcast before each forward.
    torch.manual_seed(r)
    bn = DistributedModel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)))
    bn_opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    for _ in range(3):
        bn(torch.randn(6, 8) + r).sum().backward()  # each rank's batches differ
        bn_opt.step()
        bn_opt.zero_grad()
    bn.eval()
    with torch.no_grad():
        bn(torch.randn(2, 8))  # eval: the broadcast, no update
    if not same_as_rank0(bn.module.buffers()):
        bad.append("BatchNorm buffers differ from rank 0's")
    return bad


def main() -> None:
    mode = sys.argv[1]
    ctx = dtcore.init(timeout=60)
    result = {"rank": ctx.rank}
    if mode == "parity":
        result["bad"] = parity(ctx, float(sys.argv[2]))
    else:
        try:
            DistributedModel(mlp(hidden=48 if ctx.rank == 1 else 64))
            result["error"] = None
        except dtcore.ConfigError as e:
            result["error"] = str(e)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
