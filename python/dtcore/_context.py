"""`dtcore.init()`: from a launcher's environment to a validated, connected world.

The steps, each in C++ unless noted:
  1. read the launcher environment into a WorldSpec (init() arguments > DTCORE_* > launcher);
  2. choose the backend (Python: needs torch.cuda) and validate the world before any CUDA call;
  3. set up logging for this rank, set the CUDA device to the *local* rank, seed per rank;
  4. rendezvous on a TCPStore: roster, missing-rank reports, fingerprint agreement;
  5. create the communicator (Gloo on CPU, dtcore's NCCL communicator on GPU);
  6. set up torch.distributed's default process group on the same store (Python).
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import logging
import os
import random
import socket
import threading
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from . import _C
from ._logging import console_level_for

log = logging.getLogger("dtcore")

_BACKENDS = ("auto", "nccl", "gloo")


@dataclasses.dataclass(frozen=True)
class Context:
    """What `dtcore.init()` set up. One per process; see `dtcore.get_context()`."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    backend: str  # "nccl" | "gloo"
    device: torch.device
    launcher: str  # "torchrun" | "accelerate" | "slurm" | "openmpi" | "mpich" | "env" | "single"
    timeout: float  # seconds, for rendezvous and each collective
    seed: Optional[int]  # the seed given to init(); this rank was seeded with seed + rank
    log_file: str  # this rank's log file, "" without a log directory
    sources: dict[str, str]  # where each world value came from (variable or argument)
    communicator: Any = dataclasses.field(repr=False, compare=False)
    rendezvous: Any = dataclasses.field(repr=False, compare=False)
    health: Any = dataclasses.field(repr=False, compare=False)
    owns_torch_process_group: bool = dataclasses.field(repr=False, compare=False, default=False)

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0


_lock = threading.Lock()
_context: Optional[Context] = None
_generation = 0  # how many times this process has initialized (see RendezvousOptions::generation)
_OVERRIDES = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "num_nodes", "master_addr",
              "master_port")


def _resolve_timeout(timeout: Optional[float]) -> float:
    if timeout is None:
        return _C.knob_seconds("DTCORE_TIMEOUT")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise _C.ConfigError(f"init(timeout={timeout!r}) must be a positive number of seconds. Fix: e.g. timeout=300.")
    return float(timeout)


def _resolve_backend(backend: str) -> str:
    source = "init(backend=)"
    if backend == "auto" and _C.knob_value("DTCORE_BACKEND") != "auto":
        backend, source = _C.knob_value("DTCORE_BACKEND").lower(), "DTCORE_BACKEND"
    if backend not in _BACKENDS:
        raise _C.ConfigError(f"{source}='{backend}' is not a backend. Fix: use one of {', '.join(_BACKENDS)}.")
    cuda = torch.cuda.is_available()
    if backend == "auto":
        return "nccl" if cuda and _C.has_nccl else "gloo"
    if backend == "nccl" and not _C.has_nccl:
        raise _C.ConfigError(
            f"{source}='nccl', but this dtcore was built without NCCL. Fix: rebuild where the CUDA toolkit and NCCL "
            "are found (set NCCL_HOME; `pip install --no-build-isolation .`), or use backend='gloo'."
        )
    if backend == "nccl" and not cuda:
        raise _C.ConfigError(
            f"{source}='nccl', but torch sees no usable CUDA device here (torch {torch.__version__}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}). Fix: run on a GPU node with "
            "a CUDA build of torch, or use backend='gloo'."
        )
    return backend


def _nccl_version() -> str:
    if torch.cuda.is_available():
        try:
            return ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # torch built without NCCL
            pass
    return _C.nccl_version() or "none"


def _job_id() -> str:
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMI_JOBID"):
        if os.environ.get(var):
            return f"{var}={os.environ[var]}"
    return "none"


def _fingerprint(backend: str, world_size: int) -> dict[str, str]:
    """What must be equal on every rank; rank 0 compares and names the odd ones out."""
    from . import _build_info

    return {
        "torch": torch.__version__,
        "dtcore": _build_info.version,
        "cxx11_abi": str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "cuda": torch.version.cuda or "none",
        "nccl": _nccl_version() if backend == "nccl" else "n/a (gloo)",
        "backend": backend,
        "world_size": str(world_size),
        "job": _job_id(),
    }


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


