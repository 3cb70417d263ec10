"""Joins Python's `logging` with dtcore's C++ logger: one format, one console, one file per rank.

Records of `logging.getLogger("dtcore")` and its children are handed to the C++ facade
(csrc/dtcore/common/log.h), which prefixes time, level, rank/world and host and decides what
reaches the console and the rank's log file.
"""

from __future__ import annotations

import logging

from . import _C

_LEVELS = ((logging.ERROR, 3), (logging.WARNING, 2), (logging.INFO, 1))


def _to_cpp(levelno: int) -> int:
    for threshold, cpp in _LEVELS:
        if levelno >= threshold:
            return cpp
    return 0


class _CppHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            if record.name != "dtcore":
                message = f"{record.name.removeprefix('dtcore.')}: {message}"
            _C.log(_to_cpp(record.levelno), message)
        except Exception:  # logging must never raise into the caller
            self.handleError(record)


logger = logging.getLogger("dtcore")
if not any(isinstance(h, _CppHandler) for h in logger.handlers):
    logger.addHandler(_CppHandler())
    logger.setLevel(logging.DEBUG)  # the C++ sinks filter per rank and per sink
    logger.propagate = False  # the console line is printed once, by the C++ sink
