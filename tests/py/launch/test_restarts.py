"""--max-restarts: a failed job starts every rank again and dtcore.Trainer resumes by itself (Note [Restarts]
in dtcore/launch/restarts.py); a failure that repeats exactly is a bug and ends the job. 2 ranks of
workers/restart_worker.py (the tiny GPT, a checkpoint every step) under the real launcher."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_helpers import WORKERS, clean_env, run_in_session

pytestmark = pytest.mark.multirank
WORKER = str(WORKERS / "restart_worker.py")


def launch(tmp_path: Path, *args: str, restarts: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """dtcore.launch of 2 ranks of the worker (RUN_DIR tmp_path/run, then `args`), in a session of its own."""
    cmd = [sys.executable, "-m", "dtcore.launch", "--nproc-per-node", "2", "--max-restarts", str(restarts)]
    cmd += ["--log-dir", str(tmp_path / "logs"), "--no-preflight", WORKER, str(tmp_path / "run"), *args]
    return run_in_session(cmd, tmp_path, env or clean_env(), 180)


def losses(run: Path) -> dict[int, float]:
    """Rank 0's loss of every step; after a restart the later line of a step is the run's."""
    lines = [json.loads(x) for x in (run / "metrics" / "rank0.jsonl").read_text().splitlines()]
    return {x["step"]: x["loss"] for x in lines if x["kind"] == "train"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    r = launch(tmp, "none", "1", "4", restarts=0)
    assert r.returncode == 0, r.stderr
    return losses(tmp / "run")


def test_a_killed_rank_restarts_the_job_which_resumes_by_itself_bit_for_bit(tmp_path, reference):
    r = launch(tmp_path, "kill", "1", "5")  # rank 1 dies drawing the batch of step 5
    assert r.returncode == 0, r.stderr
    assert (
        "rank 1 failed (failure 1). Root cause: rank 1 (local rank 1)" in r.stderr and "killed by SIGKILL" in r.stderr
    )
    assert "restart 1 of 2: starting every rank again" in r.stderr
    assert losses(tmp_path / "run") == reference  # every step, bit for bit
    (restart,) = json.loads((tmp_path / "run" / "run.json").read_text())["restarts"]
    assert (restart["restart"], restart["failed_rank"], restart["cause"]) == (1, 1, "killed by SIGKILL"), restart
    assert restart["resumed_from_step"] == 4 and restart["steps_lost"] == 0 and restart["step"] == 5, restart
    assert 0 < restart["recover_s"] < 60, restart
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert [x["restart"] for x in lines if x["kind"] == "restart"] == [1]


def test_with_memory_checkpoints_a_killed_rank_resumes_from_memory_and_the_memory_goes_with_the_launcher(
    tmp_path, reference
):
    shm = tmp_path / "shm"
    shm.mkdir()
    r = launch(tmp_path, "kill", "1", "5", env=clean_env(WORKER_MEMORY_EVERY="1", DTCORE_MEMORY_DIR=str(shm)))
    assert r.returncode == 0, r.stderr
    assert losses(tmp_path / "run") == reference  # every step, bit for bit
    (restart,) = json.loads((tmp_path / "run" / "run.json").read_text())["restarts"]
    assert restart["resumed_from_step"] == 4 and restart["steps_lost"] == 0, restart
    assert "resumed from " + str(shm) in r.stderr  # from memory: on disk there is no checkpoint before the end
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_00000008"]
    deadline = time.monotonic() + 10  # the reaper removes the node's directory once the launcher has exited
    while any(shm.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(shm.iterdir())


def test_at_zero3_the_copies_in_memory_hold_every_rank_s_shards_and_resume_bit_for_bit(tmp_path):
    env = clean_env(WORKER_MEMORY_EVERY="1", WORKER_ZERO="3", DTCORE_MEMORY_DIR=str(tmp_path))
    (tmp_path / "reference").mkdir()
    (tmp_path / "killed").mkdir()
    r = launch(tmp_path / "reference", "none", "1", "1", restarts=1, env=env)
    assert r.returncode == 0, r.stderr
    r = launch(tmp_path / "killed", "kill", "0", "6", env=env)  # rank 0 this time: it writes the manifest
    assert r.returncode == 0, r.stderr
    assert losses(tmp_path / "killed" / "run") == losses(tmp_path / "reference" / "run")
    (restart,) = json.loads((tmp_path / "killed" / "run" / "run.json").read_text())["restarts"]
    assert restart["resumed_from_step"] == 5 and restart["steps_lost"] == 0, restart


def test_the_same_exception_at_the_same_step_twice_is_a_bug_and_ends_the_job(tmp_path):
    r = launch(tmp_path, "raise", "1", "3", "0,1,2", restarts=3)
    assert r.returncode == 1
    assert r.stderr.count("starting every rank again") == 1, r.stderr  # one restart, not three
    assert "not restarting: rank 1 raised the same exception (ValueError: injected at step 3)" in r.stderr
    assert "in the same step (3)" in r.stderr and "restart_worker.py" in r.stderr
    assert "Root cause: rank 1" in r.stderr and "ValueError: injected at step 3" in r.stderr


def test_the_same_exception_at_another_step_is_a_fault_and_is_restarted(tmp_path, reference):
    r = launch(tmp_path, "raise", "0", "3,5", "0,1")  # at step 3, then after the restart at step 5
    assert r.returncode == 0, r.stderr
    assert "restart 1 of 2" in r.stderr and "restart 2 of 2" in r.stderr and "not restarting" not in r.stderr
    assert losses(tmp_path / "run") == reference
    restarts = json.loads((tmp_path / "run" / "run.json").read_text())["restarts"]
    assert [x["resumed_from_step"] for x in restarts] == [2, 4], restarts
    assert [x["cause"] for x in restarts] == ["ValueError: injected at step 3", "ValueError: injected at step 5"]


def test_a_stopped_rank_is_named_killed_and_the_group_restarts(tmp_path, reference):
    started = time.monotonic()
    r = launch(tmp_path, "stop", "1", "4", env=clean_env(DTCORE_TIMEOUT="5"))
    assert r.returncode == 0, r.stderr
    assert "restart 1 of 2" in r.stderr and "rank 1" in r.stderr
    assert time.monotonic() - started < 30  # not the agent's 30 s wait for a rank that cannot act on SIGTERM
    assert losses(tmp_path / "run") == reference


def test_under_torchrun_max_restarts_the_trainer_resumes_by_itself(tmp_path, reference):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1"]
    cmd += ["--log-dir", str(tmp_path / "logs"), WORKER, str(tmp_path / "run"), "kill", "0", "6"]
    r = subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert losses(tmp_path / "run") == reference
    (restart,) = json.loads((tmp_path / "run" / "run.json").read_text())["restarts"]
    assert restart["restart"] == 1 and restart["resumed_from_step"] == 5 and restart["cause"] is None, restart
