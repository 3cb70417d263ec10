"""Checkpoints saved at N ranks load at M, across ZeRO stages, bitwise (real processes, Gloo)."""

import pytest

from launch_helpers import run_job


def _run(world, *args):
    return run_job("checkpoint_worker.py", world, *args, timeout=180)


@pytest.mark.multirank
@pytest.mark.parametrize(
    "saved,loads",
    [
        ((2, 2), [(1, 0), (3, 1), (4, 2)]),  # ZeRO-2 at 2 ranks into a plain optimizer, ZeRO-1 at 3, ZeRO-2 at 4
        ((4, 1), [(2, 2)]),
        ((3, 0), [(2, "2,3")]),  # a plain torch AdamW's checkpoint into ShardedOptimizer, over zero=2 and zero=3
    ],
)
def test_saved_at_n_ranks_loads_at_m_bitwise(tmp_path, saved, loads):
    world, zero = saved
    _run(world, "save", tmp_path, zero)
    for world, zero in loads:
        for j in _run(world, "load", tmp_path, zero):
            assert j["bad"] == [], (saved, world, zero, j)
            assert j["step"] == 5


@pytest.mark.multirank
def test_bf16_parameters_keep_their_fp32_master_across_world_sizes(tmp_path):
    _run(2, "save", tmp_path, 2, "bf16")
    for j in _run(3, "load", tmp_path, 1, "bf16"):
        assert j["bad"] == [], j  # the reference holds the fp32 master: compared too
