"""A whole node lost (its launcher and its ranks SIGKILLed), its command started again: the job goes on from
the replicas of its in-memory checkpoints on the other node (Note [Replicas]), bit for bit. Two launchers of
2 ranks of workers/restart_worker.py on this host, as the two nodes of one job."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_helpers import WORKERS, clean_env, free_port, leftover_processes, routable_address

pytestmark = pytest.mark.multirank
WORKER = str(WORKERS / "restart_worker.py")


def _node(tmp_path: Path, node: int, port: int, address: str, args: list[str], env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dtcore.launch", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2"]
    cmd += ["--master-addr", address, "--master-port", str(port), "--max-restarts", "2", "--no-preflight"]
    cmd += ["--log-dir", str(tmp_path / f"logs{node}"), WORKER, str(tmp_path / "run"), *args]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _job(tmp_path: Path, args: list[str], env: dict, again: bool = False) -> list[tuple[int, str]]:
    """Both nodes; with `again`, node 1's command is started again once its first launcher has died."""
    address = routable_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback (a job of several nodes refuses it)")
    port = free_port()
    nodes = [_node(tmp_path, k, port, address, args, env) for k in (0, 1)]
    sessions = [p.pid for p in nodes]
    try:
        if again:
            _, first = nodes[1].communicate(timeout=120)
            nodes[1] = _node(tmp_path, 1, port, address, args, env)
            sessions.append(nodes[1].pid)
        out = [(p.returncode, p.communicate(timeout=180)[1]) for p in nodes]
        return [(p.returncode, err) for p, (_, err) in zip(nodes, out)] + ([(-9, first)] if again else [])
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert leftover_processes(sessions) == []


def _losses(run: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run / "metrics" / "rank0.jsonl").read_text().splitlines()]
    return {x["step"]: x["loss"] for x in lines if x["kind"] == "train"}


def test_a_lost_node_started_again_resumes_from_the_replicas_on_the_other_node_bit_for_bit(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    env = clean_env(WORKER_MEMORY_EVERY="1", DTCORE_MEMORY_DIR=str(shm))
    reference = tmp_path / "reference"
    reference.mkdir()
    for code, err in _job(reference, ["none", "0", "1"], env):
        assert code == 0, err
    for code, err in _job(tmp_path, ["killnode", "3", "5"], env, again=True)[:2]:
        assert code == 0, err
    assert _losses(tmp_path / "run") == _losses(reference / "run")  # every step, bit for bit
    (restart,) = json.loads((tmp_path / "run" / "run.json").read_text())["restarts"]
    # Node 1's copies of step 4 may not have reached node 0 when it died (they travel during step 5): step 3's did.
    assert restart["resumed_from_step"] in (3, 4) and restart["steps_lost"] <= 1, restart
    deadline = time.monotonic() + 10  # both launchers gone: both nodes' copies go too (their reapers)
    while any(shm.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(shm.iterdir())
