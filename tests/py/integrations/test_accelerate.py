"""dtcore behind accelerate's prepare (dtcore.integrations.accelerate), against accelerate's own torch
DDP path: 2 ranks started by the real `accelerate launch` from a config file, then a save_state of
those 2 ranks resumed by 1 process. Arguments dtcore cannot honour are refused before anything
starts (in this process)."""

import json
import os
import sys

import pytest
from accelerate.utils import (
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    InitProcessGroupKwargs,
)

import dtcore
from dtcore.integrations.accelerate import Accelerator, DtcorePlugin

from launch_helpers import (
    WORKERS,
    accelerate_launch,
    clean_env,
    describe,
    leftover_processes,
    max_relative,
    run_processes,
)

WORKER = str(WORKERS / "accelerate_prepare_worker.py")
RTOL = 1e-6  # fp32: the same sums in another order (reduce-scatter and all-gather against one all-reduce)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The train job's report of each rank, and its output folder."""
    out = tmp_path_factory.mktemp("accelerate")
    results, sessions = run_processes([[*accelerate_launch(out), WORKER, "train", str(out)]], [clean_env()], timeout=90)
    assert not leftover_processes(sessions)
    assert results[0].returncode == 0, describe(results)
    return [json.loads((out / f"train_{rank}.json").read_text()) for rank in (0, 1)], out


@pytest.mark.multirank
def test_every_zero_stage_trains_as_accelerates_ddp_under_accelerate_launch(launched):
    reports, _ = launched
    for r in reports:
        assert r["distributed_type"] == "DistributedType.MULTI_CPU" and r["num_processes"] == 2, r
        assert r["bad"] == [], r["bad"]  # unwrap_model, get_state_dict, save_model
        ddp = r["ddp"]
        assert ddp["model"] == "DistributedDataParallel"
        assert len(ddp["losses"]) == 20 and len(ddp["norms"]) == 10  # 20 micro-steps, 10 optimizer steps
        for zero, model, optimizer in (
            (0, "DistributedModel", "AdamW"),
            (1, "DistributedModel", "ShardedOptimizer"),
            (2, "DistributedModel", "ShardedOptimizer"),
            (3, "FullyShardedModel", "ShardedOptimizer"),
        ):
            run = r[f"zero{zero}"]
            assert (run["model"], run["optimizer"], run["scheduler_follows"]) == (model, optimizer, True), run
            assert max_relative(run["losses"], ddp["losses"]) < RTOL, (zero, run["losses"], ddp["losses"])
            # clip_grad_norm_
            assert max_relative(run["norms"], ddp["norms"]) < RTOL, (zero, run["norms"], ddp["norms"])
            assert run["state_max_diff"] < 1e-5 and run["lr"] == pytest.approx(0.02 / 3), run
            assert run["checkpointed"] == [zero in (1, 3)] * 2, run  # DtcorePlugin(activation_checkpointing="all")
    # dtcore checkpointed the model and its optimizer; accelerate the scheduler and the RNG states only
    assert reports[0]["saved"] == ["dtcore_model_0", "random_states_0.pkl", "random_states_1.pkl", "scheduler.bin"]


@pytest.mark.multirank
def test_save_state_of_two_ranks_resumes_at_one_with_the_same_losses(launched):
    reports, out = launched
    cmd = [sys.executable, WORKER, "resume", str(out)]
    results, sessions = run_processes([cmd], [clean_env()], timeout=60)
    assert not leftover_processes(sessions)
    assert results[0].returncode == 0, describe(results)
    resumed = json.loads((out / "resume_0.json").read_text())
    assert resumed["num_processes"] == 1 and resumed["checkpoint"]
    assert max_relative(resumed["losses"], reports[0]["zero2"]["losses"][10:]) < RTOL, resumed["losses"]
    assert resumed["lr"] == pytest.approx(0.02 / 3)
    clip, lbfgs = resumed["errors"]["clip_some"], resumed["errors"]["lbfgs"]
    assert "clip_grad_norm_ got 1 of the 12 trainable parameters of a DtcorePlugin(zero=2)" in clip
    assert "Fix: pass model.parameters()" in clip
    assert "cannot tell whether LBFGS updates each element on its own" in lbfgs
    assert "clip_grad_value_ of a DtcorePlugin(zero=2) model" in resumed["errors"]["clip_value"]
    assert "Fix: clip by norm" in resumed["errors"]["clip_value"]
    assert resumed["errors"]["norm_after_free_memory"] > 0


@pytest.mark.parametrize(
    ("kwargs", "env", "expected"),
    [
        ({"fsdp_plugin": FullyShardedDataParallelPlugin()}, {}, "fsdp_plugin=FullyShardedDataParallelPlugin(...)"),
        ({}, {"ACCELERATE_USE_DEEPSPEED": "true"}, "ACCELERATE_USE_DEEPSPEED=true (set by accelerate launch"),
        ({"mixed_precision": "fp16", "dtcore_plugin": DtcorePlugin(zero=2)}, {}, "DtcorePlugin(zero=0) for fp16"),
        ({}, {"ACCELERATE_MIXED_PRECISION": "fp8"}, "ACCELERATE_MIXED_PRECISION='fp8'"),
        ({"dynamo_backend": "inductor"}, {}, "dynamo backend 'inductor'. Fix: leave dynamo_backend unset"),
        (
            {"kwargs_handlers": [DistributedDataParallelKwargs(bucket_cap_mb=10)]},
            {},
            "Fix: pass DtcorePlugin(bucket_mb=",
        ),
        ({"kwargs_handlers": [InitProcessGroupKwargs()]}, {}, "Fix: call dtcore.init(timeout=...) before"),
    ],
)
def test_what_dtcore_cannot_honour_is_refused_before_anything_starts(monkeypatch, kwargs, env, expected):
    for name in [n for n in os.environ if n.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(dtcore.ConfigError, match="dtcore.integrations.accelerate.Accelerator with") as e:
        Accelerator(**kwargs)
    assert expected in str(e.value)
    assert not dtcore.is_initialized()  # refused before dtcore.init
