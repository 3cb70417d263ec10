"""python -m dtcore.launch --slurm: the sbatch script is valid bash, asks for what was given, and its srun
line, run under a simulated SLURM step (one task per node), starts a job whose ranks dtcore.init() reads
as the right world."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import socket
import subprocess
from pathlib import Path

import pytest

from dtcore.launch.__main__ import main as launch_main

from launch_helpers import WORKERS, clean_env, leftover_processes

WORKER = str(WORKERS / "launch_worker.py")


def write_script(tmp_path: Path, *args: str) -> str:
    """Runs `python -m dtcore.launch --slurm ARGS` in tmp_path (in this process: it only writes a file)."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert launch_main(["--slurm", "--log-dir", "slurm-logs", *args]) == 0
    finally:
        os.chdir(old)
    return out.getvalue()


def test_the_script_is_valid_bash_and_asks_for_the_nodes_and_gpus(tmp_path):
    out = write_script(tmp_path, "--nnodes", "2", "--nproc-per-node", "8", "--sbatch", "partition=gpu", "-m", "m.x")
    path = tmp_path / "m.x.sbatch"
    assert f"wrote {path.name}" in out and "sbatch m.x.sbatch" in out
    text = path.read_text()
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=10)
    for line in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=gpu", "--job-name=m.x"):
        assert f"#SBATCH {line}\n" in text
    assert "--from-slurm --nproc-per-node 8" in text and "-m m.x || status=$?" in text
    assert (tmp_path / "slurm-logs").is_dir()  # SLURM opens --output=slurm-logs/... before the script runs
    # Preemption before the time limit: SIGUSR1 120 s ahead, and the job may be requeued.
    assert "#SBATCH --signal=USR1@120\n" in text and "#SBATCH --requeue\n" in text
    assert "#SBATCH --open-mode=append\n" in text  # a requeued job keeps the first run's output


