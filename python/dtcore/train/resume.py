"""The preemption signals that make every rank save before it goes (exact resume's other part, the
random generators, is rng.py)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from ..exit_codes import EXIT_PREEMPTED  # noqa: F401  (re-exported by dtcore.train)

log = logging.getLogger("dtcore.train")

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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