def _check_torch_distributed(rank: int, world: int, wanted: bool) -> None:
    """A default group the script set up itself must describe the same job."""
    if wanted and dist.is_initialized() and (dist.get_rank() != rank or dist.get_world_size() != world):
        raise _C.ConfigError(
            f"torch.distributed is already initialized as rank {dist.get_rank()} of {dist.get_world_size()}, "
            f"but dtcore sees rank {rank} of {world}. Fix: call dtcore.init() instead of "
            "torch.distributed.init_process_group(), or give both the same environment."
        )


def _torch_process_group(backend: str, store: Any, rank: int, world: int, timeout: float, device: torch.device) -> bool:
    """Sets up torch.distributed's default group on dtcore's store; False if one already exists."""
    if dist.is_initialized():
        _check_torch_distributed(rank, world, True)
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


def _connect(rdzv: Any, spec: Any, backend: str, device: torch.device, timeout: float, torch_distributed: bool):
    """Communicator, health monitor and (optionally) torch's default group, on the rendezvous store."""
    store = rdzv.store
    comm = health = None
    owns_pg = False
    try:
        if backend == "nccl":
            comm = _C.nccl_communicator(store, spec.rank, spec.world_size, device.index, timeout)
        else:
            try:
                pg = dist.ProcessGroupGloo(
                    dist.PrefixStore("gloo/", store), spec.rank, spec.world_size, datetime.timedelta(seconds=timeout)
                )
            except RuntimeError as e:
                raise _C.CommError(
                    f"rank {spec.rank}: Gloo could not connect to the other ranks: {str(e).splitlines()[0]}. "
                    "Fix: check that every host can reach every other (firewall) and that GLOO_SOCKET_IFNAME, if "
                    "set, names an interface that exists on every host."
                ) from e
            comm = _C.gloo_communicator(pg, timeout)
        health = _C.health_monitor(rdzv, _C.knob_seconds("DTCORE_HEARTBEAT_INTERVAL"))
        comm.set_health(health)  # a failed collective now names dead or stalled ranks
        # init() returns when the whole job is up: a rank that failed to set up is named here,
        # on every other rank, instead of surfacing later in the user's first collective.
        comm.barrier().wait(timeout)
        if torch_distributed:
            try:
                owns_pg = _torch_process_group(backend, store, spec.rank, spec.world_size, timeout, device)
            except (RuntimeError, ValueError) as e:
                if isinstance(e, _C.DtcoreError):
                    raise
                raise _C.CommError(
                    f"rank {spec.rank}: torch.distributed.init_process_group failed on dtcore's store: "
                    f"{str(e).splitlines()[0]}. Fix: if your script calls init_process_group itself, remove that call "
                    "(dtcore.init() sets the default group up), or pass dtcore.init(torch_distributed=False)."
                ) from e
    except BaseException:
        for part in (health, comm):
            if part is not None:
                part.close()
        raise
    return comm, health, owns_pg


