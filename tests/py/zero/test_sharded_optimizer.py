"""ZeRO-1/2 on real processes: dtcore.wrap(zero=1|2) + ShardedOptimizer train as unsharded training does."""

import pytest

from launch_helpers import run_job


def _run(world, *args):
    return run_job("zero_worker.py", world, *args, timeout=240)


@pytest.mark.multirank
@pytest.mark.parametrize(
    "world,zero,options",
    [
        (2, 1, ("clip",)),
        (2, 2, ("clip",)),
        (2, 2, ("bf16", "accum")),  # bf16 parameters, fp32 master shards; no_sync over 2 micro-batches
        (2, 1, ("bf16", "clip")),
        (3, 2, ("clip",)),  # buckets padded to a multiple of 3
        (4, 1, ("accum",)),
        (4, 2, ("clip", "accum")),
    ],
)
def test_fifty_adamw_steps_equal_unsharded_training(world, zero, options):
    for j in _run(world, "parity", zero, *options):
        assert j["bad"] == [], j
        assert j["lr"] == pytest.approx(3e-3)  # the scheduler's warmup reached the inner optimizer
        if "clip" in options and world == 2:
            assert j["clipped_steps"] > 0, j  # the clipping branch ran


@pytest.mark.multirank
@pytest.mark.parametrize("zero", [1, 2])
def test_state_dict_is_torchs_format_and_a_plain_optimizers_state_loads(zero):
    for j in _run(2, "state", zero):
        assert j["bad"] == [], j


@pytest.mark.multirank
@pytest.mark.parametrize("zero", [1, 2])
def test_find_unused_parameters_with_zero_trains_as_unsharded(zero):
    for j in _run(2, "unused", zero):
        assert j["bad"] == [], j


@pytest.mark.multirank
@pytest.mark.parametrize("zero", [1, 2])
def test_a_parameter_no_rank_gave_a_gradient_is_skipped_as_torch_ddp_skips_it(zero):
    for j in _run(2, "skipped", zero):
        assert j["bad"] == [], j


@pytest.mark.multirank
@pytest.mark.parametrize("zero", [1, 2])
def test_frozen_parameters_are_accepted_and_never_stepped_as_torchs_optimizers_skip_them(zero):
    for j in _run(2, "frozen", zero):
        assert j["bad"] == [], j
        # one unfrozen after wrapping has no bucket: neither averaged nor stepped, so refused
        assert "parameter 'embed.weight', which requires grad now but was frozen when" in j["unfrozen"], j
        assert "Fix: " in j["unfrozen"]


@pytest.mark.multirank
def test_what_cannot_be_right_is_refused():
    for j in _run(2, "refusals"):
        e = j["errors"]
        assert "zero=0" in e["zero0"] and "dtcore.wrap(model, zero=1)" in e["zero0"], e
        assert "Adafactor" in e["adafactor"] and "elementwise=True" in e["adafactor"], e
        assert "needs the wrapped model, got TinyLM" in e["unwrapped"], e
        assert "zero=4" in e["stage4"] and "Fix:" in e["stage4"], e
        # a plain torch optimizer on a zero=2 model would change nothing: refused at its step
        assert "AdamW.step()" in e["plain_optimizer"] and "dtcore.ShardedOptimizer" in e["plain_optimizer"], e
