"""`dtcore.wrap()` and DistributedModel: gradients averaged during backward.

On construction: every rank must hold the same parameters (names, shapes, dtypes; a mismatch is a
ConfigError naming the ranks and the first differing parameter), then parameters and buffers are
broadcast from rank 0 and the C++ reducer takes over the gradients (csrc/dtcore/reducer). The
reducer's options and their defaults are its own (_C.ReducerOptions); the signature here reads
them from there.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context
from ..comm import agree
from ..comm.collectives import broadcast
from . import zero_guard

_DEFAULTS = _C.ReducerOptions()


def _signature(module: torch.nn.Module) -> list[str]:
    # requires_grad too: ranks that freeze differently would plan different buckets
    return [
        f"{name} {tuple(p.shape)} {p.dtype}{'' if p.requires_grad else ' frozen'}"
        for name, p in module.named_parameters()
    ]


@torch.no_grad()
def _broadcast_tensors(tensors: list[torch.Tensor]) -> None:
    """Rank 0's values into every rank's tensors, one broadcast per dtype and device."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        flat = torch.cat([t.reshape(-1) for t in group])  # (sum of numels,)
        broadcast(flat, src=0)
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) output: tuples, lists, dicts, dataclass-like objects' fields."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    if hasattr(value, "__dict__"):
        return [t for v in vars(value).values() for t in _tensors_in(v)]
    return []


class DistributedModel(torch.nn.Module):
    """Wraps `module`; `forward` passes through, `.module` is the original. See dtcore.wrap.

    bucket_mb / first_bucket_mb: bucket caps in MiB (2^20 bytes, as torch DDP's bucket_cap_mb); the
    first bucket is small so that communication starts early in backward. comm_dtype: send
    gradients as torch.bfloat16 or torch.float16. find_unused_parameters: allow parameters that get
    no gradient in some steps. broadcast_buffers: broadcast rank 0's buffers before each forward.
    zero: 0 keeps whole gradients on every rank; 1 shards the optimizer state and 2 the gradients
    too (after backward every .grad is None): step with dtcore.ShardedOptimizer (ZeRO-1/2).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        bucket_mb: float = _DEFAULTS.bucket_mb,
        first_bucket_mb: float = _DEFAULTS.first_bucket_mb,
        comm_dtype: torch.dtype | None = _DEFAULTS.comm_dtype,
        find_unused_parameters: bool = _DEFAULTS.find_unused_parameters,
        broadcast_buffers: bool = True,
        zero: int = _DEFAULTS.zero,
    ) -> None:
        super().__init__()
        ctx = get_context()
        self.module = module
        agree.check_same(
            _signature(module),
            what="the model (parameter names, shapes, dtypes and requires_grad)",
            item="parameter",
            fix="build the same model on every rank (same code, same configuration) before wrapping it.",
        )
        if ctx.world_size > 1:
            _broadcast_tensors([p.detach() for p in module.parameters()] + list(module.buffers()))
        named = [(n, p) for n, p in module.named_parameters()]  # tied parameters appear once
        options = _C.ReducerOptions(bucket_mb, first_bucket_mb, find_unused_parameters, comm_dtype, zero)
        self._reducer = _C.Reducer([p for _, p in named], [n for n, _ in named], ctx.communicator, options)
        self._trainable = [p for _, p in named if p.requires_grad]  # the reducer's indices (bucket_layout)
        if zero == 2:
            zero_guard.guard(module)
        self._find_unused = find_unused_parameters
        # Collected once, as DDP does (BatchNorm updates its buffers in place): not per forward.
        self._synced_buffers = list(module.buffers()) if broadcast_buffers and ctx.world_size > 1 else []
        self._sync = True  # False inside no_sync()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # Only a forward with grad enabled prepares a reduction, and only a synced one talks to the
        # other ranks: a rank evaluating alone under torch.no_grad() issues no collective.
        synced = torch.is_grad_enabled() and self._sync
        if torch.is_grad_enabled():
            self._reducer.prepare_for_backward(self._sync)
        if synced and self._synced_buffers:
            _broadcast_tensors(self._synced_buffers)  # e.g. BatchNorm running statistics, as DDP does
        out = self.module(*args, **kwargs)
        if synced and self._find_unused:
            self._reducer.find_unused(_tensors_in(out))
        return out

    @property
    def zero(self) -> int:
        return self._reducer.zero

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; with zero=1|2 the gradients are zeroed in place in their buckets (or shards)."""
        if self.zero == 0:
            super().zero_grad(set_to_none)
        else:
            self._reducer.zero_grad()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward and backward passes inside accumulate locally; the next synced one reduces the sum."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    @property
    def bucket_params(self) -> list[list[int]]:
        return self._reducer.bucket_params()


def wrap(model: torch.nn.Module, **options: Any) -> DistributedModel:
    """After `loss.backward()`, every parameter's `.grad` is the average over ranks.

    Parameters and buffers are broadcast from rank 0 first; buffers again before each forward.
    Use `with model.no_sync():` to accumulate locally over micro-batches. The keyword arguments are
    DistributedModel's (its docstring says what each does).
    """
    return DistributedModel(model, **options)


def _wrap_signature() -> inspect.Signature:
    """DistributedModel's, declared there once, with wrap's first parameter (`model`)."""
    module, *keywords = inspect.signature(DistributedModel).parameters.values()
    return inspect.Signature([module.replace(name="model"), *keywords], return_annotation=DistributedModel)


wrap.__signature__ = _wrap_signature()  # type: ignore[attr-defined]  (help(dtcore.wrap) and editors show it)