def init(
    backend: str = "auto",
    *,
    timeout: Optional[float] = None,
    seed: Optional[int] = None,
    log_dir: Optional[str] = None,
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
    """
    return _init(backend, timeout, seed, log_dir, torch_distributed, preflight, overrides, _fingerprint)


def _init(
    backend: str,
    timeout: Optional[float],
    seed: Optional[int],
    log_dir: Optional[str],
    torch_distributed: bool,
    preflight: bool,
    overrides: dict[str, Any],
    fingerprint: Callable[[str, int], dict[str, str]],
) -> Context:
    """init() with the fingerprint ranks must agree on as a parameter: the distributed checker
    joins with a smaller one, so that it can report version differences instead of failing on them."""
    global _context, _generation
    with _lock:
        if _context is not None:
            _check_same(_context, backend, overrides)
            return _context
        started = time.perf_counter()
        timeout_s = _resolve_timeout(timeout)
        host = socket.gethostname()
        level = _C.knob_value("DTCORE_LOG_LEVEL")

        spec = _C.read_world(None, overrides)
        backend_name = _resolve_backend(backend)
        visible = torch.cuda.device_count() if backend_name == "nccl" else -1
        _C.validate_world(spec, backend_name, visible, host)
        if preflight:
            _preflight(overrides, log_dir)

        log_dir = log_dir if log_dir is not None else (_C.knob_value("DTCORE_LOG_DIR") or "")
        console = console_level_for(spec.rank, level, _C.knob_value("DTCORE_LOG_RANKS"))
        log_file = _C.configure_logging(spec.rank, spec.world_size, host, console, log_dir, "DTCORE_LOG_LEVEL")
        log.debug("init: %s", spec.describe())

        if backend_name == "nccl":
            # The local rank, never the global one (or 0 when the launcher bound one GPU per process).
            device = torch.device("cuda", _C.cuda_device_index(spec, visible))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        if seed is not None:
            _seed_everything(int(seed), spec.rank)

        _check_torch_distributed(spec.rank, spec.world_size, torch_distributed)  # fail before waiting on anyone
        generation = _generation
        _generation += 1  # spent even if this attempt fails: a retry must not read its keys
        rdzv = _C.rendezvous(
            spec,
            host,
            str(device),
            fingerprint(backend_name, spec.world_size),
            timeout_s,
            _C.knob_seconds("DTCORE_RDZV_LOG_INTERVAL"),
            _C.knob_value("DTCORE_STORE_LIBUV"),
            generation,
        )
        try:
            comm, health, owns_pg = _connect(rdzv, spec, backend_name, device, timeout_s, torch_distributed)
        except BaseException:
            rdzv.close()
            raise

        _context = Context(
            rank=spec.rank,
            world_size=spec.world_size,
            local_rank=spec.local_rank,
            local_world_size=spec.local_world_size,
            node_rank=spec.node_rank,
            num_nodes=spec.num_nodes,
            master_addr=spec.master_addr,
            master_port=rdzv.port,
            backend=backend_name,
            device=device,
            launcher=spec.launcher,
            timeout=timeout_s,
            seed=seed,
            log_file=log_file,
            sources=dict(spec.sources),
            communicator=comm,
            rendezvous=rdzv,
            health=health,
            owns_torch_process_group=owns_pg,
        )
        log.info(
            "dtcore %s ready in %.2f s: %d rank(s) on %d node(s), backend %s, launcher %s, store %s:%d",
            _C.__version__,
            time.perf_counter() - started,
            spec.world_size,
            spec.num_nodes,
            backend_name,
            spec.launcher,
            spec.master_addr,
            rdzv.port,
        )
        return _context


def _preflight(overrides: dict[str, Any], log_dir: Optional[str]) -> None:
    """The resource checker's probes for this process; FAILs raise, WARNs are logged."""
    from .check import run

    env = dict(os.environ)
    for key, value in overrides.items():  # init() arguments beat the environment here too
        if value is not None:
            env[f"DTCORE_{key.upper()}"] = str(value)
    report = run(env=env, log_dir=log_dir, distributed=False, preflight=True)
    for item in report.warnings:
        log.warning("preflight: %s: %s %s Fix: %s", item.title, item.value, item.message, item.fix)
    if report.failures:
        lines = "\n".join(f"  - {i.title} ({i.value}): {i.message} Fix: {i.fix}" for i in report.failures)
        raise _C.ConfigError(
            f"init(preflight=True): {len(report.failures)} check(s) failed on host {report.host}:\n{lines}\n"
            "Run `python -m dtcore.check` for the whole report."
        )


def _check_same(ctx: Context, backend: str, overrides: dict[str, Any]) -> None:
    """A repeated init() returns the same context, unless it asks for something different."""
    if backend not in ("auto", ctx.backend):
        raise _C.ConfigError(
            f"dtcore is already initialized with backend '{ctx.backend}'; init(backend='{backend}') cannot change it. "
            "Fix: call dtcore.shutdown() first."
        )
    for key, value in overrides.items():
        if key not in _OVERRIDES:
            raise _C.ConfigError(f"init() got an unknown argument '{key}'. Fix: use one of {', '.join(_OVERRIDES)}.")
        if key == "master_port" and value == 0:
            continue  # "any free port" was asked for, and one was chosen
        if value is not None and getattr(ctx, key) != value:
            raise _C.ConfigError(
                f"dtcore is already initialized with {key}={getattr(ctx, key)}; init({key}={value!r}) cannot change "
                "it. Fix: call dtcore.shutdown() first."
            )


def get_context() -> Context:
    """The current context; ConfigError before `dtcore.init()`."""
    ctx = _context
    if ctx is None:
        raise _C.ConfigError("dtcore is not initialized. Fix: call dtcore.init() first.")
    return ctx


def is_initialized() -> bool:
    return _context is not None


def shutdown(barrier: bool = True) -> None:
    """Tears down what init() set up; a no-op when not initialized.

    With `barrier`, waits (up to the timeout, at most 60 s) for every rank to reach shutdown
    first, so that rank 0's store outlives the others' last use of it.
    """
    global _context
    with _lock:
        ctx = _context
        if ctx is None:
            return
        _context = None
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
            # port is free for the next init().
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
