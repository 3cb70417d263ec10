"""One gradient reducer per parameter: dtcore refuses to stack on torch DDP, FSDP or itself.

Two reducers hooked on the same parameters both write `.grad` during backward (torch DDP copies
gradients into its buckets and back, dtcore makes them views of its own), so the step silently
uses wrong gradients, sometimes different on each rank. Refused on both sides, before any
collective and before a wrong step:
- dtcore.wrap(module) looks for a data-parallel wrapper in the module tree (torch DDP, FSDP1,
  fully_shard, DistributedModel);
- a second dtcore wrapper of parameters an earlier live one reduces takes them over, as torch allows
  a module to be wrapped again: the earlier one's hooks are removed and it refuses any further
  forward, saying it was replaced (take_over). A ZeRO wrapper is not taken over: its
  ShardedOptimizer steps from its shards;
- torch DDP around a DistributedModel trips at its construction, on the attribute it reads from
  the module it wraps (DistributedModel's `_ddp_params_and_buffers_to_ignore`);
- torch DDP around a module that holds a DistributedModel deeper down is caught by that
  DistributedModel's forward, which runs inside torch DDP's forward (`_get_active_ddp_module`).
"""

from __future__ import annotations

import sys
import weakref

import torch

from .. import _C

_TorchDDP = torch.nn.parallel.DistributedDataParallel

# id(parameter) -> (a weak reference to it, to its DistributedModel). By id: tensors compare
# elementwise, so they cannot be dictionary keys; the weak references drop the entry with either.
_owners: dict[int, tuple[weakref.ref, weakref.ref]] = {}

_ACCELERATE_FIX = (
    "Under accelerate: pass only the optimizer and data loaders to accelerator.prepare() and keep the "
    "dtcore model as it is (accelerator.no_sync, accumulate, unwrap_model and save_model work with it); or build "
    "the Accelerator from dtcore.integrations.accelerate, whose prepare(model) gives a dtcore model."
)


def wrapper_name(module: torch.nn.Module) -> str | None:
    """Which data-parallel wrapper `module` is, or None."""
    if isinstance(module, _TorchDDP):
        if getattr(module, "_dtcore_reducer", False):
            return f"dtcore's {type(module).__name__}"
        return "torch.nn.parallel.DistributedDataParallel"
    fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported: no module can be FSDP
    if fsdp is not None:
        if isinstance(module, fsdp.FullyShardedDataParallel):
            return "torch FSDP (FullyShardedDataParallel)"
        if isinstance(module, fsdp.FSDPModule):
            return "torch FSDP2 (fully_shard)"
    return None


def _error(inner: str, outer: str, where: str, fix: str) -> _C.ConfigError:
    return _C.ConfigError(
        f"{outer} over a model already wrapped by {inner} ({where}): two gradient reducers on the same parameters "
        f"both write their .grad during backward, so every step would use wrong gradients. Fix: {fix}"
    )


def check_wrappable(module: torch.nn.Module) -> None:
    """ConfigError if `module` or a submodule is a data-parallel wrapper, or if a live ZeRO
    DistributedModel already reduces one of its parameters (other earlier wrappers are taken over)."""
    for name, sub in module.named_modules():
        kind = wrapper_name(sub)
        if kind is not None:
            where = "the module passed" if name == "" else f"its submodule '{name}'"
            plain = "build the model without fully_shard" if "fully_shard" in kind else "pass the wrapper's .module"
            fix = f"use one data-parallel wrapper: dtcore.wrap replaces {kind}, so {plain}. "
            raise _error(kind, "dtcore.wrap()", where, fix + _ACCELERATE_FIX)
    for name, p in module.named_parameters():
        owner = _owner_of(p)
        if owner is not None and owner[2]:
            raise _error(
                f"dtcore's {owner[0]}",
                "dtcore.wrap()",
                f"parameter '{name}' is already reduced by a {owner[0]}(zero={owner[2]}) of {owner[1]} that is "
                "still alive, whose ShardedOptimizer steps from that wrapper's gradient shards",
                "wrap once and use the returned model everywhere; to wrap again with other options, drop "
                "every reference to the earlier wrapper (and its optimizer) first.",
            )


def _live_owner(p: torch.Tensor) -> torch.nn.Module | None:
    """The live DistributedModel whose reducer hooks `p` (not one that gave its hooks up), or None."""
    ref, owner_ref = _owners.get(id(p), (None, None))
    owner = owner_ref() if ref is not None and ref() is p else None
    return owner if owner is not None and owner._retired is None else None


def _owner_of(p: torch.Tensor) -> tuple[str, str, int] | None:
    """The class names of the live DistributedModel that reduces `p` and of its module, and its ZeRO
    stage, or None. Names only: a reference in the raising frame would keep that model (and its
    hooks) alive."""
    owner = _live_owner(p)
    return None if owner is None else (type(owner).__name__, type(owner.module).__name__, owner._options["zero"])


def take_over(model: torch.nn.Module, params: list[torch.Tensor]) -> None:
    """The earlier live dtcore wrappers of `params` give them up to `model` (See Note [One reducer
    per parameter] in csrc/dtcore/reducer/reducer.h): their hooks are removed, and they refuse any
    further use. Called just before `model`'s reducer adds its own hooks."""
    earlier = {id(o): o for o in map(_live_owner, params) if o is not None and o is not model}
    for owner in earlier.values():
        owner._retire(
            f"was replaced by a newer {type(model).__name__} of {type(model.module).__name__} built over the same "
            "parameters, which took them over",
            "use the newer wrapper (the one the later dtcore.wrap or DistributedDataParallel call returned) "
            "everywhere.",
        )


def claim(model: torch.nn.Module, params: list[torch.Tensor]) -> None:
    """Records that `model`'s reducer hooks `params` (see check_wrappable and take_over)."""
    owner = weakref.ref(model)
    for p in params:
        key = id(p)
        _owners[key] = (weakref.ref(p, lambda _, key=key: _owners.pop(key, None)), owner)


def refuse_outer_ddp(model: torch.nn.Module) -> None:
    """ConfigError when `model`'s forward runs inside a torch DDP's forward (see the module doc)."""
    outer = _TorchDDP._get_active_ddp_module()
    if outer is not None and outer is not model:
        raise torch_ddp_around(model, f"a torch DDP of {type(outer.module).__name__} runs its forward")


def torch_ddp_around(model: torch.nn.Module, where: str) -> _C.ConfigError:
    return _error(
        f"dtcore's {type(model).__name__} of {type(model.module).__name__}",
        "torch.nn.parallel.DistributedDataParallel",
        where,
        "keep one of the two: dtcore.wrap(model) alone, or torch DDP of the plain model. " + _ACCELERATE_FIX,
    )