def test_a_step_that_saved_after_the_signal_requeues_the_job_and_any_other_end_does_not(tmp_path):
    write_script(tmp_path, "--nnodes", "1", "--sbatch", "signal=B:USR1@300", "-m", "m.x")
    text = (tmp_path / "m.x.sbatch").read_text()
    assert "--signal=B:USR1@300" in text and "--signal=USR1@120" not in text  # the user's own choice stands
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "$@" >> "$(dirname "$0")/scontrol.calls"\n')
    for status, requeued in ((75, True), (1, False), (0, False)):
        (bin_dir / "srun").write_text(f"#!/bin/bash\nexit {status}\n")
        for tool in ("srun", "scontrol"):
            (bin_dir / tool).chmod(0o755)
        (bin_dir / "scontrol.calls").unlink(missing_ok=True)
        env = dict(clean_env(), PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242")
        r = subprocess.run(["bash", "m.x.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == status, r.stderr
        calls = (bin_dir / "scontrol.calls").read_text() if (bin_dir / "scontrol.calls").exists() else ""
        assert (calls == "requeue 4242\n") == requeued, (status, calls)


def test_submit_without_sbatch_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch there
    assert launch_main(["--slurm", "--submit", WORKER, "allreduce"]) == 1
    assert "sbatch is not on PATH" in capsys.readouterr().err


def fake_sbatch(tmp_path: Path, body: str) -> Path:
    """An `sbatch` executable first on PATH (no SLURM here) that runs `body` after recording its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/bash\necho "$@" > {tmp_path / "sbatch.args"}\n{body}\n')
    sbatch.chmod(0o755)
    return bin_dir


def test_submit_runs_sbatch_on_the_written_script_and_returns_its_status(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{fake_sbatch(tmp_path, 'echo Submitted batch job 4242; exit 0')}:{os.environ['PATH']}")
    assert launch_main(["--slurm", "--submit", "--nnodes", "2", "--nproc-per-node", "4", WORKER, "allreduce"]) == 0
    assert (tmp_path / "sbatch.args").read_text().split() == ["launch_worker.sbatch"]
    assert "Submitted batch job 4242" in capfd.readouterr().out  # sbatch's own output, passed through
    assert "#SBATCH --nodes=2" in (tmp_path / "launch_worker.sbatch").read_text()  # written before it was submitted


def test_submit_that_sbatch_refuses_or_does_not_answer_fails_with_the_fix(tmp_path, monkeypatch, capfd):
    from dtcore.launch import slurm

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{fake_sbatch(tmp_path, 'echo invalid partition >&2; exit 1')}:{os.environ['PATH']}")
    assert launch_main(["--slurm", "--submit", WORKER, "allreduce"]) == 1
    assert "invalid partition" in capfd.readouterr().err
    (tmp_path / "bin" / "sbatch").write_text("#!/bin/bash\nexec sleep 30\n")
    monkeypatch.setattr(slurm, "SUBMIT_TIMEOUT_S", 0.5)
    assert launch_main(["--slurm", "--submit", WORKER, "allreduce"]) == 1
    err = capfd.readouterr().err
    assert "did not answer within 0.5 s" in err and "sbatch launch_worker.sbatch" in err, err


def srun_line(script: str) -> str:
    """The command srun runs on every node (the script's last command, without `srun OPTIONS`)."""
    command = script[script.index("\nsrun ") :].split("\\\n", 1)[1]
    return command.split(" || status=$?")[0].replace("\\\n", " ")


def simulated_step(command: str, tmp_path: Path, nodes: int) -> list[tuple[int, str, str]]:
    """Runs `command` as srun would with one task per node, every "node" on this host: (status, out, err)."""
    tasks = []
    for node in range(nodes):
        slurm = {
            "SLURM_JOB_ID": str(JOB_ID),
            "SLURM_JOB_NODELIST": ",".join(["localhost"] * nodes),
            "SLURM_NNODES": str(nodes),
            "SLURM_NTASKS": str(nodes),
            "SLURM_TASKS_PER_NODE": f"1(x{nodes})",
            "SLURM_PROCID": str(node),
            "SLURM_NODEID": str(node),
            "SLURM_LOCALID": "0",
        }
        tasks.append(
            subprocess.Popen(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=clean_env(**slurm),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        outs = [t.communicate(timeout=90) for t in tasks]
    finally:
        for t in tasks:
            if t.poll() is None:
                t.kill()
    assert leftover_processes([t.pid for t in tasks]) == []
    return [(t.returncode, out, err) for t, (out, err) in zip(tasks, outs)]


def _job_id_with_a_free_port() -> int:
    """A SLURM job id whose derived port (15000 + id % 15000) is free here now."""
    for _ in range(100):
        job_id = random.randrange(1, 15000)
        with socket.socket() as s:
            try:
                s.bind(("", 15000 + job_id))
            except OSError:
                continue
        return job_id
    raise AssertionError("no free port in 15000..29999")


JOB_ID = _job_id_with_a_free_port()


@pytest.mark.multirank
def test_the_srun_line_under_simulated_slurm_starts_the_world_dtcore_reads(tmp_path):
    write_script(tmp_path, "--nnodes", "1", "--nproc-per-node", "2", WORKER, "allreduce")
    ((status, out, err),) = simulated_step(srun_line((tmp_path / "launch_worker.sbatch").read_text()), tmp_path, 1)
    assert status == 0, err
    seen = sorted((json.loads(line.split(":", 1)[1]) for line in out.splitlines() if ":{" in line), key=str)
    assert sorted(x["rank"] for x in seen) == [0, 1]
    for x in seen:
        assert x["world_size"] == 2 and x["num_nodes"] == 1 and x["local_rank"] == x["rank"], x
        assert (x["master_addr"], x["master_port"]) == ("localhost", 15000 + JOB_ID) and x["sum"] == 3.0
    assert "preflight:" in err  # the script keeps the checks
    assert len(list((tmp_path / "slurm-logs").glob("launch_worker_*_node0.log"))) == 1


@pytest.mark.multirank
def test_the_srun_line_on_two_simulated_nodes_gives_each_its_node_rank(tmp_path):
    # Both "nodes" are this host, so the ranks do not call dtcore.init() (it refuses two ranks with one local
    # rank on one host); rank 1 fails, and each node's launcher names it with the node it ran on.
    write_script(tmp_path, "--nnodes", "2", "--nproc-per-node", "1", "--no-preflight", WORKER, "raise", "1")
    results = simulated_step(srun_line((tmp_path / "launch_worker.sbatch").read_text()), tmp_path, 2)
    for node, (status, out, err) in enumerate(results):
        assert status == 1, err
        assert f"worker rank {node} of 2 says hello" in out
        assert f"this is node {node}; master localhost:{15000 + JOB_ID}" in err
        assert "Root cause: rank 1 (local rank 0) on host" in err and "(node 1)" in err
        assert "ValueError: boom on rank 1" in err
    # Node 0's rank would wait a minute: node 1's failure stopped it.
    assert "another node's job failed: stopping the ranks of this node" in results[0][2]
