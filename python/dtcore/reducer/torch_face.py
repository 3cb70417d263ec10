"""DistributedModel is a torch.nn.parallel.DistributedDataParallel to the tools that ask.

accelerate (unwrap_model, save_model, no_sync, accumulate, trigger_sync_in_backward), transformers
and torch.distributed.checkpoint recognise a data-parallel model by `isinstance(m,
DistributedDataParallel)`, then use its `.module` and a few of its attributes. DistributedModel
therefore derives from torch's class (through TorchDDPFace) without running torch's __init__:
torch's reducer, process group and logger never exist, dtcore's reducer does their work.

Note [torch DDP's members]: every member of torch's class is accounted for, so that none ends in
an AttributeError deep inside torch (test_torch_ddp_members_work_or_refuse_clearly checks the
whole class and a real torch DDP instance's attributes):
- _WORKS: work on a DistributedModel as on torch DDP (they use only the attributes it sets);
- _OWN: DistributedModel's own (forward, no_sync, pickling, _set_static_graph, the `reducer` that
  accelerate calls);
- every other method or property raises ConfigError naming it and the fix (_REFUSED gives the
  reason where there is a better one than "torch's reducer internals");
- torch DDP's instance attributes that DistributedModel lacks (_TORCH_STATE) raise
  MissingTorchState, a ConfigError that is also an AttributeError, so `hasattr` stays False.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _C
from . import stacking

_TorchDDP = torch.nn.parallel.DistributedDataParallel

_WORKS = frozenset(
    {
        "_active_ddp_module",  # dynamo's cue, set while the module runs: Note [dtcore under torch.compile]
        "_assign_modules_buffers",
        "_build_debug_param_to_name_mapping",  # the parameter indices dtcore's errors give
        "_build_params_for_reducer",  # the parameters dtcore's reducer holds, in its order
        "_get_active_ddp_module",
        "_get_data_parallel_params",
        "_inside_ddp_forward",  # dynamo's cue to split graphs at bucket boundaries: Note [dtcore under torch.compile]
        "_set_params_and_buffers_to_ignore_for_model",
        "broadcast_buffers",  # reads and sets forward_sync_buffers
        "train",
    }
)
_OWN = frozenset(
    {
        "__init__",
        "__getstate__",
        "__setstate__",
        "forward",
        "no_sync",
        "_set_static_graph",
        "_set_ddp_sink_clone",
        "_remove_autograd_hooks",
        # logging_data.py
        "_get_ddp_logging_data",
        "_set_ddp_runtime_logging_sample_rate",
        "_log_and_throw",
        # comm_hooks.py
        "register_comm_hook",
        "_register_builtin_comm_hook",
        "_register_buffer_comm_hook",
        "_default_broadcast_coalesced",
        # uneven.py
        "join",
        "join_hook",
        "join_device",
        "join_process_group",
    }
)
_CLASS_MACHINERY = frozenset({"__module__", "__annotations__", "__doc__", "__abstractmethods__", "_abc_impl"})

# member -> (what happened, the fix), where there is more to say than _INTERNAL.
_REFUSED = {
    "_register_fused_optim": (
        "optimizers fused into torch's reducer are not supported",
        "step an ordinary optimizer after backward, or dtcore.ShardedOptimizer.",
    ),
    **dict.fromkeys(
        ("scatter", "gather", "to_kwargs"),
        (
            "one device per process: inputs are not scattered nor outputs gathered across devices",
            "move inputs to model.device yourself (the model's outputs are already there).",
        ),
    ),
}
_INTERNAL = (
    "it belongs to torch's own reducer, which a dtcore model does not have (dtcore's reducer averages its gradients)",
    "use dtcore's API (dtcore.wrap options, no_sync); if you need torch's reducer itself, use torch DDP "
    "instead of dtcore, not both.",
)

# Attributes torch DDP's __init__ sets that a DistributedModel does not have.
_TORCH_STATE = frozenset(
    {
        "_accum_grad_hooks",
        "_bucket_config",
        "_comm_hooks",
        "_ddp_sink_clone",
        "_delay_all_reduce_all_params",
        "_delay_all_reduce_params",
        "_delay_grad_buffer",
        "_delay_grad_views",
        "_has_rebuilt_buckets",
        "_lazy_init_ran",
        "_module_parameters",
        "_use_python_reducer",
        "batched_grad_copy",
        "bucket_bytes_cap_default",
        "mixed_precision",
        "modules_buffers",
        "named_module_buffers",
        "skip_all_reduce_unused_params",
        "use_side_stream_for_tensor_copies",
    }
)


class MissingTorchState(_C.ConfigError, AttributeError):
    """A torch DDP attribute a DistributedModel does not have; an AttributeError too, for hasattr."""


def _refused(name: str, member: Any) -> Any:
    what, fix = _REFUSED.get(name, _INTERNAL)

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise _C.ConfigError(f"{type(self).__name__}.{name} is not supported on a dtcore model: {what}. Fix: {fix}")

    refuse.__name__ = name
    return property(refuse) if isinstance(member, property) else refuse


class _ReducerFace:
    """`model.reducer` as tools use torch DDP's: accelerate's trigger_sync_in_backward calls
    prepare_for_backward after forwards run under no_sync, so that the next backward reduces."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def prepare_for_backward(self, outputs: Any) -> None:
        self._model._arm_sync_backward(outputs)

    def __getattr__(self, name: str) -> Any:
        raise MissingTorchState(
            f"{type(self._model).__name__}.reducer.{name} is not available on a dtcore model: {_INTERNAL[0]}; only "
            f"reducer.prepare_for_backward is offered. Fix: {_INTERNAL[1]}"
        )


class TorchDDPFace(_TorchDDP):
    """torch's DistributedDataParallel class without its state; see Note [torch DDP's members]."""

    _dtcore_reducer = True  # marks dtcore's wrappers among torch DDP instances (stacking.wrapper_name)

    @property
    def reducer(self) -> _ReducerFace:
        return _ReducerFace(self)

    @property
    def _ddp_params_and_buffers_to_ignore(self) -> Any:
        # torch DDP's constructor reads this from the module it wraps first, before any collective:
        # a plain ConfigError (not an AttributeError, which hasattr would swallow) stops it there.
        raise stacking.torch_ddp_around(self, "torch DDP's constructor was given this model")

    @_ddp_params_and_buffers_to_ignore.setter
    def _ddp_params_and_buffers_to_ignore(self, value: Any) -> None:
        raise _C.ConfigError(
            f"_set_params_and_buffers_to_ignore_for_model on a {type(self).__name__}: the parameters it reduces "
            "were chosen when it was built. Fix: call it on the plain module before wrapping."
        )

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # torch.nn.Module's: parameters, buffers, submodules
        except AttributeError:
            if name not in _TORCH_STATE:
                raise
        raise MissingTorchState(
            f"{type(self).__name__}.{name} is not available on a dtcore model: {_INTERNAL[0]}. Fix: {_INTERNAL[1]}"
        )


for _name, _member in list(_TorchDDP.__dict__.items()):
    if _name not in _WORKS | _OWN | _CLASS_MACHINERY:
        setattr(TorchDDPFace, _name, _refused(_name, _member))
del _name, _member
