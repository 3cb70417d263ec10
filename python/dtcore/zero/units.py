"""zero=3's units: which module subtrees are gathered together, and which parameters each holds.

By default one unit per repeated layer, the blocks activation checkpointing finds (Note [Block
discovery] in activation/blocks.py), and the rest of the model in the root unit. `units=` names
them otherwise, as FSDP's wrap policy does: module classes (a class, a class name, or a tuple of
classes), qualified module names or patterns ('layers.*'), or a predicate `f(name, module) -> bool`.
Only the outermost matches count, never the model itself.

A parameter belongs to the unit whose subtree holds every module that registers it; a parameter two
units share (a tied embedding and output head registered in both) belongs to the root unit, which
stays gathered from the start of the forward to the end of the backward, so that it is there for
every use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _C
from ..activation.blocks import find_blocks, repeated_runs

ROOT = ""  # the root unit's name


def find_units(root: torch.nn.Module, units: Any) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, module) of each unit below the root, in registration order."""
    if units is None:
        return find_blocks(root) if repeated_runs(root) else []  # a model without repeated layers: one unit
    if isinstance(units, tuple) and units and all(isinstance(u, type) for u in units):
        found = [(n, m) for n, m in root.named_modules() if n and isinstance(m, units)]
        return _outermost(found, f"units={tuple(u.__name__ for u in units)}", root)
    if callable(units) and not isinstance(units, type):
        predicate: Callable[[str, torch.nn.Module], bool] = units
        found = [(n, m) for n, m in root.named_modules() if n and predicate(n, m)]
        return _outermost(found, "units=<predicate>", root)
    try:
        return find_blocks(root, units)
    except _C.ConfigError as e:
        raise _C.ConfigError(str(e).replace("blocks=", "units=").replace("checkpoint_activations", "zero=3")) from None


def _outermost(
    found: list[tuple[str, torch.nn.Module]], what: str, root: torch.nn.Module
) -> list[tuple[str, torch.nn.Module]]:
    out: list[tuple[str, torch.nn.Module]] = []
    for name, m in found:  # named_modules() order: a parent before its children
        if not any(name.startswith(kept + ".") for kept, _ in out):
            out.append((name, m))
    if not out:
        raise _C.ConfigError(
            f"zero=3 with {what}: no module of {type(root).__name__} matches. Fix: pass module classes present in "
            "the model, qualified names as in model.named_modules(), or leave units=None for its repeated layers."
        )
    return out


def assign(
    root: torch.nn.Module, units: list[tuple[str, torch.nn.Module]], ignored: set[str]
) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Each unit's parameters (name as root.named_parameters() gives it, parameter), the root unit's
    first, then one list per unit of `units`; names in `ignored` (torch DDP's ignored parameters) are
    in none."""
    unit_of_module: dict[int, int] = {}
    for u, (_, unit) in enumerate(units, start=1):
        for m in unit.modules():
            unit_of_module[id(m)] = u
    holders: dict[int, set[int]] = {}  # id(parameter) -> the units of the modules that register it
    for m in root.modules():
        for p in m.parameters(recurse=False):
            holders.setdefault(id(p), set()).add(unit_of_module.get(id(m), 0))
    out: list[list[tuple[str, torch.nn.Parameter]]] = [[] for _ in range(len(units) + 1)]
    for name, p in root.named_parameters():  # tied parameters once, under their first name
        if name in ignored:
            continue
        where = holders[id(p)]
        out[next(iter(where)) if len(where) == 1 else 0].append((name, p))
    return out
