"""The collectives and the main-process helpers in one process, and a failing peer on real ranks."""

import pytest
import torch

import dtcore

from launch_helpers import clean_env, describe, free_port, leftover_processes, run_ranks, torchrun_style


def test_collective_arguments_are_checked(fresh_dtcore):
    dtcore.init(timeout=30)
    with pytest.raises(dtcore.ConfigError, match="op='avg' needs a floating-point"):
        dtcore.all_reduce(torch.ones(2, dtype=torch.int64), op="avg")
    with pytest.raises(dtcore.ConfigError, match="op='prod' is not a reduction"):
        dtcore.all_reduce(torch.ones(2), op="prod")
    with pytest.raises(dtcore.ConfigError, match="not contiguous"):
        dtcore.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(dtcore.ConfigError, match=r"src=3 is not a rank"):
        dtcore.broadcast(torch.ones(2), src=3)
    work = dtcore.all_reduce(torch.ones(3), async_op=True)
    with pytest.raises(dtcore.ConfigError, match="not a positive number of seconds"):
        work.wait(0)
    work.wait(10.0)
    assert work.is_completed()
    avg = torch.full((3,), 4.0)
    work = dtcore.all_reduce(avg, op="avg", async_op=True)
    while not work.is_completed():  # polling alone completes an average, division included
        pass
    assert torch.equal(avg, torch.full((3,), 4.0))


def test_flat_reduce_scatter_and_all_gather(fresh_dtcore):
    ctx = dtcore.init(timeout=30)
    comm = ctx.communicator
    out = torch.empty(3)
    comm.reduce_scatter(out, torch.arange(3.0), "avg").wait(10.0)
    assert torch.equal(out, torch.arange(3.0))
    gathered = torch.empty(3)
    comm.all_gather(gathered, torch.arange(3.0)).wait(10.0)
    assert torch.equal(gathered, torch.arange(3.0))
    with pytest.raises(dtcore.ConfigError, match="world size x 3"):
        comm.all_gather(torch.empty(4), torch.arange(3.0))


def test_gloo_keeps_no_reference_to_a_reduce_scatters_buffers(fresh_dtcore):
    """Note [Borrowed buffers on Gloo]: Gloo gets views that own nothing, so the input's memory goes with
    the caller's last reference, not later on Gloo's thread."""
    comm = dtcore.init(timeout=30).communicator
    x = torch.arange(3.0)
    uses = lambda: torch._C._storage_Use_Count(x.untyped_storage()._cdata)  # noqa: E731
    before = uses()
    work = comm.reduce_scatter(torch.empty(3), x, "sum")
    work.wait(10.0)
    assert uses() == before  # not one more: a view held by Gloo's work
    assert work.is_completed()


def test_all_gather_stacks_reduce_scatter_splits_dim_0_and_objects_travel_as_json(fresh_dtcore):
    dtcore.init(timeout=30)
    x = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(dtcore.all_gather(x), x.unsqueeze(0))  # (world, 2, 3)
    assert torch.equal(dtcore.reduce_scatter(x, op="max"), x)
    with pytest.raises(dtcore.ConfigError, match=r"reduce_scatter: dim 0 of the tensor \(shape \(\)\).*Fix:"):
        dtcore.reduce_scatter(torch.tensor(1.0))
    assert dtcore.gather_object({"loss": float("nan"), "n": (1, 2)})[0]["n"] == [1, 2]  # a tuple comes back a list
    with pytest.raises(dtcore.ConfigError, match=r"gather_object: rank 0 passed a Tensor that JSON cannot.*Fix:"):
        dtcore.gather_object(torch.ones(1))


def test_main_process_first_runs_the_block(fresh_dtcore):
    dtcore.init(timeout=30)
    ran = []
    with dtcore.main_process_first():
        ran.append(True)
    with dtcore.local_main_process_first():
        ran.append(dtcore.is_local_main_process())
    assert ran == [True, True]
    dtcore.barrier()


@pytest.mark.multirank
@pytest.mark.parametrize(
    "mode, buckets",
    [("die", 1), ("stall", 1), ("stop", 1), ("die-backward", 8), ("stop-backward", 8)],
)
def test_dead_stopped_or_stalled_rank_is_named_on_the_survivors(mode, buckets):
    """Named by rank, host and pid, told apart (dead, stopped, stalled), the other survivor never
    blamed; inside backward as CommError (not autograd's RuntimeError), once, whatever the buckets."""
    port, timeout = free_port(), 3.0
    envs = [clean_env(**torchrun_style(rank, 3, port)) for rank in range(3)]
    # Rank 2 is never asserted on: once the survivors have reported, it is killed, not waited for
    # (stopped, it would never end by itself).
    results, sessions = run_ranks(
        "failure_worker.py", envs, args=(mode, str(timeout), str(buckets)), timeout=60, until_done=[0, 1]
    )
    fault = mode.removesuffix("-backward")
    for r in results[:2]:
        j = r.json()
        assert not j["ok"], describe(results)
        assert j["type"] == "CommError", j
        message = j["message"]
        assert "rank 2 (host " in message, message
        if fault == "die":
            assert "no heartbeat" in message and "root cause: rank 2 (dead)" in message, message
            assert "no process" in message, message  # one host: the process was looked for
        elif fault == "stop":
            assert "root cause: rank 2 (stopped)" in message and "kill -CONT" in message, message
        else:
            assert "timed out" in message, message
            assert "alive, but has not started all_reduce" in message, message
            assert "root cause: rank 2 (stalled)" in message, message
        other = 1 - j["rank"]  # the other survivor is a victim, never the cause
        assert f"root cause: rank {other}" not in message, message
        assert message.count("health check on rank") <= 1, message  # one diagnosis, not one per bucket
        assert j["seconds"] < timeout + 2.5, j  # the failure, then about two heartbeats of diagnosis
    assert not leftover_processes(sessions)


@pytest.mark.multirank
def test_every_collective_through_gloo_when_one_rank_turns_shared_memory_off():
    """DTCORE_SHM=0 on rank 1 alone: both ranks still agree (neither waits for the other's segment) and
    every collective of the worker runs through Gloo (Note [Reduce-scatter on Gloo] and the rest), saying
    why on rank 0."""
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port), **({"DTCORE_SHM": "0"} if rank else {})) for rank in range(2)]
    results, sessions = run_ranks("allreduce_worker.py", envs, timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        j = r.json()
        assert j["bad"] == [] and j["shared_memory"] is False, describe(results)
    assert "DTCORE_SHM=0 on rank(s) 1 only; they go through Gloo" in results[0].stderr, results[0].stderr
    assert not leftover_processes(sessions)
