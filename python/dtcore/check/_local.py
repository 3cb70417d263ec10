"""The probes of one process: facts only Python knows, then the C++ probes and judges."""

from __future__ import annotations

import importlib.util
import os
import platform
import socket
import time
from typing import Mapping, Optional

import torch

from .. import _C, _build_info
from .._guard import REBUILD
from ._report import Item, Report


def torch_facts() -> dict:
    """The running torch and what dtcore was built against; compared across ranks, too."""
    nccl = ""
    if torch.version.cuda:
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # a CUDA torch built without NCCL
            nccl = ""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda or "",
        "torch_cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "torch_nccl": nccl,
        "dtcore": _build_info.version,
        "built_torch": _build_info.torch_version,
        "built_cxx11_abi": bool(_build_info.torch_cxx11_abi),
        "built_cuda": _build_info.torch_cuda,
        "built_with_nccl": bool(_build_info.with_nccl),
        "dtcore_nccl": _C.nccl_version(),
        "rebuild_command": REBUILD,
    }


def _arch_list() -> list[str]:
    # The compiled-in list, without torch.cuda.is_available() (which initializes the driver).
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    return flags().split() if (torch.version.cuda and flags and flags()) else []


def _nccl_dirs() -> list[str]:
    dirs = []
    spec = importlib.util.find_spec("nvidia") if torch.version.cuda else None
    for base in (spec.submodule_search_locations or []) if spec else []:
        dirs.append(os.path.join(base, "nccl", "lib"))
    dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
    return [d for d in dirs if os.path.isdir(d)]


def _accelerate_config(env: Mapping[str, str], path: Optional[str]) -> tuple[str, str]:
    if path is None:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  "huggingface")
        path = os.path.join(home, "accelerate", "default_config.yaml")
        if not os.path.isfile(path):
            return "", ""
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read()
    except OSError as e:
        raise _C.ConfigError(f"cannot read the accelerate config '{path}': {e.strerror}. Fix: pass an existing "
                             "file to --accelerate-config, or leave it out.") from e


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


def run_local(
    *,
    env: Optional[Mapping[str, str]] = None,
    checkpoint_dir: Optional[str] = None,
    log_dir: Optional[str] = None,
    shm_path: str = "/dev/shm",
    min_free_disk_gb: float = 10.0,
    accelerate_config: Optional[str] = None,
    distributed: bool = False,
    preflight: bool = False,
    facts: Optional[dict] = None,
) -> Report:
    """Every probe of this process, judged; see dtcore.check.run()."""
    started = time.perf_counter()
    env = dict(os.environ if env is None else env)
    facts = dict(torch_facts(), **(facts or {}))
    log_dir = log_dir if log_dir is not None else env.get("DTCORE_LOG_DIR") or None
    dirs = []
    if checkpoint_dir or not preflight:  # init() cannot know where checkpoints go: judge only what was named
        dirs.append(("checkpoint directory", checkpoint_dir or "."))
    if log_dir:
        dirs.append(("log directory", log_dir))
    config_path, config_text = "", ""
    if accelerate_config is not None or any(k.startswith("ACCELERATE_") for k in env):
        # accelerate's default file only matters to `accelerate launch`; elsewhere it may be stale.
        config_path, config_text = _accelerate_config(env, accelerate_config)
    job_pids, namespaced = _job_pids()
    result = _C.run_checks(
        env=env,
        facts=facts,
        nccl_dirs=_nccl_dirs(),
        arch_list=_arch_list(),
        host=socket.gethostname(),
        shm_path=shm_path,
        dirs=dirs,
        min_free_disk_gb=min_free_disk_gb,
        accelerate_config_path=config_path,
        accelerate_config_text=config_text,
        wandb_installed=importlib.util.find_spec("wandb") is not None,
        wandb_credentials=_wandb_credentials(env),
        distributed=distributed,
        preflight=preflight,
        job_pids=job_pids,
        pid_namespace=namespaced,
    )
    gpus = result["gpus"]
    shared = {k: facts[k] for k in ("python", "torch", "torch_cuda", "torch_cxx11_abi", "torch_nccl", "dtcore",
                                    "built_torch", "dtcore_nccl")}
    shared["driver"] = gpus["driver"]
    version = gpus["cuda_driver_version"]
    shared["cuda_driver"] = f"{version // 1000}.{version % 1000 // 10}" if version else ""
    return Report(
        items=[Item(**i) for i in result["items"]],
        host=socket.gethostname(),
        mode="local",
        elapsed_s=time.perf_counter() - started,
        world=result["world"],
        backend=result["backend"],
        facts=shared,
        gpus=gpus,
    )
