"""Replicas of the in-memory checkpoints on another node, and the restart that brings every rank's copy to
every node.

Note [Replicas]
~~~~~~~~~~~~~~~
A node that is lost takes its node directory with it (its launcher's reaper removes it, or the machine is
gone). So each rank's copy also lives on the next node: after each save, rank r sends its slot's file to
the rank of the same local index on the next node (nodes in a ring), and receives the file of the rank of
its local index on the previous node, which it keeps under that rank's own name in its node directory
(slot<j>/rank<q>.safetensors, slots.py). A replica is a byte copy of the other rank's file, record
included: it says what it holds by itself.

Overlapped with the next step: the exchange runs on a thread of its own over a Gloo group of its own (CPU
tensors; on GPU the training's collectives stay on NCCL). The file sent is the slot just written, which no
save touches before the one after next, so it is stable while it travels. The receiver clears the
replica's marker first, receives the file's bytes into its mapping and the record area aside, sets the
marker last (a replica cut short holds no step, and the replica in the other slot holds the step before),
then acknowledges it to its sender. A rank waits for its exchange (its replica received, and its own copy
acknowledged: `wait`) before the next step's last collective (dtcore.train calls MemoryCheckpoints.confirm
before the all-reduce of the step's loss): so once any rank has completed step k + 1, every rank's copy of
step k is on two nodes, and losing a node then loses at most the step it interrupted.

On restart (MemoryCheckpoints.newest) every rank reports the steps of its own files and of the replicas it
holds; the newest step held somewhere for every rank is taken. Each node then needs every rank's file of
that step in its own directory (a rank's share of a replicated tensor is read by every rank): a file a node
lacks is sent to it by one rank that holds it (its owner first), every transfer posted at once, one tag
each in one order on every rank, received under a temporary name and renamed once its SHA-256 is the one
its holder reported (gather_files). With two nodes a restart that lost nothing ships nothing: each node holds its
own ranks' files and the other node's replicas. A file a rank received that is neither its own nor the
replica it keeps is removed at its next save.
"""

from __future__ import annotations

import datetime
import logging
import os
import queue
import socket
import threading
import time
import weakref

import torch
import torch.distributed as dist

from .. import _C
from ..bootstrap import context
from . import slots
from .save import remove_file

log = logging.getLogger("dtcore")

_HEADER, _BODY, _TAIL, _ACK = 0, 1, 2, 3  # the tags of an exchange's messages
_SHIP = 16  # the first tag of a restart's transfers (gather_files), one each


def ring(nodes: list[int]) -> list[tuple[int, int]]:
    """For each rank, (the rank it sends its copies to, the rank whose copies it keeps): the ranks of its local
    index on the next and the previous node. `nodes[r]`: the node of rank r, every node with as many ranks."""
    members = _members(nodes)
    order = sorted(members)
    where = {node: i for i, node in enumerate(order)}
    out = []
    for r, node in enumerate(nodes):
        index, here = members[node].index(r), where[node]
        out.append((members[order[(here + 1) % len(order)]][index], members[order[here - 1]][index]))
    return out


