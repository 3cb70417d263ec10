"""The "selective" checkpoint policy: which operators a selectively checkpointed block keeps.

Used with torch.utils.checkpoint.create_selective_checkpoint_contexts (torch's selective
activation checkpointing) by _activation.py, and by _activation_profile.py to measure what the
kept outputs weigh and what the rest costs to recompute.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# Note [Selective checkpoint ops]
# Kept: matrix multiplications and attention, the operators whose recompute costs the most per
# byte kept. F.linear and F.scaled_dot_product_attention reach the dispatcher as these (checked
# on CPU with torch 2.13: addmm/mm for linear; bmm on the math attention path that dropout takes;
# otherwise _scaled_dot_product_flash_attention_for_cpu, whose outputs include the logsumexp its
# backward needs; the CUDA attention kernels on GPUs). Everything else (norms, activations,
# softmax, dropout with its replayed random state, adds) is recomputed in backward.
SAVED_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_mm",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                 "_flash_attention_forward", "_efficient_attention_forward")
    if hasattr(torch.ops.aten, name)
)


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:  # noqa: ANN001
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():  # noqa: ANN201
    """context_fn for torch.utils.checkpoint.checkpoint: keep SAVED_OPS' outputs, recompute the rest."""
    return create_selective_checkpoint_contexts(_policy)
