"""Replicas of the in-memory checkpoints on another node (Note [Replicas] in dtcore/checkpoint/replica.py):
real ranks of two nodes on loopback, the replica a byte copy of its rank's file, and a node whose copies are
all gone resumes bit for bit from the other node's."""

import pytest

from launch_helpers import clean_env, describe, free_port, leftover_processes, routable_address, run_ranks


def _run(tmp_path, zero: int, case: str) -> list[dict]:
    address = routable_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback (a job of several nodes refuses it)")
    port, world, per_node = free_port(), 4, 2
    envs = [
        clean_env(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank % per_node),
            LOCAL_WORLD_SIZE=str(per_node),
            GROUP_RANK=str(rank // per_node),
            MASTER_ADDR=address,
            MASTER_PORT=str(port),
        )
        for rank in range(world)
    ]
    results, sessions = run_ranks("replica_worker.py", envs, args=(str(tmp_path), str(zero), case), timeout=150)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert leftover_processes(sessions) == []
    return [r.json() for r in results]


@pytest.mark.multirank
def test_every_node_holds_every_rank_s_copy_and_a_restart_that_lost_nothing_loads_it_bit_for_bit(tmp_path):
    for j in _run(tmp_path, 0, "intact"):
        assert j["bad"] == [] and j["step"] == 4, j
        assert j["replica_is_a_copy"], j
        assert j["files"] == ["manifest.json"] + [f"rank{r:05d}.safetensors" for r in range(4)], j


@pytest.mark.multirank
def test_a_node_whose_copies_are_gone_resumes_bit_for_bit_from_the_other_node_s_replicas(tmp_path):
    for j in _run(tmp_path, 2, "lost"):
        assert j["bad"] == [] and j["step"] == 4, j
        assert j["files"] == ["manifest.json"] + [f"rank{r:05d}.safetensors" for r in range(4)], j
