"""`dtcore.init()`: from a launcher's environment to a validated, connected world.

The steps, each in C++ unless noted:
  1. read the job's shape (read_world: init() arguments > DTCORE_* > launcher) and dtcore's
     settings (read_settings: init() arguments > DTCORE_* > defaults), each value with its source;
  2. choose the backend (choose_backend, from how many CUDA devices torch can use) and validate
     the world before any CUDA call;
  3. set up logging for this rank, set the CUDA device to the *local* rank, seed per rank (Python);
  4. rendezvous on a TCPStore: roster, missing-rank reports, fingerprint agreement (fingerprint.py);
  5. create the communicator (Gloo on CPU, dtcore's NCCL communicator on GPU) and the health monitor;
  6. set up torch.distributed's default process group on the same store (Python).
When the script set up torch.distributed's default group first, steps 4-6 use that group's store
instead of serving one, and the group stays the script's (shutdown() does not end it).

There are two ways in: init(), for training, and joined_for_check(), the resource checker's, which
joins with a smaller fingerprint (versions are reported by the checker, not refused) and shuts
down only a context it made itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from .. import _C
from . import accelerate, context, fingerprint
from .context import Context
from .preflight import run as run_preflight

log = logging.getLogger("dtcore")

# How many times this process has joined a job (see RendezvousOptions::generation).
_generation = 0


@dataclasses.dataclass(frozen=True)
class _Request:
    """What a caller asked of a join: init()'s arguments, or the checker's."""

    settings_args: dict[str, Any]  # timeout, backend, log_dir (None: not given)
    overrides: dict[str, Any]  # rank=, world_size=, ... (None: not given)
    seed: int | None = None
    torch_distributed: bool = True
    preflight: bool = False
    purpose: str = "init"  # fingerprint.for_rendezvous(purpose=...)
    versions: bool = True  # refuse ranks whose versions differ (the checker reports them instead)


def init(
    backend: str = "auto",
    *,
    timeout: float | None = None,
    seed: int | None = None,
    log_dir: str | None = None,
    torch_distributed: bool = True,
    preflight: bool = False,
    **overrides: Any,
) -> Context:
    """Start this process's part of the job; idempotent. README.md, "What dtcore.init() does", has the steps.

    `overrides` are rank, world_size, local_rank, local_world_size, node_rank, num_nodes,
    master_addr, master_port; they beat DTCORE_* variables, which beat the launcher's.
    With `seed`, this rank is seeded with `seed + rank` (Python, torch, NumPy).
    With `preflight`, the resource checker's probes run first (`python -m dtcore.check` without
    the collective tests) and any FAIL is raised as a ConfigError listing each with its fix.
    A repeated call returns the same context; it refuses any argument that differs from what the
    context was made with (call dtcore.shutdown() first), and runs the preflight again if asked.
    """
    request = _Request(
        {"timeout": timeout, "backend": backend, "log_dir": log_dir}, overrides, seed, torch_distributed, preflight
    )
    with context.lock:
        ctx = context.current()
        if ctx is None:
            return context.install(_join(request))
        _check_same(ctx, request)
        if preflight:
            run_preflight(request.overrides, request.settings_args)
        return ctx


@contextlib.contextmanager
def joined_for_check(backend: str, timeout: float | None) -> Iterator[Context]:
    """The job's context for the resource checker's distributed mode.

    Under a running dtcore.init(), that context, left running: a backend other than "auto" or its
    own, or a timeout other than None or its own, is refused rather than ignored. Otherwise the
    timeout is read as init() reads it (None: DTCORE_TIMEOUT or the default).
    Otherwise a context made for the check, with a fingerprint that leaves the versions out (the
    checker compares and reports them), shut down when the block ends.
    """
    with context.lock:
        ctx = context.current()
        created = ctx is None
        if not created and str(backend).lower() not in ("auto", ctx.backend):
            raise _C.ConfigError(
                f"the check was asked for backend '{backend}', but it runs inside this job's context, which uses "
                f"'{ctx.backend}'. Fix: pass backend='auto' (or '{ctx.backend}'), or run the check before init()."
            )
        if not created and timeout is not None and timeout != ctx.timeout:
            raise _C.ConfigError(
                f"the check was asked for timeout={timeout:g}, but it runs inside this job's context, whose "
                f"collectives wait {ctx.timeout:g} s. Fix: pass timeout=None (or {ctx.timeout:g}), or run the check "
                "before init()."
            )
        if created:
            request = _Request(
                {"timeout": timeout, "backend": backend, "log_dir": None}, {}, purpose="dtcore.check", versions=False
            )
            ctx = context.install(_join(request))
    try:
        yield ctx
    finally:
        if created:
            context.shutdown()


def _cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _join(r: _Request) -> Context:
    global _generation
    started = time.perf_counter()
    host = socket.gethostname()
    spec = _C.read_world(overrides=r.overrides)
    settings = _C.read_settings(r.settings_args)
    backend = _C.choose_backend(settings, _cuda_devices(), torch.__version__, spec)
    visible = torch.cuda.device_count() if backend == "nccl" else -1
    _C.validate_world(spec, backend, visible, host)
    if r.preflight:
        run_preflight(r.overrides, r.settings_args)

    log_file = _C.configure_logging(spec.rank, spec.world_size, host, settings)
    if spec.local_rank == 0:  # a node's ranks share its environment: one warning per node
        for line in _C.unknown_knobs():
            log.warning("init: %s", line)
    log.debug("init: %s", spec.describe())
    accelerate.warn_if_started_fewer(spec)
    if backend == "nccl":
        # The local rank, never the global one (or 0 when the launcher bound one GPU per process).
        device = torch.device("cuda", _C.cuda_device_index(spec, visible))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if r.seed is not None:
        _seed_everything(int(r.seed), spec.rank)

    existing = _existing_store(spec, r.torch_distributed)  # fail before waiting on anyone
    generation = _generation
    _generation += 1  # spent even if this attempt fails: a retry must not read its keys
    fp = fingerprint.for_rendezvous(backend, spec, purpose=r.purpose, versions=r.versions)
    rdzv = _C.rendezvous(spec, settings, host, str(device), fp, generation, _device_id(device), existing)
    try:
        comm, health, owns_pg = _connect(rdzv, backend, device, settings, r.torch_distributed)
    except BaseException:
        rdzv.close()
        raise
    ctx = Context(
        rdzv.spec,
        backend=backend,
        device=device,
        settings=settings,
        seed=r.seed,
        log_file=log_file,
        communicator=comm,
        rendezvous=rdzv,
        health=health,
        torch_distributed=r.torch_distributed,
        owns_torch_process_group=owns_pg,
    )
    log.info(
        "dtcore %s ready in %.2f s: %d rank(s) on %d node(s), backend %s, launcher %s, store %s:%d",
        _C.__version__,
        time.perf_counter() - started,
        ctx.world_size,
        ctx.num_nodes,
        f"{backend} (through shared memory)" if comm.shared_memory else backend,
        ctx.launcher,
        ctx.master_addr,
        ctx.master_port,
    )
    return ctx


def _check_same(ctx: Context, r: _Request) -> None:
    """A repeated init() returns the same context, unless it asks for something different."""

    def refuse(asked: str, have: str) -> None:
        raise _C.ConfigError(
            f"dtcore is already initialized with {have}; init({asked}) cannot change it. "
            "Fix: call dtcore.shutdown() first."
        )

    _C.validate_overrides(r.overrides)  # an unknown name or a wrong type, as the first init() would say
    backend = r.settings_args["backend"]
    if str(backend).lower() not in ("auto", ctx.backend):
        refuse(f"backend={backend!r}", f"backend '{ctx.backend}'")
    timeout = r.settings_args["timeout"]
    if timeout is not None and timeout != ctx.timeout:
        refuse(f"timeout={timeout!r}", f"timeout={ctx.timeout:g} ({ctx.settings.sources['timeout_s']})")
    log_dir = r.settings_args["log_dir"]
    if log_dir is not None and log_dir != ctx.settings.log_dir:
        refuse(f"log_dir={log_dir!r}", f"log_dir={ctx.settings.log_dir!r}")
    if r.seed is not None and r.seed != ctx.seed:
        refuse(f"seed={r.seed!r}", f"seed={ctx.seed!r}")
    if not r.torch_distributed and ctx.torch_distributed:
        refuse("torch_distributed=False", "torch.distributed set up (torch_distributed=True)")
    for key, value in r.overrides.items():
        if value is None or (key == "master_port" and value == 0):  # 0: "any free port" was asked, and chosen
            continue
        if getattr(ctx, key) != value:
            refuse(f"{key}={value!r}", f"{key}={getattr(ctx, key)}")


def _seed_everything(seed: int, rank: int) -> None:
    """Seeds Python, torch (CPU and CUDA) and NumPy, if present, with seed + rank."""
    s = seed + rank
    random.seed(s)
    torch.manual_seed(s)
    try:
        import numpy

        numpy.random.seed(s % (2**32))
    except ImportError:
        pass


def _existing_store(spec: Any, torch_distributed: bool) -> Any:
    """torch.distributed's default store when the script set the default group up first, else None.

    Its rank 0 already serves that store at the master port, so dtcore rendezvouses on it instead
    of serving a second one there (which would find the port taken). The group stays the
    script's: shutdown() leaves it alone. A group of another shape is refused, unless init() was
    told to leave torch.distributed alone (torch_distributed=False), when dtcore keeps to its own store.
    """
    if not dist.is_initialized():
        return None
    if dist.get_rank() == spec.rank and dist.get_world_size() == spec.world_size:
        log.debug("init: on torch.distributed's default store (the default group was set up first)")
        return dist.distributed_c10d._get_default_store()
    if torch_distributed:
        raise _C.ConfigError(
            f"torch.distributed is already initialized as rank {dist.get_rank()} of {dist.get_world_size()}, "
            f"but dtcore sees rank {spec.rank} of {spec.world_size} ({spec.sources['rank']}, "
            f"{spec.sources['world_size']}). Fix: call dtcore.init() instead of "
            "torch.distributed.init_process_group(), or give both the same environment (rank= and world_size=)."
        )
    return None


# The first NCCL that runs several ranks on one GPU (when NCCL_MULTI_RANK_GPU_ENABLE=1); older ones
# fail such a job in their first collective ("Duplicate GPU detected"), which the roster refuses ahead.
MULTI_RANK_GPU_NCCL = (2, 30)


def _device_id(device: torch.device) -> str:
    """What makes `device` one piece of hardware, for the roster's shared-device check: a GPU's UUID;
    "" where ranks share it without harm: on CPU, and on a GPU whose NCCL runs several ranks on one."""
    if device.type != "cuda" or nccl_shares_gpus(_C.nccl_version(), os.environ):
        return ""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def nccl_shares_gpus(version: str, env: dict[str, str] | os._Environ) -> bool:
    """Whether NCCL `version` ("2.30.7") runs several ranks on one GPU in this environment: it must be
    2.30 or newer, and NCCL_MULTI_RANK_GPU_ENABLE=1 must ask for it. Asked of an older NCCL, it says
    so at warning level, since the roster then refuses the ranks that share a GPU."""
    if env.get("NCCL_MULTI_RANK_GPU_ENABLE", "") != "1":
        return False
    parts = version.split(".")
    if len(parts) >= 2 and all(x.isdigit() for x in parts[:2]):
        if (int(parts[0]), int(parts[1])) >= MULTI_RANK_GPU_NCCL:
            return True
    log.warning(
        "NCCL_MULTI_RANK_GPU_ENABLE=1 is set, but this NCCL (%s) is older than %d.%d, the first to run several "
        "ranks on one GPU: ranks that share a GPU will be refused. Fix: install nvidia-nccl-cu13>=2.30 and "
        "rebuild dtcore against it, or give each rank a GPU of its own.",
        version or "not built in",
        *MULTI_RANK_GPU_NCCL,
    )
    return False


def _torch_process_group(backend: str, store: Any, rank: int, world: int, timeout: float, device: torch.device) -> bool:
    """Sets up torch.distributed's default group on dtcore's store; False if one already exists."""
    if dist.is_initialized():  # the script's own, of the same shape (_existing_store): not ours to end
        return False
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore("torch/", store),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
        **kwargs,
    )
    return True


def _flight_record_path(spec: Any, settings: _C.Settings, group: str = "") -> str:
    """Where this rank's flight record goes on a failure or SIGUSR2: beside its log when there is
    one, else in a folder of the job's under the temporary directory, the same on every rank of a host.
    A subgroup's communicator has a file of its own (flight-group<name>-rank<r>.jsonl)."""
    job = _file_safe(f"{spec.job_id}-{spec.master_port}")
    folder = settings.log_dir or os.path.join(tempfile.gettempdir(), f"dtcore-flight-{job}")
    name = f"flight-group{_file_safe(group)}-rank{spec.rank}.jsonl" if group else f"flight-rank{spec.rank}.jsonl"
    return os.path.join(folder, name)


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def connect(
    rdzv: Any,
    backend: str,
    device: torch.device,
    settings: _C.Settings,
    ranks: list[int] | None = None,
    group: str = "",
) -> tuple[Any, Any]:
    """A communicator and its health monitor on the rendezvous store, once every member has one.

    For the whole job by default; with `ranks` (a torch group's rank list, in group order) and
    `group` (torch's name for it, the same on every member), for that subgroup: its keys under
    "group/<name>/", this rank at its index in `ranks`. See Note [Subgroup communicators] in
    csrc/dtcore/comm/communicator.h.
    """
    spec, timeout, host = rdzv.spec, settings.timeout_s, socket.gethostname()
    store, rank, size, prefix = rdzv.store, spec.rank, spec.world_size, ""
    if ranks is not None:
        prefix = f"group/{group}"  # PrefixStore adds the "/"
        store, rank, size = dist.PrefixStore(prefix, store), ranks.index(spec.rank), len(ranks)
    comm = health = None
    try:
        if backend == "nccl":
            comm = _C.nccl_communicator(store, rank, size, device.index, settings, ranks or [])
        else:
            try:
                pg = dist.ProcessGroupGloo(
                    dist.PrefixStore("gloo/", store), rank, size, datetime.timedelta(seconds=timeout)
                )
            except RuntimeError as e:
                raise _C.CommError(
                    f"rank {spec.rank}: Gloo could not connect to the other ranks: {str(e).splitlines()[0]}. "
                    "Fix: check that every host can reach every other (firewall) and that GLOO_SOCKET_IFNAME, if "
                    "set, names an interface that exists on every host."
                ) from e
            comm = _C.gloo_communicator(pg, settings, ranks or [])
        health = _C.health_monitor(rdzv, settings, ranks or [], prefix)
        comm.set_health(health)  # a failed collective now names dead or stalled ranks
        comm.set_flight_dump(_flight_record_path(spec, settings, group if ranks is not None else ""), host)
        # Returns when every member is up: a rank that failed to set up is named here, on every
        # other rank, instead of surfacing later in the user's first collective.
        comm.barrier().wait()
    except BaseException:
        for part in (health, comm):
            if part is not None:
                part.close()
        raise
    return comm, health


def _connect(rdzv: Any, backend: str, device: torch.device, settings: _C.Settings, torch_distributed: bool):
    """Communicator, health monitor and (optionally) torch's default group, on the rendezvous store."""
    comm, health = connect(rdzv, backend, device, settings)
    owns_pg = False
    spec = rdzv.spec
    try:
        if torch_distributed:
            try:
                owns_pg = _torch_process_group(
                    backend, rdzv.store, spec.rank, spec.world_size, settings.timeout_s, device
                )
            except (RuntimeError, ValueError) as e:
                if isinstance(e, _C.DtcoreError):
                    raise
                raise _C.CommError(
                    f"rank {spec.rank}: torch.distributed.init_process_group failed on dtcore's store: "
                    f"{str(e).splitlines()[0]}. Fix: if your script calls init_process_group itself, remove that call "
                    "(dtcore.init() sets the default group up), or pass dtcore.init(torch_distributed=False)."
                ) from e
    except BaseException:
        health.close()
        comm.close()
        raise
    return comm, health, owns_pg
