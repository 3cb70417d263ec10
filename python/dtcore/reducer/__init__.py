"""Gradient averaging during backward (csrc/dtcore/reducer): DistributedModel (dtcore.wrap with zero=0|1|2) and
the torch DDP drop-in."""

from .ddp import DistributedDataParallel
from .model import DistributedModel

__all__ = ["DistributedModel", "DistributedDataParallel"]
