"""In-memory checkpoints: every rank's state copied into its node's shared memory every few steps, where a
restarted job resumes from, losing at most the steps since the last copy.

Note [In-memory checkpoints]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A disk checkpoint costs seconds and is taken every few hundred steps; a restart after a failure then
redoes every step since. Here each rank copies its state, every `memory_every` steps, into memory that
outlives the rank's process: files in a tmpfs (DTCORE_MEMORY_DIR, /dev/shm by default) in a directory of
the launch (`node_directory`), which a small reaper process removes once the node's launcher exits,
however it exits (reaper.py). A killed rank's copy is still there when the launcher starts the ranks
again.

What is copied is what the rank writes of a disk checkpoint (collect.py: its chunks of the model and
optimizer, a replicated tensor split across the ranks), its RNG states and data position (rank_extra),
and on rank 0 the schedule and the optimizer's hyperparameters: the same checkpoint format
(Note [Checkpoint layout]), so that loading it is load_checkpoint's job, unchanged.

Cheap enough for every step:
- Two slots per rank, each one file (slots.py) written once (when the state's layout is first seen,
  or changes: an optimizer state created late, a buffer replaced) and mapped into memory. A save is one
  copy of the state's bytes into the mapping (a CopyPlan: one memcpy per tensor), then a small record in the same
  file naming the step (the RNG states, the schedule, the hyperparameters), written through the
  mapping: no collective and no system call. The record's marker is cleared before the copy
  starts and set after the record is written, so that a rank killed in the middle of a save leaves
  that slot without a step (its pages outlive the process: what it wrote is in the tmpfs), and its
  other slot holds the step before.
- Two slots suffice: a rank starts its save of step k + 1 only after step k + 1's collectives, which
  every rank joins after its save of step k; so whenever a rank fails, every rank's slots hold step k
  (and some maybe k + 1). The newest step that every rank recorded is complete. A step's slot is
  (step // every) % 2 on every rank, so that the ranks' copies of a step are in one directory.
- What is copied is what the layout found: views of the live tensors, taken again at every save where
  flattening a tensor copies it (a channels_last weight); a tensor replaced, registered or created
  since (an optimizer's state, a buffer set after warmup) makes a new layout (_Watch). (A process's first
  save writes both of its files anew, so a failure during the first step after a restart finds no
  copy, and the restart after it resumes from disk.)
- On several nodes, each file also goes to a rank of the next node once it is written, on a thread
  while the next step runs (Note [Replicas] in replica.py): a node that is lost loses no copy.

On restart (`newest`, a collective) the ranks agree on the newest step of which every rank's copy is
held somewhere (its own file, or its replica on another node); every node gets the files it lacks from
a rank that holds them, one rank of each node writes the slot's manifest there (save.write_manifest, as
after a disk save) from the reports of each file's holder (its size and SHA-256), and the caller compares
it with the newest disk checkpoint and loads the newer. Copies of later steps than the one agreed on (a
rank that got further) are cleared, so that a later restart never joins them with copies of the new
run's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from typing import Any

import torch
from torch.nn import Module

from .. import _C
from ..comm import agree, barrier
from ..zero.optimizer import ShardedOptimizer
from . import collect as collecting
from . import manifest, slots, values
from .replica import Replicas, ring
from .save import bucket_plan, remove_file, to_host, write_manifest
from .slots import SLOTS, SlotFile

log = logging.getLogger("dtcore")

_LAUNCH = "launch"  # the file in a node directory naming the launch it belongs to


def base_directory() -> str:
    """DTCORE_MEMORY_DIR (docs/knobs.md): where the nodes' directories go."""
    return _C.read_settings().memory_dir


def node_directory(launch: str) -> str:
    """The directory of this launch's in-memory checkpoints on this node: one name on every node and
    every restart of the launch, another for any other launch."""
    return os.path.join(base_directory(), "dtcore-" + hashlib.sha256(launch.encode()).hexdigest()[:16])


