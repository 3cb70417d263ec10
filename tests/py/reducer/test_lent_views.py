"""Note [Lent bucket views]: after optimizer.zero_grad(set_to_none=True) autograd accumulates straight
into the bucket views, with torch DDP's gradients and None where no rank used a parameter. One 2-rank
job (workers/lent_views_worker.py) against torch DDP on the same batches."""

import pytest

from launch_helpers import run_job

pytestmark = pytest.mark.multirank

USED = ["body.bias", "body.weight", "head.bias", "head.weight"]
NEVER = ["never.bias", "never.weight"]


@pytest.fixture(scope="module")
def ranks():
    reports = run_job("lent_views_worker.py", 2, timeout=120)
    for report in reports:
        result = report["set_to_none_steps"]
        assert "raised" not in result, result["raised"]
    return [r["set_to_none_steps"] for r in reports]


def test_gradients_equal_torch_ddps_and_unused_ones_stay_none(ranks):
    for r in ranks:
        for step in r["steps"]:
            assert step["none"] == step["ddp_none"] == NEVER, step
            assert all(step["equal"][name] for name in USED + ["spare.bias", "spare.weight"]), step["equal"]


def test_autograd_accumulates_into_the_bucket_views(ranks):
    for rank, r in enumerate(ranks):
        # from the second step: the first ends by rebuilding the buckets in the order observed
        for i, step in enumerate(r["steps"][1:], start=1):
            micro_batches = 2 if i == 2 else 1  # the third step accumulates one inside no_sync() first
            used = USED + (["spare.bias", "spare.weight"] if rank == 1 else [])
            for name in used:
                assert step["accumulated_into_grad"][name] == [True] * micro_batches, (rank, i, name, step)
            for name in set(step["accumulated_into_grad"]) - set(used):
                assert step["accumulated_into_grad"][name] == [], (rank, i, name)


def test_the_gradients_keep_their_storage_from_step_to_step(ranks):
    for r in ranks:
        # the buckets are rebuilt once, at the end of the first reduced backward; then they stay
        assert r["steps"][1]["storages"] == r["steps"][2]["storages"]


def test_the_rebuilt_buckets_are_in_memory_every_rank_maps(ranks):
    for r in ranks:  # Note [Buckets in shared memory]: from the rebuild at the end of the first backward
        assert [step["shared"] for step in r["steps"]] == [[True]] * 3
