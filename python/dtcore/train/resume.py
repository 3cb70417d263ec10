"""What exact resume needs besides the model and optimizer: every random generator of this rank,
and the preemption signals that make every rank save before it goes.

RNG states are converted to JSON-like values and tensors (dtcore.save_checkpoint takes no pickle).
"""

from __future__ import annotations

import array
import logging
import os
import random
import signal
import threading
import time
from typing import Any

import torch

from ..exit_codes import EXIT_PREEMPTED  # noqa: F401  (re-exported by dtcore.train)

log = logging.getLogger("dtcore.train")

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


_python_words: tuple[tuple[int, ...], torch.Tensor] | None = None  # rng_state's last: Python's words, as a tensor


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's (if installed) and torch's CPU and CUDA generators."""
    global _python_words
    version, internal, gauss = random.getstate()
    # Python's 625 words as a tensor: a checkpoint's JSON stays small (an in-memory one is taken every step).
    # The last one is taken again while the state is the same (no tensor is ever written to: they can be shared).
    if _python_words is None or _python_words[0] != internal:
        _python_words = (internal, torch.frombuffer(array.array("q", internal), dtype=torch.int64))
    words = _python_words[1]
    state: dict[str, Any] = {"python": [version, words, gauss]}
    state["torch"] = torch.get_rng_state()
    if torch.cuda.is_initialized():  # (which a machine without CUDA never is)
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    state["numpy"] = _numpy_state(numpy)
    return state


class _NumpyLast:
    """NumPy's global generator's state as rng_state() last read it in full, and a live view of its words."""

    def __init__(self, generator: Any, live: Any, state: list[Any]) -> None:
        self.generator, self.live, self.state = generator, live, state
        self.words = live.tobytes() if live is not None else None


_numpy_last: _NumpyLast | None = None


def _numpy_state(numpy: Any) -> list[Any]:
    """NumPy's global generator's state, as [kind, keys (int64 tensor), pos, has_gauss, gauss].

    numpy.random.get_state() costs 33 us (its MT19937 copies the 624 words one by one in Python), a sixth
    of an in-memory checkpoint taken every step, while most training never draws from NumPy. So the words
    and position are also read live, through the generator's documented ctypes address (2.5 KB, 1 us to
    compare): while they are those of the last full read, and that read had no Gaussian cached, the state
    is the same and the last one is returned (its tensors are never written to). A cached Gaussian can be
    used up without the words moving, so with one cached every read is full (and set_rng_state() makes the
    next read full: a state set may differ only in that Gaussian). The live view is trusted only
    after it matched a full read (NumPy's MT19937 state is 624 words and the position); any other layout,
    generator or NumPy without get_bit_generator reads in full every time."""
    global _numpy_last
    last = _numpy_last
    generator = getattr(numpy.random, "get_bit_generator", lambda: None)()
    if (
        last is not None
        and last.live is not None
        and last.generator is generator
        and last.state[3] == 0
        and last.live.tobytes() == last.words
    ):
        return last.state
    kind, keys, pos, has_gauss, cached = numpy.random.get_state()
    state = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    live = last.live if last is not None and last.generator is generator else _numpy_words(numpy, generator)
    if live is not None and not (live[:624].tobytes() == keys.astype("uint32").tobytes() and int(live[624]) == pos):
        live = None  # not the layout assumed: full reads from now on
    _numpy_last = _NumpyLast(generator, live, state)
    return state


def _numpy_words(numpy: Any, generator: Any) -> Any:
    """A live view of an MT19937 generator's state (624 words, then the position: a NumPy array), or None."""
    if generator is None or type(generator).__name__ != "MT19937":
        return None
    try:
        import ctypes

        address = generator.ctypes.state_address
        return numpy.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_uint32)), shape=(625,))
    except (AttributeError, TypeError, ValueError):
        return None


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    internal = internal.tolist() if isinstance(internal, torch.Tensor) else internal  # a list in older checkpoints
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if "cuda" in state:
        torch.cuda.set_rng_state_all([s.to(torch.uint8) for s in state["cuda"]])
    if "numpy" in state:
        import numpy

        global _numpy_last
        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), int(pos), int(has_gauss), float(cached)))
        _numpy_last = None  # a state restored may differ from the last read only in its cached Gaussian


# A repeat of the first signal within this many seconds is the same request delivered twice (SLURM
# signals every process of the step, and torch's agent forwards the signal to its ranks as well).
REPEAT_WINDOW_S = 2.0


class Preemption:
    """SIGTERM or SIGUSR1 asks for a stop (the trainer agrees on it with every rank within one
    step, saves and exits with EXIT_PREEMPTED); a second signal exits at once with 128 + signal."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.received_at: float | None = None  # time.monotonic() of the first signal
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("the trainer runs outside the main thread: SIGTERM/SIGUSR1 will not save a checkpoint")
            return
        for sig in PREEMPT_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum == signum and time.monotonic() - (self.received_at or 0.0) < REPEAT_WINDOW_S:
            return  # the same signal twice at once: SLURM signals every process and the agent forwards it too
        if self.signum is not None:
            os.write(2, f"dtcore.train: second signal {signal.Signals(signum).name}: exiting now\n".encode())
            os._exit(128 + signum)
        self.signum, self.received_at = signum, time.monotonic()
        name = signal.Signals(signum).name
        note = f"dtcore.train: {name}: every rank saves a checkpoint after this step; a second signal exits now\n"
        os.write(2, note.encode())  # not logging: a signal handler must not take the logging locks

    @property
    def requested(self) -> bool:
        return self.signum is not None
