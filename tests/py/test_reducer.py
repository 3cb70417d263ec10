"""The C++ reducer on real processes: averaged gradients equal one process on the whole batch."""

import pytest

from launch_helpers import clean_env, describe, free_port, leftover_processes, run_ranks, torchrun_style

pytestmark = pytest.mark.multirank


def _run(world, *args):
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, world, port)) for rank in range(world)]
    results, sessions = run_ranks("reducer_worker.py", envs, args=tuple(str(a) for a in args), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert not leftover_processes(sessions)
    return [r.json() for r in results]


@pytest.mark.parametrize(
    "world,bucket_mb,first_mb,expected_buckets",
    [
        (2, 25.0, 1.0, 1),  # the whole model (~21 KB) fits the first bucket
        (2, 0.001, 0.001, 3),  # ~1 KB caps: a small bias shares with the next weight (as in DDP)
        (2, 1e-5, 1e-5, 6),  # caps below the smallest parameter: one parameter per bucket
        (4, 0.01, 0.001, None),
    ],
)
def test_gradients_match_one_process_on_the_whole_batch(world, bucket_mb, first_mb, expected_buckets):
    for j in _run(world, bucket_mb, first_mb):
        assert j["error"] is None and j["bad"] == [], j
        assert j["reductions"] == j["steps"]
        if expected_buckets is not None:
            assert len(j["buckets"]) == expected_buckets, j["buckets"]
        assert sorted(i for b in j["buckets"] for i in b) == list(range(6))


def test_a_parameter_without_gradient_is_named():
    for j in _run(2, 25.0, 0.0001, "unused"):
        # reported by the next forward, as a ConfigError naming the parameters and the fix
        assert j["error"] is not None and j["error"].startswith("ConfigError"), j
        assert "parameter 'spare.weight' (and 1 more, e.g. 'spare.bias') received no gradient" in j["error"], j
        assert "find_unused_parameters=True" in j["error"] and "requires_grad_(False)" in j["error"]


@pytest.mark.parametrize("world,bucket_mb", [(2, 25.0), (4, 0.001)])
def test_distributed_model_broadcasts_accumulates_and_keeps_buffers_in_step(world, bucket_mb):
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, world, port)) for rank in range(world)]
    results, sessions = run_ranks("wrap_worker.py", envs, args=("parity", str(bucket_mb)), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        assert r.json()["bad"] == [], r.json()
    assert not leftover_processes(sessions)


def test_a_model_that_differs_across_ranks_is_named_by_rank_and_parameter():
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("wrap_worker.py", envs, args=("mismatch",), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    errors = [r.json()["error"] for r in results]
    for e in errors:
        assert e is not None and "rank 1 has other parameters" in e and "Fix:" in e, e
    assert "First difference, parameter #0: rank 0 has '0.weight (64, 32) torch.float32', rank 1 has " \
           "'0.weight (48, 32) torch.float32'" in errors[1], errors[1]
    assert not leftover_processes(sessions)


@pytest.mark.parametrize("mode", ["unused", "rebuild", "bf16", "bf16params"])
def test_find_unused_parameters_bucket_rebuild_and_comm_dtype(mode):
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("wrap_worker.py", envs, args=(mode,), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        assert r.json()["bad"] == [], r.json()
    assert not leftover_processes(sessions)


@pytest.mark.parametrize("world,bucket_cap_mb,steps", [(2, 25.0, 20), (2, 0.001, 3), (4, 25.0, 3), (4, 0.001, 3)])
def test_ddp_drop_in_on_mlp_cnn_with_batchnorm_and_tied_transformer(world, bucket_cap_mb, steps):
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, world, port)) for rank in range(world)]
    results, sessions = run_ranks("ddp_worker.py", envs, args=(str(bucket_cap_mb), str(steps)), timeout=180)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        j = r.json()
        assert j["bad"] == [], j
        assert "DistributedDataParallel(mixed_precision=" in j["refused"] and "is not supported" in j["refused"]
    assert not leftover_processes(sessions)


def test_the_main_job_trains_under_torchrun():
    import sys
    from pathlib import Path

    from launch_helpers import run_processes

    script = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           "--preset", "tiny", "--steps", "20", "--accum", "2", "--log-every", "10"]
    results, sessions = run_processes([cmd], [clean_env()], timeout=240)
    assert results[0].returncode == 0, describe(results)
    assert "tokens/s" in results[0].stdout and ": OK" in results[0].stdout, results[0].stdout
    assert not leftover_processes(sessions)
