"""`dtcore.save_checkpoint`: every rank writes its own safetensors file, rank 0 the manifest last.

The calling thread does what must see the live training state: it agrees with the other ranks
on the directory and step (one small collective), collects this rank's chunks (collect.py) and,
for an asynchronous save, copies them to host memory. The rest touches no training state and
no collective: writing the file (C++, without the GIL), reporting it through the rendezvous store
on a connection of its own, and on rank 0 waiting for every report and writing the manifest.
That rest runs on the calling thread (a synchronous save) or on a background thread (async_save),
so that training goes on while the files are written. See Note [Checkpoint layout].

Every wait is bounded by `timeout` (default: the job's, init(timeout=)); a rank that does not
report in time (dead, or its disk too slow) leaves the checkpoint incomplete (no manifest) and
every rank raises a CheckpointError naming it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from typing import Any

import torch

from .. import _C
from ..bootstrap import context
from ..comm import agree, barrier
from . import collect as collecting
from . import manifest, values

log = logging.getLogger("dtcore")

_lock = threading.Lock()
_pending: _Write | None = None  # the asynchronous save in flight, if any
# Seconds an abandoned save still waits for the other ranks' reports: a living rank's file is usually written
# by then (a slower one's checkpoint is lost: at most one checkpoint interval, and only in a run that failed);
# a dead rank's never is, and each second here is one more before a restarted job trains again.
ABANDON_GRACE_S = 2.0
_POLL_S = 0.05  # the longest pause between two looks at the store for the other ranks' reports
_KEPT = "Checkpoints in other directories are untouched (a directory of steps gives the newest complete one)."


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int,
    extra: Any = None,
    rank_extra: Any = None,
    async_save: bool = False,
    timeout: float | None = None,
) -> None:
    """Saves `model` (and `optimizer`) into the directory `path`; a collective: every rank calls it.

    model: a dtcore.wrap'ed model, a torch DDP or compiled model, or a plain module: its bare
    state_dict is saved (no `module.` prefix). optimizer: a torch optimizer or a
    dtcore.ShardedOptimizer; each rank writes only the shard it holds. extra: plain values
    (numbers, strings, lists, dicts, tensors, NumPy arrays) that are the same on every rank, such
    as a scheduler's state_dict; rank_extra: such values of this rank alone (its RNG states).
    async_save: return once the state is copied to host memory and write in the background; the
    next save, load_checkpoint, dtcore.checkpoint.wait(), shutdown() and exit wait for it.
    The checkpoint is complete once `path`/manifest.json exists (Note [Checkpoint layout]).
    """
    wait()  # one save at a time: the previous one completes (or raises) first
    ctx = context.current()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    timeout = float(
        timeout if timeout is not None else (ctx.timeout if ctx is not None else _C.read_settings().timeout_s)
    )
    directory = os.path.abspath(os.fspath(path))
    if not isinstance(step, int) or isinstance(step, bool):
        raise _C.ConfigError(f"save_checkpoint(step={step!r}): step must be an int. Fix: pass the training step.")

    token = uuid.uuid4().hex if rank == 0 else ""
    if world > 1:
        # One collective: the same directory and step everywhere, and rank 0's token for the store keys.
        seen = agree.gather([directory, step, token])
        odd = [r for r, (d, s, _) in enumerate(seen) if (d, s) != (directory, step)]
        if odd:
            raise _C.ConfigError(
                f"save_checkpoint was called with other arguments on different ranks: rank 0 saves step "
                f"{seen[0][1]} into {seen[0][0]}, rank {odd[0]} step {seen[odd[0]][1]} into {seen[odd[0]][0]}. "
                "Fix: pass the same path and step on every rank (a shared file system, the same path)."
            )
        token = seen[0][2]
    if rank == 0:  # the arguments agree: an existing checkpoint here is incomplete from now on, never mixed
        os.makedirs(directory, exist_ok=True)
        remove_file(os.path.join(directory, manifest.MANIFEST))
    if world > 1:
        barrier()  # no rank writes into the directory before it exists and its old manifest is gone
        os.makedirs(directory, exist_ok=True)

    scalar_tensors: list[tuple[str, torch.Tensor]] = []
    collected = collecting.collect(model, optimizer, rank, world, scalar_tensors)
    extras: list[tuple[str, torch.Tensor]] = []
    report: dict[str, Any] = {
        "rank": rank,
        "tensors": collected.tensors,
        "chunks": [[c.name, c.lo, c.hi] for c in collected.chunks],
        "rank_extra": values.encode(rank_extra, extras, "rank_extra"),
    }
    if rank == 0:
        report.update(
            step=step,
            aliases=collected.aliases,
            optimizer=collected.optimizer,
            extra=values.encode(extra, extras, "extra"),
            bucket_plan=bucket_plan(model),
        )
    entries = [(manifest.chunk_key(c.name, c.lo), c.data) for c in collected.chunks] + scalar_tensors + extras
    entries = [(key, to_host(t, copy=async_save)) for key, t in entries]

    store = ctx.rendezvous.store.clone() if world > 1 else None
    job = _Write(directory, rank, world, token, entries, report, store, timeout)
    if not async_save:
        job.run()
        job.raise_error()
        return
    global _pending
    with _lock:
        _pending = job
    job.thread = threading.Thread(target=job.run, name="dtcore-checkpoint", daemon=False)
    job.thread.start()


def bucket_plan(model: torch.nn.Module) -> dict[str, Any] | None:
    """A bucket_mb="auto" model's chosen buckets, which a resumed job adopts instead of measuring again."""
    wrapper = collecting.distributed_model(model)
    return wrapper.bucket_plan_state() if wrapper is not None else None


