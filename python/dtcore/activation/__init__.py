"""Activation checkpointing: recompute the activations of repeated blocks in backward, under a
memory budget if asked (the planner is C++: csrc/dtcore/activation). See docs/activation.md.

LiveTensorMemory measures what it saves: the peak of live tensor storages in a block of code.
"""

from .api import CheckpointSummary, checkpoint_activations
from .profile import LiveTensorMemory

__all__ = ["checkpoint_activations", "CheckpointSummary", "LiveTensorMemory"]
