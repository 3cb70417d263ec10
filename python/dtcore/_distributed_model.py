"""`dtcore.wrap()` and `dtcore.DistributedDataParallel`: gradients averaged during backward.

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
    # requires_grad too: ranks that freeze differently would plan different buckets
    return [f"{name} {tuple(p.shape)} {p.dtype}{'' if p.requires_grad else ' frozen'}"
            for name, p in module.named_parameters()]


def _check_same_parameters(module: torch.nn.Module) -> None:
    """ConfigError on every rank when any rank's parameters differ from rank 0's."""
    ctx = get_context()
    if ctx.world_size == 1:
        return
    mine = _signature(module)
    device = ctx.device  # the communicator's device (NCCL takes CUDA tensors only)
    digest = torch.frombuffer(bytearray(hashlib.sha256("\n".join(mine).encode()).digest()), dtype=torch.uint8)
    digest = digest.to(device)
    gathered = torch.empty(32 * ctx.world_size, dtype=torch.uint8, device=device)
    ctx.communicator.all_gather(gathered, digest).wait(ctx.timeout)
    digests = gathered.view(ctx.world_size, 32).cpu()
    odd = [r for r in range(ctx.world_size) if not torch.equal(digests[r], digests[0])]
    if not odd:
        return
    # Rank 0's list, so that each odd rank can name its first difference.
    text = None
    if ctx.rank == 0:
        text = torch.frombuffer(bytearray("\n".join(mine).encode() or b" "), dtype=torch.uint8).to(device)
    length = torch.tensor([text.numel() if text is not None else 0], dtype=torch.int64, device=device)
    broadcast(length, src=0)
    buffer = text if text is not None else torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    broadcast(buffer, src=0)
    reference = bytes(buffer.cpu().tolist()).decode().split("\n")
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


def wrap(
    model: torch.nn.Module,
    *,
    bucket_mb: float = 25.0,
    first_bucket_mb: float = 1.0,
    comm_dtype: Optional[torch.dtype] = None,
    find_unused_parameters: bool = False,
    broadcast_buffers: bool = True,
) -> DistributedModel:
    """After `loss.backward()`, every parameter's `.grad` is the average over ranks.

    Parameters and buffers are broadcast from rank 0 first; buffers again before each forward.
    Use `with model.no_sync():` to accumulate locally over micro-batches.
    """
    return DistributedModel(
        model,
        bucket_mb=bucket_mb,
        first_bucket_mb=first_bucket_mb,
        comm_dtype=comm_dtype,
        find_unused_parameters=find_unused_parameters,
        broadcast_buffers=broadcast_buffers,
    )


# Accepted at torch's default (None or False) only.
_HARMLESS_DDP = {
    "bucket_cap_mb_list": "pass one bucket_cap_mb",
    "batched_grad_copy": "gradients are bucket views: there is nothing to copy",
    "forward_sync_buffers": "buffers are broadcast before each synced forward when broadcast_buffers=True",
}

_UNSUPPORTED_DDP = {
    "mixed_precision": "use comm_dtype-style compression through dtcore.wrap(comm_dtype=torch.bfloat16)",
    "device_mesh": "dtcore runs one data-parallel group, the whole job",
    "delay_all_reduce_named_params": "every parameter is reduced during backward",
    "param_to_hook_all_reduce": "every parameter is reduced during backward",
    "skip_all_reduce_unused_params": "unused parameters are reduced with zeros (find_unused_parameters=True)",
}


class DistributedDataParallel(DistributedModel):
    """A drop-in for torch.nn.parallel.DistributedDataParallel's constructor and behaviour.

    Switch with one import (`from dtcore import DistributedDataParallel as DDP`). Gradients are
    always bucket views (as with gradient_as_bucket_view=True); their values are the same either
    way. Arguments dtcore cannot honour raise ConfigError instead of being ignored.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: Optional[list] = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: Optional[bool] = None,  # torch 2.13's default: None means True
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: Optional[float] = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        **unsupported: Any,
    ) -> None:
        ctx = get_context()
        for name, value in unsupported.items():
            if name not in _UNSUPPORTED_DDP and name not in _HARMLESS_DDP:
                raise _C.ConfigError(f"DistributedDataParallel got an unknown argument '{name}' (torch's has none "
                                     "of that name either). Fix: check its spelling.")
            if value is not None and value is not False:  # torch's defaults are None or False
                why = _UNSUPPORTED_DDP.get(name) or _HARMLESS_DDP[name]
                raise _C.ConfigError(f"DistributedDataParallel({name}={value!r}) is not supported: {why}.")
        if device_ids:  # None or []: the module's own device
            wanted = [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in device_ids]
            if wanted != [ctx.device]:
                raise _C.ConfigError(
                    f"DistributedDataParallel(device_ids={device_ids}): this rank's device is {ctx.device}, one "
                    f"device per process. Fix: leave device_ids=None"
                    + (f" or pass device_ids=[{ctx.device.index}]." if ctx.device.type == "cuda" else " on CPU.")
                )
        out_dev = torch.device("cuda", output_device) if isinstance(output_device, int) else output_device
        if out_dev is not None and torch.device(out_dev) != ctx.device:
            raise _C.ConfigError(f"DistributedDataParallel(output_device={output_device}): outputs stay on "
                                 f"{ctx.device}, this rank's device. Fix: leave output_device=None.")
        if dim != 0:
            raise _C.ConfigError(f"DistributedDataParallel(dim={dim}): one device per process needs no scatter "
                                 "dimension. Fix: leave dim=0.")
        if process_group is not None:
            import torch.distributed as dist

            if not dist.is_initialized() or process_group is not dist.group.WORLD:
                raise _C.ConfigError(
                    "DistributedDataParallel(process_group=...): dtcore reduces over the whole job only. Fix: leave "
                    "process_group=None (or pass the default group)."
                )
        if not init_sync:
            raise _C.ConfigError(
                "DistributedDataParallel(init_sync=False): dtcore always broadcasts rank 0's parameters and checks "
                "them across ranks at wrap time. Fix: leave init_sync=True."
            )
        del check_reduction, gradient_as_bucket_view, static_graph  # honoured as they are (see docstring)
        super().__init__(
            module,
            bucket_mb=25.0 if bucket_cap_mb is None else float(bucket_cap_mb),
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=True if broadcast_buffers is None else broadcast_buffers,
        )

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        raise _C.ConfigError(
            "DistributedDataParallel.register_comm_hook is not supported: dtcore's reducer averages buckets with "
            "its own communicator. Fix: for bf16/fp16 compression use dtcore.wrap(model, comm_dtype=torch.bfloat16)."
        )