def wait() -> None:
    """Waits for the asynchronous save in flight, if any; raises its CheckpointError if it failed."""
    global _pending
    with _lock:
        job, _pending = _pending, None
    if job is None:
        return
    assert job.thread is not None
    job.thread.join()
    job.raise_error()


def abandon(why: str) -> None:
    """The asynchronous save in flight, if any, is given up because the run failed (`why`): its waits for
    the other ranks end ABANDON_GRACE_S after this call (a rank that is alive and writing still gets
    that long to report), not at the timeout, since a dead peer would otherwise keep this process for
    all of it. Returns once the writer thread has ended. The checkpoint has a manifest only if every
    rank's file was written; otherwise it is never loaded."""
    global _pending
    with _lock:
        job, _pending = _pending, None
    if job is None or job.thread is None or not job.thread.is_alive():
        return
    job.abandoned_at = time.monotonic()
    job.thread.join(ABANDON_GRACE_S + 2 * _POLL_S + 1.0)  # its own file's write, if still going, is not waited for
    if job.thread.is_alive() or job.error is not None:
        log.warning("checkpoint %s: given up, since %s (without a manifest it is never loaded)", job.directory, why)


context.before_shutdown.append(wait)


def to_host(t: torch.Tensor, *, copy: bool) -> torch.Tensor:
    """A contiguous CPU tensor with `t`'s values; a copy when asked (async: training goes on)."""
    t = t.detach()
    if t.device.type != "cpu":
        return t.to("cpu").contiguous()
    if copy:
        return t.clone(memory_format=torch.contiguous_format)
    return t.contiguous()


