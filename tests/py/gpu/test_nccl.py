"""dtcore on a GPU with NCCL: init, collectives, the reducer, ZeRO, activation offload, the checker,
and ranks that share one GPU. Skipped where there is no GPU or this dtcore was built without NCCL
(the CPU machines that run CI); run on a GPU machine with `python -m pytest tests/py/gpu`."""

import json
import subprocess
import sys

import pytest
import torch

import dtcore
from dtcore import _build_info

from launch_helpers import clean_env, describe, free_port, leftover_processes, run_ranks, torchrun_style

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and _build_info.with_nccl),
    reason="needs a CUDA GPU and a dtcore built with NCCL",
)


def _nccl() -> tuple[int, int]:
    major, minor, *_ = (int(x) for x in dtcore._C.nccl_version().split("."))
    return major, minor


def _run(world: int, timeout: float = 180.0, **extra: str):
    port = free_port()
    envs = [clean_env(**torchrun_style(r, world, port), **extra) for r in range(world)]
    results, sessions = run_ranks("nccl_worker.py", envs, timeout=timeout)
    assert leftover_processes(sessions) == []
    return results


def _check_report(report: dict, world: int) -> None:
    assert report["setup"] == {
        "backend": "nccl",
        "device": "cuda:0",
        "nccl": dtcore._C.nccl_version(),
        "torch_backend": "nccl",
        "world": world,
    }
    assert report["collectives"] == dict.fromkeys(report["collectives"], True), report["collectives"]
    assert report["reducer"]["grads_on_gpu"]
    assert report["reducer"]["max_error"] < 1e-5, report["reducer"]
    for kind, auto in report["auto_buckets"].items():  # the device's timeline, eager and compiled
        assert auto["max_error"] < 1e-5 and auto["chosen"] and auto["device_clock"], (kind, auto)
    zero = report["zero"]
    for key in ("zero=1 max_error", "zero=2 max_error", "zero=3 max_error"):
        assert zero[key] < 1e-5, zero
    # zero=2's per-step gradient buckets go back to the allocator when the reducer's stream has
    # waited for them (Note [Waiting on the stream]), not a watchdog interval later.
    assert zero["zero=2 held_bytes"] - zero["zero=1 held_bytes"] < zero["param_bytes"] // 2, zero
    offload = report["offload"]
    assert offload["summary"].startswith("on"), offload
    assert offload["packed"] > 0 and offload["prefetched"] > 0, offload
    assert offload["max_error"] < 1e-5, offload


def test_world_size_1_runs_everything_on_nccl():
    [result] = _run(1)
    assert result.returncode == 0, describe([result])
    _check_report(result.json(), 1)


def test_two_ranks_on_one_gpu_run_with_nccl_2_30_and_are_refused_before():
    """NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 runs both ranks on the one GPU; an older NCCL
    would fail in its first collective, so dtcore refuses at rendezvous and says why."""
    results = _run(2, CUDA_VISIBLE_DEVICES="0", NCCL_MULTI_RANK_GPU_ENABLE="1")
    if _nccl() >= (2, 30):
        assert all(r.returncode == 0 for r in results), describe(results)
        for r in results:
            _check_report(r.json(), 2)
    else:
        assert all(r.returncode != 0 for r in results), describe(results)
        text = "".join(r.stderr for r in results)
        assert "would share one device" in text, text
        assert "older than 2.30" in text, text


def test_check_reports_the_gpu():
    out = subprocess.run(
        [sys.executable, "-m", "dtcore.check", "--json"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 1), out.stderr  # 1: a problem found, never a crash
    report = json.loads(out.stdout)
    assert report["backend"] == "nccl", report
    assert report["facts"]["dtcore_nccl"] == dtcore._C.nccl_version(), report["facts"]
    assert torch.cuda.get_device_name(0) in out.stdout, out.stdout
