"""The root cause of a failed job and the diagnosis of known failures, from what the agent saw.

torch's agent ends a failed job with ChildFailedError: one ProcessFailure per failed rank of this
node (exit code, pid, and the error file that dtcore.launch.entry wrote for an uncaught
exception). This module turns that into what a person needs first: the first rank that failed
(by the exact time its exception was recorded, or when the agent saw it die), its host, its
Python traceback (or, for a rank without one, how it ended and the tail of its stderr), and, for
the failures that have a known cause, what it means and the fix.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import socket
from collections.abc import Callable

_STDERR_TAIL = 20  # lines of a rank's stderr shown when it left no traceback


@dataclasses.dataclass
class RankFailure:
    """One failed rank, as the summary shows it."""

    rank: int
    local_rank: int
    host: str
    pid: int
    exitcode: int
    time: float
    """When it failed: the recorded exception's time, else when the agent saw the process end."""
    summary: str
    """"ValueError: ..." for an exception, "killed by SIGKILL" or "exited with status 3" otherwise."""
    traceback: str
    """The Python traceback from the user's code on; empty when the rank left none."""
    stderr_tail: str
    """The last lines of the rank's stderr (from the agent's per-rank log), for ranks without a traceback."""
    node: int = 0
    """The node (--node-rank) it ran on."""
    recorded: bool = False
    """Whether the rank recorded its exception (dtcore.launch.entry): `time` is then exact."""
    place: str | None = None
    """file:line in function of the innermost frame that raised, when recorded."""
    step: int | None = None
    """The training step dtcore.train marked the exception with, when recorded (Note [Restarts])."""

    @property
    def stopped(self) -> bool:
        """Stopped by a launcher's SIGTERM after another rank failed (or the whole job was stopped)."""
        return self.exitcode == -signal.SIGTERM and not self.traceback


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(path: str, lines: int = _STDERR_TAIL) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def first_first(failures: list[RankFailure]) -> list[RankFailure]:
    """The root cause first: ranks stopped with SIGTERM last (unless every rank was, e.g. the whole job got
    SIGTERM), then by time: a recorded exception's exact time, else when the agent saw the end. The sort is
    stable, so equal keys keep the agent's order (it lists the ranks it found failed first)."""
    everyone_stopped = all(r.stopped for r in failures)
    return sorted(failures, key=lambda r: (r.stopped and not everyone_stopped, r.time))


def rank_failures(failures: dict, stderr_file: Callable[[int], str], node: int = 0) -> list[RankFailure]:
    """ChildFailedError.failures ({global rank: ProcessFailure}) as RankFailures, the root cause first.
    `stderr_file(local_rank)` is where the agent kept that rank's stderr."""
    out = []
    for rank, f in failures.items():
        ours = f.error_file_data.get("dtcore", {}) if isinstance(f.error_file_data, dict) else {}
        if ours:
            summary = f.message["message"] if isinstance(f.message, dict) else str(f.message)
        elif f.exitcode < 0:
            summary = f"killed by {_signal_name(f.exitcode)}"
        else:
            summary = f"exited with status {f.exitcode} without an uncaught Python exception"
        out.append(
            RankFailure(
                rank=int(rank),
                local_rank=f.local_rank,
                host=ours.get("host", socket.gethostname()),
                pid=f.pid,
                exitcode=f.exitcode,
                time=float(ours.get("time", f.timestamp)),
                summary=summary,
                traceback=ours.get("traceback", ""),
                stderr_tail="" if ours else _tail(stderr_file(f.local_rank)),
                node=node,
                recorded=bool(ours),
                place=ours.get("place"),
                step=ours.get("step"),
            )
        )
    return first_first(out)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """A known failure: how to recognise it, what it means, what to do."""

    name: str
    pattern: str  # a regular expression searched in the summary, traceback and stderr tail
    meaning: str
    fix: str


