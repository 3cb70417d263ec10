"""`python -m dtcore.train [--preset P] [--config F.toml] [--key=value ...]`: the built-in GPT.

Exit statuses: reference.EXIT_STATUS (shown by --help).
"""

from __future__ import annotations

import logging
import sys

import torch

from .. import _C
from ..bootstrap import init, shutdown
from .config import parse_args
from .demo import data
from .demo.gpt import GPT, shape
from .reference import help_text
from .trainer import Trainer

log = logging.getLogger("dtcore.train")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(help_text())
        return 0
    try:
        config = parse_args(argv)
    except _C.ConfigError as e:
        print(f"dtcore.train: error: {e}", file=sys.stderr)
        return 2
    try:
        ctx = init(seed=config.training.seed)
        m, t = config.model, config.training
        tokenizer, train, evaluation = data.build(
            config.data, m.block_size, t.device_batch_size, ctx.rank, ctx.world_size, t.seed
        )
        model = GPT(shape(m, tokenizer.vocab_size, f"data.tokenizer={config.data.tokenizer!r}"))
        if ctx.rank == 0:
            params = sum(p.numel() for p in model.parameters())
            log.info(
                "GPT %.2fM parameters, vocabulary %d (%s tokenizer: %d), %d rank(s) on %s",
                params / 1e6,
                model.config.vocab_size,
                config.data.tokenizer,
                tokenizer.vocab_size,
                ctx.world_size,
                ctx.device,
            )
        result = Trainer(model, None, train, config, eval_data=evaluation).fit()
    except _C.ConfigError as e:
        log.error("%s", e)
        return 2
    except (_C.DtcoreError, torch.OutOfMemoryError) as e:
        log.error("the run ended: %s", e)  # CommError: the health monitor's verdict; OOM: the breakdown
        return 1
    if result["losses"] and ctx.rank == 0:
        log.info("done: step %d, loss %.4f", result["step"], result["losses"][-1])
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
