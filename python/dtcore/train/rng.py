"""Every random generator of a rank, for exact resume: Python's, NumPy's (if installed), torch's CPU
generator and, once CUDA is initialised, its generators, as JSON-like values and tensors
(dtcore.save_checkpoint takes no pickle).

rng_state() is taken at every in-memory checkpoint (every step with checkpoint.memory_every=1), right
after the step's compute, where Python runs cold: reading Python's and NumPy's generators in full
(a tuple of 625 ints; NumPy's MT19937 copies its 624 words one by one in Python) cost more than the
copy of a small model's state. So both are also read live, as the bytes of their state (2.5 KB each,
compared in about a microsecond): while those are the bytes of the last full read, the state is
that read's, and its values are returned again (their tensors are never written to). A live view is
trusted only after it matched a full read; one whose layout is not the one assumed (another Python or
NumPy, another generator) is never used, and every read is full. What the bytes do not hold is read
each time (Python's cached Gaussian, a plain attribute), or makes every read full (NumPy's: a cached
Gaussian can be used up without the words moving; set_rng_state() makes the next read full too).
"""

from __future__ import annotations

import ctypes
import random
import struct
from typing import Any

import torch

_PYTHON_WORDS = 624  # the Mersenne Twister's state, in Python's random and NumPy's MT19937 alike
_STATE_BYTES = 4 * (_PYTHON_WORDS + 1)  # the words and the position


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's (if installed) and torch's CPU and CUDA generators."""
    state: dict[str, Any] = {"python": _python_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():  # (which a machine without CUDA never is)
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    state["numpy"] = _numpy_state(numpy)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    global _numpy_last
    version, internal, gauss = state["python"]
    internal = internal.tolist() if isinstance(internal, torch.Tensor) else internal  # a list in older checkpoints
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if "cuda" in state:
        torch.cuda.set_rng_state_all([s.to(torch.uint8) for s in state["cuda"]])
    if "numpy" in state:
        import numpy

        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), int(pos), int(has_gauss), float(cached)))
        _numpy_last = None  # a state restored may differ from the last read only in its cached Gaussian


class _Last:
    """A generator's state as last read in full (`state`: what rng_state gives for it), with the bytes of its
    live state then (`raw`), and how to read them again (`live`: None where they cannot be trusted)."""

    def __init__(self, owner: Any, live: Any, state: list[Any]) -> None:
        self.owner, self.live, self.state = owner, live, state
        self.raw = live() if live is not None else None


# Python's ---------------------------------------------------------------------------------------

_python_last: _Last | None = None


def _python_state() -> list[Any]:
    """[version, its 625 words as an int64 tensor, the cached Gaussian] of Python's global generator."""
    global _python_last
    last, owner = _python_last, getattr(random, "_inst", None)  # the generator behind random.random(), random.seed()
    if last is not None and last.owner is owner and last.live is not None and last.live() == last.raw:
        return [last.state[0], last.state[1], owner.gauss_next]
    version, internal, gauss = random.getstate()
    state = [version, torch.frombuffer(bytearray(struct.pack(f"<{len(internal)}q", *internal)), dtype=torch.int64)]
    live = last.live if last is not None and last.owner is owner else _python_live(owner)
    if live is not None and struct.unpack(f"<i{_PYTHON_WORDS}I", live()) != (internal[-1], *internal[:-1]):
        live = None  # not the layout assumed: full reads from now on
    _python_last = _Last(owner, live, state)
    return [version, state[1], gauss]


def _python_live(owner: Any) -> Any:
    """A reader of the bytes of a random.Random's state (CPython's: its position, then its 624 words, after the
    object's header), or None where the object is too small to hold them."""
    start = object.__basicsize__  # the header: reference count and type
    if owner is None or type(owner).__basicsize__ < start + _STATE_BYTES:
        return None
    address = id(owner) + start
    return lambda: ctypes.string_at(address, _STATE_BYTES)


# NumPy's ----------------------------------------------------------------------------------------

_numpy_last: _Last | None = None


def _numpy_state(numpy: Any) -> list[Any]:
    """[kind, keys (int64 tensor), pos, has_gauss, gauss] of NumPy's global generator."""
    global _numpy_last
    last = _numpy_last
    generator = getattr(numpy.random, "get_bit_generator", lambda: None)()  # (NumPy >= 1.25)
    if (
        last is not None
        and last.owner is generator
        and last.live is not None
        and last.state[3] == 0
        and last.live() == last.raw
    ):
        return last.state
    kind, keys, pos, has_gauss, cached = numpy.random.get_state()
    state = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    live = last.live if last is not None and last.owner is generator else _numpy_live(generator)
    if live is not None and live() != keys.astype("uint32").tobytes() + struct.pack("<i", pos):
        live = None  # not the layout assumed: full reads from now on
    _numpy_last = _Last(generator, live, state)
    return state


def _numpy_live(generator: Any) -> Any:
    """A reader of the bytes of an MT19937 generator's state (its 624 words, then its position), through its
    documented ctypes address, or None."""
    if generator is None or type(generator).__name__ != "MT19937":
        return None
    try:
        address = generator.ctypes.state_address
    except (AttributeError, TypeError, ValueError):
        return None
    return lambda: ctypes.string_at(address, _STATE_BYTES)
