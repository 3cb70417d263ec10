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

import json
from collections.abc import Callable
from typing import Any

import torch

from .. import _C


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise _C.CheckpointError(f"the checkpoint names dtype '{name}', which this torch does not have.")
    return dtype


def encode(value: Any, tensors: list[tuple[str, torch.Tensor]], where: str) -> Any:
    """`value` as JSON; its tensors are appended to `tensors` as (key, contiguous CPU copy or view)."""
    return json.loads(encode_json(value, tensors, where))


def encode_json(value: Any, tensors: list[tuple[str, torch.Tensor]], where: str) -> str:
    """encode(value, tensors, where) as JSON text, as json.dumps would write it. The walk over containers and
    plain values is dtcore._C's (an in-memory checkpoint encodes its record at every step); the rest is
    _leaf's, here. Keys: `where`, then `[i]` for an item of a list or tuple, `[repr(key)]` for a dict's value
    and `.key` for a key that is not a string."""
    return _C.encode_json(value, tensors, where, _leaf)


def _leaf(value: Any, tensors: list[tuple[str, torch.Tensor]], where: str) -> str:
    """The JSON text of what encode_json's walk leaves here: a torch.dtype, NumPy's arrays and scalars, and
    the error for anything else."""
    if isinstance(value, torch.dtype):
        return json.dumps({"__dtype__": dtype_name(value)})
    numpy = _numpy()
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            tensors.append((where, torch.from_numpy(numpy.ascontiguousarray(value)).clone()))
            return json.dumps({"__ndarray__": where})
        if isinstance(value, numpy.generic):
            return json.dumps(value.item())  # a NumPy scalar comes back as the Python number it holds
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
