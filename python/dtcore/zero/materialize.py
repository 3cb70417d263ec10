"""zero=3 on a model built on the meta device: each unit's parameters come into being on this rank's
device just before they are sharded, so that no rank ever holds more than its shards and one unit.

A module whose own parameters or buffers are on meta gets real (uninitialised) tensors on the
device, then is initialised by `init(module)` when given, else by its `reset_parameters()`
(torch.nn's layers have one). A tied parameter (one Parameter in two modules) stays one. The ranks'
values need not agree: the unit is broadcast from rank 0 before it is sharded (stage3.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _C


def _has_meta(m: torch.nn.Module) -> bool:
    tensors = list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
    return any(t.is_meta for t in tensors)


def materialize(
    modules: list[torch.nn.Module],
    device: torch.device,
    init: Callable[[torch.nn.Module], None] | None,
    label: str,
    holders: dict[int, list[tuple[torch.nn.Module, str]]],
) -> None:
    """Real tensors for the meta parameters and buffers of `modules`, initialised (see the module doc).
    `holders` (registrations(model)) lists every module and name that registers each parameter: a tied
    one is replaced everywhere at once, so that it stays one Parameter."""
    for m in modules:
        if not _has_meta(m):
            continue
        if init is None and not callable(getattr(m, "reset_parameters", None)):
            raise _C.ConfigError(
                f"zero=3: module {type(m).__name__} in unit {label} was built on the meta device and has no "
                "reset_parameters() to give its parameters values. Fix: pass init=fn to dtcore.wrap (called as "
                "fn(module) on each such module once its tensors exist), or build this module on a real device."
            )
        for name, p in list(m._parameters.items()):
            if p is None or not p.is_meta:
                continue
            real = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=p.requires_grad)
            for holder, held in holders.get(id(p), [(m, name)]):
                holder._parameters[held] = real
        for name, b in list(m._buffers.items()):
            if b is not None and b.is_meta:
                m._buffers[name] = torch.zeros(b.shape, dtype=b.dtype, device=device)
        with torch.no_grad():
            if init is not None:
                init(m)
            else:
                m.reset_parameters()


def registrations(model: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """id(parameter) -> every (module, attribute name) that registers it."""
    out: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is not None:
                out.setdefault(id(p), []).append((m, name))
    return out
