"""The nodes' roll call: torch's static rendezvous, but never silent and never 600 s blind.

torchrun's static rendezvous (`--nnodes N --node-rank K`) blocks in TCPStore's constructor until
N connections arrive, and says nothing about which node is missing. This handler plugs into
torch's elastic agent (registered as the "dtcore-static" rendezvous backend, used only by
`python -m dtcore.launch`) and does the same job in the open: node 0 serves the agent's store,
every node signs in under its node rank with its host, and every node prints every few seconds
which nodes have joined and which are missing. At the timeout it raises RendezvousError naming
the missing nodes and the command that starts them. A node rank claimed by two hosts is refused
(claimed again from the same host, it is a restart of that node).

When a node's job fails, its launcher posts its first failure in the store (post_failure); every
other node watches for that (watch_failures) and stops its own ranks, so that a job never hangs on
a node whose ranks wait for a dead peer, and every node prints the same root cause: the earliest
failure posted (gather_failures). Node 0, which serves the store, waits a little for the others to
read it before it exits.

After the roll call it hands the agent what StaticTCPRendezvous would: the store (prefixed by the
run id and the round, below), this node's rank, the number of nodes, and the store's address for the
workers (TORCHELASTIC_USE_AGENT_STORE, which dtcore.init() reads).

Note [Rounds]: with --max-restarts, the nodes restart together. Each completed roll call is a round
of the job: the first is round 0, and round k is the job's k-th restart, on every node. The job's
round is one key in node 0's store. A node whose agent restarts its ranks (they failed) moves that
key from its round k to k+1 with compare_set (nodes failing at once all land in k+1), posts its cause
under round k+1, and signs in there; the other nodes' agents see the job's round newer than theirs
(num_nodes_waiting(), torch's path for a change of membership, which does not count a restart), stop
their ranks and sign in too. A node started again after its launcher was lost with its ranks finds
its node rank signed in to the job's round: it moves the job to the next round (or, when that round
still waits for it, joins it). RestartingAgent (restarts.py) then gives every node's ranks the
round as their restart count (TORCHELASTIC_RESTART_COUNT, by which dtcore.init() keys its own
rendezvous), so the count is the same on every node; a round past --max-restarts is refused. The
agent's own keys live under a prefix per round, so that a round never reads a previous one's.
Node 0 serves the store: a job cannot outlive it (every node must then be started again).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
from collections.abc import Callable

from torch.distributed import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)

from .. import _C

BACKEND = "dtcore-static"
# Store keys of the roll call, under <_ROLL><run id>/: node<k> -> {"host", "pid"} (node k's claim of its node rank);
# round -> the job's round (Note [Rounds]); round<r>/node<k> -> {"host", "pid"} (node k signed in to round r);
# round<r>/cause/node<k> -> the failure for which node k moved the job to round r.
_ROLL = "dtcore_roll_call/"
_RELAY_TIMEOUT = 10.0  # seconds for one store operation of the failure relay, and node 0's wait for readers


class RollCallRendezvous(RendezvousHandler):
    """Static rendezvous of `num_nodes` nodes at master_addr:master_port, with a roll call."""

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        node_rank: int,
        num_nodes: int,
        run_id: str,
        timeout: float,
        interval: float,
        say: Callable[[str], None],
        start_command: Callable[[int], str],
        max_restarts: int = 0,
    ):
        self.master_addr = master_addr
        self.master_port = master_port
        self.node_rank = node_rank
        self.num_nodes = num_nodes
        self.run_id = run_id
        self.timeout = timeout
        self.interval = interval  # seconds between progress lines
        self.say = say
        self.start_command = start_command  # node rank -> the command that starts it (for messages)
        self.max_restarts = max_restarts  # the job's, every node's: the last round is max_restarts
        self.round: int | None = None  # this node's round of the job (Note [Rounds]); None before the first
        self._cause: dict | None = None  # why the agent restarts this node's ranks, posted with the next round
        self._store: Store | None = None
        self._stop_watching = threading.Event()

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True

    @property
    def joined(self) -> bool:
        """Whether this node's first roll call is done (its ranks have been started)."""
        return self._store is not None

    def failed_with(self, cause: dict) -> None:
        """The agent restarts this node's ranks after `cause` (restarts.py's failures.jsonl entry): posted for
        the other nodes with the round this node moves the job to."""
        self._cause = cause

    def next_rendezvous(self) -> RendezvousInfo:
        deadline = time.monotonic() + self.timeout
        first = self._store is None
        try:
            if first:
                store = self._serve() if self.node_rank == 0 else self._connect(deadline)
                self.round = self._first_round(store)
            else:
                store = self._store
                self.round = self._move(store, self.round + 1, self._cause)
            self._cause = None
            self.round = self._roll_call(store, self.round, deadline)
        except RuntimeError as e:  # torch's store errors (DistNetworkError, DistStoreError) derive from it
            if isinstance(e, _C.DtcoreError):
                raise
            raise self._lost_store(e, "during the roll call" if first else "while the nodes restart") from e
        if first:
            self._store = store
            if self.num_nodes > 1:
                threading.Thread(target=self._watch, daemon=True, name="dtcore-failure-watch").start()
        return RendezvousInfo(
            PrefixStore(f"{self.run_id}/round{self.round}", self._store),  # the agent's keys, per round
            self.node_rank,
            self.num_nodes,
            RendezvousStoreInfo(self.master_addr, self.master_port),
        )

    def _lost_store(self, error: RuntimeError, when: str) -> _C.RendezvousError:
        """Node 0's store is gone: the job cannot go on (Note [Rounds])."""
        return _C.RendezvousError(
            f"node {self.node_rank} ({socket.gethostname()}) lost node 0's rendezvous store at "
            f"{self.master_addr}:{self.master_port} {when} ({error}): node 0 serves the store, and the job cannot go "
            "on without it (node 0 failed, gave up or was stopped; a restart brings back any node but node 0). "
            f"Fix: see node 0's output; start every node again, node 0 first ({self.start_command(0)}); "
            "dtcore.train resumes from its newest checkpoint."
        )

    def _store_at(self, is_master: bool, timeout: float) -> TCPStore:
        return TCPStore(
            self.master_addr,
            self.master_port,
            None,
            is_master,
            datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
            multi_tenant=True,  # the workers' dtcore.init() opens this same store (agent store)
            use_libuv=_libuv(),
        )

    def _serve(self) -> TCPStore:
        try:
            return self._store_at(True, self.timeout)
        except RuntimeError as e:
            if "in use" in str(e).lower():
                raise _C.RendezvousError(
                    f"node 0 cannot serve the rendezvous store: port {self.master_port} is already in use on "
                    f"{socket.gethostname()} (another job, or a previous run still exiting). Fix: pass another "
                    "--master-port (the same on every node), or leave it out on one node to take a free one."
                ) from e
            raise

    def _connect(self, deadline: float) -> TCPStore:
        """A client of node 0's store. Until node 0 listens, a plain TCP connect is tried every 0.25 s (quiet and
        instant when refused, where TCPStore's own retries log a C++ backtrace each) and the wait is reported."""
        started = time.monotonic()
        next_line = started + self.interval
        while True:
            now = time.monotonic()
            try:
                socket.create_connection(
                    (self.master_addr, self.master_port), timeout=max(0.1, min(2.0, deadline - now))
                ).close()
                break
            except OSError as e:
                error = e
            now = time.monotonic()
            if now >= deadline:
                raise _C.RendezvousError(
                    f"node {self.node_rank} ({socket.gethostname()}) could not reach node 0's rendezvous store "
                    f"at {self.master_addr}:{self.master_port} within {self.timeout:g} s ({error.strerror or error}). "
                    f"Fix: start node 0 first with: {self.start_command(0)}; check that {self.master_addr} resolves "
                    f"from this node and that port {self.master_port} is open between the nodes."
                ) from error
            if now >= next_line:
                self.say(
                    f"node {self.node_rank}: waiting for node 0's store at {self.master_addr}:{self.master_port} "
                    f"({now - started:.0f} s of --timeout {self.timeout:g})"
                )
                next_line = now + self.interval
            time.sleep(0.25)
        store = self._store_at(False, max(1.0, deadline - time.monotonic()))
        store.set_timeout(datetime.timedelta(seconds=self.timeout))
        return store

    def _key(self, name: str) -> str:
        return f"{_ROLL}{self.run_id}/{name}"

    def _first_round(self, store: Store) -> int:
        """Claims this node's rank; the round it joins: the job's, or the next one for a node started again."""
        me = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})
        seen = store.compare_set(self._key(f"node{self.node_rank}"), "", me).decode()
        other = json.loads(seen)
        if seen != me and other["host"] == socket.gethostname():
            # This node started again (after Ctrl-C, or its launcher was lost with its ranks): its claim stands.
            store.set(self._key(f"node{self.node_rank}"), me)
        elif seen != me:
            raise _C.RendezvousError(
                f"node rank {self.node_rank} is claimed twice: by host {other['host']} (pid {other['pid']}) and by "
                f"this node, {socket.gethostname()} (pid {os.getpid()}). Fix: give every node its own "
                f"--node-rank, 0 .. {self.num_nodes - 1}."
            )
        job = int(store.compare_set(self._key("round"), "", "0").decode())  # "0" for a new job
        signed = [store.check([self._key(f"round{job}/node{k}")]) for k in range(self.num_nodes)]
        if seen == me or not all(signed):
            return job  # a new node, or one started again before its round was complete: the round waits for it
        # Its round was complete: its launcher was lost with its ranks, and the other nodes run on without it.
        left = {"time": time.time(), "node": self.node_rank, "host": socket.gethostname(), "left": True}
        return self._move(store, job + 1, left)

    def _move(self, store: Store, target: int, cause: dict | None) -> int:
        """Moves the job from round target - 1 to `target` (or finds another node did); posts `cause` under it."""
        if target > self.max_restarts:
            raise _C.RendezvousError(
                f"node {self.node_rank} ({socket.gethostname()}) was started again while the job runs, but the job "
                f"has no restart left to take it back (--max-restarts {self.max_restarts}, {target - 1} used). "
                f"Fix: stop every node, then start every node again, node 0 first ({self.start_command(0)}); "
                "dtcore.train resumes from its newest checkpoint."
            )
        post = f"round{{}}/cause/node{self.node_rank}"
        if cause is not None:  # before the job moves, so that the nodes it moves can read it
            store.set(self._key(post.format(target)), json.dumps(cause))
        moved = int(store.compare_set(self._key("round"), str(target - 1), str(target)).decode())
        if cause is not None and moved != target:  # another node moved it further first
            store.set(self._key(post.format(moved)), json.dumps(cause))
        return moved

    def causes(self, round_: int) -> list[dict]:
        """The causes the other nodes posted for `round_` (Note [Rounds]), each with its "node"."""
        try:
            keys = {k: self._key(f"round{round_}/cause/node{k}") for k in range(self.num_nodes) if k != self.node_rank}
            return [
                dict(json.loads(self._store.get(key)), node=k) for k, key in keys.items() if self._store.check([key])
            ]
        except RuntimeError as e:
            raise self._lost_store(e, "while the nodes restart") from e

    def _roll_call(self, store: Store, round_: int, deadline: float) -> int:
        """Signs in to `round_` and waits for every node (following the job when another node moves it further);
        the round reached."""
        me = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})
        store.set(self._key(f"round{round_}/node{self.node_rank}"), me)
        next_line = time.monotonic() + self.interval
        while True:
            keys = [self._key(f"round{round_}/node{k}") for k in range(self.num_nodes)]
            joined = [k for k, name in enumerate(keys) if store.check([name])]
            of = f" for restart {round_} of {self.max_restarts}" if round_ else ""
            if len(joined) == self.num_nodes:
                if self.num_nodes > 1:
                    self.say(f"all {self.num_nodes} nodes joined{of}")
                return round_
            job = int(store.get(self._key("round")))
            if job > round_:  # a node started again moved the job on while this one waited: follow
                round_ = job
                store.set(self._key(f"round{round_}/node{self.node_rank}"), me)
                continue
            missing = [k for k in range(self.num_nodes) if k not in joined]
            now = time.monotonic()
            if now >= deadline:
                hosts = _hosts(store, keys, joined)
                lost = (
                    " (a node whose launcher was lost with its ranks rejoins when its command runs again)"
                    if round_
                    else ""
                )
                raise _C.RendezvousError(
                    f"rendezvous{of} timed out after {self.timeout:g} s: {len(missing)} of {self.num_nodes} nodes "
                    f"never joined: node {', '.join(map(str, missing))} (joined: {hosts}). Fix: start each "
                    f"missing node{lost} with:\n"
                    + "\n".join(f"  node {k}: {self.start_command(k)}" for k in missing)
                    + f"\nand check that they reach {self.master_addr}:{self.master_port}; or raise --timeout."
                )
            if now >= next_line:
                self.say(
                    f"rendezvous{of}: {len(joined)}/{self.num_nodes} nodes joined ({_hosts(store, keys, joined)}); "
                    f"missing: node {', '.join(map(str, missing))} "
                    f"({deadline - now:.0f} s left of --timeout {self.timeout:g})"
                )
                next_line = now + self.interval
            time.sleep(0.2)

    # Failures across nodes: keys <_ROLL><run id>/failed/node<k> (a JSON failure) and .../read/node<k>.

    def _client(self) -> TCPStore:
        """A connection of its own: the agent's store object is used by the agent's thread."""
        return self._store_at(False, _RELAY_TIMEOUT)

    def _failure_key(self, node: int, kind: str = "failed") -> str:
        return f"{_ROLL}{self.run_id}/{kind}/node{node}"

    def _watch(self) -> None:
        """Until stop(): when another node posts a failure, on_remote_failure() (the launcher stops its ranks)."""
        try:
            store = self._client()
            others = [self._failure_key(k) for k in range(self.num_nodes) if k != self.node_rank]
            while not self._stop_watching.wait(0.25):
                if any(store.check([key]) for key in others):
                    self._stop_watching.set()
                    _launcher["on_remote_failure"]()
                    return
        except RuntimeError:
            return  # node 0's store is gone: the job is over; the agent reports what its own ranks did

    def stop_watching(self) -> None:
        self._stop_watching.set()

    def post_failure(self, failure: dict) -> None:
        """Posts this node's first failure for the other nodes (best effort: the store may be gone)."""
        self._stop_watching.set()
        try:
            self._client().set(self._failure_key(self.node_rank), json.dumps(failure))
        except RuntimeError:
            pass

    def gather_failures(self, grace: float) -> list[dict]:
        """Every node's posted failure, after `grace` seconds for the slower nodes to post theirs; then marks
        this node as having read them, and node 0 waits (a few seconds at most) until every node has."""
        time.sleep(grace)
        try:
            store = self._client()
            found = [
                dict(json.loads(store.get(self._failure_key(k))), node=k)
                for k in range(self.num_nodes)
                if store.check([self._failure_key(k)])
            ]
            store.set(self._failure_key(self.node_rank, "read"), "1")
            if self.node_rank == 0:  # this process serves the store: keep it until the others have read
                readers = [self._failure_key(k, "read") for k in range(1, self.num_nodes)]
                deadline = time.monotonic() + _RELAY_TIMEOUT
                while not all(store.check([key]) for key in readers) and time.monotonic() < deadline:
                    time.sleep(0.1)
            return found
        except RuntimeError:
            return []

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        """torch's agent asks every 0.1 s while its ranks are healthy: > 0 restarts them without counting a
        restart. Here: 1 when another node moved the job to a newer round (Note [Rounds]); one store read."""
        if self._store is None or self.num_nodes == 1:
            return 0
        return int(self.job_round() > self.round)

    def job_round(self) -> int:
        """The job's round (Note [Rounds]), as node 0's store holds it."""
        try:
            return int(self._store.get(self._key("round")))
        except RuntimeError as e:
            raise self._lost_store(e, "while its ranks ran") from e

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


