"""The trainer end to end on 2 CPU ranks (Gloo): torchrun -m dtcore.train, the metrics files of
the run directory, and an out-of-memory error diagnosed on the rank it hit."""

import json
import os
import sys

import pytest
import torch

from dtcore.train import DataConfig
from dtcore.train.demo.data import Tokenizer, load_text
from dtcore.train.demo.gpt import GPT, GPTConfig, num_parameters
from dtcore.train.rundir.run import load, spread
from dtcore.train.trainer import constructor_defaults

from launch_helpers import clean_env, describe, free_port, leftover_processes, run_processes, run_ranks, torchrun_style

TRAIN_KEYS = {"kind", "step", "time", "rank", "host", "loss", "lr", "step_time_s", "wait_s", "tokens", "tokens_per_s"}
TRAIN_KEYS |= {"mfu"}
TRAIN_KEYS |= {"mem_allocated_bytes", "mem_reserved_bytes"}


def _lines(run_dir, rank):
    return [json.loads(line) for line in (run_dir / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]


def _worker(mode, run_dir):
    """train_worker.py MODE on 2 ranks; every rank reports (its JSON line), none is left behind."""
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("train_worker.py", envs, args=(mode, str(run_dir)), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert leftover_processes(sessions) == []
    return results


@pytest.mark.multirank
def test_torchrun_trains_the_tiny_preset_and_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "dtcore.train"]
    cmd += ["--preset", "tiny", f"--logging.run_dir={run_dir}"]
    (result,), sessions = run_processes([cmd], [clean_env()], timeout=120)
    assert result.returncode == 0, describe([result])
    assert leftover_processes(sessions) == []
    run = json.loads((run_dir / "run.json").read_text())
    assert run["world_size"] == 2 and run["num_iterations"] == 40 and len(run["hosts"]) == 2
    assert run["config"]["training"]["num_iterations"] == 40 and run["peak_flops_per_device"] is None
    assert run["model_flops_per_token"] > 6 * 100_000  # 6 per parameter and more
    for rank in (0, 1):
        lines = _lines(run_dir, rank)
        train = [line for line in lines if line["kind"] == "train"]
        evals = [line for line in lines if line["kind"] == "eval"]
        assert [t["step"] for t in train] == list(range(1, 41))
        assert all(set(t) == TRAIN_KEYS and t["rank"] == rank and t["mfu"] is None for t in train)
        assert all(t["tokens"] == 8 * 64 and t["tokens_per_s"] > 0 for t in train)
        assert [e["step"] for e in evals] == [20, 40] and evals[1]["eval_loss"] < evals[0]["eval_loss"]
        first, last = sum(t["loss"] for t in train[:5]) / 5, sum(t["loss"] for t in train[-5:]) / 5
        assert last < first - 0.5, (first, last)  # ln(58) = 4.06 to about 2.7 in 40 steps
    assert _lines(run_dir, 0)[-1]["eval_loss"] == _lines(run_dir, 1)[-1]["eval_loss"]  # averaged over ranks
    assert "loss" in result.stderr and "tok/s" in result.stderr  # rank 0's progress
    assert os.listdir(run_dir / "checkpoints") == ["step_00000040"]  # at the end
    assert (run_dir / "checkpoints" / "step_00000040" / "manifest.json").exists()
    plots = sorted(p.name for p in (run_dir / "plots").iterdir())  # logging.plot: written at the end
    assert plots == ["loss.png", "step_time.png", "throughput.png"] and "plots of this run" in result.stderr
    _check_tensorboard(run_dir, [_lines(run_dir, rank) for rank in (0, 1)])


def _check_tensorboard(run_dir, lines):
    """Rank 0 alone wrote TensorBoard scalars: the job's loss (mean over ranks) each step, the eval loss."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = [p for p in (run_dir / "tensorboard").iterdir() if p.name.startswith("events.out.tfevents")]
    tb = EventAccumulator(str(events))
    tb.Reload()
    assert {"train/loss", "train/tokens_per_s", "eval/loss"} <= set(tb.Tags()["scalars"]), tb.Tags()
    assert "train/mfu" not in tb.Tags()["scalars"]  # null on CPU: left out, never drawn as 0
    loss = {e.step: e.value for e in tb.Scalars("train/loss")}
    by_step = [{x["step"]: x["loss"] for x in rank if x["kind"] == "train"} for rank in lines]
    assert sorted(loss) == list(range(1, 41))
    assert all(loss[s] == pytest.approx((by_step[0][s] + by_step[1][s]) / 2, rel=1e-5) for s in loss)
    evals = {x["step"]: x["eval_loss"] for x in lines[0] if x["kind"] == "eval"}
    assert {e.step: pytest.approx(e.value, rel=1e-5) for e in tb.Scalars("eval/loss")} == evals


@pytest.mark.multirank
def test_injected_out_of_memory_is_diagnosed_on_its_rank_and_the_other_gets_the_verdict(tmp_path):
    results = _worker("oom", tmp_path)
    zero, one = (r.json() for r in results)
    assert one["error"] == "OutOfMemoryError", one
    message = one["message"]
    for needle in (
        "out of memory on rank 1",
        "during step 2, forward of micro-batch 1/2: CUDA out of memory. Tried to allocate 2.00 GiB",
        "parameters ",
        "gradients ",
        "optimizer state ",
        "activations ",
        "(estimate for device_batch_size=8, activation_checkpointing=none)",
        "1. --training.device_batch_size=4 with --training.total_batch_size=32",
        "2. --parallel.zero=2: shards gradients and optimizer state over 2 ranks",
        "3. --parallel.activation_checkpointing=all",
    ):
        assert needle in message, message
    vocab = Tokenizer("char", load_text(DataConfig())).vocab_size
    params = num_parameters(GPT(GPTConfig(vocab_size=vocab)))
    assert f"parameters       {4 * params / 2**20:.2f} MiB" in message  # measured on the rank, fp32
    assert zero["error"] == "CommError" and "root cause: rank 1" in zero["message"], zero  # the health verdict


@pytest.mark.multirank
def test_any_module_with_a_plain_list_of_batches_and_its_own_optimizer_sharded(tmp_path):
    results = _worker("mlp", tmp_path)
    for r in results:
        j = r.json()
        assert j["error"] is None and j["optimizer"] == "ShardedOptimizer", j
        assert len(j["losses"]) == 30 and sum(j["losses"][-5:]) < 0.5 * sum(j["losses"][:5]), j["losses"]
    assert results[0].json()["losses"] == results[1].json()["losses"]  # the job's loss, averaged over ranks
    assert [line["tokens"] for line in _lines(tmp_path, 1)][:2] == [2 * 4 * 8] * 2  # 2 micro-batches of (4, 8)


@pytest.mark.multirank
def test_a_tracker_that_cannot_start_stops_every_rank_before_the_first_step_with_the_fix(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("a file where TensorBoard's directory goes")
    port = free_port()
    cmd = [sys.executable, "-m", "dtcore.train", "--preset", "tiny", f"--logging.run_dir={run_dir}"]
    results, sessions = run_processes([cmd] * 2, [clean_env(**torchrun_style(r, 2, port)) for r in (0, 1)], timeout=120)
    assert [r.returncode for r in results] == [2, 2], describe(results)  # a configuration error, on both ranks
    assert leftover_processes(sessions) == []
    for rank, r in enumerate(results):
        assert ("rank 0: " if rank else "") + f"TensorBoard: cannot write scalars to {run_dir}/tensorboard" in r.stderr
        assert "Fix: make" in r.stderr and "--logging.tensorboard=false" in r.stderr and "Traceback" not in r.stderr
    assert not (run_dir / "metrics").exists()  # before the first step


def test_a_fresh_run_into_an_earlier_runs_directory_moves_that_run_aside(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "dtcore.train", "--preset", "tiny", f"--logging.run_dir={run_dir}"]
    cmd += ["--training.num_iterations=3"]
    for _ in range(2):
        (result,), _sessions = run_processes([cmd], [clean_env()], timeout=120)
        assert result.returncode == 0, describe([result])
    steps = [line["step"] for line in _lines(run_dir, 0) if line["kind"] == "train"]
    assert steps == [1, 2, 3], steps  # this run's lines only, never appended to the earlier run's
    (earlier,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.")]
    assert [line["step"] for line in _lines(earlier, 0) if line["kind"] == "train"] == [1, 2, 3]
    assert (earlier / "checkpoints").is_dir()  # nothing of it lost


@pytest.mark.multirank
def test_a_rank_slow_before_the_gradient_all_reduce_is_named_by_the_trainer_and_the_monitor(tmp_path):
    # Rank 1's forward takes 30 ms more: both ranks' step times include that (rank 0 waits for it
    # at the all-reduce), so only each rank's own time, the step time less its wait, tells them apart.
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("train_worker.py", envs, args=("slow", str(tmp_path)), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert leftover_processes(sessions) == []
    assert "straggler at step 10: rank 1 (" in results[0].stderr, results[0].stderr
    assert "rank 0 (" not in results[0].stderr.split("straggler at step 10:")[1].split("\n")[0]
    step_times = [[x["step_time_s"] for x in _lines(tmp_path, r)] for r in range(2)]
    assert abs(sorted(step_times[0])[10] - sorted(step_times[1])[10]) < 0.02  # medians alike: no help alone
    named = spread(load(str(tmp_path))).stragglers
    assert [s.rank for s in named] == [1], named


def test_a_callers_optimizer_is_rebuilt_sharded_from_what_its_constructor_takes():
    # torch's AdamW keeps decoupled_weight_decay in its defaults but takes no such argument
    p = torch.nn.Parameter(torch.zeros(2))
    adamw = torch.optim.AdamW([p], lr=0.1, betas=(0.8, 0.9), weight_decay=0.2, fused=True)
    assert torch.optim.AdamW([p], **constructor_defaults(adamw)).defaults == adamw.defaults
    sgd = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    assert constructor_defaults(sgd) == sgd.defaults
