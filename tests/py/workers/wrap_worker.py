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
from dtcore import DistributedModel


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
    bn(torch.randn(2, 8))  # a synced forward: the broadcast; eval: no update after it
    with torch.no_grad():
        if r == 0:
            bn(torch.randn(2, 8))  # one rank alone under no_grad: no collective, so no hang
    if not same_as_rank0(bn.module.buffers()):
        bad.append("BatchNorm buffers differ from rank 0's")
    return bad


class Reordered(torch.nn.Module):
    """Registered last-to-first, used first-to-last: gradients become ready in registration order."""

    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Linear(16, 8)
        self.b = torch.nn.Linear(16, 16)
        self.a = torch.nn.Linear(32, 16)
        self.extra = torch.nn.Linear(8, 8)

    def forward(self, x, use_extra: bool = False):  # (B, 32) -> (B, 8)
        y = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return self.extra(y) if use_extra else y


def features(ctx, mode: str) -> list:
    """unused: `extra` is used on rank 0 only; rebuild: buckets follow the observed order;
    bf16: comm_dtype=bfloat16; bf16params: bfloat16 parameters (gradients reduced in bfloat16)."""
    n, r = ctx.world_size, ctx.rank
    bad = []
    torch.manual_seed(0)
    kwargs = {"bucket_mb": 0.0001, "first_bucket_mb": 0.0001}  # several buckets, so that order matters
    if mode == "unused":
        kwargs["find_unused_parameters"] = True
    if mode == "bf16":
        kwargs["comm_dtype"] = torch.bfloat16
    module = Reordered().to(torch.bfloat16) if mode == "bf16params" else Reordered()
    model = DistributedModel(module, **kwargs)
    reference = copy.deepcopy(model.module)
    initial = model.bucket_params
    data = torch.Generator().manual_seed(11)
    tol = {"rtol": 1e-2, "atol": 1e-2} if mode.startswith("bf16") else {"rtol": 1.3e-6, "atol": 5e-5}
    dtype = torch.bfloat16 if mode == "bf16params" else torch.float32
    for step in range(3):
        x, y = torch.randn(8, 32, generator=data, dtype=dtype), torch.randn(8, 8, generator=data, dtype=dtype)
        shard = slice(r * 8 // n, (r + 1) * 8 // n)
        # unused: `extra` on rank 0 only; otherwise everywhere, and the reference uses it too
        use_extra = r == 0 if mode == "unused" else True
        local = copy.deepcopy(model.module)  # this rank's own gradients, before any reduction
        F.mse_loss(local(x[shard], use_extra), y[shard]).backward()
        F.mse_loss(model(x[shard], use_extra), y[shard]).backward()
        if mode == "unused":
            # the definition: the average over ranks of each rank's local gradient (zero if unused)
            for (name, p), q in zip(model.module.named_parameters(), local.parameters()):
                expected = q.grad.clone() if q.grad is not None else torch.zeros_like(p)
                dtcore.all_reduce(expected, op="avg")
                if not torch.allclose(p.grad, expected, rtol=1.3e-6, atol=5e-5):
                    bad.append(f"unused step {step}: {name} max diff {(p.grad - expected).abs().max().item():.3g}")
        else:
            F.mse_loss(reference(x, True), y).backward()
            for (name, p), q in zip(model.module.named_parameters(), reference.parameters()):
                if not torch.allclose(p.grad, q.grad, **tol):
                    bad.append(f"{mode} step {step}: {name} max diff {(p.grad - q.grad).abs().max().item():.3g}")
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    if mode == "rebuild":
        if model.bucket_params == initial:
            bad.append(f"buckets were not rebuilt: {initial}")
        first = model.bucket_params[0]
        names = [name for name, _ in model.module.named_parameters()]
        if not names[first[0]].startswith("extra") and not names[first[0]].startswith("c."):
            bad.append(f"first bucket after rebuild starts with {names[first[0]]}")
    return bad


def main() -> None:
    mode = sys.argv[1]
    ctx = dtcore.init(timeout=60)
    result = {"rank": ctx.rank}
    if mode == "parity":
        result["bad"] = parity(ctx, float(sys.argv[2]))
    elif mode in ("unused", "rebuild", "bf16", "bf16params"):
        result["bad"] = features(ctx, mode)
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