def open_node_directory(launch: str, owner_pid: int) -> str:
    """node_directory(launch), created if it is not there yet; its creator starts the reaper that removes it
    once process `owner_pid` (the node's launcher) has exited."""
    directory = node_directory(launch)
    base = os.path.dirname(directory)
    if not os.path.isdir(base):
        raise _C.ConfigError(
            f"checkpoint.memory_every: DTCORE_MEMORY_DIR={base} is not a directory. Fix: point DTCORE_MEMORY_DIR at "
            "a tmpfs every rank of the node can write (/dev/shm is the default), or set checkpoint.memory_every=0."
        )
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        owner = _read_text(os.path.join(directory, _LAUNCH))
        if owner is not None and owner.strip() != launch:  # (None: its creator is about to write it, atomically)
            raise _C.ConfigError(
                f"checkpoint.memory_every: {directory} belongs to another launch ({owner.strip()}), not this one "
                f"({launch}). Fix: remove it if no job of that launch runs any more, or set DTCORE_MEMORY_DIR to "
                "another directory."
            ) from None
        return directory
    _C.write_file_atomic(os.path.join(directory, _LAUNCH), launch + "\n")  # whole or not at all for the others
    reaper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")
    started = subprocess.run(
        [sys.executable, "-I", reaper, str(owner_pid), directory],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # a pipe would stay open in the reaper, and run() would wait for it
        close_fds=True,
        start_new_session=True,  # the launcher kills its ranks by process group: not this one
        timeout=60,
    )
    if started.returncode != 0:
        raise _C.ConfigError(
            f"checkpoint.memory_every: the process that removes {directory} when the launcher exits did not start "
            f"(exit status {started.returncode} of {sys.executable} -I {reaper}). Fix: set checkpoint.memory_every=0."
        )
    return directory


def refuse_ranks(ranks: list[list[int]], node: int) -> str | None:
    """Why the ranks cannot keep in-memory checkpoints (None: they can), from every rank's [node, parent pid]:
    on several nodes every node must run as many ranks (a rank's copy goes to its local index on the next
    node), and the ranks of node `node` must be children of one launcher (which owns the copies)."""
    nodes = [n for n, _ in ranks]
    sizes = {n: nodes.count(n) for n in sorted(set(nodes))}
    parents = sorted({p for n, p in ranks if n == node})
    if len(set(sizes.values())) > 1:
        return (
            f"checkpoint.memory_every: the nodes run different numbers of ranks ({sizes}), where each rank's copy goes "
            "to the rank of its local index on the next node. Fix: start as many ranks on every node "
            "(--nproc-per-node), or set checkpoint.memory_every=0"
        )
    if len(parents) > 1 or parents == [1]:
        return (
            f"checkpoint.memory_every: the parent processes of the ranks of node {node} are {parents}, where the "
            "copies need one launcher per node that is its ranks' parent (it owns them). Fix: start the ranks with "
            "dtcore.launch or torchrun themselves (not through a wrapper script), or set checkpoint.memory_every=0"
        )
    return None