def _members(nodes: list[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for r, node in enumerate(nodes):
        members.setdefault(node, []).append(r)
    return members


class Replicas:
    """This rank's side of the ring of replicas (Note [Replicas]). A collective to build (a Gloo group)."""

    def __init__(self, directory: str, rank: int, nodes: list[int], timeout: float) -> None:
        """timeout: seconds an exchange or a restart's transfer may take (DTCORE_TIMEOUT). A wait says what it
        still waits for every DTCORE_RDZV_LOG_INTERVAL seconds, as the rendezvous does."""
        if not dist.is_initialized():
            raise _C.ConfigError(
                "checkpoint.memory_every on several nodes sends each rank's copy to another node through "
                "torch.distributed, which is not set up. Fix: dtcore.init() with torch_distributed=True (the "
                "default), or set checkpoint.memory_every=0."
            )
        self.directory, self.rank, self.nodes, self.timeout = directory, rank, nodes, timeout
        self.interval = max(0.5, _C.read_settings().rdzv_log_interval_s)
        self.send_to, self.keeps = ring(nodes)[rank]
        try:
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        except RuntimeError as e:
            raise _C.ConfigError(
                f"checkpoint.memory_every: rank {rank} on {socket.gethostname()} could not join the Gloo group that "
                f"sends the copies to another node ({str(e).splitlines()[0]}). Fix: set GLOO_SOCKET_IFNAME to the "
                "network interface the nodes reach each other on, or set checkpoint.memory_every=0."
            ) from None
        self._files: dict[int, slots.SlotFile] = {}  # slot -> the replica it receives into
        self._shipped: list[str] = []  # files gather_files brought here that are neither this rank's nor its replica
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self._doing = ""  # what the exchange in flight waits for, for wait()'s progress lines
        threading.Thread(target=self._serve, daemon=True, name="dtcore-replicas").start()
        _live.add(self)

    # Saving ---------------------------------------------------------------------------------------

    def send(self, slot: int, step: int, own: slots.SlotFile) -> None:
        """After this rank's save of `step` into `own`: the exchange of that slot with the ring, on the thread."""
        self.wait()
        for path in self._shipped:
            remove_file(path)
        self._shipped = []
        self._idle.clear()
        self._jobs.put((slot, step, own))

    def wait(self) -> None:
        """The exchange in flight is complete (the replica received, this rank's copy acknowledged by the rank
        that keeps it); its error is raised here."""
        started = time.monotonic()
        limit = self.timeout + 10  # the thread's own waits end at the timeout: it says why first
        while not self._idle.wait(min(self.interval, max(0.0, started + limit - time.monotonic()))):
            waited = time.monotonic() - started
            if waited >= limit:
                raise _C.CommError(
                    f"in-memory checkpoints: rank {self.rank} on {socket.gethostname()} waited {waited:.0f} s for its "
                    f"exchange of copies with rank {self.send_to} and rank {self.keeps} ({self._doing}), beyond the "
                    "timeout (DTCORE_TIMEOUT). Fix: see those ranks' logs; one of them has stalled or died."
                )
            log.warning(
                "in-memory checkpoints: rank %d waiting %.0f s for its exchange of copies (%s)",
                self.rank,
                waited,
                self._doing,
            )
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _serve(self) -> None:
        while True:
            slot, step, own = self._jobs.get()
            try:
                self._exchange(slot, step, own)
            except _C.DtcoreError as e:  # raised on the training thread by the next wait()
                self._error = e
            except BaseException as e:
                self._error = _C.CommError(
                    f"in-memory checkpoints: rank {self.rank} on {socket.gethostname()} could not exchange the copies "
                    f"of step {step} with rank {self.send_to} (which keeps its copy) and rank {self.keeps} (whose copy "
                    f"it keeps) while it {self._doing}: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}. Most likely one of those ranks failed or is gone "
                    "(its node's log has the cause); else the link between the nodes broke."
                )
            finally:
                own = None  # (the slot's mapping is not kept alive here while the slots are laid out again)
                self._idle.set()

    def _exchange(self, slot: int, step: int, own: slots.SlotFile) -> None:
        deadline = time.monotonic() + self.timeout  # one for the whole exchange
        mine = torch.tensor([own.size, own.record_at, step], dtype=torch.int64)
        theirs = torch.empty(3, dtype=torch.int64)
        self._doing = f"sends the size of its copy of step {step}"
        self._wait(
            deadline,
            [
                dist.isend(mine, self.send_to, self.group, tag=_HEADER),
                dist.irecv(theirs, self.keeps, self.group, tag=_HEADER),
            ],
        )
        size, record_at, their_step = theirs.tolist()
        target = self._file(slot, size, record_at)
        tail = torch.empty(size - record_at, dtype=torch.uint8)
        self._doing = f"sends its copy of step {step} ({_C.format_bytes(own.size)}) and receives rank {self.keeps}'s"
        self._wait(
            deadline,
            [
                dist.isend(own.mapped[: own.record_at], self.send_to, self.group, tag=_BODY),
                dist.isend(own.mapped[own.record_at :], self.send_to, self.group, tag=_TAIL),
                dist.irecv(target.mapped[:record_at], self.keeps, self.group, tag=_BODY),
                dist.irecv(tail, self.keeps, self.group, tag=_TAIL),
            ],
        )
        tail_bytes = tail.numpy().tobytes()
        kept = slots.marker_of(tail_bytes) == their_step  # else the sender's slot changed under it: no step here
        if kept:
            target.commit_bytes(tail_bytes)
        ack = torch.tensor([their_step if kept else -1], dtype=torch.int64)
        acked = torch.empty(1, dtype=torch.int64)
        self._doing = f"waits for rank {self.send_to} to confirm it keeps its copy of step {step}"
        self._wait(
            deadline,
            [
                dist.isend(ack, self.keeps, self.group, tag=_ACK),
                dist.irecv(acked, self.send_to, self.group, tag=_ACK),
            ],
        )
        if int(acked) != step:
            raise _C.CommError(
                f"in-memory checkpoints: rank {self.send_to} did not keep rank {self.rank}'s copy of step {step} (it "
                f"confirmed {int(acked)}): the copy it received did not hold the step it was sent for. This is a bug "
                "in dtcore; the copies of the step before stand. Fix: report it, and set checkpoint.memory_every=0."
            )

    def _file(self, slot: int, size: int, record_at: int) -> slots.SlotFile:
        """The replica file of `slot`, `size` bytes, its marker cleared (at the new record area and the old)."""
        target = self._files.get(slot)
        if target is not None and target.size == size:
            target.clear()
            target.record_at = record_at
            target.clear()
            return target
        if target is not None:
            target.close()
            del self._files[slot]
        path = slots.slot_file(self.directory, slot, self.keeps)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            target = slots.SlotFile.allocate(path, size, record_at)
        except OSError as e:
            raise _C.ConfigError(
                f"checkpoint.memory_every: rank {self.rank} cannot keep rank {self.keeps}'s copy "
                f"({_C.format_bytes(size)}) in {self.directory}: {e}. Every rank of a job of several nodes keeps 2 "
                "copies of its own and 2 of another node's rank. Fix: give the node's shared memory more room (a "
                "container's --shm-size), point DTCORE_MEMORY_DIR at a larger tmpfs, or set checkpoint.memory_every=0."
            ) from None
        self._files[slot] = target
        return target

    def _wait(self, deadline: float, works: list) -> None:
        for work in works:
            work.wait(datetime.timedelta(seconds=max(0.001, deadline - time.monotonic())))

    def finish_quietly(self) -> None:
        """Before shutdown: the exchange in flight completes (bounded), its error logged, not raised."""
        try:
            self.wait()
        except _C.DtcoreError as e:
            log.warning("in-memory checkpoints: %s", e)

    # Restarting -----------------------------------------------------------------------------------

    def recorded(self) -> dict[int, int]:
        """{step: slot} of the replicas this rank keeps."""
        return slots.recorded(self.directory, self.keeps, len(self.nodes))

    def clear_newer(self, step: int | None) -> None:
        for held, slot in self.recorded().items():
            if step is None or held > step:
                slots.clear_record(slots.slot_file(self.directory, slot, self.keeps))

    def gather_files(self, slot: int, holders: list[list[int]], reports: list[dict]) -> None:
        """A collective: every node's directory gets the file of slot `slot` of every rank q from one rank
        that holds it (holders[q]: the ranks that do, the one to send it first; reports[q]: its size and SHA-256,
        which the file received must have before it takes the file's name). Every transfer is posted at once
        (one tag each, in one order on every rank), so that the links between the nodes carry them together."""
        members = _members(self.nodes)
        transfers = []  # (rank q whose file, from, to)
        for q in range(len(self.nodes)):
            index = members[self.nodes[q]].index(q)
            for node in sorted(members):
                if not any(self.nodes[h] == node for h in holders[q]):
                    transfers.append((q, holders[q][0], members[node][index]))
        deadline = time.monotonic() + self.timeout
        posted = []  # (work, transfer, the file being received or None)
        for tag, (q, src, dst) in enumerate(transfers, start=_SHIP):
            path, size = slots.slot_file(self.directory, slot, q), reports[q]["bytes"]
            if self.rank == src:
                data = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)  # a mapping: not read here
                posted.append((dist.isend(data, dst, self.group, tag=tag), (q, src, dst), None))
            elif self.rank == dst:
                received = self._allocate(path, size)
                posted.append((dist.irecv(received.mapped, src, self.group, tag=tag), (q, src, dst), received))
        for work, (q, src, dst), received in posted:
            try:
                work.wait(datetime.timedelta(seconds=max(0.001, deadline - time.monotonic())))
            except RuntimeError as e:
                raise _C.CommError(
                    f"in-memory checkpoints: restarting, rank {self.rank} on {socket.gethostname()} could not "
                    f"{'receive' if received else 'send'} rank {q}'s copy ({_C.format_bytes(reports[q]['bytes'])}) "
                    f"{'from' if received else 'to'} rank {src if received else dst}: {str(e).splitlines()[0]}. Fix: "
                    "see that rank's log; the next restart resumes from disk if this one fails again."
                ) from None
            if received is not None:
                self._take(received, reports[q]["sha256"], src)
                if q not in (self.rank, self.keeps):
                    self._shipped.append(received.path.rsplit(".tmp-", 1)[0])

    def _allocate(self, path: str, size: int) -> slots.SlotFile:
        """A file of `size` bytes under a temporary name beside `path`, for a copy another rank sends."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            return slots.SlotFile.allocate(f"{path}.tmp-{os.getpid()}", size, 0)
        except OSError as e:
            raise _C.ConfigError(
                f"checkpoint.memory_every: restarting, rank {self.rank} has no room in {self.directory} for another "
                f"rank's copy ({_C.format_bytes(size)}): {e}. On a restart every node holds every rank's copy of the "
                "step it resumes from. Fix: give the node's shared memory more room (a container's --shm-size), point "
                "DTCORE_MEMORY_DIR at a larger tmpfs, or set checkpoint.memory_every=0."
            ) from None

    def _take(self, received: slots.SlotFile, sha256: str, src: int) -> None:
        """A copy received from rank `src` takes its name once its digest is the one its holder reported."""
        received.close()
        path = received.path.rsplit(".tmp-", 1)[0]
        digest = _C.digest_file(received.path)
        if digest.sha256 != sha256:
            remove_file(received.path)
            raise _C.CheckpointError(
                f"in-memory checkpoints: the copy rank {self.rank} received from rank {src} for {path} has SHA-256 "
                f"{digest.sha256}, not {sha256} as sent. Fix: see rank {src}'s log; the next restart resumes from disk."
            )
        os.replace(received.path, path)


_live: weakref.WeakSet[Replicas] = weakref.WeakSet()  # for dtcore.shutdown(): exchanges in flight complete first


def _finish_all() -> None:
    for replicas in list(_live):
        replicas.finish_quietly()


context.before_shutdown.append(_finish_all)
