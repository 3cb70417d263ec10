"""`dtcore.DistributedDataParallel`: a drop-in for torch.nn.parallel.DistributedDataParallel.

Switch with one import (`from dtcore import DistributedDataParallel as DDP`): torch DDP's
constructor maps onto DistributedModel. Arguments dtcore cannot honour raise ConfigError instead
of being ignored.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context
from . import stacking
from .model import _DEFAULTS, DistributedModel

# Accepted at torch's default (None or False) only.
_HARMLESS_DDP = {
    "batched_grad_copy": "gradients are bucket views: there is nothing to copy",
}

_UNSUPPORTED_DDP = {
    "mixed_precision": "use comm_dtype-style compression through dtcore.wrap(comm_dtype=torch.bfloat16)",
    "delay_all_reduce_named_params": "every parameter is reduced during backward",
    "param_to_hook_all_reduce": "every parameter is reduced during backward",
}

# torch 2.13's warnings, word for word: scripts and tests match them.
_BROADCAST_BUFFERS_DEPRECATED = (
    "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: unlike "
    "`broadcast_buffers=False`, `forward_sync_buffers=False` still syncs buffers at init. If you rely on buffers NOT "
    "being synced at init (e.g. rank-local buffers), keep using `broadcast_buffers=False` until `init_sync_buffers` "
    "is available."
)
_BOTH_BUFFER_ARGUMENTS = (
    "Both `broadcast_buffers` and `forward_sync_buffers` were specified. `broadcast_buffers` is deprecated and its "
    "value is ignored when `forward_sync_buffers` is provided."
)
_CHECK_REDUCTION_DEPRECATED = (
    "The `check_reduction` argument in `DistributedDataParallel` module is deprecated. Please avoid using it."
)


class DistributedDataParallel(DistributedModel):
    """A drop-in for torch.nn.parallel.DistributedDataParallel's constructor and behaviour, over the
    whole job or a proper subgroup of it (process_group=, or a 1-D device_mesh= such as mesh["dp"]).

    Gradients are always bucket views (as with gradient_as_bucket_view=True); their values are the
    same either way. bucket_cap_mb is in MiB, as torch's; bucket_cap_mb_list gives the first
    bucket's cap and the others' ([first, rest]). process_group (or a 1-D device_mesh's group) may be
    a proper subgroup, e.g. the data-parallel replicas beside tensor parallelism: gradients are then
    averaged over its ranks, on a communicator of its own (See Note [Subgroup communicators] in
    csrc/dtcore/comm/communicator.h), and parameters broadcast from its first rank.
    static_graph=True (or _set_static_graph()) lets parameters go unused without
    find_unused_parameters, as long as the same ones do in every step (a graph that changes is an
    error). skip_all_reduce_unused_params=True (with find_unused_parameters or static_graph) skips
    the collective of a bucket no rank used in the previous step; unlike torch's, it stays correct
    (the bucket is reduced late) when a rank uses one of its parameters after all.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: list | None = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool | None = None,  # torch 2.13's default: None means True
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        device_mesh: Any = None,
        bucket_cap_mb_list: list[float] | None = None,
        forward_sync_buffers: bool | None = None,
        skip_all_reduce_unused_params: bool = False,
        **unsupported: Any,
    ) -> None:
        ctx = get_context()
        for name, value in unsupported.items():
            if name not in _UNSUPPORTED_DDP and name not in _HARMLESS_DDP:
                raise _C.ConfigError(
                    f"DistributedDataParallel got an unknown argument '{name}' (torch's has none "
                    "of that name either). Fix: check its spelling."
                )
            if value is not None and value is not False:  # torch's defaults are None or False
                why = _UNSUPPORTED_DDP.get(name) or _HARMLESS_DDP[name]
                raise _C.ConfigError(f"DistributedDataParallel({name}={value!r}) is not supported: {why}.")
        stacking.check_wrappable(module)  # first: a dtcore wrapper refuses to have its attributes read
        ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        if not any(p.requires_grad for n, p in module.named_parameters() if n not in ignored):
            raise _C.ConfigError(  # torch's words first: scripts match them
                "DistributedDataParallel is not needed when a module doesn't have any parameter that requires a "
                f"gradient: {type(module).__name__} has none (or only ignored ones). Fix: unfreeze the parameters "
                "to train (requires_grad_(True)), or use the module without a data-parallel wrapper."
            )
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
            raise _C.ConfigError(
                f"DistributedDataParallel(output_device={output_device}): outputs stay on "
                f"{ctx.device}, this rank's device. Fix: leave output_device=None."
            )
        if dim != 0:
            raise _C.ConfigError(
                f"DistributedDataParallel(dim={dim}): one device per process needs no scatter "
                "dimension. Fix: leave dim=0."
            )
        if not init_sync:
            raise _C.ConfigError(
                "DistributedDataParallel(init_sync=False): dtcore always broadcasts rank 0's parameters and checks "
                "them across ranks at wrap time. Fix: leave init_sync=True."
            )
        group = _torch_group(process_group, device_mesh)
        if broadcast_buffers is not None:  # as torch's: broadcast_buffers=False also skips the buffers at init
            warnings.warn(
                _BOTH_BUFFER_ARGUMENTS if forward_sync_buffers is not None else _BROADCAST_BUFFERS_DEPRECATED,
                FutureWarning,
                stacklevel=2,
            )
        if forward_sync_buffers is not None:
            forward_sync, init_sync_buffers = forward_sync_buffers, True
        else:
            forward_sync = init_sync_buffers = True if broadcast_buffers is None else broadcast_buffers
        if check_reduction:
            warnings.warn(_CHECK_REDUCTION_DEPRECATED, FutureWarning, stacklevel=2)
        options = dict(
            bucket_mb=_DEFAULTS.bucket_mb,
            first_bucket_mb=_DEFAULTS.first_bucket_mb,
            find_unused_parameters=find_unused_parameters,
            comm_dtype=None,
            zero=0,
            static_graph=static_graph,
            skip_all_reduce_unused_params=skip_all_reduce_unused_params,
        )
        if bucket_cap_mb_list:
            options.update(_bucket_caps(bucket_cap_mb_list))
        elif bucket_cap_mb is not None:
            options.update(bucket_mb=float(bucket_cap_mb), first_bucket_mb=float(bucket_cap_mb))  # as torch's
        self._build(
            module,
            options,
            forward_sync_buffers=forward_sync,
            init_sync_buffers=init_sync_buffers,
            process_group=group,
        )
        # The argument, as torch's logging data reports it: dtcore's gradients are bucket views either way.
        self._ddp_log.data["gradient_as_bucket_view"] = int(gradient_as_bucket_view)
        if bucket_cap_mb_list:
            self.bucket_bytes_cap_list = [int(mb * 2**20) for mb in bucket_cap_mb_list]
        if device_mesh is not None:
            self.device_mesh = device_mesh  # as torch's, only when given
        if static_graph:
            self._set_static_graph()


