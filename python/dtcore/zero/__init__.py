"""ZeRO: dtcore.wrap for every stage, the sharded optimizer, shard-aware clipping, and stage 3's units
(stage3.py, schedule.py, flat.py, units.py)."""

from .clip import clip_grad_norm_
from .optimizer import ELEMENTWISE, ShardedOptimizer
from .stage3 import FullyShardedModel
from .wrap import wrap

__all__ = ["wrap", "FullyShardedModel", "ShardedOptimizer", "clip_grad_norm_", "ELEMENTWISE"]
