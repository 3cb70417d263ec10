"""Replicas of the in-memory checkpoints on another node (Note [Replicas] in dtcore/checkpoint/replica.py):
real ranks of two nodes on loopback, the replica a byte copy of its rank's file, and a node whose copies are
all gone resumes bit for bit from the other node's."""

import re

import pytest

from launch_helpers import clean_env, describe, free_port, leftover_processes, routable_address, run_ranks


def _run(tmp_path, zero: int, case: str, world: int = 4, per_node: int = 2) -> list:
    address = routable_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback (a job of several nodes refuses it)")
    port = free_port()
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
    assert leftover_processes(sessions) == []
    if case in ("peerdies", "torn"):
        return results
    assert all(r.returncode == 0 for r in results), describe(results)
    return [r.json() for r in results]


@pytest.mark.multirank
def test_every_node_holds_every_rank_s_copy_and_a_restart_that_lost_nothing_loads_it_bit_for_bit(tmp_path):
    for j in _run(tmp_path, 0, "intact"):
        assert j["bad"] == [] and j["step"] == 4, j
        assert j["replica_is_a_copy"], j
        assert j["files"] == ["manifest.json"] + [f"rank{r:05d}.safetensors" for r in range(4)], j
        assert j["written"] == [], j  # two nodes that lost nothing: every file was there, none was sent


@pytest.mark.multirank
def test_a_node_whose_copies_are_gone_resumes_bit_for_bit_from_the_other_node_s_replicas(tmp_path):
    for j in _run(tmp_path, 2, "lost"):
        assert j["bad"] == [] and j["step"] == 4, j
        assert j["files"] == ["manifest.json"] + [f"rank{r:05d}.safetensors" for r in range(4)], j


@pytest.mark.multirank
def test_on_three_nodes_a_lost_node_gets_every_file_and_the_others_the_files_they_lack(tmp_path):
    """3 nodes of 1 rank: node 1's directory removed. Node 0 holds rank 0's own and rank 2's replica and gets
    rank 1's from node 2's replica; node 2 gets rank 0's; node 1 gets all three."""
    results = _run(tmp_path, 0, "lost", world=3, per_node=1)
    for j in results:
        assert j["bad"] == [] and j["step"] == 4, j
        assert j["files"] == ["manifest.json"] + [f"rank{r:05d}.safetensors" for r in range(3)], j
    assert [j["written"] for j in results] == [
        ["rank00001.safetensors"],
        ["rank00000.safetensors", "rank00001.safetensors", "rank00002.safetensors"],
        ["rank00000.safetensors"],
    ]


@pytest.mark.multirank
def test_a_peer_that_dies_during_the_exchange_is_a_comm_error_naming_it_on_its_partner(tmp_path):
    results = _run(tmp_path, 0, "peerdies")
    assert results[2].returncode == -9
    assert results[0].returncode != 0 and results[0].seconds < 60, describe(results)
    assert "CommError: in-memory checkpoints: rank 0" in results[0].stderr, results[0].stderr
    # (step 2's exchange may still be in flight when rank 2 dies: the step named is the one whose exchange failed)
    assert re.search(r"could not exchange the copies of step [23] with rank 2 ", results[0].stderr), results[0].stderr
    assert [r.json()["confirmed"] for r in (results[1], results[3])] == [3, 3]


@pytest.mark.multirank
def test_a_copy_that_arrives_without_its_step_is_not_kept_and_its_sender_is_told(tmp_path):
    results = _run(tmp_path, 0, "torn")
    assert results[0].returncode != 0, describe(results)
    assert "did not keep rank 0's copy of step 3 (it confirmed -1)" in results[0].stderr, results[0].stderr
    assert all(r.returncode == 0 for r in results[1:]), describe(results)
    # Rank 2 keeps rank 0's copies: steps 2 (and 1, in the other slot) stand, step 3 is not there.
    assert [r.json()["kept"] for r in results[1:]] == [[2, 3], [2], [2, 3]]
