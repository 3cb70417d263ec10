"""A zero=3 model's state_dict() and load_state_dict(): whole tensors, as the model had them before wrapping.

A pre-hook gathers a unit's parameters in their own dtype (the masters: fp32 under mixed
precision) and points the parameters at them, so that torch's own state_dict collects, and
load_state_dict copies into, whole tensors; a post-hook frees them again (after a load, once this
rank's shard is cut from the loaded values). torch runs every load post-hook at the end of the
load, so a load_state_dict holds the whole model for its duration (dtcore.load_checkpoint and a
weights file through it read each rank's ranges only). Both are collectives over the gathers'
communicator: call them on every rank, as with FSDP2's full state dict. The state dict holds every
parameter whole (on each rank): for checkpoints of models larger than one rank,
dtcore.save_checkpoint writes each rank's shard only.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _C
from .unit import Unit


def _gather_masters(unit: Unit, communicator: Any) -> None:
    for g in unit.groups:
        whole = g.gather_masters(communicator)  # (padded,) in the parameters' own dtype
        for p, offset, numel, shape in zip(g.params, g.offsets, g.numels, g.shapes, strict=True):
            p.data = whole.narrow(0, offset, numel).view(shape)
        g.gathered = True  # the parameters point at values: free() empties them


def install_state_hooks(root: torch.nn.Module, units: list[Unit], communicator: Any) -> None:
    """Hooks on every module whose state_dict can reach a unit's parameters: the root (the root unit),
    each unit's module, and each module that registers parameters itself (its parameters' units), so
    that `model.module.blocks[0].mlp.state_dict()` gives whole values too. A unit is gathered once
    however many of these hooks cover it in one call (a count per unit) and freed, or after a load
    cut into its shards, when the last of them ends."""
    unit_of = {id(p): u for u in units for g in u.groups for p in g.params}
    count = [0] * len(units)

    def enter(covered: list[Unit]) -> None:
        for u in covered:
            if count[u.index] == 0:
                _gather_masters(u, communicator)
            count[u.index] += 1

    def leave(covered: list[Unit], loaded: bool) -> None:
        for u in covered:
            count[u.index] -= 1
            if count[u.index] == 0:
                if loaded:
                    for g in u.groups:
                        g.adopt()  # this rank's shard of what was loaded; frees
                else:
                    u.free()

    for module in root.modules():
        covered = {unit_of[id(p)].index: unit_of[id(p)] for p in module.parameters(recurse=False) if id(p) in unit_of}
        for u in units:
            if (u.module if u.module is not None else root) is module:
                covered[u.index] = u
        if not covered:
            continue
        mine = [covered[k] for k in sorted(covered)]  # every rank gathers in one order
        ids = {id(p) for u in mine for g in u.groups for p in g.params}

        def before(*args: Any, mine: list[Unit] = mine) -> None:
            enter(mine)

        def before_load(module: torch.nn.Module, state: dict, prefix: str, meta: Any, *rest: Any, mine=mine) -> None:
            if meta.get("assign_to_params_buffers"):
                raise _C.ConfigError(
                    "load_state_dict(assign=True) into a zero=3 model would replace the Parameters its units shard "
                    "with new, whole ones that nothing gathers or reduces. Fix: load_state_dict without assign (each "
                    "rank keeps its shard of the values), or dtcore.load_checkpoint."
                )
            enter(mine)

        def after_save(
            module: torch.nn.Module, state: dict, prefix: str, meta: Any, mine: list[Unit] = mine, ids: set = ids
        ) -> None:
            for key, value in state.items():  # keep_vars=True gives the Parameters: their values, before the free
                if key.startswith(prefix) and id(value) in ids:
                    state[key] = value.detach()
            leave(mine, loaded=False)

        def after_load(module: torch.nn.Module, incompatible: Any, mine: list[Unit] = mine) -> None:
            leave(mine, loaded=True)

        module.register_state_dict_pre_hook(before)
        module.register_state_dict_post_hook(after_save)
        module.register_load_state_dict_pre_hook(before_load)
        module.register_load_state_dict_post_hook(after_load)