def _hosts(store: Store, keys: list[str], joined: list[int]) -> str:
    return ", ".join(f"node {k} {json.loads(store.get(keys[k]))['host']}" for k in joined)


_libuv_ok: bool | None = None


def _libuv() -> bool:
    """Whether this torch's TCPStore has libuv. Builds without it fail with "use_libuv was requested but
    PyTorch was built without libuv support" when asked for it (torch's default): dtcore never asks them,
    and tells the workers the same (USE_LIBUV=0), so that error cannot appear."""
    global _libuv_ok
    if _libuv_ok is None:
        try:
            probe = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=5), use_libuv=True)
            _libuv_ok = bool(getattr(probe, "libuvBackend", True))
            del probe
        except RuntimeError as e:
            if "libuv" not in str(e):
                raise
            _libuv_ok = False
        if not _libuv_ok:
            os.environ["USE_LIBUV"] = "0"  # inherited by the workers, whose stores then match
    return _libuv_ok


# What the handler needs from the launcher; set by register() before the agent starts (one launch per process).
_launcher: dict = {}
# The handler the agent made, for the launcher's failure relay (None on one node, before the rendezvous).
handler: RollCallRendezvous | None = None


def _create(params: RendezvousParameters) -> RendezvousHandler:
    global handler
    addr, _, port = params.endpoint.rpartition(":")
    handler = RollCallRendezvous(
        addr,
        int(port),
        int(params.config["rank"]),
        params.max_nodes,
        params.run_id,
        float(params.config["timeout"]),
        _launcher["interval"],
        _launcher["say"],
        _launcher["start_command"],
        int(params.config.get("max_restarts", 0)),
    )
    return handler


def register(
    say: Callable[[str], None],
    start_command: Callable[[int], str],
    interval: float,
    on_remote_failure: Callable[[], None],
) -> None:
    """Registers the "dtcore-static" backend with torch's rendezvous registry (this process only)."""
    _launcher.update(say=say, start_command=start_command, interval=interval, on_remote_failure=on_remote_failure)
    rendezvous_handler_registry.register(BACKEND, _create)  # idempotent for the same creator
