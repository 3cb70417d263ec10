"""ZeRO-1/2: the sharded optimizer and shard-aware gradient clipping (see optimizer.py)."""

from .clip import clip_grad_norm_
from .optimizer import ELEMENTWISE, ShardedOptimizer

__all__ = ["ShardedOptimizer", "clip_grad_norm_", "ELEMENTWISE"]
