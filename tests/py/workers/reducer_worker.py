"""One rank: gradients through the C++ reducer against one process on the whole batch.

reducer_worker.py BUCKET_MB FIRST_BUCKET_MB [unused]
"""

import copy
import json
import sys

import torch
import torch.nn.functional as F

import dtcore
from dtcore import _C


class Net(torch.nn.Module):
    def __init__(self, unused: bool) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 8)
        self.spare = torch.nn.Linear(8, 8) if unused else None  # registered, never used

    def forward(self, x):  # (B, 32) -> (B, 8)
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def main() -> None:
    bucket_mb, first_mb = float(sys.argv[1]), float(sys.argv[2])
    unused = len(sys.argv) > 3 and sys.argv[3] == "unused"
    ctx = dtcore.init(timeout=60)
    n, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)  # the same initial weights on every rank
    model = Net(unused)
    reference = copy.deepcopy(model)  # one process, whole batch
    names, params = zip(*model.named_parameters())
    reducer = _C.Reducer(list(params), list(names), ctx.communicator, _C.ReducerOptions(bucket_mb, first_mb))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(123)
    bad, error = [], None
    steps = 5
    try:
        for step in range(steps):
            x, y = torch.randn(16, 32, generator=data), torch.randn(16, 8, generator=data)
            shard = slice(r * 16 // n, (r + 1) * 16 // n)  # this rank's equal slice of the batch
            reducer.prepare_for_backward()
            F.mse_loss(model(x[shard]), y[shard]).backward()
            F.mse_loss(reference(x), y).backward()
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                if q.grad is not None and not torch.allclose(p.grad, q.grad, rtol=1.3e-6, atol=5e-5):
                    bad.append(f"step {step}: {name} max diff {(p.grad - q.grad).abs().max().item():.3g}")
            opt.step()
            ref_opt.step()
            opt.zero_grad(set_to_none=step % 2 == 0)  # both ways: the reducer must cope with each
            ref_opt.zero_grad()
    except RuntimeError as e:  # raised inside backward, torch hands dtcore's errors on as RuntimeError
        error = f"{type(e).__name__}: {e}"
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    mine = flat.clone()
    dtcore.broadcast(flat, src=0)
    if error is None and not torch.equal(flat, mine):
        bad.append("parameters differ across ranks")
    report = {
        "rank": r,
        "bad": bad,
        "error": error,
        "reductions": reducer.reductions,
        "buckets": reducer.bucket_params(),
        "steps": steps,
    }
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
