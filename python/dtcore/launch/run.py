"""One node's part of a launched job: preflight, the other nodes' commands, torch's elastic agent,
and the verdict. `python -m dtcore.launch` (__main__.py) parses the command line and tees the log;
this module does the rest.

Process supervision is torch's: elastic_launch builds a LocalElasticAgent that starts, watches and
stops the ranks. dtcore adds the roll call of the nodes (rendezvous.py), the recording entry every
rank runs through (entry.py), and the root cause of a failure (failure.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import logging
import os
import shlex
import signal
import sys
import time

from .. import _C
from ..exit_codes import EXIT_PREEMPTED
from . import rendezvous
from .failure import RankFailure, first_first, rank_failures, report
from .rendezvous import BACKEND, register
from .restarts import Restarts, restarting_agent

DEFAULT_TIMEOUT = _C.read_settings(env={}).timeout_s  # seconds for every node to join: DTCORE_TIMEOUT's default
DEFAULT_LOG_DIR = "logs"
# Seconds a failed node waits for the other nodes to post their failures before naming the earliest: a rank
# that raised and the peers that lost it a moment later fail within this of each other.
_POST_GRACE = 2.0


def say(message: str) -> None:
    print(f"dtcore.launch: {message}", file=sys.stderr, flush=True)


def _without_agent_verdict(record: logging.LogRecord) -> bool:
    """Drops torch's agent's "failed (exitcode: ...) local_rank: ..." line: it picks the first failure by whole
    seconds, so it may name a rank the agent itself stopped; the launcher prints the root cause instead."""
    return not str(record.msg).startswith("failed (exitcode")


class Job:
    """This node's share of the job: `nproc` ranks of `nnodes * nproc`."""

    def __init__(
        self,
        a: argparse.Namespace,
        program: list[str],
        nproc: int,
        master_addr: str,
        master_port: int,
        log_path: str,
        python: str,
    ):
        self.a = a
        self.program = program  # ["-m", module, args...] or [script, args...]
        self.nproc = nproc
        self.world = a.nnodes * nproc
        self.master_addr = master_addr
        self.master_port = master_port
        self.log_path = log_path
        self.python = python  # how printed commands name the interpreter
        # The agent's per-rank files (stdout, stderr, error file) sit next to the node log.
        self.rank_dir = os.path.splitext(log_path)[0]
        self.remote_failure = False  # set when another node's failure stopped this node's ranks

    def command_for(self, node: int) -> str:
        """The exact command that starts node `node` of this job."""
        a = self.a
        words = [self.python, "-m", "dtcore.launch", "--nnodes", str(a.nnodes), "--node-rank", str(node)]
        words += ["--master-addr", self.master_addr, "--master-port", str(self.master_port)]
        words += ["--nproc-per-node", str(self.nproc)]
        if a.timeout != DEFAULT_TIMEOUT:
            words += ["--timeout", f"{a.timeout:g}"]
        if a.max_restarts:
            words += ["--max-restarts", str(a.max_restarts)]
        if a.log_dir != DEFAULT_LOG_DIR:
            words += ["--log-dir", a.log_dir]
        if a.name:
            words += ["--name", a.name]
        if not a.preflight:
            words += ["--no-preflight"]
        return shlex.join(words + self.program)

    def stderr_file(self, local_rank: int) -> str:
        """Where the agent kept a rank's stderr: <rank_dir>/<run id>_<random>/attempt_<n>/<local rank>/stderr.log."""
        found = glob.glob(os.path.join(glob.escape(self.rank_dir), "*", "attempt_*", str(local_rank), "stderr.log"))
        return max(found, key=_attempt) if found else ""

    def run_log_dir(self) -> str:
        """The agent's directory of this launch, <rank_dir>/<run id>_<random>, which holds attempt_<k>/ (the
        restarted ranks find restarts.FAILURES there, three levels above their TORCHELASTIC_ERROR_FILE). A node
        started again into a running job begins at attempt_<k> with k > 0 (Note [Rounds] in rendezvous.py)."""
        found = glob.glob(os.path.join(glob.escape(self.rank_dir), "*", "attempt_*"))
        return os.path.dirname(max(found, key=_attempt)) if found else self.rank_dir

    def worker_env(self) -> dict[str, str]:
        """What local rank 0 of this node will see, as the preflight judges it."""
        return dict(
            os.environ,
            RANK=str(self.a.node_rank * self.nproc),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE=str(self.nproc),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
        )

    def preflight(self) -> bool:
        """dtcore.check's probes of this node for the job it is about to run: WARNs shown, FAILs stop it."""
        from ..check import run as check

        started = time.monotonic()
        report = check(env=self.worker_env(), distributed=False)
        for item in report.warnings:
            say(f"preflight WARN {item.title} ({item.value}): {item.message} Fix: {item.fix}")
        if report.failures:
            lines = "\n".join(
                f"  FAIL {i.title} ({i.value}): {i.message}\n       Fix: {i.fix}" for i in report.failures
            )
            say(
                f"preflight: {len(report.failures)} check(s) failed on {report.host}; nothing was started:\n{lines}\n"
                "(`python -m dtcore.check` shows the whole report; --no-preflight skips these checks.)"
            )
            return False
        say(f"preflight: {len(report.items)} checks, no failure ({time.monotonic() - started:.1f} s)")
        return True

    def run(self) -> int:
        a = self.a
        say(
            f"{a.nnodes} node(s) x {self.nproc} process(es) = {self.world} rank(s); this is node {a.node_rank}; "
            f"master {self.master_addr}:{self.master_port}; log {self.log_path}"
        )
        if a.node_rank == 0 and a.nnodes > 1 and not a.from_slurm:  # under SLURM, srun starts every node
            say("start the other nodes with:\n" + "\n".join(f"  {self.command_for(k)}" for k in range(1, a.nnodes)))
        if self.nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
            os.environ["OMP_NUM_THREADS"] = "1"  # as torchrun: several ranks' thread pools would fight over the CPUs
            say("OMP_NUM_THREADS=1 for every rank (set it to choose otherwise)")
        if a.preflight and not self.preflight():
            return 1
        return self._agent()

    def _agent(self) -> int:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        a = self.a
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_without_agent_verdict)
        # The same knob as dtcore.init()'s own rendezvous lines (DTCORE_RDZV_LOG_INTERVAL, 5 s by default).
        register(say, self.command_for, _C.read_settings().rdzv_log_interval_s, self._remote_failure)
        config = LaunchConfig(
            min_nodes=a.nnodes,
            max_nodes=a.nnodes,
            nproc_per_node=self.nproc,
            run_id="dtcore",
            role="worker",
            rdzv_endpoint=f"{self.master_addr}:{self.master_port}",
            rdzv_backend=BACKEND,
            rdzv_configs={"rank": a.node_rank, "timeout": a.timeout, "max_restarts": a.max_restarts},
            max_restarts=a.max_restarts,  # Note [Restarts] in restarts.py
            monitor_interval=0.1,
            # Each rank's stdout/stderr are also kept in its own file (read back for a rank that died without a
            # traceback) and shown on the console with a [rank<r>] prefix.
            logs_specs=DefaultLogsSpecs(log_dir=self.rank_dir, tee=Std.ALL),
            log_line_prefix_template="[rank${rank}]:",
            # SIGUSR1 is what SLURM sends before a time limit (sbatch --signal=USR1@120): like SIGTERM, it is passed
            # on to every rank (dtcore.train saves a checkpoint and exits), which get TORCH_ELASTIC_SHUTDOWN_TIMEOUT
            # seconds (30 by default) before SIGKILL. Left to its default action it would kill the launcher alone.
            signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        )
        started = time.monotonic()
        restarts = Restarts(
            a.max_restarts,
            self.log_path,
            self.world,
            say,
            lambda failures: rank_failures(failures, self.stderr_file, a.node_rank),
            self.run_log_dir,
        )
        try:
            with restarting_agent(restarts):
                elastic_launch(config, sys.executable)("-u", "-m", "dtcore.launch.entry", *self.program)
        except ChildFailedError as e:
            if all(f.exitcode == EXIT_PREEMPTED for f in e.failures.values()):
                say(f"every failed rank of node {a.node_rank} saved a checkpoint and exited after a preemption signal")
                return EXIT_PREEMPTED
            self._failed(rank_failures(e.failures, self.stderr_file, a.node_rank))
            if restarts.bug:
                say(restarts.bug)
            elif a.max_restarts:
                handler = rendezvous.handler
                used = handler.round if handler is not None and handler.round is not None else len(restarts.failures)
                say(f"no restart left: the job failed {used + 1} time(s), --max-restarts {a.max_restarts}")
            return 1
        except _C.DtcoreError as e:
            ran = rendezvous.handler is not None and rendezvous.handler.joined
            say(str(e) if ran else f"the job did not start: {e}")
            return 1
        except SignalException as e:
            if self.remote_failure:
                self._failed([])
                return 1
            name = signal.Signals(e.sigval).name
            saved = glob.glob(os.path.join(glob.escape(self.rank_dir), "*", "attempt_*", "*", "*.preempted"))
            if len(saved) == self.nproc:
                say(f"stopped by {name}: every rank of node {a.node_rank} saved a checkpoint and exited; resume it")
                return EXIT_PREEMPTED
            say(f"stopped by {name}; the ranks of this node were stopped")
            return 128 + int(e.sigval)
        finally:
            if rendezvous.handler is not None:
                rendezvous.handler.stop_watching()
        say(f"all {self.nproc} rank(s) of node {a.node_rank} finished in {time.monotonic() - started:.1f} s")
        return 0

    def _remote_failure(self) -> None:
        """Another node posted a failure: stop this node's ranks (torch's agent turns SIGTERM into SignalException)
        rather than let them wait for a dead peer until a timeout."""
        self.remote_failure = True
        say("another node's job failed: stopping the ranks of this node")
        os.kill(os.getpid(), signal.SIGTERM)

    def _failed(self, local: list[RankFailure]) -> None:
        """Prints the root cause: on several nodes, the earliest failure any node posted."""
        root = local[0] if local else None
        handler = rendezvous.handler
        if self.a.nnodes > 1 and handler is not None:
            if root is not None:
                handler.post_failure(dataclasses.asdict(root))
            posted = [RankFailure(**f) for f in handler.gather_failures(_POST_GRACE)]
            if posted:
                root = first_first(posted)[0]
        if root is None:
            say("another node failed, but its failure could not be read (its store is gone): see that node's log")
            return
        others = [r for r in local if r != root]
        print(report(root, others, self.log_path, self.world, self.a.nnodes), file=sys.stderr, flush=True)


def _attempt(path: str) -> tuple[int, str]:
    """The attempt number k of a path with an attempt_<k> directory in it (attempt_10 after attempt_9)."""
    for part in reversed(path.split(os.sep)):
        if part.startswith("attempt_") and part[8:].isdigit():
            return int(part[8:]), path
    return -1, path
