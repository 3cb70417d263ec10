"""python -m dtcore.launch with real processes on loopback: ranks through torch's agent, the node log, the
root cause and diagnosis of a failed rank (raised, killed, exited, out of memory), a missing node, the preflight,
and bad usage. A failure on another node: test_slurm.py (two simulated nodes)."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtcore.launch.__main__ import main as launch_main

from launch_helpers import WORKERS, clean_env, free_port, leftover_processes, run_in_session

pytestmark = pytest.mark.multirank
WORKER = str(WORKERS / "launch_worker.py")


def launch(tmp_path: Path, *args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs the launcher in tmp_path (logs under tmp_path/logs), in a session of its own, and checks that no
    process of it (a rank included) outlives it."""
    cmd = [sys.executable, "-m", "dtcore.launch", "--log-dir", str(tmp_path / "logs"), *args]
    return run_in_session(cmd, tmp_path, env or clean_env(), timeout)


def node_log(tmp_path: Path, node: int = 0) -> str:
    (path,) = glob.glob(str(tmp_path / "logs" / f"launch_worker_*_node{node}.log"))
    return Path(path).read_text()


def test_two_ranks_run_through_the_agent_and_the_node_log_holds_their_output(tmp_path):
    r = launch(tmp_path, "--nproc-per-node", "2", WORKER, "allreduce")
    assert r.returncode == 0, r.stderr
    results = sorted(
        (eval(line.split(":", 1)[1].replace("null", "None")) for line in r.stdout.splitlines() if ":{" in line),
        key=lambda x: x["rank"],
    )
    assert [x["rank"] for x in results] == [0, 1]
    assert all(x["world_size"] == 2 and x["launcher"] == "torchrun" and x["sum"] == 3.0 for x in results)
    log = node_log(tmp_path)
    assert "[rank0]:worker rank 0 of 2 says hello" in log and "[rank1]:worker rank 1 of 2 says hello" in log
    assert "preflight:" in log and "all 2 rank(s) of node 0 finished" in log
    # The agent's own per-rank files sit next to the node log.
    assert glob.glob(str(tmp_path / "logs" / "launch_worker_*_node0" / "*" / "attempt_0" / "1" / "stdout.log"))


def test_a_rank_that_raises_is_the_root_cause_with_host_and_traceback(tmp_path):
    r = launch(tmp_path, "--nproc-per-node", "2", WORKER, "raise", "1")
    assert r.returncode == 1
    err = r.stderr
    assert f"Root cause: rank 1 (local rank 1) on host {socket.gethostname()}" in err, err
    assert "ValueError: boom on rank 1" in err
    summary = err[err.index("Root cause") :]
    assert "in fail_deep" in summary and "launch_worker.py" in summary  # the user's frames
    assert "runpy" not in summary and "entry.py" not in summary  # not the launcher's
    assert "<N/A>" not in err and "error_file" not in err
    assert "rank 0 on" in summary and "SIGTERM" in summary  # stopped afterwards, not the root cause
    assert "Root cause: rank 1" in node_log(tmp_path)


def test_a_killed_rank_is_named_with_the_oom_killer_diagnosis(tmp_path):
    r = launch(tmp_path, "--nproc-per-node", "2", WORKER, "kill", "1")
    assert r.returncode == 1
    assert "Root cause: rank 1 (local rank 1)" in r.stderr and "killed by SIGKILL" in r.stderr, r.stderr
    assert "Diagnosis (killed)" in r.stderr and "dmesg" in r.stderr


def test_a_rank_that_exits_without_a_traceback_shows_its_stderr(tmp_path):
    r = launch(tmp_path, "--nproc-per-node", "2", WORKER, "exit", "0")
    assert r.returncode == 1
    assert "Root cause: rank 0 (local rank 0)" in r.stderr and "exited with status 3" in r.stderr, r.stderr
    tail = r.stderr[r.stderr.index("Last lines of rank 0's stderr") :]
    assert "giving up: no data shard for this rank" in tail


def test_out_of_memory_is_diagnosed_with_the_fixes(tmp_path):
    r = launch(tmp_path, "--nproc-per-node", "1", WORKER, "oom", "0")
    assert r.returncode == 1
    assert "OutOfMemoryError: CUDA out of memory" in r.stderr, r.stderr
    assert "Diagnosis (GPU out of memory)" in r.stderr and "zero=2" in r.stderr


