"""The process's Context: what `dtcore.init()` set up, how to get it, and how it ends.

One Context per process at a time. join.py makes it and installs it here; everything else reads
it with get_context(). shutdown() tears it down in the reverse order of its making, whatever
fails on the way, so that a Context the caller still holds keeps nothing alive.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .. import _C

log = logging.getLogger("dtcore")

# Guards _current and the making and ending of a context: init() and shutdown() from several
# threads see one context or none.
lock = threading.RLock()
_current: Context | None = None
# Called (without arguments) at the start of shutdown(), while the context still works: work that
# must finish on it first registers here (an asynchronous checkpoint save waits to complete).
before_shutdown: list[Callable[[], None]] = []


class Context(_C.WorldSpec):
    """What `dtcore.init()` set up. One per process; see `dtcore.get_context()`.

    The world this process joined comes from WorldSpec (see Note [World fields]): rank,
    world_size, local_rank, local_world_size, node_rank, num_nodes, master_addr, master_port
    (the port really used), launcher, sources (where each came from), job_id. The rest is what
    init() made of it. Read-only.
    """

    def __init__(
        self,
        world: _C.WorldSpec,
        *,
        backend: str,
        device: torch.device,
        settings: _C.Settings,
        seed: int | None,
        log_file: str,
        communicator: Any,
        rendezvous: Any,
        health: Any,
        torch_distributed: bool,
        owns_torch_process_group: bool,
    ) -> None:
        super().__init__(world)
        values = {
            "backend": backend,  # "nccl" | "gloo"
            "device": device,  # this rank's device: cuda:<local rank> with NCCL, cpu with Gloo
            "settings": settings,  # timeout, log level, ... each with its source (settings.sources)
            "seed": seed,  # the seed given to init(); this rank was seeded with seed + rank
            "log_file": log_file,  # this rank's log file, "" without a log directory
            "communicator": communicator,
            "rendezvous": rendezvous,
            "health": health,
            "torch_distributed": torch_distributed,  # init() was asked to set up torch.distributed
            "owns_torch_process_group": owns_torch_process_group,  # ...and did, so shutdown() ends it
            # torch group name -> (communicator, health monitor) of a subgroup, made on first use by
            # dtcore.comm.subgroup and closed by shutdown(); See Note [Subgroup communicators].
            "subgroups": {},
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"dtcore.Context is read-only ({name}). Fix: dtcore.shutdown(), then dtcore.init(...).")

    # Read-only, and tied to one communicator: a copy is the context itself, as a tuple's is.
    def __copy__(self) -> Context:
        return self

    def __deepcopy__(self, memo: dict) -> Context:
        return self

    def _key(self) -> tuple:
        """What a context is, for == and hash(): the world and what init() chose (not the live parts)."""
        return tuple(getattr(self, f) for f in self.FIELDS) + (self.backend, self.device, self.timeout, self.seed)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def timeout(self) -> float:
        """Seconds that rendezvous and each collective may take (init(timeout=) or DTCORE_TIMEOUT)."""
        return self.settings.timeout_s

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        return f"Context({self.describe()}, backend={self.backend}, device={self.device})"


def current() -> Context | None:
    return _current


def install(ctx: Context) -> Context:
    """Makes `ctx` the process's context (join.py, with `lock` held)."""
    global _current
    _current = ctx
    return ctx


def get_context() -> Context:
    """The current context; ConfigError before `dtcore.init()`."""
    ctx = _current
    if ctx is None:
        raise _C.ConfigError("dtcore is not initialized. Fix: call dtcore.init() first.")
    return ctx


def is_initialized() -> bool:
    """True between `dtcore.init()` and `dtcore.shutdown()` in this process."""
    return _current is not None


def shutdown(barrier: bool = True) -> None:
    """Tears down what init() set up; a no-op when not initialized.

    With `barrier`, waits (up to the timeout, at most 60 s) for every rank to reach shutdown
    first, so that rank 0's store outlives the others' last use of it.
    """
    global _current
    with lock:
        ctx = _current
        if ctx is None:
            return
        for finish in before_shutdown:
            try:
                finish()
            except Exception as e:  # shutdown goes on: what failed was reported when it failed
                log.warning("shutdown: %s", e)
        _current = None
        try:
            if barrier and ctx.world_size > 1:
                try:
                    ctx.communicator.barrier().wait(min(ctx.timeout, 60.0))
                except _C.CommError as e:
                    log.warning("shutdown: not every rank reached shutdown: %s", e)
            if ctx.owns_torch_process_group and dist.is_initialized():
                dist.destroy_process_group()
        finally:
            # Closed explicitly (and whatever happened above, Ctrl-C included), so that a Context the
            # caller still holds keeps nothing alive: on rank 0 the store server stops here, and the
            # port is free for the next init(). The subgroups' first: their monitors' last beats
            # go through the store.
            for comm, health in ctx.subgroups.values():
                comm.close()
                health.close()
            ctx.subgroups.clear()
            ctx.communicator.close()
            ctx.health.close()
            ctx.rendezvous.close()
        _C.flush_logs()


@atexit.register
def _shutdown_at_exit() -> None:
    # No barrier: at interpreter exit some ranks may be gone already.
    try:
        shutdown(barrier=False)
    except Exception:  # never turn a clean exit into a traceback
        pass