class MemoryCheckpoints:
    """This rank's two slots in `directory` (a node directory): save() every few steps, newest() on
    restart. See Note [In-memory checkpoints]."""

    def __init__(
        self,
        directory: str,
        rank: int,
        world: int,
        every: int = 1,
        nodes: list[int] | None = None,
        timeout: float = 600.0,
    ) -> None:
        """every: the steps between two saves (a step's slot is (step // every) % 2, alike on every rank).
        nodes: the node of each rank (None: all on one); on several, every node with as many ranks, the copies
        also go to another node (Note [Replicas], replica.py; then a collective, waiting at most `timeout` s)."""
        self.directory, self.rank, self.world, self.every = directory, rank, world, every
        self.nodes = nodes if nodes is not None else [0] * world
        mine = [r for r, node in enumerate(self.nodes) if node == self.nodes[rank]]
        self.writes_manifest = rank == mine[0]  # one rank per node writes its directory's manifests
        self.replicas = Replicas(directory, rank, self.nodes, timeout) if len(set(self.nodes)) > 1 else None
        self._slots: list[SlotFile] | None = None
        self._watch: _Watch | None = None
        self._meta: str | None = None  # rank 0: the optimizer's part a step does not change: JSON, open
        self._cuda = False  # whether the state copied is on a GPU
        self._scalars: list[tuple[str, torch.Tensor]] = []  # rank 0: its live scalar tensors, copied each save
        self._plans: list[_C.CopyPlan] = []  # each slot's copies: from the live tensors (chunks of) into its file
        self._extra_keys: list[tuple[str, tuple, torch.dtype]] = []
        self._refresh: list[tuple[int, torch.Tensor, int, int]] = []
        self._layouts = 0
        self._manifests: set[int] = set()  # (writes_manifest) the slots newest() wrote a manifest into

    def slot_directory(self, slot: int) -> str:
        return slots.slot_directory(self.directory, slot)

    # Saving ---------------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        extra: Any = None,
        rank_extra: Any = None,
    ) -> None:
        """Copies this rank's state of `step` into its next slot; returns once it is recorded there (its replica
        on another node is sent while the next step runs)."""
        if self.replicas is not None:
            self.replicas.wait()  # the last save's file is no longer being sent: it may be laid out again
        fresh = self._slots is None or not self._watch.same(optimizer)
        per_step: list[tuple[str, torch.Tensor]] = []
        # The record, as JSON text made in parts (the optimizer's static part is kept as text).
        record = f'{{"step": {int(step)}, "rank_extra": {values.encode_json(rank_extra, per_step, "rank_extra")}'
        if self.rank == 0:
            record += f', "extra": {values.encode_json(extra, per_step, "extra")}'
            record += f', "optimizer": {self._optimizer_json(model, optimizer, per_step, fresh)}'
        payload = (record + "}").encode()
        extra_keys = [(k, tuple(t.shape), t.dtype) for k, t in per_step]
        if fresh or extra_keys != self._extra_keys or len(payload) > self._slots[0].record_room:
            self._lay_out(model, optimizer, per_step, record_room=4 * len(payload))
            self._watch, self._extra_keys = _Watch(model, optimizer), extra_keys
        slot = (step // self.every) % SLOTS  # the same on every rank: they agree on a step's slot at restart
        target = self._slots[slot]
        if slot in self._manifests:  # newest() made this slot a checkpoint: it is about to change
            remove_file(os.path.join(self.slot_directory(slot), manifest.MANIFEST))
            self._manifests.discard(slot)
        target.clear()  # from here until the record is written, this slot holds no step
        taken = [source.detach().reshape(-1)[lo:hi] for _, source, lo, hi in self._refresh]
        self._plans[slot].run(taken + [t for _, t in per_step])
        if self._cuda:
            torch.cuda.synchronize()  # the copies into the mapping are done before the record says so
        target.commit(step, payload)
        if self.replicas is not None:
            self.replicas.send(slot, step, target)

    def confirm(self) -> None:
        """Returns once the last save's copy is also on another node (Note [Replicas]): called by every rank
        before a collective of the next step (dtcore.train: before the step's loss is all-reduced), so that no
        rank completes that step before every rank's copy of the last one is on two nodes. Also to be called
        before the job ends (the ranks that keep the copies wait for them)."""
        if self.replicas is not None:
            self.replicas.wait()

    def _optimizer_json(self, model: torch.nn.Module, optimizer: Any, per_step: list, fresh: bool) -> str:
        """Rank 0's optimizer part of the manifest (collect.optimizer_meta) as JSON, its tensors appended to
        `per_step`. A torch optimizer whose scalar state is all tensors on the CPU (Adam's step counts) has them
        copied from the live tensors, as the rest of the state, and only its hyperparameters recorded each step
        (the rest's JSON is made once per layout); otherwise the whole part is made again at each save."""
        if optimizer is None:
            return "null"
        if fresh:
            found: list[tuple[str, torch.Tensor]] = []
            meta = collecting.optimizer_meta(optimizer, model, found)
            live = {t.data_ptr() for t in collecting.optimizer_tensors(optimizer)}
            static = not isinstance(optimizer, ShardedOptimizer) and _tensors_only(meta["scalars"])
            static = static and all(t.device.type == "cpu" and t.data_ptr() in live for _, t in found)
            fixed = {k: v for k, v in meta.items() if k != "param_groups"}
            self._meta = (json.dumps(fixed)[:-1] + ", " if fixed else "{") if static else None
            self._scalars = found if static else []
        if self._meta is None:
            return json.dumps(collecting.optimizer_meta(optimizer, model, per_step))
        groups = values.encode_json(collecting.param_groups(optimizer), per_step, "optimizer.param_groups")
        return f'{self._meta}"param_groups": {groups}}}'

    def _lay_out(self, model: torch.nn.Module, optimizer: Any, per_step: list, record_room: int) -> None:
        """Collects the state (collect.py), writes both slots' files whole (with room for a record of at least
        `record_room` bytes) and maps them."""
        # The optimizer's scalars that collect() lists (rank 0's) are self._scalars or in `per_step`: _optimizer_json.
        collected = collecting.collect(model, optimizer, self.rank, self.world, [])
        chunks = [(manifest.chunk_key(c.name, c.lo), c.data.detach()) for c in collected.chunks] + self._scalars
        # A chunk that is not a view of its live tensor (a non-contiguous one, flattened: a copy) is taken again
        # at every save; a view is copied from directly.
        self._refresh = [
            (i, c.source, c.lo, c.hi)
            for i, c in enumerate(collected.chunks)
            if c.source is not None and c.data.untyped_storage().data_ptr() != c.source.untyped_storage().data_ptr()
        ]
        room = torch.zeros(slots.HEAD_BYTES + max(record_room, slots.MIN_RECORD_ROOM), dtype=torch.uint8)
        entries = chunks + [(k, t) for k, t in per_step] + [(slots.RECORD, room)]
        host = [(k, to_host(t, copy=False)) for k, t in entries]
        nbytes = sum(t.numel() * t.element_size() for _, t in host)
        self._cuda = any(t.is_cuda for _, t in chunks)
        static = {  # the report's parts that change only with the layout
            "rank": self.rank,
            "world_size": self.world,
            "tensors": collected.tensors,
            "chunks": [[c.name, c.lo, c.hi] for c in collected.chunks],
        }
        if self.rank == 0:
            static.update(aliases=collected.aliases, bucket_plan=bucket_plan(model))
        self._layouts += 1
        if self._layouts == 3:
            log.warning(
                "in-memory checkpoints: rank %d's state changed its layout again (3 times): each time both copies are "
                "written anew, and until then a restart finds none (a tensor replaced at every step, or an extra= "
                "value of another shape each time?)",
                self.rank,
            )
        # The old mappings go before the new files are written (the plans hold views of them): never more than 2 copies.
        self._slots, self._plans = None, []
        files = []
        try:
            for slot in range(SLOTS):
                directory = self.slot_directory(slot)
                os.makedirs(directory, exist_ok=True)
                if self.writes_manifest:  # a manifest newest() wrote (maybe in an earlier process): the files change
                    remove_file(os.path.join(directory, manifest.MANIFEST))
                    self._manifests.discard(slot)
                path = self._file_path(slot)
                for entry in os.scandir(directory):  # the old file, and one a killed process was writing
                    if entry.name == os.path.basename(path) or entry.name.startswith(os.path.basename(path) + ".tmp-"):
                        remove_file(entry.path)
                files.append(SlotFile.write(path, static, host))
        except (_C.CheckpointError, OSError, RuntimeError) as e:
            free = _free_bytes(self.directory)
            raise _C.ConfigError(
                f"checkpoint.memory_every: rank {self.rank}'s in-memory checkpoints in {self.directory} need "
                f"{_C.format_bytes(SLOTS * nbytes)} (2 copies of its "
                f"state; every rank of the node needs its own), and it has {_C.format_bytes(free)} free: {e}. Fix: "
                "give the node's shared memory more room (a container's --shm-size), point DTCORE_MEMORY_DIR at a "
                "larger tmpfs, or set checkpoint.memory_every=0 (disk checkpoints only)."
            ) from None
        # The copies: the chunks that are views of the live tensors, then (at each save) the others taken anew
        # and the values of the step (per_step), in that order.
        taken = [i for i, *_ in self._refresh]
        fixed = [i for i in range(len(chunks)) if i not in taken]
        order = fixed + taken + list(range(len(chunks), len(chunks) + len(per_step)))
        self._plans = [_C.CopyPlan([f.views[i] for i in order], [chunks[i][1] for i in fixed]) for f in files]
        self._slots = files
        log.info(
            "in-memory checkpoints: %s per copy on rank %d, 2 copies in %s",
            _C.format_bytes(nbytes),
            self.rank,
            self.directory,
        )

    # Restarting -----------------------------------------------------------------------------------

    def recorded(self) -> dict[int, int]:
        """{step: slot} of this rank's recorded copies (a file whose marker names a step)."""
        return slots.recorded(self.directory, self.rank, self.world)

    def _file_path(self, slot: int) -> str:
        return slots.slot_file(self.directory, slot, self.rank)

    def newest(self) -> tuple[int, str] | None:
        """A collective: the newest step of which every rank's copy is held somewhere (its own, or its replica
        on another node), as (step, checkpoint directory) with every rank's file and the manifest in this
        node's directory, or None when there is none."""
        own = self.recorded()
        held = self.replicas.recorded() if self.replicas is not None else {}
        mine = {"own": sorted(own.items()), "held": sorted(held.items())}
        every = agree.gather(mine) if self.world > 1 else [mine]
        where: list[dict[tuple[int, int], list[int]]] = [{} for _ in range(self.world)]  # rank -> copy -> holders
        keeps = [kept for _, kept in ring(self.nodes)] if self.replicas is not None else []
        for r, found in enumerate(every):
            for copy in found["own"]:
                where[r].setdefault(tuple(copy), []).insert(0, r)  # its own copy first
            for copy in found["held"]:
                where[keeps[r]].setdefault(tuple(copy), []).append(r)
        common = set(where[0]).intersection(*where[1:])  # (step, slot) pairs
        newest = max(common, default=None)
        for step, slot in own.items():  # a newer copy than the one resumed from is never taken later
            if newest is None or step > newest[0]:
                slots.clear_record(self._file_path(slot))
        if self.replicas is not None:
            self.replicas.clear_newer(None if newest is None else newest[0])
        if newest is None:
            if any(found["own"] or found["held"] for found in every):
                steps = [sorted({step for step, _ in held}) for held in where]
                log.warning(
                    "in-memory checkpoints: no step of which every rank's copy is held (the steps held of each rank's: "
                    "%s); resuming from disk",
                    steps,
                )
            return None
        step, slot = newest
        directory = self.slot_directory(slot)
        holders = [where[q][newest] for q in range(self.world)]
        mine = [self._report(slot, q) for q in range(self.world) if holders[q][0] == self.rank]
        reports = [report for found in (agree.gather(mine) if self.world > 1 else [mine]) for report in found]
        reports.sort(key=lambda report: report["rank"])
        if self.replicas is not None:
            # Every other holder checks its copy against the digest of the one the manifest names: a copy that
            # differs is as good as none, and is sent again.
            bad = [
                q
                for q in range(self.world)
                if self.rank in holders[q][1:]
                and _C.digest_file(slots.slot_file(self.directory, slot, q)).sha256 != reports[q]["sha256"]
            ]
            for r, found in enumerate(agree.gather(bad)):
                for q in found:
                    log.warning("in-memory checkpoints: rank %d's copy of rank %d's step %d differs", r, q, step)
                    holders[q].remove(r)
            self.replicas.gather_files(slot, holders, reports)
        if self.writes_manifest:
            write_manifest(directory, self.world, reports)
            self._manifests.add(slot)
        if self.world > 1:
            barrier()  # every rank reads the manifest after it is written
        return step, directory

    def _report(self, slot: int, rank: int) -> dict[str, Any]:
        """Rank `rank`'s part of the manifest, from its file of `slot` in this node's directory."""
        path = slots.slot_file(self.directory, slot, rank)
        static, record = slots.read_record(path)
        digest = _C.digest_file(path)
        return {**static, **record, "file": os.path.basename(path), "bytes": digest.bytes, "sha256": digest.sha256}


class _Watch:
    """Whether the state's layout is still the one the slots were laid out for: every parameter and buffer the
    same tensor in the same place, and the optimizer's state the same tensors in the same place (a tensor
    replaced, a state created or loaded since: another layout). Checked each save, so it must be cheap: each
    tensor is looked up in the table that holds it (its module's, or its optimizer state's entry), with no walk
    of the module tree, by a _C.TensorWatch."""

    def __init__(self, model: torch.nn.Module, optimizer: Any) -> None:
        # (a module's children too: a submodule replaced is other tensors, which no table of the old one's shows)
        tables: list[dict[str, Any]] = [
            t for module in model.modules() for t in (module._parameters, module._buffers, module._modules)
        ]
        self.sharded = isinstance(optimizer, ShardedOptimizer)
        self.state = optimizer.state if optimizer is not None and not self.sharded else None
        entries = list(self.state.items()) if self.state is not None else []
        tables += [entry for _, entry in entries]  # a torch optimizer's state entries are tables too
        held = [
            (table, name, t) for table in tables for name, t in table.items() if isinstance(t, (torch.Tensor, Module))
        ]
        if self.state is not None:  # and its state a table of them: each parameter's entry the same dict
            tables.append(self.state)
            held += [(self.state, param, entry) for param, entry in entries]
        empty = [(table, name) for table in tables for name, t in table.items() if t is None]  # set since?
        self.watch = _C.TensorWatch(
            tables,
            [h[0] for h in held],
            [h[1] for h in held],
            [h[2] for h in held],
            [e[0] for e in empty],
            [e[1] for e in empty],
        )
        self.pieces = self._pieces(optimizer) if self.sharded else ()

    @staticmethod
    def _pieces(optimizer: Any) -> tuple:
        """A ShardedOptimizer's state, as its tensors' addresses and its entries' sizes."""
        tensors = collecting.optimizer_tensors(optimizer)
        lengths = tuple(len(entry) for entry in optimizer.state.values())
        return tuple(t.data_ptr() for t in tensors) + lengths

    def same(self, optimizer: Any) -> bool:
        if isinstance(optimizer, ShardedOptimizer) != self.sharded:
            return False
        if self.sharded:
            if self._pieces(optimizer) != self.pieces:
                return False
        elif (optimizer.state if optimizer is not None else None) is not self.state:
            return False
        return self.watch.same()


def _tensors_only(value: Any) -> bool:
    """Whether every leaf of an encoded value is a tensor (values.encode's {"__tensor__": key})."""
    if isinstance(value, dict):
        return "__tensor__" in value or all(_tensors_only(v) for v in value.values())
    if isinstance(value, list):
        return all(_tensors_only(v) for v in value)
    return False


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _free_bytes(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize
