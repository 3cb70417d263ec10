"""DistributedModel: a module whose gradients are averaged across ranks during backward.

Internal until gradient bucketing is complete (find_unused_parameters, comm_dtype, bucket
rebuild and the DistributedDataParallel drop-in come with it); then `dtcore.wrap` returns one.

On construction: every rank must hold the same parameters (names, shapes, dtypes; a mismatch is a
ConfigError naming the ranks and the first differing parameter), then parameters and buffers are
broadcast from rank 0 and the C++ reducer takes over the gradients (csrc/dtcore/reducer).
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Iterator, Optional

import torch

from . import _C
from ._collectives import broadcast
from ._context import get_context


def _signature(module: torch.nn.Module) -> list[str]:
    return [f"{name} {tuple(p.shape)} {p.dtype}" for name, p in module.named_parameters()]


def _check_same_parameters(module: torch.nn.Module) -> None:
    """ConfigError on every rank when any rank's parameters differ from rank 0's."""
    ctx = get_context()
    if ctx.world_size == 1:
        return
    mine = _signature(module)
    digest = torch.frombuffer(bytearray(hashlib.sha256("\n".join(mine).encode()).digest()), dtype=torch.uint8)
    gathered = torch.empty(32 * ctx.world_size, dtype=torch.uint8)
    ctx.communicator.all_gather(gathered, digest).wait(ctx.timeout)
    digests = gathered.view(ctx.world_size, 32)
    odd = [r for r in range(ctx.world_size) if not torch.equal(digests[r], digests[0])]
    if not odd:
        return
    # Rank 0's list, so that each odd rank can name its first difference.
    text = torch.frombuffer(bytearray("\n".join(mine).encode() or b" "), dtype=torch.uint8) if ctx.rank == 0 else None
    length = torch.tensor([text.numel() if text is not None else 0], dtype=torch.int64)
    broadcast(length, src=0)
    buffer = text if text is not None else torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast(buffer, src=0)
    reference = bytes(buffer.tolist()).decode().split("\n")
    where = ""
    if ctx.rank in odd:
        for i in range(max(len(mine), len(reference))):
            a = reference[i] if i < len(reference) else "<none>"
            b = mine[i] if i < len(mine) else "<none>"
            if a != b:
                where = f" First difference, parameter #{i}: rank 0 has '{a}', rank {ctx.rank} has '{b}'."
                break
        if len(mine) != len(reference) and not where:
            where = f" Rank 0 has {len(reference)} parameters, rank {ctx.rank} has {len(mine)}."
    raise _C.ConfigError(
        f"the model differs across ranks: rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} "
        f"ha{'ve' if len(odd) > 1 else 's'} other parameters (names, shapes or dtypes) than rank 0.{where} "
        "Fix: build the same model on every rank (same code, same configuration) before wrapping it."
    )


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
    """Wraps `module`; `forward` passes through, `.module` is the original."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        bucket_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        comm_dtype: Optional[torch.dtype] = None,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
    ) -> None:
        super().__init__()
        ctx = get_context()
        self.module = module
        _check_same_parameters(module)
        if ctx.world_size > 1:
            _broadcast_tensors([p.detach() for p in module.parameters()] + list(module.buffers()))
        named = [(n, p) for n, p in module.named_parameters()]  # tied parameters appear once
        if comm_dtype is not None and comm_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise _C.ConfigError(
                f"comm_dtype={comm_dtype} cannot carry gradients. Fix: use torch.bfloat16, torch.float16 or None."
            )
        self._reducer = _C.Reducer([p for _, p in named], [n for n, _ in named], ctx.communicator, bucket_mb,
                                   first_bucket_mb, find_unused_parameters, comm_dtype)
        self._find_unused = find_unused_parameters
        self._broadcast_buffers = broadcast_buffers and ctx.world_size > 1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            self._reducer.prepare_for_backward()
        if self._broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers:
                _broadcast_tensors(buffers)  # e.g. BatchNorm running statistics, as DDP does
        out = self.module(*args, **kwargs)
        if self._find_unused and torch.is_grad_enabled():
            self._reducer.find_unused(_tensors_in(out))
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate locally; the next one outside reduces the sum."""
        self._reducer.set_require_sync(False)
        try:
            yield
        finally:
            self._reducer.set_require_sync(True)

    @property
    def bucket_params(self) -> list[list[int]]:
        return self._reducer.bucket_params()
