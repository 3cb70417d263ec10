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
    float inf/nan       JSON's Infinity/NaN, as Python's json module writes them

Anything else (functions, arbitrary objects) is a CheckpointError naming where it is, for it
could only be saved by pickling it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _C

_TAGS = ("__tuple__", "__items__", "__tensor__", "__ndarray__", "__dtype__")
_PLAIN = (int, float, str, bool, type(None))  # exactly these types (not subclasses, not NumPy scalars)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise _C.CheckpointError(f"the checkpoint names dtype '{name}', which this torch does not have.")
    return dtype


def encode(value: Any, tensors: list[tuple[str, torch.Tensor]], where: str) -> Any:
    """`value` as JSON; its tensors are appended to `tensors` as (key, contiguous CPU copy or view)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        key = f"{where}"
        tensors.append((key, value.detach().to("cpu").contiguous()))
        return {"__tensor__": key}
    if isinstance(value, torch.dtype):
        return {"__dtype__": dtype_name(value)}
    if isinstance(value, (list, tuple)):
        if all(type(v) in _PLAIN for v in value):  # a long list of numbers (Python's RNG state): as it is
            return list(value) if isinstance(value, list) else {"__tuple__": list(value)}
        items = [v if type(v) in _PLAIN else encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k in _TAGS for k in value):
            # (a plain value is itself: neither a call nor its `where` made for it, a save taken every step)
            return {k: v if type(v) in _PLAIN else encode(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
        return {
            "__items__": [
                [encode(k, tensors, f"{where}.key"), encode(v, tensors, f"{where}[{k!r}]")] for k, v in value.items()
            ]
        }
    numpy = _numpy()
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            key = f"{where}"
            tensors.append((key, torch.from_numpy(numpy.ascontiguousarray(value)).clone()))
            return {"__ndarray__": key}
        if isinstance(value, numpy.generic):
            return value.item()  # a NumPy scalar comes back as the Python number it holds
    raise _C.CheckpointError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint cannot hold without "
        "pickle (dtcore never pickles). Fix: save plain values there (numbers, strings, lists, dicts, tensors, "
        "NumPy arrays), e.g. an object's state_dict() instead of the object."
    )


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
    return {k: decode(v, read) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
