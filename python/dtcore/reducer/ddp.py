"""`dtcore.DistributedDataParallel`: a drop-in for torch.nn.parallel.DistributedDataParallel.

Switch with one import (`from dtcore import DistributedDataParallel as DDP`): torch DDP's
constructor maps onto DistributedModel. Arguments dtcore cannot honour raise ConfigError instead
of being ignored.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context
from .model import DistributedModel

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

    Gradients are always bucket views (as with gradient_as_bucket_view=True); their values are the
    same either way. bucket_cap_mb is in MiB, as torch's.
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
        options: dict[str, Any] = {} if bucket_cap_mb is None else {"bucket_mb": float(bucket_cap_mb)}
        super().__init__(
            module,
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=True if broadcast_buffers is None else broadcast_buffers,
            **options,
        )
