"""One rank: dtcore.DistributedDataParallel on three models against one process on the whole batch.

ddp_worker.py BUCKET_CAP_MB STEPS
"""

import copy
import json
import sys

import torch
import torch.nn.functional as F

import dtcore


class TinyGPT(torch.nn.Module):
    """A small transformer with tied input and output embeddings."""

    def __init__(self, vocab: int = 50, dim: int = 32, seq: int = 12) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.block = torch.nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one parameter, two uses

    def forward(self, idx):  # (B, T) -> (B, T, vocab)
        x = self.tok(idx) + self.pos[: idx.shape[1]]  # (B, T, C)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        return self.head(self.norm(self.block(x, src_mask=mask, is_causal=True)))


def make(kind: str):
    """The model and a loss over one slice of a batch."""
    if kind == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        return (
            model,
            lambda m, x, y: F.mse_loss(m(x), y),
            lambda g: (torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)),
        )
    if kind == "cnn":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 5),
        )
        return (
            model,
            lambda m, x, y: F.cross_entropy(m(x), y),
            lambda g: (torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g)),
        )
    model = TinyGPT()
    return (
        model,
        (lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1), y.flatten())),
        (lambda g: (torch.randint(0, 50, (8, 12), generator=g), torch.randint(0, 50, (8, 12), generator=g))),
    )


def main() -> None:
    bucket_cap_mb, steps = float(sys.argv[1]), int(sys.argv[2])
    ctx = dtcore.init(timeout=60)
    n, r = ctx.world_size, ctx.rank
    report = {"rank": r, "bad": []}
    for kind in ("mlp", "cnn", "transformer"):
        torch.manual_seed(0)
        module, loss_fn, batch = make(kind)
        reference = copy.deepcopy(module)
        model = dtcore.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-3)
        data = torch.Generator().manual_seed(5)
        for step in range(steps):
            x, y = batch(data)
            shard = slice(r * 8 // n, (r + 1) * 8 // n)
            loss_fn(model, x[shard], y[shard]).backward()
            # One process on the whole batch. With BatchNorm in training mode each rank normalizes
            # with its own slice's statistics (as torch DDP does), so the reference does the same:
            # the mean over slices of each slice's loss.
            slices = [slice(k * 8 // n, (k + 1) * 8 // n) for k in range(n)]
            (sum(loss_fn(reference, x[s], y[s]) for s in slices) / n).backward()
            if step < 3:
                for (name, p), q in zip(model.module.named_parameters(), reference.parameters()):
                    if not torch.allclose(p.grad, q.grad, rtol=1.3e-6, atol=5e-5):
                        report["bad"].append(
                            f"{kind} step {step}: {name} max diff {(p.grad - q.grad).abs().max().item():.3g}"
                        )
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
        mine = torch.cat([p.detach().flatten() for p in model.module.parameters()])
        theirs = mine.clone()
        dtcore.broadcast(theirs, src=0)
        if not torch.equal(mine, theirs):
            report["bad"].append(f"{kind}: parameters not bitwise identical across ranks after {steps} steps")
    try:
        dtcore.DistributedDataParallel(torch.nn.Linear(2, 2), mixed_precision=object())
        report["bad"].append("mixed_precision was accepted")
    except dtcore.ConfigError as e:
        report["refused"] = str(e)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dtcore.shutdown()


if __name__ == "__main__":
    main()
