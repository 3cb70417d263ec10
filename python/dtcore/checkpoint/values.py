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
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from .. import _C

_TAGS = ("__tuple__", "__items__", "__tensor__", "__ndarray__", "__dtype__", "__namespace__")
_PLAIN = (int, float, str, bool, type(None))  # exactly these types (not subclasses, not NumPy scalars)


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
    encode(value, None, where, exact=exact, fix=fix)


def encode(
    value: Any,
    tensors: list[tuple[str, torch.Tensor]] | None,
    where: str,
    *,
    exact: bool = False,
    fix: str | None = None,
) -> Any:
    """`value` as JSON; its tensors are appended to `tensors` as (key, contiguous CPU copy or view), unless
    `tensors` is None (check_extra() only). `exact` and `fix`: see check_extra()."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return _exactly(value, _PLAIN, where, fix) if exact else value
    if isinstance(value, torch.Tensor):
        if exact:
            _exactly(value, (torch.Tensor,), where, fix)
        if value.is_meta:
            raise _C.CheckpointError(
                f"{where} is a meta tensor (a shape and dtype without values), which a checkpoint cannot hold. Fix: "
                + (fix or "save a tensor with values there.")
            )
        if tensors is not None:
            tensors.append((where, value.detach().to("cpu").contiguous()))
        return {"__tensor__": where}
    if isinstance(value, torch.dtype):
        return {"__dtype__": dtype_name(value)}
    if isinstance(value, argparse.Namespace):
        if exact:
            _exactly(value, (argparse.Namespace,), where, fix)
        return {"__namespace__": encode(vars(value), tensors, where, exact=exact, fix=fix)}
    if isinstance(value, (list, tuple)):
        if exact:
            _exactly(value, (list, tuple), where, fix)
        if all(type(v) in _PLAIN for v in value):  # a long list of numbers (Python's RNG state): as it is
            return list(value) if isinstance(value, list) else {"__tuple__": list(value)}
        items = [
            v if type(v) in _PLAIN else encode(v, tensors, f"{where}[{i}]", exact=exact, fix=fix)
            for i, v in enumerate(value)
        ]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        if exact:
            _exactly(value, (dict,), where, fix)
        if all(isinstance(k, str) for k in value) and not any(k in _TAGS for k in value):
            # (a plain value is itself: neither a call nor its `where` made for it, a save taken every step)
            return {
                k: v if type(v) in _PLAIN else encode(v, tensors, f"{where}[{k!r}]", exact=exact, fix=fix)
                for k, v in value.items()
            }
        return {
            "__items__": [
                [
                    encode(k, tensors, f"{where}.key", exact=exact, fix=fix),
                    encode(v, tensors, f"{where}[{k!r}]", exact=exact, fix=fix),
                ]
                for k, v in value.items()
            ]
        }
    numpy = _numpy()
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            if exact:
                _exactly(value, (numpy.ndarray,), where, fix)
            if tensors is not None:
                tensors.append((where, torch.from_numpy(numpy.ascontiguousarray(value)).clone()))
            return {"__ndarray__": where}
        if isinstance(value, numpy.generic):
            if exact:  # a NumPy scalar comes back as the Python number it holds
                _exactly(value, (), where, fix, held_as=type(value.item()))
            return value.item()
    raise _C.CheckpointError(
        f"{where} is a {_type_name(type(value))}, which a checkpoint cannot hold without pickle (dtcore never "
        "pickles). Fix: "
        + (
            fix
            or "save plain values there (numbers, strings, lists, dicts, tensors, NumPy arrays), e.g. an object's "
            "state_dict() instead of the object."
        )
    )


def _exactly(value: Any, types: tuple[type, ...], where: str, fix: str | None, held_as: type | None = None) -> Any:
    """`value`, if its type is one of `types` exactly; else a CheckpointError: it would come back as its base type."""
    if type(value) in types:
        return value
    base = _type_name(held_as or next(t for t in types if isinstance(value, t)), short_builtins=True)
    raise _C.CheckpointError(
        f"{where} is a {_type_name(type(value))}, which a checkpoint gives back as a plain {base}, not as the type "
        f"it was saved as. Fix: {fix or f'save a plain {base} there.'}"
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
