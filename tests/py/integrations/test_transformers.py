"""dtcore behind Hugging Face's Trainer (dtcore.integrations.transformers), against the stock Trainer's torch
DDP: one 2-rank job on loopback (workers/transformers_trainer_worker.py) trains a GPT-2 of a small config
each way (dtcore at zero=0, 2 and 3, fp32 and bf16), checkpoints, resumes, evaluates and saves; one process
resumes its checkpoints; `accelerate launch` starts the Trainer on dtcore. TrainingArguments dtcore cannot
honour are refused as the Trainer is built (in this process)."""

import json
import sys

import pytest
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import dtcore
from dtcore.integrations.transformers import DtcorePlugin, Trainer

from launch_helpers import (
    WORKERS,
    accelerate_launch,
    clean_env,
    describe,
    free_port,
    leftover_processes,
    max_relative,
    run_processes,
    run_ranks,
    torchrun_style,
)

WORKER = str(WORKERS / "transformers_trainer_worker.py")
RTOL = 1e-6  # fp32: the same sums in another order (reduce-scatter and all-gather against one all-reduce)
# bf16 autocast: matmuls round their inputs to 8 bits (2^-8 = 3.9e-3 relative). The step-1 losses are bitwise
# equal; from step 2, fp32 gradients reduced in another order (1e-7 apart) flip some of those roundings: measured
# 3e-5 over 20 steps, bounded at 2e-4 (5 % of one bf16 rounding). A run without autocast is caught at step 1.
RTOL_BF16 = 2e-4
STEPS, SAVE_EVERY = 20, 5  # as the worker's


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Each rank's report of the 2-rank job, and its output folder (its checkpoints)."""
    out = tmp_path_factory.mktemp("trainer")
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("transformers_trainer_worker.py", envs, args=(str(out),), timeout=150)
    assert not leftover_processes(sessions)
    assert all(r.returncode == 0 for r in results), describe(results)
    return [json.loads((out / f"report_{rank}.json").read_text()) for rank in (0, 1)], out


@pytest.fixture(scope="module")
def reports(job):
    return job[0]


@pytest.mark.multirank
def test_every_step_loss_at_every_zero_stage_equals_the_stock_trainers_ddp(reports):
    for r in reports:
        ddp = r["ddp"]
        assert ddp["model"] == "DistributedDataParallel" and len(ddp["losses"]) == STEPS
        assert ddp["losses"][-1] < ddp["losses"][0] - 0.2  # it learns: the comparison is not of constants
        assert r["zero0"]["model"] == "DistributedModel"
        assert r["zero0"]["plugin"] == [0, True, 1.0]  # from ddp_find_unused_parameters=True, ddp_bucket_cap_mb=1
        assert (r["zero2"]["model"], r["zero2"]["optimizer"]) == ("DistributedModel", "ShardedOptimizer")
        assert (r["zero3"]["model"], r["zero3"]["optimizer"]) == ("FullyShardedModel", "ShardedOptimizer")
        for zero in (0, 2, 3):
            ours = r[f"zero{zero}"]["losses"]
            assert max_relative(ours, ddp["losses"]) < RTOL, (zero, ours, ddp["losses"])
        accumulate = r["accumulate"]  # gradient_accumulation_steps=2, the script's own optimizer and scheduler
        assert len(accumulate["ddp"]) == STEPS and accumulate["ddp"] != ddp["losses"], accumulate
        assert max_relative(accumulate["zero2"], accumulate["ddp"]) < RTOL, accumulate
        # the scheduler steps the ShardedOptimizer that replaced the optimizer it was built over, and torch sees it
        assert accumulate["scheduler_over"] == "ShardedOptimizer" and not accumulate["warned"], accumulate


@pytest.mark.multirank
def test_resume_from_a_mid_run_checkpoint_gives_the_uninterrupted_losses(reports):
    for r in reports:
        for zero in (2, 3):  # dtcore's sharded checkpoint sits in the Trainer's folder, in place of optimizer.pt
            files = r[f"zero{zero}"]["checkpoint5"]
            assert r[f"zero{zero}"]["dtcore_manifest"] and "optimizer.pt" not in files, (zero, files)
            assert {"config.json", "dtcore", "scheduler.pt", "trainer_state.json"} <= set(files), (zero, files)
        # The whole weights at zero=2 (from_pretrained loads the folder), none at zero=3: its dtcore shards, ungathered
        assert "model.safetensors" in r["zero2"]["checkpoint5"]
        assert "model.safetensors" not in r["zero3"]["checkpoint5"]
        after = r["zero2"]["losses"][SAVE_EVERY:]
        # zero=2 from its own checkpoint, zero=1 and zero=3 from zero=2's, zero=2 from the stock Trainer's
        assert sorted(r["resumed"]) == ["zero1", "zero2", "zero2_from_ddp", "zero3"]
        for name, resumed in r["resumed"].items():
            assert max_relative(resumed, after) < RTOL, (name, resumed, after)


@pytest.mark.multirank
def test_save_model_writes_whole_weights_and_evaluate_runs(reports):
    for zero in (2, 3):
        for r in reports:
            assert r[f"zero{zero}"]["saved_mismatched"] == []  # from_pretrained of save_model's: the trained weights
            assert 0 < r[f"zero{zero}"]["eval_loss"] < r["ddp"]["losses"][0]
        assert reports[0][f"zero{zero}"]["eval_loss"] == reports[1][f"zero{zero}"]["eval_loss"]  # gathered
    assert reports[0]["zero3"]["eval_loss"] == pytest.approx(reports[0]["zero2"]["eval_loss"], rel=RTOL)