def test_a_missing_node_is_named_every_few_seconds_then_at_the_timeout(tmp_path):
    port = free_port()
    started = time.monotonic()
    r = launch(
        tmp_path,
        *("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port), "--timeout", "4"),
        *("--nproc-per-node", "1", "--no-preflight", WORKER, "allreduce"),
        env=clean_env(DTCORE_RDZV_LOG_INTERVAL="1"),
    )
    assert time.monotonic() - started < 30
    assert r.returncode == 1
    progress = [line for line in r.stderr.splitlines() if "missing: node 1" in line]
    assert len(progress) >= 2 and "1/2 nodes joined (node 0 " in progress[0], r.stderr
    assert "rendezvous timed out after 4 s: 1 of 2 nodes never joined: node 1" in r.stderr
    command = f"--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port {port} --nproc-per-node 1"
    up_front = r.stderr.index("start the other nodes with:\n")  # before the roll call, the node's exact command
    assert command in r.stderr[up_front : r.stderr.index("missing: node 1")], r.stderr
    assert command in r.stderr[r.stderr.index("rendezvous timed out") :]  # and again in the error
    assert "missing: node 1" in node_log(tmp_path)


def test_a_node_whose_node_0_never_comes_says_so_and_how_to_start_it(tmp_path):
    port = free_port()
    r = launch(
        tmp_path,
        *("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)),
        *("--timeout", "3", "--nproc-per-node", "1", "--no-preflight", WORKER, "allreduce"),
        env=clean_env(DTCORE_RDZV_LOG_INTERVAL="1"),
    )
    assert r.returncode == 1
    assert r.stderr.count(f"node 1: waiting for node 0's store at 127.0.0.1:{port}") >= 2, r.stderr
    assert f"could not reach node 0's rendezvous store at 127.0.0.1:{port} within 3 s" in r.stderr
    fix = r.stderr[r.stderr.index("start node 0 first with: ") :]
    assert f"-m dtcore.launch --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port {port}" in fix
    assert "Traceback" not in r.stderr and "frame #" not in r.stderr  # no C++ retry backtraces from torch


def signalled(cmd: list[str], cwd: Path, ready, signum: int) -> tuple[subprocess.Popen, str, str]:
    """Starts the launcher, waits until ready(process) returns, sends it `signum`; (process, out, err)."""
    p = subprocess.Popen(
        cmd, cwd=cwd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        ready(p)
        p.send_signal(signum)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p, out, err


def test_sigusr1_to_the_launcher_reaches_every_rank(tmp_path):
    cmd = [sys.executable, "-m", "dtcore.launch", "--log-dir", str(tmp_path / "logs"), "--nproc-per-node", "2"]

    def ready(p):
        waiting = 0
        for line in p.stdout:  # both ranks have their handler: SLURM's warning signal now goes to the launcher
            waiting += "waits for SIGUSR1" in line
            if waiting == 2:
                return

    p, out, err = signalled([*cmd, WORKER, "usr1"], tmp_path, ready, signal.SIGUSR1)
    assert p.returncode == 128 + signal.SIGUSR1, err
    assert "rank 0 got SIGUSR1: saving" in out and "rank 1 got SIGUSR1: saving" in out, out
    assert "stopped by SIGUSR1" in err
    assert leftover_processes([p.pid]) == []


def test_a_preflight_failure_stops_the_launch_with_the_fix(tmp_path):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = launch(tmp_path, "--nproc-per-node", "2", "--master-port", str(port), WORKER, "allreduce")
    assert r.returncode == 1
    assert "nothing was started" in r.stderr and f"port {port} is taken" in r.stderr, r.stderr
    assert "worker rank" not in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--node-rank", "1", "--nnodes", "2"], "--node-rank 1 needs --master-addr"),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank 2: need 0 .. 1"),
        (["--nproc-per-node", "0"], "--nproc-per-node 0: need at least 1"),
        (["--from-slurm"], "--from-slurm reads a SLURM job step"),
        (["--max-restarts", "-1"], "--max-restarts -1: need 0 (no restart) or more"),
        (["--nnodes", "1:2"], "'1:2': an elastic range of nodes (torchrun's MIN:MAX) is not supported"),
        (["--nnodes", "two"], "'two' is not a number of nodes"),
    ],
)
def test_bad_usage_exits_2_with_the_fix(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    for name in set(os.environ) - set(clean_env()):
        monkeypatch.delenv(name)  # no launcher variable of the test's own environment
    with pytest.raises(SystemExit) as exit:
        launch_main([*args, WORKER, "allreduce"])
    assert exit.value.code == 2 and message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "logs")


def test_a_preempted_training_run_ends_the_launcher_with_the_preempted_status(tmp_path):
    """SIGTERM to the launcher: every rank of dtcore.train saves and exits 75, and so does the launcher,
    so that a requeue script tells "saved, resume me" from "killed"."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "dtcore.launch", "--log-dir", str(tmp_path / "logs"), "--nproc-per-node", "2"]
    cmd += [
        "-m",
        "dtcore.train",
        "--preset",
        "tiny",
        "--training.num_iterations=100000",
        f"--logging.run_dir={run_dir}",
    ]

    def ready(p):
        metrics = run_dir / "metrics" / "rank1.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not metrics.exists() or metrics.read_text().count("\n") < 3):
            time.sleep(0.2)

    p, out, err = signalled(cmd, tmp_path, ready, signal.SIGTERM)
    import dtcore
    from dtcore.exit_codes import EXIT_PREEMPTED

    assert p.returncode == EXIT_PREEMPTED, err[-3000:]
    assert dtcore.checkpoint.latest(run_dir / "checkpoints") is not None
    assert leftover_processes([p.pid]) == []


def test_the_newest_attempt_s_files_are_read_past_nine_restarts(tmp_path):
    """attempt_10 is newer than attempt_9 (not by text order): the failed rank's stderr and the run's log dir."""
    import argparse

    from dtcore.launch.run import Job

    job = Job(argparse.Namespace(nnodes=1), [], 1, "127.0.0.1", 1, str(tmp_path / "node0.log"), sys.executable)
    for k in (1, 9, 10, 2):
        (tmp_path / "node0" / "dtcore_x" / f"attempt_{k}" / "0").mkdir(parents=True)
        (tmp_path / "node0" / "dtcore_x" / f"attempt_{k}" / "0" / "stderr.log").write_text(str(k))
    assert Path(job.stderr_file(0)).read_text() == "10"
    assert job.run_log_dir() == str(tmp_path / "node0" / "dtcore_x")
