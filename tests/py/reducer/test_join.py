"""Uneven inputs: model.join() with ranks of 3 and 5 batches matches torch DDP's join on the same data."""

import pytest

from launch_helpers import run_job


@pytest.mark.multirank
def test_join_with_3_and_5_batches_matches_torch_ddp():
    results = run_job("join_worker.py", 2, timeout=120)
    for j in results:
        cases = j["grad_diff"].keys()
        assert set(cases) == {
            "default",
            "divide_by_initial_world_size=False",
            "allreduce_hook",
            "find_unused_parameters",
        }, j
        for case in cases:
            assert j["steps"][case] == 3 + 2 * j["rank"]
            assert j["grad_diff"][case] == 0.0, (case, j)  # the same arithmetic as torch DDP
            assert j["final_diff"][case] == 0.0, (case, j)
            assert j["same_on_every_rank"][case], (case, j)
        assert "join) with zero=1 are not supported" in j["zero_refused"] and "Fix:" in j["zero_refused"]
