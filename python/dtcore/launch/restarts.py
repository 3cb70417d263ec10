"""Restarts of a failed job (`--max-restarts N`): torch's elastic agent, told what each failure was.

Note [Restarts]: torch's agent already restarts the worker group: when a rank fails and restarts
are left, it stops the others (SIGTERM, then SIGKILL) and starts every rank again, with
TORCHELASTIC_RESTART_COUNT one higher; dtcore.init() keys its rendezvous by that count, so a new
attempt never reads the last one's keys. What the agent does not do, dtcore adds here, in a
subclass of the agent that launch_agent builds (RestartingAgent, put in place for the duration of
one launch):
  - each failure's root cause is printed as the final one would be, then "restart k of N";
  - each is appended to failures.jsonl in the agent's log directory for this run (beside the
    attempt_<k> directories), where the restarted ranks read it (dtcore.train records it in its
    run directory with the steps it lost and the seconds it took to recover);
  - a failure that is a bug, not a fault, ends the job at once: the same exception, raised at the
    same place (the innermost frame of its traceback) in the same training step, twice in a row. A
    fault (a killed rank, a lost peer, a flaky link) rarely repeats exactly; a bug always does, and
    restarting it N times only delays its traceback. The step comes from dtcore.train (and
    dtcore.Trainer), which marks the exceptions it lets through (entry.py records it); a failure
    without a step is never judged a bug, so other scripts restart N times.
On several nodes the nodes restart together, and the budget is the job's (Note [Rounds] in
rendezvous.py): after every rendezvous the agent's restarts left are set from the job's round, so
that every node gives its ranks the same restart count and "restart k of N" is the job's k-th
restart on every node. A node whose ranks were healthy, restarted because another node's failed,
says which node failed and why (the cause that node posted with the round), and records it in its
failures.jsonl as its own. A restart never goes through the failure relay of rendezvous.py, which
stops every node: only the final failure does (no restart left, or a bug).
A rank that hangs is a failure too: dtcore's health monitor names it on the other ranks within the
timeout (their collective fails with CommError), and those ranks' exit starts the restart; the agent
stops the hung rank with SIGKILL if SIGTERM does not end it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator

from ..exit_codes import FAILURES
from .failure import RankFailure, report
from .rendezvous import RollCallRendezvous


@dataclasses.dataclass
class Restarts:
    """What the launcher knows of the restarts: `max_restarts` allowed, each failure so far."""

    max_restarts: int
    log_file: str
    world_size: int
    say: Callable[[str], None]
    to_failures: Callable[[dict], list[RankFailure]]  # the agent's {rank: ProcessFailure} as RankFailures
    run_log_dir: Callable[[], str]  # the agent's directory of this run, which holds attempt_<k>/
    failures: list[dict] = dataclasses.field(default_factory=list)
    bug: str | None = None  # why the job was not restarted after its last failure, when it was a bug
    said: set[int] = dataclasses.field(default_factory=set)  # restarts whose cause on another node was said here

    def failed(self, failures: dict, remaining: int, polled: float) -> bool:
        """The agent found `failures` (polling at time `polled`) with `remaining` restarts left: reports it;
        False when the job must not be restarted (the same failure as the last one: a bug)."""
        ranks = self.to_failures(failures)
        root = ranks[0]
        entry = _entry(root, polled) | {"restart": self.max_restarts - remaining + 1}
        bug = bool(self.failures) and _same_bug(self.failures[-1], entry)
        self.failures.append(entry | {"restarted": not bug})
        _append(os.path.join(self.run_log_dir(), FAILURES), self.failures[-1])
        if bug:
            self.bug = (
                f"not restarting: rank {root.rank} raised the same exception ({entry['cause']}) at the same place "
                f"({entry['place']}) in the same step ({entry['step']}) as before the last restart: most likely a "
                "bug in the program, which another restart would only repeat (a faulty device can repeat too: see "
                "its host's log). Fix: the traceback above; then start the job again, and dtcore.train resumes with "
                "--checkpoint.resume=auto."
            )
            return False
        what = f"rank {root.rank} failed (failure {len(self.failures)})"
        print(report(root, ranks[1:], self.log_file, self.world_size, what=what), file=sys.stderr, flush=True)
        self.say(f"restart {entry['restart']} of {self.max_restarts}: starting every rank again")
        return True

    def elsewhere(self, restart: int, causes: list[dict], healthy: bool) -> None:
        """The other nodes' `causes` of the job's restart `restart` (posted with its round, Note [Rounds] in
        rendezvous.py): the first is said, once, and recorded in failures.jsonl for the restarted ranks, unless
        this node's own failure came first. `healthy`: this node's ranks are stopped for it."""
        own = next((f for f in reversed(self.failures) if f["restart"] == restart), None)
        first = min(causes, key=lambda c: c["time"], default=None)
        if restart in self.said or (own is not None and (first is None or own["time"] <= first["time"])):
            return
        head = f"restart {restart} of {self.max_restarts}: "
        if first is None:  # the cause is read again after the roll call
            if healthy:
                self.say(head + "another node's ranks failed; starting every rank again")
            return
        self.said.add(restart)
        if first.get("left"):
            what = f"node {first['node']} ({first['host']}) left (its launcher was lost with its ranks), started again"
            first = first | {"cause": f"node {first['node']} left and was started again"}
        else:
            what = f"node {first['node']} ({first['host']}) failed: rank {first['rank']}: {first['cause']}"
        self.say(head + what + ("; starting every rank again" if healthy else ""))
        entry = {
            k: first.get(k)
            for k in ("time", "rank", "local_rank", "host", "node", "cause", "exitcode", "place", "step")
        }
        _append(os.path.join(self.run_log_dir(), FAILURES), entry | {"restart": restart, "restarted": True})


def _entry(root: RankFailure, polled: float) -> dict:
    """One line of failures.jsonl: the root cause, as the restarted ranks and dtcore.monitor read it."""
    return {
        # A recorded exception's exact time; otherwise the poll that found the rank ended (the agent's own
        # timestamp has whole seconds only, and is taken after it has stopped the other ranks).
        "time": root.time if root.recorded else polled,
        "rank": root.rank,
        "local_rank": root.local_rank,
        "host": root.host,
        "node": root.node,
        "cause": root.summary.splitlines()[0] if root.summary else "",
        "exitcode": root.exitcode,
        "place": root.place,
        "step": root.step,
    }


def _same_bug(a: dict, b: dict) -> bool:
    """Note [Restarts]: the same exception from the same place in the same step."""
    return b["step"] is not None and all(a[k] == b[k] for k in ("cause", "place", "step"))


def _append(path: str, entry: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def _report(restarts: Restarts, failures: dict, remaining: int, polled: float) -> bool:
    """Restarts.failed, which must not take the agent down: a failure to report is said, and the job restarted."""
    try:
        return restarts.failed(failures, remaining, polled)
    except Exception as e:
        restarts.say(f"could not report the failure ({type(e).__name__}: {e}); restarting the ranks anyway")
        return True


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (state first), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _failed_exit(fields: list[str] | None) -> bool:
    """Whether the process has exited (a zombie not yet reaped) with a status other than 0, or is gone."""
    if fields is None:
        return True
    # exit_code is stat's 52nd field (Linux >= 3.5), 49th after the name: a wait() status, signal or code << 8.
    return fields[0] in ("Z", "X") and (len(fields) < 50 or int(fields[49]) != 0)


def _kill_stopped_once_one_ended(pids: list[int]) -> None:
    """A rank stopped by SIGSTOP (or Ctrl-Z) cannot act on the agent's SIGTERM, which would then wait its
    whole shutdown timeout (30 s) before SIGKILL: once another rank has failed, a stopped rank is killed at
    once. Only state T: a rank stopped by a debugger or a profiler that traces it (t) is left alone."""
    stats = {pid: _stat(pid) for pid in pids}
    if not any(_failed_exit(f) for f in stats.values()):
        return
    for pid, fields in stats.items():
        if fields is not None and fields[0] == "T":
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def restarting_agent(restarts: Restarts) -> Iterator[None]:
    """While it lasts, torch's launch_agent builds a RestartingAgent reporting to `restarts`."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.launcher import api

    base = api.LocalElasticAgent

    class RestartingAgent(base):  # type: ignore[misc, valid-type]
        def _monitor_workers(self, worker_group):
            _kill_stopped_once_one_ended([w.id for w in worker_group.workers])
            polled = time.time()  # within the agent's monitor interval (0.1 s) of any failure found now
            result = super()._monitor_workers(worker_group)
            failed = result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) and result.failures
            remaining = self._remaining_restarts
            if failed and remaining > 0:
                known = len(restarts.failures)
                if not _report(restarts, result.failures, remaining, polled):
                    self._remaining_restarts = 0  # the agent stops the ranks and raises ChildFailedError
                elif len(restarts.failures) > known and isinstance(
                    handler := worker_group.spec.rdzv_handler, RollCallRendezvous
                ):
                    handler.failed_with(restarts.failures[-1])  # posted with the round it moves the job to
            return result

        def _restart_workers(self, worker_group):
            handler = worker_group.spec.rdzv_handler
            if worker_group.state == WorkerState.HEALTHY and isinstance(handler, RollCallRendezvous):
                # torch's path for a change of membership: another node moved the job's round (Note [Rounds]).
                restart = handler.job_round()
                restarts.elsewhere(restart, handler.causes(restart), healthy=True)
            super()._restart_workers(worker_group)

        def _rendezvous(self, worker_group):
            handler = worker_group.spec.rdzv_handler
            first = isinstance(handler, RollCallRendezvous) and handler.round is None  # this launcher's first
            super()._rendezvous(worker_group)
            if not isinstance(handler, RollCallRendezvous):
                return
            # The job's budget, the same on every node: TORCHELASTIC_RESTART_COUNT = max_restarts - remaining.
            self._remaining_restarts = worker_group.spec.max_restarts - handler.round
            if handler.round:
                if first:  # a launcher whose first round is a restart: its node was started again
                    restarts.say(
                        f"node {handler.node_rank} was started again: it rejoins the job at restart {handler.round} "
                        f"of {restarts.max_restarts}"
                    )
                restarts.elsewhere(handler.round, handler.causes(handler.round), healthy=False)

    api.LocalElasticAgent = RestartingAgent
    try:
        yield
    finally:
        api.LocalElasticAgent = base
