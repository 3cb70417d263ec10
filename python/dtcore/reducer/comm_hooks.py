"""torch DDP's communication hooks on a dtcore model: register_comm_hook, the built-in hooks and
the buffer hook.

A gradient hook runs inside dtcore's reducer (See Note [Communication hooks] in
csrc/dtcore/reducer/comm_hook.h): it gets each ready bucket as a torch.distributed.GradBucket,
returns a torch.futures.Future of the reduced bucket, and the reducer waits for it, with the job's
timeout, before backward ends. torch's own hooks (allreduce_hook, the fp16/bf16 compression hooks
and wrappers, PowerSGD, post-localSGD) call torch.distributed collectives on the default group,
which dtcore.init() sets up (torch_distributed=True, the default).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel.distributed import _BufferCommHookLocation

from .. import _C
from ..comm.collectives import broadcast_tensors
from .logging_data import records_errors

# torch's C++ built-in hooks and the Python hooks that compute the same.
_BUILTIN = {
    dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
    dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
}


def require_default_group(what: str) -> None:
    """ConfigError unless torch.distributed's default group is up (dtcore.init sets it up)."""
    if not dist.is_initialized():
        raise _C.ConfigError(
            f"{what} runs torch.distributed collectives on the default process group, which is not initialized: "
            "dtcore.init(torch_distributed=False) leaves torch.distributed alone. Fix: call dtcore.init() with "
            "torch_distributed=True (the default)."
        )


class HookNotCallable(_C.ConfigError, TypeError):
    """A communication hook that is not callable: a TypeError too, as torch DDP raises."""


def _check_hook(hook: Any) -> None:
    """torch DDP's checks of a hook's signature, with dtcore's errors."""
    if not callable(hook):
        raise HookNotCallable(
            f"register_comm_hook(hook={hook!r}): a communication hook must be callable as hook(state, bucket) -> "
            "torch.futures.Future[torch.Tensor]. Fix: pass a function such as torch's default_hooks.allreduce_hook."
        )
    params = inspect.signature(hook).parameters
    bucket = params.get("bucket")
    if bucket is not None and bucket.annotation not in (inspect.Parameter.empty, dist.GradBucket):
        raise _C.ConfigError(
            f"register_comm_hook: the hook {hook.__qualname__}'s bucket is annotated {bucket.annotation!r}. Fix: "
            "annotate it torch.distributed.GradBucket (or not at all)."
        )
    returns = inspect.signature(hook).return_annotation
    if returns not in (inspect.Signature.empty, torch.futures.Future[torch.Tensor]):
        raise _C.ConfigError(
            f"register_comm_hook: the hook {hook.__qualname__} is annotated to return {returns!r}. Fix: annotate "
            "it torch.futures.Future[torch.Tensor] (or not at all)."
        )


class CommHooks:
    """The hook registration of torch DDP, on DistributedModel (which supplies `_reducer`, `_comm`,
    `module`, `process_group`, `forward_sync_buffers` and `_synced_buffers`)."""

    _comm_hook: tuple[Any, Callable] | None = None  # (state, hook), registered again on a copy's reducer
    _buffer_hook: tuple[Any, Callable, _BufferCommHookLocation] | None = None

    @records_errors
    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """As torch DDP's: `hook(state, bucket)` reduces each gradient bucket; once, before the first backward."""
        _check_hook(hook)
        self._reducer.register_comm_hook(state, hook)
        self._comm_hook = (state, hook)
        self._set_comm_hook_name(hook.__qualname__)  # as torch's logging data names it

    @records_errors
    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        """As torch DDP's: BuiltinCommHookType.ALLREDUCE or FP16_COMPRESS, on the default group."""
        if comm_hook_type not in _BUILTIN:
            raise _C.ConfigError(
                f"_register_builtin_comm_hook({comm_hook_type!r}): torch's built-in hooks are ALLREDUCE and "
                "FP16_COMPRESS. Fix: pass torch.distributed.BuiltinCommHookType.ALLREDUCE or FP16_COMPRESS."
            )
        require_default_group("_register_builtin_comm_hook")
        # As torch's built-in hooks: over this model's group (state None is torch's WORLD).
        group = None if self.process_group is dist.group.WORLD else self.process_group
        self.register_comm_hook(group, _BUILTIN[comm_hook_type])
        self._set_comm_hook_name(str(comm_hook_type))

    @records_errors
    def _register_buffer_comm_hook(
        self, state: Any, hook: Callable, comm_hook_location: Any = _BufferCommHookLocation.POST_FORWARD
    ) -> None:
        """As torch DDP's: `hook(state, {name: buffer})` syncs the buffers instead of the broadcast from rank 0,
        before or after each synced forward; futures it returns are waited for before backward ends."""
        if not callable(hook):
            raise HookNotCallable(
                f"_register_buffer_comm_hook(hook={hook!r}): the hook must be callable as hook(state, buffers). Fix: "
                "pass a function."
            )
        if comm_hook_location not in tuple(_BufferCommHookLocation):
            raise _C.ConfigError(
                f"_register_buffer_comm_hook(comm_hook_location={comm_hook_location!r}). Fix: pass "
                "_BufferCommHookLocation.PRE_FORWARD or POST_FORWARD."
            )
        self._buffer_hook = (state, hook, comm_hook_location)

    def _reattach_hooks(self, reducer: Any) -> None:
        """A copy's new reducer gets the gradient hook the original had."""
        if self._comm_hook is not None:
            reducer.register_comm_hook(*self._comm_hook)

    def _default_broadcast_coalesced(
        self, bufs: list[torch.Tensor] | None = None, bucket_size: int | None = None, authoritative_rank: int = 0
    ) -> None:
        """As torch DDP's: `bufs` (by default the buffers a synced forward broadcasts) from rank
        `authoritative_rank` to every rank; what a buffer hook calls to keep the default broadcast."""
        del bucket_size  # dtcore's broadcast coalesces by dtype, whatever the size
        broadcast_tensors(list(bufs) if bufs is not None else self._synced_buffers, authoritative_rank, self._comm)

    def _sync_forward_buffers(self, src: int, post_forward: bool) -> None:
        """The buffers of a synced forward: rank `src`'s broadcast before it, or the buffer hook where it asked."""
        if self._buffer_hook is None:
            buffers = [] if post_forward else self._synced_buffers
            if buffers:
                broadcast_tensors(buffers, src, self._comm)
            return
        state, hook, location = self._buffer_hook
        if post_forward != (location == _BufferCommHookLocation.POST_FORWARD):
            return
        futures = hook(state, dict(self.module.named_buffers()))
        if futures is not None:
            self._reducer.install_post_backward_futures(list(futures))
