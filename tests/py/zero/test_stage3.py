"""zero=3 on real processes: dtcore.wrap(zero=3) + ShardedOptimizer train as torch DDP + AdamW does."""

import pytest

from launch_helpers import run_job


def _run(world, *args):
    return run_job("zero3_worker.py", world, *args, timeout=240)


@pytest.mark.multirank
@pytest.mark.parametrize(
    "world,model,options",
    [
        (2, "gpt", ()),
        (2, "quirks", ()),  # tied embedding and head, a frozen parameter, one used twice, BatchNorm buffers
        (3, "quirks", ("unused", "accum")),  # shards padded to 3; find_unused_parameters; no_sync
        (4, "gpt", ("checkpoint",)),  # checkpoint_activations: the recompute gathers again
        (2, "quirks", ("noreshard", "prefetch0", "meta")),  # kept for backward; no prefetch; built on meta
    ],
)
def test_ten_clipped_adamw_steps_equal_torch_ddp(world, model, options):
    for j in _run(world, "parity", model, *options):
        assert j["bad"] == [], j


@pytest.mark.multirank
def test_compile_whole_model_runs_eagerly_and_units_compile():
    """Note [zero=3 and torch.compile]: the gradients of eager training, at one rank (exact comparison)."""
    for j in run_job("zero3_worker.py", 1, "compile", timeout=300):
        assert j["bad"] == [], j


@pytest.mark.multirank
@pytest.mark.parametrize("mode", ["bf16", "units", "eval", "state", "refusals", "diverge", "unused_error"])
def test_stage3_behaviour(mode):
    """bf16: param_dtype=bf16 computes in bf16 from fp32 shards; units: what units= selects; eval:
    no_grad forwards gather and free, then training goes on; state: whole state_dict, a load shards
    it; refusals: what zero=3 cannot honour; diverge: ranks running different units raise inside
    backward; unused_error: a parameter without gradient on one rank raises in every rank's backward."""
    for j in _run(2, mode):
        assert j["bad"] == [], j
