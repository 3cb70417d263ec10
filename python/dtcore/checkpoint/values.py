"""Values that ride along in a checkpoint (`extra=`, `rank_extra=`, optimizer hyperparameters and
scalar state) as JSON plus tensors, with no pickle: loading never runs code from the files.

encode(value, tensors, where) turns a value into JSON, appending each tensor it holds to
`tensors` (they are written to the rank's safetensors file) and leaving a reference in its place;
decode(json, read) rebuilds the value. What JSON lacks is tagged so that it comes back as it was:

    tuple               {"__tuple__": [...]}
    dict, other keys    {"__items__": [[key, value], ...]}   (e.g. int keys; JSON keys are strings)
    torch.Tensor        {"__tensor__": "<key in the file>"}  (any shape and dtype, on CPU at load)
    numpy.ndarray       {"__ndarray__": "<key in the file>"} (NumPy's RNG state, for instance)
    torch.dtype         {"__dtype__": "float32"}
    argparse.Namespace  {"__namespace__": {attribute: value, ...}}
    float inf/nan       JSON's Infinity/NaN, as Python's json module writes them

Anything else (functions, arbitrary objects) is a CheckpointError naming where it is, for it
could only be saved by pickling it. A subclass of those types is held as its base type (an
OrderedDict comes back as a dict, an IntEnum as an int, a NumPy scalar as the Python number);
check_extra(value, where, exact=True) refuses it instead, for values whose type must come back too
(hyperparameters that rebuild a model).

The walk over containers and plain values is dtcore._C.encode_json's (an in-memory checkpoint encodes
its record at every step, where a walk in Python cost tens of microseconds); it hands the rest to
_leaf, here, which gives its JSON text, and takes the tags from TAGS.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import Any

import torch

from .. import _C

# The keys of the tagged values above: a dict of str keys among which one of these is written as __items__, so that
# decode() never takes it for a tagged value.
TAGS = frozenset(("__tuple__", "__items__", "__tensor__", "__ndarray__", "__dtype__", "__namespace__"))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise _C.CheckpointError(f"the checkpoint names dtype '{name}', which this torch does not have.")
    return dtype


def check_extra(value: Any, where: str, *, exact: bool = False, fix: str | None = None) -> None:
    """A CheckpointError unless save_checkpoint(extra=) can hold `value`; with `exact`, also unless each part of it
    comes back as the very type it has (not as its base type). The error names the part (`where`, then its keys
    and indices) and its type; `fix`, when given, is the fix it tells."""
    encode_json(value, None, where, exact=exact, fix=fix)


def encode(value: Any, tensors: list[tuple[str, torch.Tensor]], where: str) -> Any:
    """`value` as JSON; its tensors are appended to `tensors` as (key, contiguous CPU copy or view)."""
    return json.loads(encode_json(value, tensors, where))


def encode_json(
    value: Any,
    tensors: list[tuple[str, torch.Tensor]] | None,
    where: str,
    *,
    exact: bool = False,
    fix: str | None = None,
) -> str:
    """encode(value, tensors, where) as JSON text, as json.dumps would write it (its tensors not appended where
    `tensors` is None: check_extra). Keys: `where`, then `[i]` for an item of a list or tuple, `[repr(key)]` for
    a dict's value and `.key` for a key that is not a string. `exact` and `fix`: see check_extra()."""
    leaf = functools.partial(_leaf, exact=exact, fix=fix) if exact or fix else _leaf
    return _C.encode_json(value, tensors, where, leaf, TAGS, exact)


_HELD_AS_BASE = (bool, int, float, str, list, tuple, dict)  # their subclasses come back as these


