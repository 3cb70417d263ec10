"""python -m dtcore.launch.entry (-m MODULE | SCRIPT) [ARGS...]: one rank of a launched job.

The launcher starts every worker through this entry, which runs the user's module or script exactly
as `python -m MODULE` / `python SCRIPT` would (sys.argv, sys.path[0], __main__), and records an
uncaught exception the way TorchElastic's @record does, without the user decorating anything: the
error file named by TORCHELASTIC_ERROR_FILE (which torch's agent sets for each worker) gets torch's
JSON layout, so the agent reads it, plus a "dtcore" section with what the root-cause summary
needs: the exact time (torch keeps whole seconds), the rank, its host and the traceback without
this entry's frames. The traceback is then printed as Python would (without this entry's frames) and
the rank exits with status 1, as for any uncaught exception.
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys
import time
import traceback
from collections.abc import Sequence

from ..exit_codes import EXIT_PREEMPTED


def preempted_marker() -> str:
    """Beside this worker's error file: it exited with EXIT_PREEMPTED (its checkpoint is saved)."""
    return os.environ["TORCHELASTIC_ERROR_FILE"] + ".preempted"


USAGE = "usage: python -m dtcore.launch.entry (-m MODULE | SCRIPT) [ARGS...]"


def _file(name: str) -> str:
    return name if name.startswith("<") else os.path.abspath(name)


def _user_traceback(e: BaseException) -> str:
    """The traceback from the user's first frame on: runpy's and this entry's frames say nothing."""
    tb = e.__traceback__
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while tb is not None and tb.tb_next is not None and _file(tb.tb_frame.f_code.co_filename) in ours:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _place(e: BaseException) -> str | None:
    """file:line of the innermost frame that raised `e`, the function's name after it."""
    frames = traceback.extract_tb(e.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None


def _step(e: BaseException) -> int | None:
    """The training step dtcore.train marked `e` with, or an exception it was raised from (a program that
    wraps fit() and raises its own), else None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        step = getattr(e, "dtcore_step", None)
        if step is not None:
            return int(step)
        e = e.__cause__ or e.__context__
    return None


def record(e: BaseException, path: str | None = None) -> None:
    """Writes `e` into this worker's error file (TORCHELASTIC_ERROR_FILE), in torch's layout plus "dtcore"."""
    path = path or os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time()
    text = _user_traceback(e)
    data = {
        "message": {  # torch's ErrorHandler layout: torch.distributed.elastic reads "message" back
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {"py_callstack": text, "timestamp": str(int(now))},
        },
        "dtcore": {
            "time": now,
            "rank": int(os.environ.get("RANK", "-1")),
            "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "exception": type(e).__name__,
            "traceback": text,
            # What tells a bug from a fault (Note [Restarts] in restarts.py): where it was raised, and the
            # training step dtcore.train marked it with (None elsewhere).
            "place": _place(e),
            "step": _step(e),
        },
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)  # the agent never reads half a file


def run(argv: Sequence[str]) -> None:
    """Runs `-m MODULE ARGS` or `SCRIPT ARGS` as __main__, recording an uncaught exception."""
    argv = list(argv)
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit(USAGE)
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # runpy sets sys.argv[0] to the module's file, as python -m does
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = [script, *argv[1:]]
            sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code == EXIT_PREEMPTED and os.environ.get("TORCHELASTIC_ERROR_FILE"):
            open(preempted_marker(), "w").close()  # the launcher tells it from a kill: see preempted_marker()
        raise  # sys.exit(code) is the program's own answer, not an uncaught exception
    except BaseException as e:
        record(e)
        # What Python prints for an uncaught exception, less this entry's and runpy's frames; same exit status.
        sys.stderr.write(_user_traceback(e))
        sys.stderr.flush()
    else:
        return
    sys.exit(1)


if __name__ == "__main__":
    run(sys.argv[1:])
