"""The C++ reducer on real processes: averaged gradients equal one process on the whole batch."""

import sys

import pytest
import torch

import dtcore

from launch_helpers import (
    EXAMPLES,
    clean_env,
    describe,
    free_port,
    leftover_processes,
    run_job,
    run_processes,
    run_ranks,
    torchrun_style,
)


def _run(world, *args):
    return run_job("reducer_worker.py", world, *args)


@pytest.mark.multirank
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


@pytest.mark.multirank
def test_a_parameter_without_gradient_is_named():
    for j in _run(2, 25.0, 0.0001, "unused"):
        # reported by the next forward, as a ConfigError naming the parameters and the fix
        assert j["error"] is not None and j["error"].startswith("ConfigError"), j
        assert "Expected to have finished reduction in the prior iteration" in j["error"], j
        assert "Parameters which did not receive grad for rank " in j["error"], j
        assert ": spare.weight, spare.bias." in j["error"], j
        assert "find_unused_parameters=True" in j["error"] and "requires_grad_(False)" in j["error"]


@pytest.mark.multirank
@pytest.mark.parametrize("world,bucket_mb", [(2, 25.0), (4, 0.001)])
def test_distributed_model_broadcasts_accumulates_and_keeps_buffers_in_step(world, bucket_mb):
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, world, port)) for rank in range(world)]
    results, sessions = run_ranks("wrap_worker.py", envs, args=("parity", str(bucket_mb)), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        assert r.json()["bad"] == [], r.json()
    assert not leftover_processes(sessions)


@pytest.mark.multirank
def test_a_model_that_differs_across_ranks_is_named_by_rank_and_parameter():
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("wrap_worker.py", envs, args=("mismatch",), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    errors = [r.json()["error"] for r in results]
    for e in errors:
        assert e is not None and "rank 1 has other parameters" in e and "Fix:" in e, e
    assert (
        "First difference, parameter #0: rank 0 has '0.weight (64, 32) torch.float32', rank 1 has "
        "'0.weight (48, 32) torch.float32'" in errors[1]
    ), errors[1]
    assert not leftover_processes(sessions)


@pytest.mark.multirank
@pytest.mark.parametrize("mode", ["unused", "rebuild", "bf16", "bf16params"])
def test_find_unused_parameters_bucket_rebuild_and_comm_dtype(mode):
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("wrap_worker.py", envs, args=(mode,), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        assert r.json()["bad"] == [], r.json()
    assert not leftover_processes(sessions)


@pytest.mark.multirank
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


@pytest.mark.multirank
def test_the_main_job_trains_under_torchrun():
    script = EXAMPLES / "train_gpt.py"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        "--preset",
        "tiny",
        "--steps",
        "20",
        "--accum",
        "2",
        "--log-every",
        "10",
    ]
    results, sessions = run_processes([cmd], [clean_env()], timeout=240)
    assert results[0].returncode == 0, describe(results)
    assert "tokens/s" in results[0].stdout and ": OK" in results[0].stdout, results[0].stdout
    assert not leftover_processes(sessions)


def test_ddp_drop_in_refuses_what_it_cannot_honour(fresh_dtcore):
    dtcore.init(timeout=30)
    net = torch.nn.Linear(3, 3)
    with pytest.raises(dtcore.ConfigError, match=r"device_ids=\[1\].*cpu"):
        dtcore.DistributedDataParallel(net, device_ids=[1])
    with pytest.raises(dtcore.ConfigError, match="dim=1"):
        dtcore.DistributedDataParallel(net, dim=1)
    with pytest.raises(dtcore.ConfigError, match="init_sync=False"):
        dtcore.DistributedDataParallel(net, init_sync=False)
    with pytest.raises(dtcore.ConfigError, match="Only 1D device mesh is supported.*device_mesh=mesh"):
        dtcore.DistributedDataParallel(net, device_mesh=object())
    with pytest.raises(dtcore.ConfigError, match="unknown argument 'bucket_size'"):
        dtcore.DistributedDataParallel(net, bucket_size=3)
    # torch's own defaults, passed explicitly, are accepted
    model = dtcore.DistributedDataParallel(
        net,
        None,
        None,
        0,
        None,
        True,
        None,
        bucket_cap_mb=1,
        gradient_as_bucket_view=True,
        skip_all_reduce_unused_params=False,
        batched_grad_copy=False,
        mixed_precision=None,
    )
    with pytest.raises(dtcore.ConfigError, match="_register_fused_optim is not supported"):
        model._register_fused_optim(torch.optim.SGD, lr=0.1)
    with pytest.raises(dtcore.ConfigError, match="comm_dtype=torch.int8"):
        dtcore.wrap(torch.nn.Linear(2, 2), comm_dtype=torch.int8)
    with pytest.raises(dtcore.ConfigError, match="bucket_mb=0 is not a positive size"):
        dtcore.wrap(torch.nn.Linear(2, 2), bucket_mb=0)
    model(torch.ones(1, 3)).sum().backward()  # world of one: the average is the gradient itself
    assert torch.equal(net.weight.grad, torch.ones(3, 1).expand(3, 3))


def test_create_graph_through_a_wrapped_model_is_refused_clearly(fresh_dtcore):
    dtcore.init(timeout=30)
    model = dtcore.wrap(torch.nn.Linear(3, 1))
    loss = (model(torch.ones(2, 3)) ** 2).sum()
    with pytest.raises(RuntimeError, match=r"create_graph=True\) through a wrapped model is not supported"):
        loss.backward(create_graph=True)
    model(torch.ones(2, 3)).sum().backward()  # the next step is clean
