"""One rank: copies of a wrapped model (copy.deepcopy, torch.save/torch.load) train as the original,
against one process on the whole batch.

An EMA-style copy is taken after two steps; then the original, the copy and a torch.load-ed model
all train (each with its own reducer on the same context), the copy's parameters also move towards
the original's as an EMA does.
"""

import copy
import io
import json

import torch
import torch.nn.functional as F

import dtcore


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


class Pair:
    """A wrapped model, its optimizer, and a plain reference that trains on the whole batch."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.reference = copy.deepcopy(model.module)
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.ref_opt = torch.optim.SGD(self.reference.parameters(), lr=0.1, momentum=0.9)

    def step(self, x: torch.Tensor, y: torch.Tensor, shard: slice, what: str) -> list[str]:
        F.mse_loss(self.model(x[shard]), y[shard]).backward()
        F.mse_loss(self.reference(x), y).backward()
        bad = [
            f"{what}: {name} max diff {(p.grad - q.grad).abs().max().item():.3g}"
            for (name, p), q in zip(self.model.module.named_parameters(), self.reference.parameters())
            if not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)
        ]
        self.opt.step()
        self.ref_opt.step()
        self.opt.zero_grad()
        self.ref_opt.zero_grad()
        return bad


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def main() -> None:
    ctx = dtcore.init(timeout=60)
    n, r = ctx.world_size, ctx.rank
    shard = slice(r * 8 // n, (r + 1) * 8 // n)
    data = torch.Generator().manual_seed(11)
    torch.manual_seed(r)  # rank-dependent: wrapping broadcasts rank 0's
    original = Pair(dtcore.wrap(mlp()))
    bad = []
    for step in range(2):
        bad += original.step(
            torch.randn(8, 16, generator=data), torch.randn(8, 4, generator=data), shard, f"step {step}"
        )

    if r == 0:  # one rank alone copies the model and evaluates the copy: no collective, so no wait
        solo = copy.deepcopy(original.model)
        with torch.no_grad():
            solo(torch.randn(2, 16, generator=torch.Generator().manual_seed(5)))
        del solo
    ema_model = copy.deepcopy(original.model)
    if not isinstance(ema_model, dtcore.DistributedModel) or ema_model._reducer is original.model._reducer:
        bad.append("the deep copy has no reducer of its own")
    if any(p is q for p, q in zip(ema_model.parameters(), original.model.parameters())):
        bad.append("the deep copy shares parameters with the original")
    if not torch.equal(flat(ema_model), flat(original.model)):
        bad.append("the deep copy's parameters differ from the original's")
    ema = Pair(ema_model)

    buffer = io.BytesIO()
    torch.save(original.model, buffer)
    buffer.seek(0)
    loaded = Pair(torch.load(buffer, weights_only=False))
    if not torch.equal(flat(loaded.model), flat(original.model)):
        bad.append("the loaded model's parameters differ from the original's")

    for step in range(2, 5):
        x, y = torch.randn(8, 16, generator=data), torch.randn(8, 4, generator=data)
        bad += original.step(x, y, shard, f"original step {step}")
        bad += ema.step(x.flip(0), y.flip(0), shard, f"copy step {step}")  # other data: its own gradients
        bad += loaded.step(x * 2, y, shard, f"loaded step {step}")
        with torch.no_grad():  # the EMA update, on the copy and on its plain reference alike
            for e, p in zip(ema.model.module.parameters(), original.model.module.parameters()):
                e.lerp_(p, 0.25)
            for e, p in zip(ema.reference.parameters(), original.reference.parameters()):
                e.lerp_(p, 0.25)
    for what, pair in (("original", original), ("copy", ema), ("loaded", loaded)):
        if not torch.allclose(flat(pair.model.module), flat(pair.reference), rtol=1e-5, atol=1e-6):
            bad.append(f"the {what}'s parameters drifted from its reference")
    for what, model in (("original", original.model), ("copy", ema.model), ("loaded", loaded.model)):
        mine = flat(model)
        theirs = mine.clone()
        dtcore.broadcast(theirs, src=0)
        if not torch.equal(mine, theirs):
            bad.append(f"the {what}'s parameters differ across ranks")
    print(
        json.dumps(
            {
                "rank": r,
                "bad": bad,
                "reductions": [m._reducer.reductions for m in (original.model, ema.model, loaded.model)],
            }
        ),
        flush=True,
    )
    dtcore.shutdown()


if __name__ == "__main__":
    main()