def _torch_group(process_group: Any, device_mesh: Any) -> Any:
    """The group DDP was given (or a 1-D mesh's); None for the default (the whole job)."""
    if process_group is not None and device_mesh is not None:
        raise _C.ConfigError(  # torch's words first
            "Cannot specify both process_group and device_mesh arguments. Fix: pass one of them."
        )
    if device_mesh is not None:
        if getattr(device_mesh, "ndim", None) != 1:  # torch's words first
            raise _C.ConfigError(
                f"Only 1D device mesh is supported, but got {device_mesh!r}. Fix: pass a torch DeviceMesh of the "
                "data-parallel dimension alone (device_mesh=mesh['dp'])."
            )
        process_group = device_mesh.get_group(mesh_dim=0)
    return process_group


def _bucket_caps(caps: list[float]) -> dict[str, float]:
    """torch's bucket_cap_mb_list as dtcore's two caps: the first bucket's, then every other's."""
    first, *rest = (float(c) for c in caps)
    if any(c != rest[0] for c in rest):
        raise _C.ConfigError(
            f"DistributedDataParallel(bucket_cap_mb_list={list(caps)}): dtcore's buckets have two caps, the "
            "first bucket's and every other's. Fix: pass [first, rest] (e.g. "
            f"[{first:g}, {max(rest):g}]), or bucket_cap_mb alone."
        )
    return {"first_bucket_mb": first, "bucket_mb": rest[0] if rest else first}