@pytest.mark.multirank
def test_load_best_model_at_end_brings_back_an_earlier_checkpoints_weights_at_zero_3(reports):
    for r in reports:
        best = r["best"]
        assert best["checkpoint"] == f"checkpoint-{SAVE_EVERY}" and len(best["evaluated"]) == STEPS // SAVE_EVERY
        assert best["evaluated"][0] == max(best["evaluated"]) > best["evaluated"][-1], best
        assert best["eval_loss"] == pytest.approx(best["evaluated"][0], rel=RTOL), best
        # save_only_model: the model's shards alone, no gathered weights, no optimizer, scheduler or RNG states
        assert "model.safetensors" not in best["checkpoint5"] and "scheduler.pt" not in best["checkpoint5"], best
        assert "dtcore" in best["checkpoint5"], best


@pytest.mark.multirank
def test_bf16_at_zero_2_follows_the_stock_trainers_bf16(reports):
    for r in reports:
        bf16, fp32 = r["bf16"], r["ddp"]["losses"]
        assert bf16["ddp"][0] != fp32[0] and bf16["zero2"][0] == bf16["ddp"][0], (bf16, fp32)  # autocast, both
        assert max_relative(bf16["zero2"], bf16["ddp"]) < RTOL_BF16, bf16


@pytest.mark.multirank
def test_a_checkpoint_of_two_ranks_resumes_at_one_process_with_the_uninterrupted_losses(job):
    reports, out = job
    results, sessions = run_processes([[sys.executable, WORKER, str(out), "alone"]], [clean_env()], timeout=60)
    assert not leftover_processes(sessions)
    assert results[0].returncode == 0, describe(results)
    alone = json.loads((out / "alone.json").read_text())
    assert alone["world_size"] == 1
    # gradient_accumulation_steps=2 at one process: the global batch of 8 that 2 ranks of 4 trained with
    assert max_relative(alone["zero2"], reports[0]["zero2"]["losses"][SAVE_EVERY:]) < RTOL, alone["zero2"]
    # zero=3's checkpoint has its weights only in its dtcore folder; resumed at zero=0
    assert max_relative(alone["zero3"], reports[0]["zero3"]["losses"][SAVE_EVERY:]) < RTOL, alone["zero3"]
    assert len(alone["warnings"]) == 2 and all("saved by 2 processes and resumes at 1" in w for w in alone["warnings"])
    batch, epoch = alone["refused"]["batch"], alone["refused"]["epoch"]
    assert "saved with a global batch of 8 (2 processes x per_device_train_batch_size 4 x" in batch, batch
    assert "this run's is 4 (1 process x per_device_train_batch_size 4 x gradient_accumulation_steps 1)" in batch
    assert batch.endswith("Fix: gradient_accumulation_steps=2, which gives the global batch of 8."), batch
    assert "an epoch was 10 optimizer steps there and is 11 here" in epoch, epoch
    assert "Fix: resume at 2 processes with the same dataset, or give the dataset a multiple of 8 samples." in epoch


@pytest.mark.multirank
def test_accelerate_launch_starts_the_trainer_on_dtcore(job, tmp_path):
    reports, _ = job
    cmd = [*accelerate_launch(tmp_path), WORKER, str(tmp_path), "launched"]
    results, sessions = run_processes([cmd], [clean_env()], timeout=90)
    assert not leftover_processes(sessions)
    assert results[0].returncode == 0, describe(results)
    for rank in (0, 1):
        launched = json.loads((tmp_path / f"launched_{rank}.json").read_text())
        assert launched["distributed_type"] == "DistributedType.MULTI_CPU" and launched["num_processes"] == 2
        assert "ACCELERATE_MIXED_PRECISION" in launched["accelerate_env"], launched  # accelerate launch's, not ours
        assert (launched["model"], launched["optimizer"]) == ("DistributedModel", "ShardedOptimizer"), launched
        # the same losses as the torchrun-style job's zero=2 run
        assert max_relative(launched["losses"], reports[rank]["zero2"]["losses"]) < RTOL, launched["losses"]


@pytest.mark.parametrize(
    ("kwargs", "zero", "expected"),
    [
        ({"fsdp": "full_shard"}, 0, "TrainingArguments(fsdp=True): it would wrap the model too. Fix: drop fsdp."),
        ({"torch_compile": True}, 0, "TrainingArguments(torch_compile=True)"),
        ({"fp16": True}, 1, "Fix: use bf16=True (no scaler), or DtcorePlugin(zero=0) for fp16."),
        ({"ddp_static_graph": True}, 0, "Fix: leave ddp_static_graph unset."),
        ({"ddp_broadcast_buffers": False}, 0, "Fix: leave ddp_broadcast_buffers unset."),
        ({"auto_find_batch_size": True}, 2, "Fix: set per_device_train_batch_size yourself"),
    ],
)
def test_what_dtcore_cannot_honour_is_refused_as_the_trainer_is_built(tmp_path, kwargs, zero, expected):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8))
    with pytest.raises(dtcore.ConfigError, match="dtcore.integrations.transformers.Trainer with") as e:
        Trainer(model=model, args=args, dtcore_plugin=DtcorePlugin(zero=zero))
    assert expected in str(e.value)
    assert not dtcore.is_initialized()  # refused before dtcore.init
