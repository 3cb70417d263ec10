"""The wrapped forward's outputs: the tensors in them, and the function they pass through so that
outputs the loss does not use leave their parameters' .grad None, as torch DDP's _DDPSink does.

See Note [Outputs the loss does not use] in csrc/dtcore/reducer/reducer.h: with
find_unused_parameters, the graph search counts every parameter an output reaches as used, but
autograd runs only what the loss reaches. Passing every output that needs a gradient through one
autograd function (`_Join`) makes autograd run all of their graphs once the loss reaches any of
them; the parameters behind the unused ones then get their hooks with an undefined gradient.

Both functions here walk outputs with `_walk`: tensors; lists and tuples (named tuples too);
dicts, and their subclasses such as Hugging Face's ModelOutput; dataclasses through their fields.
The graph search also looks inside any other object's attributes (a KV cache, say: a parameter
the loss reaches only through it must count as used), but the join leaves such an object as it is,
since copying it to put other tensors in would hand the caller an object it did not make; a
parameter reached only through one and not by the loss then behaves as without the join: the next
forward reports it, saying so (torch DDP does not look inside such objects at all, and cannot
train through them with find_unused_parameters).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch


def _walk(value: Any, visit: Callable[[torch.Tensor], torch.Tensor], *, objects: bool) -> Any:
    """`value` with each tensor replaced by visit(tensor), in a stable order; a container whose
    tensors all come back unchanged is returned as it is (no copy). `objects`: also the attributes of
    objects other than dataclasses."""
    if isinstance(value, torch.Tensor):
        return visit(value)
    if isinstance(value, (list, tuple)):
        items = [_walk(v, visit, objects=objects) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if isinstance(value, tuple):
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # named or not
        return items if type(value) is list else _copy_with(value, enumerate(items))
    if isinstance(value, dict):
        items = {k: _walk(v, visit, objects=objects) for k, v in value.items()}
        if all(items[k] is v for k, v in value.items()):
            return value
        return _copy_with(value, items.items())
    dataclass = dataclasses.is_dataclass(value) and not isinstance(value, type)
    if (dataclass or objects) and hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)):
        fields = {k: _walk(v, visit, objects=objects) for k, v in vars(value).items()}
        if all(fields[k] is v for k, v in vars(value).items()):
            return value
        out = copy.copy(value)
        for k, v in fields.items():
            object.__setattr__(out, k, v)  # frozen dataclasses too
        return out
    return value


def _copy_with(value: Any, items: Any) -> Any:
    """A shallow copy of a dict or sequence subclass with `items` ((key, value) pairs) set in it."""
    out = copy.copy(value)
    for k, v in items:
        out[k] = v  # a ModelOutput sets the attribute of the same name too
    return out


def tensors_in(value: Any, *, objects: bool = True) -> list[torch.Tensor]:
    """Every tensor in a (nested) output, in `_walk`'s order; inside any object's attributes too,
    unless `objects` is False."""
    found: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    _walk(value, keep, objects=objects)
    return found


class _Join(torch.autograd.Function):
    """Identity on the outputs that need a gradient; its backward hands on what it gets, None
    included (no zeros made up), so that every output's graph runs once any output is used."""

    @staticmethod
    def forward(ctx: Any, clone: bool, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        # Cloned (torch DDP's default, _set_ddp_sink_clone) so that the caller may change an output
        # in place; else autograd refuses in-place changes of a custom function's outputs.
        return tuple(t.clone() for t in tensors) if clone else tensors

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        return (None, *grads)


def join_outputs(out: Any, *, clone: bool) -> Any:
    """`out` with its tensors that need a gradient passed through one `_Join`; the same object when
    none does."""
    joined = [t for t in tensors_in(out, objects=False) if t.requires_grad]
    if not joined:
        return out
    results = iter(_Join.apply(clone, *joined))
    return _walk(out, lambda t: next(results) if t.requires_grad else t, objects=False)  # `joined`'s order
