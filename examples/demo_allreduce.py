"""The main job for now: start a world, all-reduce, print what every rank got.

    torchrun --standalone --nproc_per_node=2 examples/demo_allreduce.py

Each rank contributes tensors that depend on its rank; the printed sums and averages are
checked against the closed-form answer, so a wrong result fails the job with exit code 1.
"""

import sys
import time

import torch
import torch.distributed as dist

import dtcore


def main() -> int:
    t0 = time.perf_counter()
    ctx = dtcore.init(seed=0)
    init_s = time.perf_counter() - t0
    n, r = ctx.world_size, ctx.rank

    x = torch.full((1024,), float(r + 1))  # sum over ranks: n(n+1)/2
    dtcore.all_reduce(x, op="sum")
    y = torch.full((4,), float(r), dtype=torch.bfloat16)  # mean over ranks: (n-1)/2
    dtcore.all_reduce(y, op="avg")
    z = torch.tensor([r], dtype=torch.int64)
    dtcore.all_reduce(z, op="max")
    w = torch.tensor([float(r)])
    dist.all_reduce(w)  # plain torch.distributed keeps working after dtcore.init()

    ok = (
        torch.all(x == n * (n + 1) / 2).item()
        and torch.allclose(y.float(), torch.full((4,), (n - 1) / 2))
        and z.item() == n - 1
        and w.item() == n * (n - 1) / 2
    )
    sys.stdout.write(
        f"rank {r}/{n} on {ctx.launcher}: init {init_s * 1000:.0f} ms | sum={x[0].item():g} avg(bf16)={y[0].item():g} "
        f"max(int64)={z.item()} dist.sum={w.item():g} -> {'OK' if ok else 'WRONG'}\n"
    )
    sys.stdout.flush()
    dtcore.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
