"""The probes of one process: what only Python knows (the running torch, wandb, accelerate's
config file, this job's processes), then the C++ probes and judges (csrc/dtcore/check).

Nothing here imports torch: its facts come from dtcore._guard, which reads them from torch's files
where it may (Note [The checker without torch's Python])."""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from collections.abc import Mapping

from .. import _C, _guard
from ..bootstrap import fingerprint
from ..bootstrap.accelerate import default_config_path
from ._options import Options
from ._report import Item, Report


def _arch_list(running: _guard.TorchBuild) -> list[str]:
    if not running.cuda:
        return []
    import torch  # imported already: a CUDA build always is (see the Note)

    # The compiled-in list, without torch.cuda.is_available() (which initializes the driver).
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    return flags().split() if (flags and flags()) else []


def _nccl_dirs(running: _guard.TorchBuild) -> list[str]:
    dirs = []
    spec = importlib.util.find_spec("nvidia") if running.cuda else None
    for base in (spec.submodule_search_locations or []) if spec else []:
        dirs.append(os.path.join(base, "nccl", "lib"))
    dirs.append(running.lib_dir)
    return [d for d in dirs if os.path.isdir(d)]


def _accelerate_config(env: Mapping[str, str], path: str | None) -> tuple[str, str]:
    if path is None:
        path = default_config_path(env)
        if not os.path.isfile(path):
            return "", ""
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read()
    except OSError as e:
        raise _C.ConfigError(
            f"cannot read the accelerate config '{path}': {e.strerror}. Fix: pass an existing "
            "file to --accelerate-config, or leave it out."
        ) from e


def _wandb_credentials(env: Mapping[str, str]) -> bool:
    netrc = env.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        with open(netrc, encoding="utf-8", errors="replace") as f:
            return "api.wandb.ai" in f.read()
    except OSError:
        return False


def _job_pids() -> tuple[list[int], bool]:
    """This process, its launcher (parent) and its siblings (the other local ranks), whose GPU
    memory is the job's own; and whether this runs in a PID namespace (a container), where NVML
    reports the host's pids instead."""
    me, parent = os.getpid(), os.getppid()
    pids = {me, parent}
    for stat in os.listdir("/proc"):
        if not stat.isdigit():
            continue
        try:
            with open(f"/proc/{stat}/stat", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == parent:
            pids.add(int(stat))
    namespaced = False
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
        namespaced = len(nspid) > 1
    except OSError:
        pass
    return sorted(pids), namespaced


def _gpus(g: _C.GpuFacts) -> dict:
    version = g.cuda_driver_version
    return {
        "driver": g.driver_version if g.driver_loaded else "",
        "cuda_driver": f"{version // 1000}.{version % 1000 // 10}" if version else "",
        "cuda_driver_version": version,
        "devices": [
            {
                "index": d.index,
                "name": d.name,
                "uuid": d.uuid,
                "memory_total": d.memory_total,
                "memory_free": d.memory_free,
                "compute_capability": f"{d.cc_major}.{d.cc_minor}",
                "mig": d.mig_enabled,
            }
            for d in g.devices
        ],
    }


def run_local(o: Options) -> Report:
    """Every probe of this process, judged; see dtcore.check.run()."""
    started = time.perf_counter()
    env = dict(o.env or {})
    facts = fingerprint.local_facts()
    inputs = _C.CheckInputs()
    inputs.env = env
    inputs.world_arguments = dict(o.overrides)
    # The settings as init() would read them. The timeout is init()'s only under preflight: otherwise it is the
    # checker's own wait, and DTCORE_TIMEOUT is judged as it stands.
    inputs.settings_arguments = {
        "timeout": o.timeout if o.preflight else None,
        "backend": o.backend,
        "log_dir": o.log_dir,
    }
    versions = _C.VersionFacts()
    for key, value in facts.items():
        setattr(versions, key, value)
    inputs.versions = versions
    running = _guard.torch_build()
    inputs.nccl_dirs = _nccl_dirs(running)
    inputs.arch_list = _arch_list(running)
    inputs.host = socket.gethostname()
    inputs.shm_path = o.shm_path
    if o.checkpoint_dir is not None:
        inputs.checkpoint_dir = o.checkpoint_dir
    inputs.min_free_disk_gb = o.min_free_disk_gb
    if o.accelerate_config is not None or any(k.startswith("ACCELERATE_") for k in env):
        # accelerate's default file only matters to `accelerate launch`; elsewhere it may be stale.
        inputs.accelerate_config_path, inputs.accelerate_config_text = _accelerate_config(env, o.accelerate_config)
    inputs.wandb_installed = importlib.util.find_spec("wandb") is not None
    inputs.wandb_credentials = _wandb_credentials(env)
    inputs.distributed = bool(o.distributed)
    inputs.preflight = o.preflight
    inputs.job_pids, inputs.pid_namespace = _job_pids()
    result = _C.run_checks(inputs)

    gpus = _gpus(result.gpus)
    shared = {fact.key: facts.get(fact.key, gpus.get(fact.key, "")) for fact in fingerprint.FACTS}
    world = None
    if result.spec is not None:
        world = {name: getattr(result.spec, name) for name in _C.WorldSpec.FIELDS}
        world["launcher"] = result.spec.launcher
    return Report(
        items=[Item.of(i) for i in result.items],
        host=inputs.host,
        mode="local",
        elapsed_s=time.perf_counter() - started,
        world=world,
        backend=result.backend,
        facts=shared,
        gpus={k: v for k, v in gpus.items() if k != "cuda_driver"},
    )