def _leaf(
    value: Any,
    tensors: list[tuple[str, torch.Tensor]] | None,
    where: str,
    *,
    exact: bool = False,
    fix: str | None = None,
) -> str:
    """The JSON text of what encode_json's walk leaves here: a torch.dtype, an argparse.Namespace, NumPy's arrays
    and scalars, a meta tensor (refused), with `exact` every subclass of what the walk holds (refused), and the
    error for anything else."""
    if isinstance(value, torch.Tensor):
        if exact and type(value) is not torch.Tensor:
            _not_exactly(value, torch.Tensor, where, fix)
        if value.is_meta:
            raise _C.CheckpointError(
                f"{where} is a meta tensor (a shape and dtype without values), which a checkpoint cannot hold. Fix: "
                + (fix or "save a tensor with values there.")
            )
        raise _C.CheckpointError(  # (the walk takes every other tensor)
            f"{where} is a {_type_name(type(value))}, a tensor whose operations run Python (a DTensor's, a "
            "__torch_dispatch__ subclass's), which a checkpoint cannot hold as it is. Fix: "
            + (fix or "save a plain tensor there (a DTensor's full_tensor(), or its to_local() in a rank_extra=).")
        )
    if exact and isinstance(value, _HELD_AS_BASE):
        _not_exactly(value, next(t for t in _HELD_AS_BASE if isinstance(value, t)), where, fix)
    if isinstance(value, torch.dtype):
        return json.dumps({"__dtype__": dtype_name(value)})
    if isinstance(value, argparse.Namespace):
        if exact and type(value) is not argparse.Namespace:
            _not_exactly(value, argparse.Namespace, where, fix)
        return f'{{"__namespace__": {encode_json(vars(value), tensors, where, exact=exact, fix=fix)}}}'
    numpy = _numpy()
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            if exact and type(value) is not numpy.ndarray:
                _not_exactly(value, numpy.ndarray, where, fix)
            if tensors is not None:
                tensors.append((where, torch.from_numpy(numpy.ascontiguousarray(value)).clone()))
            return json.dumps({"__ndarray__": where})
        if isinstance(value, numpy.generic):  # a NumPy scalar comes back as the Python number it holds
            item = value.item()
            if type(item) not in (bool, int, float):  # bytes, a datetime, a complex number: no JSON number
                raise _C.CheckpointError(
                    f"{where} is a {_type_name(type(value))} ({item!r}), which a checkpoint cannot hold. Fix: "
                    + (fix or "save a number, a string or an array there.")
                )
            if exact:
                _not_exactly(value, type(item), where, fix)
            return json.dumps(item)
    raise _C.CheckpointError(
        f"{where} is a {_type_name(type(value))}, which a checkpoint cannot hold without pickle (dtcore never "
        "pickles). Fix: "
        + (
            fix
            or "save plain values there (numbers, strings, lists, dicts, tensors, NumPy arrays), e.g. an object's "
            "state_dict() instead of the object."
        )
    )


def _not_exactly(value: Any, base: type, where: str, fix: str | None) -> None:
    """The CheckpointError of check_extra(exact=True): `value` would come back as `base`, not as its own type."""
    name = _type_name(base, short_builtins=True)
    raise _C.CheckpointError(
        f"{where} is a {_type_name(type(value))}, which a checkpoint gives back as a plain {name}, not as the type "
        f"it was saved as. Fix: {fix or f'save a plain {name} there.'}"
    )


def _type_name(cls: type, *, short_builtins: bool = False) -> str:
    plain = short_builtins and cls.__module__ == "builtins"
    return cls.__qualname__ if plain else f"{cls.__module__}.{cls.__qualname__}"


def decode(value: Any, read: Callable[[str], torch.Tensor]) -> Any:
    """The value encode() was given; `read(key)` gives a tensor from the file."""
    if isinstance(value, list):
        return [decode(v, read) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tuple__" in value:
        return tuple(decode(v, read) for v in value["__tuple__"])
    if "__items__" in value:
        return {_hashable(decode(k, read)): decode(v, read) for k, v in value["__items__"]}
    if "__tensor__" in value:
        return read(value["__tensor__"])
    if "__ndarray__" in value:
        return read(value["__ndarray__"]).numpy()
    if "__dtype__" in value:
        return dtype_of(value["__dtype__"])
    if "__namespace__" in value:
        return argparse.Namespace(**decode(value["__namespace__"], read))
    return {k: decode(v, read) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
