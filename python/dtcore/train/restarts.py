"""The trainer's side of a restart: knowing it is one, and recording what the failure cost.

A launcher that restarts a failed job (`dtcore.launch --max-restarts`, `torchrun --max-restarts`)
starts every rank again with TORCHELASTIC_RESTART_COUNT > 0; SLURM starts a requeued job with
SLURM_RESTART_COUNT > 0. The trainer then resumes from the newest checkpoint of its run directory
whatever checkpoint.resume says (a restarted job that started over would silently redo its work),
keeps the run directory (a restart is the same run), and once its first step after the restart is
done, rank 0 records the failure: a "restart" line in its metrics file and an entry of run.json's
"restarts" (Note [Run directory] in metrics.py), with the root cause that dtcore.launch wrote
(Note [Restarts] in dtcore/launch/restarts.py; under another launcher the cause is unknown here,
and its log has it), the steps lost and the seconds from the failure to that first step.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..exit_codes import FAILURES

_COUNTS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


def restart_count() -> int:
    """How many times the job has been restarted before this start: 0 for a first start."""
    for name in _COUNTS:
        value = os.environ.get(name, "")
        if value.strip().isdigit() and int(value) > 0:
            return int(value)
    return 0


def launch_id() -> str | None:
    """What every start of one job shares and no other job has: the SLURM job (a requeued one keeps its
    id), else the agent's log directory of this launch (<log dir>/<run id>_<random>, above attempt_<k>:
    dtcore.launch's and torchrun's alike); None outside both. run.json records it, so that a restart
    resumes only the run its own first start wrote (not an earlier run in the same directory, when the
    first start failed before it began its own)."""
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm:{os.environ['SLURM_JOB_ID']}"
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    return f"agent:{_run_log_dir(error_file)}" if error_file else None


def agent_log_dir() -> str | None:
    """The log directory of this launch of torch's agent (dtcore.launch's or torchrun's), shared by its restarts
    and no other launch; None outside one."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    return _run_log_dir(error_file) if error_file else None


def _run_log_dir(error_file: str) -> str:
    """<run log dir>/attempt_<k>/<local rank>/error.json -> <run log dir> (torch's DefaultLogsSpecs layout)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(error_file)))


def launcher_record(restart: int) -> dict[str, Any] | None:
    """The failure dtcore.launch restarted this job after (restart number `restart`), from the failures.jsonl
    above this worker's error file (<run log dir>/attempt_<k>/<local rank>/error.json), or None."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return None
    path = os.path.join(_run_log_dir(error_file), FAILURES)
    try:
        with open(path, encoding="utf-8") as f:
            entries = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None
    return next((e for e in reversed(entries) if e.get("restart") == restart), None)


def last_step(metrics_file: str) -> int | None:
    """The step of the last train line of this rank's metrics file: how far the attempt before the restart
    got (the last in the file, not the highest: an earlier attempt may have got further)."""
    try:
        with open(metrics_file, encoding="utf-8") as f:
            lines = f.read().split("\n")[:-1]  # a line cut by the failure has no newline: not a step done
    except OSError:
        return None
    steps = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("kind") == "train":
            steps.append(int(entry["step"]))
    return steps[-1] if steps else None


def restart_line(restart: int, resumed_from: int, last: int | None, first_step: int, rank: int) -> dict[str, Any]:
    """The "restart" metrics line, written once `first_step` (the first after the restart) is done."""
    now = time.time()
    cause = launcher_record(restart) or {}
    failed_at = cause.get("time")
    return {
        "kind": "restart",
        "step": first_step,
        "time": now,
        "rank": rank,
        "restart": restart,
        "failed_rank": cause.get("rank"),
        "failed_host": cause.get("host"),
        "cause": cause.get("cause"),
        "failed_at": failed_at,
        "resumed_from_step": resumed_from,
        "last_step": last,
        "steps_lost": None if last is None else max(0, last - resumed_from),
        "recover_s": None if failed_at is None else now - float(failed_at),
    }
