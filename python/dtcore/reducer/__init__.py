"""Gradient averaging during backward (csrc/dtcore/reducer): `dtcore.wrap` and the torch DDP drop-in."""

from .ddp import DistributedDataParallel
from .model import DistributedModel, wrap

__all__ = ["wrap", "DistributedModel", "DistributedDataParallel"]