def remove_file(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class _Write:
    """Writing one rank's file, reporting it, and on rank 0 the manifest (see the module's doc)."""

    def __init__(
        self,
        directory: str,
        rank: int,
        world: int,
        token: str,
        entries: list[tuple[str, torch.Tensor]],
        report: dict[str, Any],
        store: Any,
        timeout: float,
    ) -> None:
        self.directory, self.rank, self.world, self.token = directory, rank, world, token
        self.entries, self.report, self.store, self.timeout = entries, report, store, timeout
        self.prefix = f"dtcore/checkpoint/{token}"
        self.abandoned_at: float | None = None  # abandon(): the run failed, its peers may never report
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def raise_error(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def run(self) -> None:
        started = time.monotonic()
        try:
            self._run()
            log.debug(
                "checkpoint: rank %d wrote its part of %s in %.2f s",
                self.rank,
                self.directory,
                time.monotonic() - started,
            )
        except BaseException as e:  # kept for wait(); an asynchronous save reports it there
            self.error = e
            if self.thread is not None and self.abandoned_at is None:
                log.error("checkpoint %s failed on rank %d: %s", self.directory, self.rank, e)
        finally:
            self.entries = []  # the host copies go as soon as they are written

    def _run(self) -> None:
        name = manifest.file_name(self.rank)
        try:
            digest = _C.write_safetensors(
                os.path.join(self.directory, name), self.entries, {"format": "pt", "dtcore_rank": str(self.rank)}
            )
            self.report.update(file=name, bytes=digest.bytes, sha256=digest.sha256, error=None)
        except _C.CheckpointError as e:
            self.report.update(error=str(e))
            if self.world == 1:
                raise
        if self.world == 1:
            self._write_manifest([self.report])
            return
        self.store.set(f"{self.prefix}/report/{self.rank}", json.dumps(self.report))
        if self.rank == 0:
            self._finish_as_rank0()
        else:
            # Rank 0 waits up to `timeout` for the last report, from when its own file is written, then
            # always posts the outcome: twice that, and a margin, never gives up on a save that completes.
            done = json.loads(
                self._get(f"{self.prefix}/done", "rank 0 to complete the manifest", 2 * self.timeout + 30)
            )
            self.store.add(f"{self.prefix}/acks", 1)
            if done.get("error"):
                raise _C.CheckpointError(done["error"])

    def _finish_as_rank0(self) -> None:
        keys = [f"{self.prefix}/report/{r}" for r in range(self.world)]
        try:
            self._wait_for(keys)
            reports = [json.loads(self.store.get(k)) for k in keys]
            failed = [r for r in reports if r.get("error")]
            if failed:
                raise _C.CheckpointError(
                    f"checkpoint {self.directory} is incomplete: rank {failed[0]['rank']} could not write its file: "
                    f"{failed[0]['error']}"
                )
            self._write_manifest(reports)
            outcome: dict[str, Any] = {"ok": self.directory}
        except BaseException as e:
            outcome = {"error": str(e)}
            raise
        finally:
            for key in keys:
                self.store.delete_key(key)
            self.store.set(f"{self.prefix}/done", json.dumps(outcome))
            # After a failure a rank may be dead and never answer: the living ones read at once.
            self._await_acks(self.timeout if "ok" in outcome else min(self.timeout, 2.0))

    def _await_acks(self, limit: float) -> None:
        """Until every rank has read the outcome (bounded): this process may exit next, and with it
        the store the others read it from. Then the save's last keys are deleted."""
        deadline = time.monotonic() + limit
        acks = f"{self.prefix}/acks"
        while self.store.add(acks, 0) < self.world - 1 and time.monotonic() < min(deadline, self._grace_end()):
            time.sleep(0.005)
        self.store.delete_key(f"{self.prefix}/done")
        self.store.delete_key(acks)

    def _grace_end(self) -> float:
        """When the waits of an abandoned save end (never, for one that is not)."""
        return math.inf if self.abandoned_at is None else self.abandoned_at + ABANDON_GRACE_S

    def _poll(self, keys: list[str], limit: float) -> bool:
        """Whether every key is set within `limit` seconds; checked every _POLL_S at most, so that abandon()
        ends the wait (a CheckpointError) without waiting out the timeout."""
        deadline, pause = time.monotonic() + limit, 0.001
        while not self.store.check(keys):
            if time.monotonic() >= self._grace_end():
                raise _C.CheckpointError(f"checkpoint {self.directory}: given up, the run failed")
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S)
        return True

    def _wait_for(self, keys: list[str]) -> None:
        if not self._poll(keys, self.timeout):
            missing = [k.rsplit("/", 1)[1] for k in keys if not self.store.check([k])]
            raise _C.CheckpointError(
                f"checkpoint {self.directory} is incomplete: rank(s) {', '.join(missing)} did not report their file "
                f"written within {self.timeout:g} s (the process died, or its disk is that slow); it has no manifest, "
                f"so it is never loaded. {_KEPT} Fix: look at those ranks' logs; raise timeout= for slow storage."
            )

    def _get(self, key: str, what: str, limit: float) -> bytes:
        if not self._poll([key], limit):
            raise _C.CheckpointError(
                f"checkpoint {self.directory}: rank {self.rank} waited {limit:g} s for {what}, in vain (rank 0 "
                f"died, or another rank did not write its file); it has no manifest, so it is never loaded. {_KEPT} "
                "Fix: look at rank 0's log."
            )
        return self.store.get(key)

    def _write_manifest(self, reports: list[dict[str, Any]]) -> None:
        write_manifest(self.directory, self.world, reports)


def write_manifest(directory: str, world: int, reports: list[dict[str, Any]]) -> None:
    """The manifest of a checkpoint whose files every rank reported written (rank order): written last,
    it makes the checkpoint complete. A report holds the rank's file, bytes, sha256, tensors, chunks and
    rank_extra; rank 0's also step, aliases, optimizer, extra and bucket_plan (save_checkpoint)."""
    head = reports[0]
    files, tensors = [], {}
    for index, rep in enumerate(reports):
        files.append({"name": rep["file"], "rank": rep["rank"], "bytes": rep["bytes"], "sha256": rep["sha256"]})
        for name, info in rep["tensors"].items():
            tensors.setdefault(name, {**info, "chunks": []})
        for name, lo, hi in rep["chunks"]:
            tensors[name]["chunks"].append([index, lo, hi])
    for name, info in tensors.items():
        _check_tiled(name, info)
    document = {
        "format": manifest.FORMAT,
        "version": manifest.VERSION,
        "step": head["step"],
        "world_size": world,
        "dtcore_version": _C.__version__,
        "torch_version": torch.__version__,
        "created": time.time(),
        "files": files,
        "tensors": tensors,
        "aliases": head["aliases"],
        "optimizer": head["optimizer"],
        "extra": head["extra"],
        "rank_extra": [rep["rank_extra"] for rep in reports],
        "bucket_plan": head["bucket_plan"],
    }
    manifest.write_json(os.path.join(directory, manifest.MANIFEST), document)


def _check_tiled(name: str, info: dict[str, Any]) -> None:
    """The chunks of `name` cover it exactly once: else the manifest is not written (never a wrong load)."""
    numel = 1
    for n in info["shape"]:
        numel *= n
    position = 0
    for _, lo, hi in sorted(info["chunks"], key=lambda c: c[1]):
        if lo != position:
            break
        position = hi
    else:
        if position == numel:
            info["chunks"].sort(key=lambda c: c[1])
            return
    raise _C.CheckpointError(
        f"checkpoint: the parts written of '{name}' (shape {info['shape']}) do not cover it exactly "
        f"({info['chunks']}); the manifest is not written. Fix: report this as a dtcore bug with the model."
    )
