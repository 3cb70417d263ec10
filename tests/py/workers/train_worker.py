"""dtcore.Trainer on real ranks, with a model of the test's own (not `python -m dtcore.train`).

    train_worker.py oom RUN_DIR   rank 1's forward raises torch.OutOfMemoryError in step 2
    train_worker.py mlp RUN_DIR   a regression MLP returning {"loss": ...}, data a plain list of dicts,
                                  zero=1 with the caller's SGD rebuilt sharded, 2 micro-batches a step
    train_worker.py slow RUN_DIR  the same MLP, whose forward takes 30 ms longer on rank 1: a straggler

Prints one JSON line: {"rank", "error": class name or null, "message", "losses"}.
"""

import json
import sys
import time

import torch

import dtcore
from dtcore.train import TrainConfig
from dtcore.train.demo import data
from dtcore.train.demo.gpt import GPT, GPTConfig


class OutOfMemoryGPT(GPT):
    """The built-in GPT whose third forward raises what CUDA's allocator raises when it is full."""

    calls = 0

    def forward(self, idx, targets):
        self.calls += 1
        if self.calls == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        return super().forward(idx, targets)


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def forward(self, x, y):
        return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}


class SlowRegression(Regression):
    def forward(self, x, y):
        time.sleep(0.03)
        return super().forward(x, y)


def mlp(ctx, config, model=None):
    gen = torch.Generator().manual_seed(ctx.rank)
    xs = torch.randn(64, 4, 8, generator=gen)  # 64 batches of 4
    batches = [{"x": x, "y": x.sum(1, keepdim=True) / 4} for x in xs]  # a linear target
    config.training.device_batch_size, config.training.total_batch_size = 4, 16
    config.parallel.zero, config.training.num_iterations = 1, 30
    model = model or Regression()
    return dtcore.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), batches, config)


def main() -> int:
    mode, run_dir = sys.argv[1], sys.argv[2]
    ctx = dtcore.init(seed=0)
    config = TrainConfig()
    config.logging.run_dir, config.logging.progress, config.checkpoint.at_end = run_dir, False, False
    config.training.num_iterations, config.training.total_batch_size = 5, 32  # 2 micro-batches of 8 per rank
    result = {"rank": ctx.rank, "error": None, "message": "", "losses": []}
    if mode == "mlp":
        trainer = mlp(ctx, config)
    elif mode == "slow":
        config.logging.straggler_window = 10
        trainer = mlp(ctx, config, SlowRegression() if ctx.rank == 1 else Regression())
    else:
        tokenizer, train, _ = data.build(config.data, 64, 8, ctx.rank, ctx.world_size, 0)
        shape = GPTConfig(vocab_size=tokenizer.vocab_size)
        model = OutOfMemoryGPT(shape) if mode == "oom" and ctx.rank == 1 else GPT(shape)
        trainer = dtcore.Trainer(model, None, train, config)
    try:
        result["losses"] = trainer.fit()["losses"]
        result["optimizer"] = type(trainer.optimizer).__name__
    except (torch.OutOfMemoryError, dtcore.DtcoreError) as e:
        result |= {"error": type(e).__name__, "message": str(e)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
