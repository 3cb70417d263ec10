"""dtcore.DistributedDataParallel over proper subgroups (4 ranks on loopback, Gloo): the data-parallel
pairs {0,2} and {1,3} beside "tensor parallelism", a 2-D DeviceMesh's dp dimension and new_subgroups,
each against torch DDP over the same torch group; a dead member named by its job rank; the refusal
of a group this rank is not in; shutdown closing every communicator (workers/subgroup_worker.py)."""

import pytest

from launch_helpers import clean_env, describe, free_port, leftover_processes, run_job, run_ranks, torchrun_style

pytestmark = pytest.mark.multirank


@pytest.fixture(scope="module")
def ranks():
    return run_job("subgroup_worker.py", 4, "compare", timeout=240)


@pytest.mark.parametrize("case", ["pairs", "mesh", "new_subgroups"])
def test_gradients_are_torch_ddps_over_the_same_subgroup(ranks, case):
    for r in ranks:
        j = r[case]
        assert r["rank"] in j["ranks"] and len(j["ranks"]) == 2, j
        assert j["diff"] < 1e-6, j  # what torch DDP computes over that group
        assert j["weight_diff"] < 1e-6, j
        first = j["ranks"][0]
        assert j["buffer"] == [float(first), float(first)], j  # broadcast from the group's first rank, as torch's
    groups = {}
    for r in ranks:
        groups.setdefault(tuple(r[case]["ranks"]), []).append(r[case]["grad0"])
    assert len(groups) == 2, groups
    (a, b), (c, d) = groups.values()
    assert a == b and c == d  # averaged within a group...
    assert a != c  # ...and over that group only: the other group's data differs


def test_the_pairs_are_the_ones_asked_for(ranks):
    for r in ranks:
        assert r["pairs"]["ranks"] == [r["rank"] % 2, r["rank"] % 2 + 2]
        assert r["new_subgroups"]["ranks"] == [r["rank"] // 2 * 2, r["rank"] // 2 * 2 + 1]
        assert r["mesh"]["device_mesh"]
        # the group's own communicator: its rank is the index in the group's rank list
        assert r["communicator"] == {"ranks": r["pairs"]["ranks"], "rank": r["rank"] // 2, "size": 2}


def test_a_group_this_rank_is_not_in_is_refused_by_name(ranks):
    for r in ranks:
        e = r["refused"]
        assert e is not None
        assert f"on rank {r['rank']} got torch.distributed.GroupMember.NON_GROUP_MEMBER" in e, e
        assert f"rank {r['rank']} is not in that group" in e and "Fix: pass each rank the group it belongs to" in e


def test_shutdown_closes_every_subgroup_communicator(ranks):
    for r in ranks:
        # the pairs, the mesh's dp pair and new_subgroups' pair: three communicators, all closed
        assert r["shutdown"] == {"groups": 3, "closed": [True, True, True], "left": 0}, r["shutdown"]


def test_a_dead_member_is_named_by_its_job_rank_on_its_groups_survivor():
    port, timeout = free_port(), 6.0
    envs = [clean_env(**torchrun_style(rank, 4, port)) for rank in range(4)]
    results, sessions = run_ranks("subgroup_worker.py", envs, args=("die", str(timeout)), timeout=120)
    for rank in (1, 3):  # the other pair trains on
        assert results[rank].json()["ok"], describe(results)
    j = results[0].json()
    assert not j["ok"] and j["type"] == "CommError", describe(results)
    message = j["message"]
    assert "health check on rank 0:" in message, message
    assert "rank 2 (host " in message and "root cause: rank 2 (dead)" in message, message  # its job rank
    assert "rank 1 (host " not in message, message  # not its rank in the group, nor a rank outside it
    assert j["seconds"] < timeout + 5, j
    assert leftover_processes(sessions) == []
