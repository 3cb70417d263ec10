"""The "selective" checkpoint policy: which operators a selectively checkpointed block keeps.

Used with torch.utils.checkpoint.create_selective_checkpoint_contexts (torch's selective
activation checkpointing) by api.py, and by profile.py to measure what the
kept outputs weigh and what the rest costs to recompute.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext, create_selective_checkpoint_contexts

from .. import _C

# Note [Selective checkpoint ops]
# Kept: matrix multiplications and attention, the operators whose recompute costs the most per
# byte kept. F.linear and F.scaled_dot_product_attention reach the dispatcher as these (checked
# on CPU with torch 2.13: addmm/mm for linear; bmm on the math attention path that dropout takes;
# otherwise _scaled_dot_product_flash_attention_for_cpu, whose outputs include the logsumexp its
# backward needs; the CUDA attention kernels on GPUs). Everything else (norms, activations,
# softmax, dropout with its replayed random state, adds) is recomputed in backward.
# A kept output must not be changed in place afterwards (e.g. nn.ReLU(inplace=True) after a
# Linear): torch's cache would hand the changed tensor to backward and refuses to, in backward.
# The profile marks such blocks (no selective option for a budget plan) and the policy raises a
# ConfigError in forward when it sees one; see mutated_by().
SAVED_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    )
    if hasattr(torch.ops.aten, name)
)

_written_args: dict[Any, tuple[tuple[int, str], ...]] = {}  # operator -> (position, name) of each argument it writes


def mutated_by(op: Any, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """The tensors operator `op` changes in place (`self` of relu_, add_, copy_; `out=` arguments)."""
    written = _written_args.get(op)
    if written is None:
        schema = getattr(op, "_schema", None)
        written = (
            tuple(
                (i, a.name)
                for i, a in enumerate(schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write
            )
            if schema is not None
            else ()
        )
        _written_args[op] = written
    for i, name in written:
        value = args[i] if i < len(args) else kwargs.get(name)
        for t in tree_flatten(value)[0]:
            if isinstance(t, torch.Tensor):
                yield t


# The in-place check of selective_context() reads each kept operator's output in the policy, which
# torch 2.13 calls after the operator with it (SelectiveCheckpointContext.op_output); earlier
# releases call the policy before the operator runs. Without it selective checkpointing is refused:
# policy 'selective' raises unsupported_error(), and 'budget:' plans whole-block checkpoints only.
SUPPORTED = "op_output" in inspect.signature(SelectiveCheckpointContext.__init__).parameters


def unsupported_error(policy: str) -> _C.ConfigError:
    return _C.ConfigError(
        f"checkpoint_activations(policy={policy!r}): selective checkpointing needs torch 2.13 or newer, whose "
        "checkpoint policy sees each operator's output (dtcore needs it to refuse an in-place change of a kept "
        f"output); this is torch {torch.__version__}. Fix: use policy 'all' or 'budget:<size>' (which then "
        "checkpoints whole blocks only), or upgrade torch."
    )


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata  # one StorageImpl, whatever view of it we hold


def mutation_error(blocks: list[str], op: Any) -> _C.ConfigError:
    """ConfigError: `op` changed an output that selective checkpointing of `blocks` kept."""
    which = ("block " if len(blocks) == 1 else "blocks ") + ", ".join(f"'{b}'" for b in blocks)
    return _C.ConfigError(
        f"checkpoint_activations(policy='selective'): {which}: {op} changes the output of a matrix multiplication "
        "in place after selective checkpointing kept it, so backward would see the changed tensor. Fix: use policy "
        "'all' (or 'budget:<size>', which leaves selective out for such blocks), or make the operation out of place "
        "(e.g. nn.ReLU(inplace=False), x = x + y instead of x += y)."
    )


def selective_context(block: str = "?"):
    """context_fn for torch.utils.checkpoint.checkpoint: keep SAVED_OPS' outputs, recompute the rest.

    Raises mutation_error() in forward when an operator of the block changes a kept output in place.
    """
    kept: set[int] = set()  # storage keys of the outputs kept in this call (alive: torch's cache holds them)

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if not ctx.is_recompute and not torch.compiler.is_compiling():
            if kept and any(storage_key(t) in kept for t in mutated_by(op, args, kwargs)):
                raise mutation_error([block], f"the in-place operator {op}")
            if op in SAVED_OPS:
                kept.update(storage_key(t) for t in tree_flatten(ctx.op_output)[0] if isinstance(t, torch.Tensor))
        return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
