"""One zero=3 unit: a module subtree whose parameters are gathered together (Note [Fully sharded units]).

A unit owns its FlatGroups (flat.py), one per dtype and requires_grad, and the state of the step it
is in: whether it ran in this forward, which of its trainable parameters have their gradient in
this backward, and whether it was reduced.
"""

from __future__ import annotations

from typing import Any

import torch

from .flat import FlatGroup


class Unit:
    """Read-only to users (model.units): `name` ("" for the root), `module` (None for the root), `groups`."""

    def __init__(self, index: int, name: str, module: torch.nn.Module | None, groups: list[FlatGroup]) -> None:
        self.index = index
        self.name = name
        self.module = module
        self.groups = groups
        self.trainable = {id(p) for g in groups if g.requires_grad for p in g.params}
        # per backward (Schedule resets them)
        self.got: set[int] = set()  # ids of trainable parameters whose gradient came
        self.done = False  # its backward is over: every input got its gradient (its post-backward hook)
        self.reduced = False

    @property
    def label(self) -> str:
        return self.name or "<root>"

    @property
    def numel(self) -> int:
        return sum(g.numel for g in self.groups)

    @property
    def gathered(self) -> bool:
        """Whether it holds gathered storage, or a gather into it is in flight."""
        return any(g.gathered or g.in_flight for g in self.groups)

    def gather(self, communicator: Any) -> None:
        for g in self.groups:
            g.gather(communicator)

    def wait(self) -> None:
        for g in self.groups:
            g.wait()

    def free(self, frozen: bool = True) -> None:
        """Frees its gathered parameters (the frozen ones too unless frozen=False: See Note [Fully sharded units])."""
        for g in self.groups:
            if frozen or g.requires_grad:
                g.free()

    @property
    def ready(self) -> bool:
        """Reducible: every trainable parameter has its gradient, or its backward is over."""
        return self.done or len(self.got) == len(self.trainable)

    def __repr__(self) -> str:
        return f"Unit({self.label!r}, {self.numel} parameters in {len(self.groups)} groups)"