# Order matters: the first that matches is the most specific explanation. docs/troubleshooting.md
# shows each message, what dtcore says and what to do; keep the two in step.
KNOWN = (
    Diagnosis(
        "GPU out of memory",
        r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
        "the rank ran out of GPU memory.",
        "in the order that costs least: a smaller device batch with more gradient accumulation (same total "
        "batch); dtcore.wrap(model, zero=2) to shard gradients and optimizer state; "
        "dtcore.checkpoint_activations(model); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
        "fragmentation.",
    ),
    Diagnosis(
        "libuv store",
        r"use_libuv|libuv",
        "torch's TCPStore was asked for its libuv backend, which this torch build lacks.",
        "dtcore's launcher never asks for it; under another launcher set USE_LIBUV=0 in every process.",
    ),
    Diagnosis(
        "port in use",
        r"[Aa]ddress already in use|EADDRINUSE|is already in use|is taken on this host",
        "the rendezvous port is taken on the master host (another job, or a previous run still exiting).",
        "pass another --master-port (the same on every node), or leave it out on one node to take a free one; "
        "`python -m dtcore.check` names the process holding it.",
    ),
    Diagnosis(
        "invalid device ordinal",
        r"invalid device ordinal",
        "a rank's local rank is beyond the GPUs visible on its node: typically a 2x8 cluster started as 1x16, "
        "or CUDA_VISIBLE_DEVICES listing fewer GPUs than --nproc-per-node.",
        "set --nproc-per-node to the GPUs per node (or leave it out: it defaults to the GPU count) and "
        "--nnodes to the number of nodes; check CUDA_VISIBLE_DEVICES on every node.",
    ),
    Diagnosis(
        "missing rank",
        r"rendezvous timed out|never joined|did not join|missing rank",
        "a rank or node never arrived at the rendezvous.",
        "start every node with the command node 0 prints, with the same --nnodes, --master-addr and "
        "--master-port; check that the master address resolves and its port is open from every node.",
    ),
    Diagnosis(
        "collective mismatch",
        r"mismatch|different collectives|do not match",
        "ranks called different collectives (or the same one with different shapes) at the same point.",
        "make every rank run the same collectives in the same order: look for a branch on the rank or on data "
        "(e.g. an uneven last batch); the message names each rank's call.",
    ),
    Diagnosis(
        "collective timeout",
        r"timed out|Watchdog caught collective|CommError",
        "a collective did not complete in time: a rank died, hangs, or is far behind the others.",
        "look first at the rank the message names (its log above); `python -m dtcore.check --analyze LOG_DIR` "
        "reads the flight records; raise the timeout (dtcore.init(timeout=) or DTCORE_TIMEOUT) only for a "
        "rank that is slow on purpose (e.g. a long save on rank 0).",
    ),
    Diagnosis(
        "killed",
        r"killed by SIGKILL",
        "the rank was killed by SIGKILL, which no program can catch: most often the kernel's out-of-memory "
        "killer (host memory, e.g. too many DataLoader workers or a large dataset loaded per rank), or the "
        "scheduler at a time or memory limit.",
        "check `dmesg -T | grep -i -E 'killed process|out of memory'` on the rank's host and the scheduler's "
        "log; lower host memory per rank (fewer DataLoader workers, memory-mapped data).",
    ),
)


def diagnose(failure: RankFailure) -> Diagnosis | None:
    text = "\n".join((failure.summary, failure.traceback, failure.stderr_tail))
    return next((d for d in KNOWN if re.search(d.pattern, text)), None)


def report(
    root: RankFailure,
    others: list[RankFailure],
    log_file: str,
    world_size: int,
    nodes: int = 1,
    what: str = "the job failed",
) -> str:
    """The summary printed when a job failed (or, `what` says, a failure it restarts after): the root cause,
    this node's other failures, then the fix."""
    where = f"host {root.host}" + (f" (node {root.node})" if nodes > 1 else "")
    lines = [
        "=" * 78,
        f"dtcore.launch: {what}. Root cause: rank {root.rank} (local rank {root.local_rank}) on {where}, "
        f"pid {root.pid}: {root.summary}",
    ]
    if root.traceback:
        lines += ["", f"Traceback of rank {root.rank}:", root.traceback.rstrip()]
    elif root.stderr_tail:
        lines += ["", f"Last lines of rank {root.rank}'s stderr:", root.stderr_tail.rstrip()]
    if others:
        lines += ["", f"Then, on this node ({len(others)} of {world_size} ranks; SIGTERM: stopped by the launcher):"]
        lines += [f"  rank {r.rank} on {r.host}: {r.summary.splitlines()[0]}" for r in others]
    found = diagnose(root)
    if found:
        lines += ["", f"Diagnosis ({found.name}): {found.meaning}", f"Fix: {found.fix}"]
    lines += ["", f"Full output of this node: {log_file}", "=" * 78]
    return "\n".join(lines)
