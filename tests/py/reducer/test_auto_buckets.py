"""bucket_mb="auto": buckets cut from the first backward's timeline and the measured cost of an all-reduce
(Note [Buckets that size themselves] in csrc/dtcore/reducer/bucket_plan.h). One 2-rank job
(workers/auto_buckets_worker.py)."""

import pytest

from launch_helpers import run_job

pytestmark = pytest.mark.multirank


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    reports = run_job("auto_buckets_worker.py", 2, tmp_path_factory.mktemp("auto"), timeout=240)
    for report in reports:
        for case, result in report.items():
            assert not (isinstance(result, dict) and "raised" in result), (case, result["raised"])
    return reports


def test_the_auto_plan_trains_as_torch_ddp_on_rank_0s_measurements(ranks):
    for r in ranks:
        j = r["against_ddp"]
        assert j["param_diff"] == 0.0, j
        info = j["info"]
        # (the cost fit is clamped at 0: a loaded machine can measure a slope of 0 per MiB)
        assert info["chosen"] and info["alpha_us"] >= 0 and info["us_per_mib"] >= 0 and info["backward_ms"] > 0, info
        assert not info["device_clock"]  # the host's clock on CPU
        assert 1 <= len(j["buckets"]) <= 64
        assert sorted(i for b in j["buckets"] for i in b) == list(range(j["params"]))
        assert j["bucket_cap"] == 25 * 2**20  # what dynamo splits by before the plan is chosen
    assert ranks[0]["against_ddp"]["buckets"] == ranks[1]["against_ddp"]["buckets"]  # rank 0's plan everywhere


def test_sharded_stages_take_the_auto_plan(ranks):
    for r in ranks:
        for zero, j in r["sharded"].items():
            assert j["chosen"] and j["param_diff"] < 1e-6, (zero, j)


def test_a_graph_that_may_change_keeps_its_first_plan(ranks):
    for r in ranks:
        assert r["find_unused"] == {"dynamic": False, "static": True}


def test_a_checkpoint_keeps_the_plan_and_the_resumed_job_adopts_it(ranks):
    for r in ranks:
        j = r["checkpoint"]
        assert j["adopted"] == j["saved"] and not j["measured_again"], j
        assert j["param_diff"] == 0.0
        assert j["kept_on_resave"] and j["fresh_adopted"]
        assert not j["other_world_adopted"]  # measured at another world size: this job measures its own


def test_what_auto_refuses(ranks):
    j = ranks[0]["refusals"]
    assert j["first_bucket"].startswith("first_bucket_mb=2 with bucket_mb='auto'") and "Fix:" in j["first_bucket"]
    assert j["word"].startswith("bucket_mb='fast' is neither a size in MiB nor 'auto'")
    for r in ranks:  # the probe and the plan are collectives: every rank must choose auto, or none
        message = r["refusals"]["ranks_differ"]
        assert message.startswith("the bucket size (bucket_mb) differs across ranks: rank 1 has"), message
    assert "rank 0 has 'bucket_mb=auto', rank 1 has 'bucket_mb=25'" in ranks[1]["refusals"]["ranks_differ"]


def test_auto_is_the_default_and_deterministic_algorithms_fix_the_default_caps(ranks):
    """Two runs may measure different plans; a process that asked torch for deterministic algorithms
    gets the 25 MiB buckets, the same as bucket_mb=25 (model.bucket_options)."""
    for r in ranks:
        j = r["deterministic"]
        assert j["default_chosen"] and not j["fixed_chosen"], j
        assert j["same_buckets_as_25"] and j["param_diff"] == 0.0, j
        assert j["ranks_differ"].startswith("the bucket size (bucket_mb) differs across ranks"), j["ranks_differ"]
    message = ranks[1]["deterministic"]["ranks_differ"]
    assert (
        "rank 0 has 'bucket_mb=auto', rank 1 has 'bucket_mb=auto, fixed by torch.use_deterministic_algorithms(True)'"
        in message
    )
    assert "call torch.use_deterministic_algorithms alike on every rank" in message
