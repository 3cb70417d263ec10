"""What must be the same on every rank, written once.

A rank's facts (the versions of what it runs) are gathered here, each looked up in one place.
Two users compare them across ranks:
  * dtcore.init() refuses to start a job whose ranks disagree on a fact marked `refused`: the
    rendezvous compares fingerprints and names the odd ranks (csrc/dtcore/bootstrap/roster.h);
  * the checker's distributed mode (`python -m dtcore.check` under a launcher) compares every
    fact and reports each difference as an item, with the title and fix written here, instead of
    refusing, so that one run lists them all.
"""

from __future__ import annotations

import dataclasses
import platform
from typing import Any, Literal

from .. import _C, _build_info, _guard


@dataclasses.dataclass(frozen=True)
class Fact:
    key: str  # the name in fingerprints, in the checker's facts and in its item ids ("consistency.<key>")
    title: str  # for the checker's table
    fix: str  # what to do when ranks differ; {value} is the majority's value
    refused: Literal["always", "nccl", "never"]  # init() refuses ranks that differ: always, with NCCL, never
    severity: Literal["FAIL", "WARN"] = "FAIL"  # the checker's verdict on a difference


FACTS = (
    Fact("torch", "torch", "install the same torch on every node (pip install torch=={value}).", "always"),
    Fact("torch_cuda", "torch's CUDA", "install the same torch build (same CUDA variant) on every node.", "always"),
    Fact("torch_cxx11_abi", "C++11 ABI", "install the same torch build on every node.", "always"),
    Fact("torch_nccl", "torch's NCCL", "install the same torch (and nvidia-nccl package) on every node.", "nccl"),
    Fact("dtcore_nccl", "dtcore's NCCL", "build dtcore against the same NCCL on every node.", "nccl"),
    Fact("dtcore", "dtcore", "install the same dtcore on every node.", "always"),
    Fact("built_torch", "dtcore built for", "rebuild dtcore against the same torch on every node.", "never"),
    Fact("driver", "NVIDIA driver", "run the same driver on every node (ask the cluster's administrators).", "never"),
    Fact("cuda_driver", "driver's CUDA", "run the same driver on every node.", "never"),
    Fact("python", "Python", "use the same Python (minor version) on every node.", "never", "WARN"),
)


def local_facts() -> dict[str, Any]:
    """This process's facts: the running torch and what dtcore was built against. The NVIDIA
    driver's (driver, cuda_driver) come from the checker's GPU probe."""
    running = _guard.torch_build()
    return {
        "python": platform.python_version(),
        "torch": running.version,
        "torch_cuda": running.cuda,
        "torch_cxx11_abi": running.cxx11_abi,
        "torch_nccl": running.nccl,
        "dtcore": _build_info.version,
        "built_torch": _build_info.torch_version,
        "built_cxx11_abi": bool(_build_info.torch_cxx11_abi),
        "built_cuda": _build_info.torch_cuda,
        "built_with_nccl": bool(_build_info.with_nccl),
        "dtcore_nccl": _C.nccl_version(),
        "rebuild_command": _guard.REBUILD,
    }


def for_rendezvous(backend: str, spec: _C.WorldSpec, *, purpose: str, versions: bool = True) -> dict[str, str]:
    """The fingerprint a rank registers: ranks that differ in any of it are refused by name.

    `versions=False` leaves the facts out (the checker compares and reports them itself); the
    backend, world size, job id and purpose always count: two jobs meeting on one port, or a
    training job meeting a check, must not join.
    """
    facts = local_facts()
    out = {
        "purpose": purpose,
        "backend": backend,
        "world_size": str(spec.world_size),
        "job": f"{spec.job_id_source}={spec.job_id}" if spec.job_id != "none" else "none",
    }
    if versions:
        for fact in FACTS:
            if fact.refused == "always" or (fact.refused == "nccl" and backend == "nccl"):
                value = facts[fact.key]
                out[fact.key] = str(int(value)) if isinstance(value, bool) else str(value or "none")
    return out
