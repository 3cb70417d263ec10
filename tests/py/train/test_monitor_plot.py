"""python -m dtcore.monitor and python -m dtcore.plot on run directories laid out as dtcore.train writes them
(run.json, metrics/rank<r>.jsonl: one JSON object per line): the state and the stragglers named, PNGs written,
null metrics tolerated, and an absent or empty directory refused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from dtcore.train.rundir.monitor import main as monitor_main
from dtcore.train.rundir.plot import main as plot_main

from launch_helpers import clean_env


def write_run(run: Path, steps: int = 30, total: int = 100, slow_rank: int | None = 1, gpu: bool = False) -> None:
    """A 2-rank run of `steps` steps (0-based) of `total`; `slow_rank` takes 1.3x the others' step time."""
    (run / "metrics").mkdir(parents=True)
    started = time.time() - steps
    info = {
        "config": {"train": {"num_iterations": total}},
        "world_size": 2,
        "num_iterations": total,
        "started": started,
        "hosts": ["nodeA", "nodeB"],
        "model_flops_per_token": 6.0e6,
        "peak_flops_per_device": 989e12 if gpu else None,
    }
    (run / "run.json").write_text(json.dumps(info))
    for rank in (0, 1):
        lines = []
        for step in range(steps):
            step_time = 0.2 * (1.3 if rank == slow_rank else 1.0)
            lines.append(
                {
                    "kind": "train",
                    "step": step,
                    "time": started + step + 1,
                    "rank": rank,
                    "host": info["hosts"][rank],
                    "loss": 5.0 - 0.1 * step + 0.01 * rank,
                    "lr": 1e-3,
                    "step_time_s": step_time,
                    "tokens": 4096,
                    "tokens_per_s": 8192 / 0.26,
                    "mfu": 0.41 if gpu else None,
                    "mem_allocated_bytes": (3 << 30) + rank if gpu else None,
                    "mem_reserved_bytes": (4 << 30) if gpu else None,
                }
            )
            if step % 10 == 9:
                lines.append({"kind": "eval", "step": step, "time": started + step + 1, "rank": rank, "eval_loss": 4.0})
        text = "".join(json.dumps(x) + "\n" for x in lines)
        (run / "metrics" / f"rank{rank}.jsonl").write_text(text + '{"kind": "train", "step": 30, "lo')  # mid-write


def tool(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module args` as the user runs it (a real process)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=clean_env(), capture_output=True, text=True, timeout=60, check=False
    )


MAINS = {"dtcore.monitor": monitor_main, "dtcore.plot": plot_main}


def call(capsys, module: str, *args: str) -> subprocess.CompletedProcess:
    """The same in this process (no interpreter and torch start): most tests need only the output."""
    code = MAINS[module](list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([module, *args], code, out, err)


def test_monitor_shows_the_state_and_names_the_straggler(tmp_path):
    write_run(tmp_path / "run")
    r = tool("dtcore.monitor", str(tmp_path / "run"), "--once")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "2 rank(s) on nodeA, nodeB" in out
    assert "step 29 (30/100, 30%)" in out  # the half-written line of step 30 is not read
    assert "loss 2.1050 (step 29, mean of 2 rank(s))" in out and "eval loss 4.0000 (step 29)" in out
    assert "31,508 tokens/s" in out and "MFU n/a" in out
    assert "ETA 0:00:16" in out  # 70 steps x the job's median step time (0.23 s)
    assert "from 0.200 s (rank 0) to 0.260 s (rank 1)" in out
    assert "stragglers (> 1.1x the job's median): rank 1 on nodeB: 0.260 s (1.13x)" in out


def test_monitor_without_straggler_says_so(tmp_path, capsys):
    write_run(tmp_path / "run", slow_rank=None, steps=100)
    r = call(capsys, "dtcore.monitor", str(tmp_path / "run"))  # not --once: a finished run ends the watch
    assert r.returncode == 0, r.stderr
    assert "finished" in r.stdout and "no straggler" in r.stdout


def test_plot_writes_pngs_and_leaves_out_null_metrics(tmp_path):
    write_run(tmp_path / "run")
    r = tool("dtcore.plot", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    plots = tmp_path / "run" / "plots"
    assert sorted(p.name for p in plots.iterdir()) == ["loss.png", "step_time.png", "throughput.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000 for p in plots.iterdir())
    assert "memory: null in every line" in r.stdout and "MFU: null in every line" in r.stdout


def test_plot_draws_memory_and_mfu_when_measured(tmp_path, capsys):
    write_run(tmp_path / "run", gpu=True)
    r = call(capsys, "dtcore.plot", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "plots" / "memory.png").stat().st_size > 10_000 and "null" not in r.stdout


def test_absent_or_empty_run_dirs_are_refused_with_the_fix(tmp_path, capsys):
    for module in ("dtcore.plot", "dtcore.monitor"):
        r = call(capsys, module, str(tmp_path / "nowhere"))
        assert r.returncode == 1 and "is not a directory" in r.stderr and "Fix:" in r.stderr, r.stderr
        r = call(capsys, module, str(tmp_path))
        assert r.returncode == 1 and "holds no run" in r.stderr and "Fix:" in r.stderr, r.stderr
    assert not (tmp_path / "plots").exists()


def test_a_resumed_run_counts_each_step_once_and_ranks_of_an_earlier_world_not_at_all(tmp_path):
    from dtcore.train.rundir.run import load

    run = tmp_path / "run"
    write_run(run, steps=12)
    for rank in (0, 1):  # resumed from step 5: steps 6..11 run again, with other losses
        path = run / "metrics" / f"rank{rank}.jsonl"
        text = path.read_text().rsplit("\n", 1)[0] + "\n"  # without the half line
        again = [{"kind": "train", "step": s, "time": 0, "rank": rank, "host": "h", "loss": 1.0} for s in range(6, 12)]
        path.write_text(text + "".join(json.dumps(x) + "\n" for x in again))
    (run / "metrics" / "rank2.jsonl").write_text(json.dumps({"kind": "train", "step": 3, "loss": 9.0}) + "\n")
    loaded = load(str(run))
    assert sorted(loaded.train) == [0, 1]  # world_size 2 in run.json: rank 2's file is an earlier run's
    for rank in (0, 1):
        steps = [x["step"] for x in loaded.train[rank]]
        assert steps == list(range(12)), steps
        assert [x["loss"] for x in loaded.train[rank][6:]] == [1.0] * 6  # the later line of each step


def test_restarts_are_shown_by_the_monitor_and_marked_in_the_loss_plot(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, steps=12, slow_rank=None)
    path = run / "metrics" / "rank0.jsonl"
    text = path.read_text().rsplit("\n", 1)[0] + "\n"
    restart = {"kind": "restart", "step": 6, "time": 0, "rank": 0, "restart": 1, "failed_rank": 1}
    restart |= {"failed_host": "nodeB", "cause": "killed by SIGKILL", "failed_at": 0, "resumed_from_step": 5}
    restart |= {"last_step": 6, "steps_lost": 1, "recover_s": 4.25}
    path.write_text(text + json.dumps(restart) + "\n")
    out = call(capsys, "dtcore.monitor", "--once", str(run)).stdout
    assert (
        "restarts: 1\n  #1 at step 5 (rank 1 on nodeB: killed by SIGKILL): 1 step(s) lost, training again 4.2 s" in out
    )
    assert call(capsys, "dtcore.plot", str(run)).returncode == 0
