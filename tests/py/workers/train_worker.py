"""dtcore.Trainer on real ranks, with a model of the test's own (not `python -m dtcore.train`).

    train_worker.py oom RUN_DIR   rank 1's forward raises torch.OutOfMemoryError in step 2

Prints one JSON line: {"rank", "error": class name or null, "message"}.
"""

import json
import sys

import torch

import dtcore
from dtcore.train import TrainConfig, data
from dtcore.train.gpt import GPT, GPTConfig


class OutOfMemoryGPT(GPT):
    """The built-in GPT whose third forward raises what CUDA's allocator raises when it is full."""

    calls = 0

    def forward(self, idx, targets):
        self.calls += 1
        if self.calls == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        return super().forward(idx, targets)


def main() -> int:
    mode, run_dir = sys.argv[1], sys.argv[2]
    ctx = dtcore.init(seed=0)
    config = TrainConfig()
    config.logging.run_dir, config.logging.progress, config.checkpoint.at_end = run_dir, False, False
    config.training.num_iterations, config.training.total_batch_size = 5, 32  # 2 micro-batches of 8 per rank
    tokenizer, train, _ = data.build(config.data, 64, 8, ctx.rank, ctx.world_size, 0)
    shape = GPTConfig(vocab_size=tokenizer.vocab_size)
    model = OutOfMemoryGPT(shape) if mode == "oom" and ctx.rank == 1 else GPT(shape)
    result = {"rank": ctx.rank, "error": None, "message": ""}
    try:
        dtcore.Trainer(model, None, train, config).fit()
    except (torch.OutOfMemoryError, dtcore.DtcoreError) as e:
        result |= {"error": type(e).__name__, "message": str(e)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
