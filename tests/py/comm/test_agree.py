"""dtcore.comm.agree, the one "same on every rank?" exchange, on real ranks."""

import pytest

from launch_helpers import run_job

pytestmark = pytest.mark.multirank


def _run(world, mode):
    return run_job("agree_worker.py", world, mode, timeout=90)


def test_gather_and_maximum_and_agreement_on_three_ranks():
    for j in _run(3, "agree"):
        assert j["gathered"] == [{"rank": r, "text": "x" * (10 * r)} for r in range(3)]
        assert j["maximum"] == [2.0, 0.0, 0.5]
        assert j["error"] is None


def test_a_difference_is_an_error_on_every_rank_naming_rank_and_first_difference():
    results = _run(3, "differ")
    for j in results:
        assert (
            j["error"] is not None and "the test model differs across ranks: rank 1 has other parameters" in j["error"]
        ), j
        assert j["error"].endswith("Fix: build the same model."), j
    assert (
        "First difference, parameter #1: rank 0 has 'layer.1 (4, 4)', rank 1 has 'layer.1 (4, 8)'"
        in results[1]["error"]
    )
