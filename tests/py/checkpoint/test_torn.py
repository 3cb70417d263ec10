"""A rank SIGKILLed at a random point of a save: loading yields the previous or the new checkpoint,
whole, never a mixture (real processes, Gloo). And an asynchronous save holds the state of its
call while training goes on, and is completed by the process's exit."""

import sys

import pytest
import torch
from safetensors.torch import load_file

import dtcore

from launch_helpers import WORKERS, clean_env, describe, free_port, leftover_processes, run_ranks, torchrun_style

sys.path.insert(0, str(WORKERS))
from checkpoint_worker import differences, tiny_model

TRIALS = 20  # zero=2's; zero=3 writes through the same path (its shards as chunks): one trial checks it


def _loaded_state(path):
    """The checkpoint's model and optimizer state, loaded here (one process) into a plain AdamW."""
    model = tiny_model()
    groups = [
        {"params": [p for p in model.parameters() if p.dim() > 1]},
        {"params": [p for p in model.parameters() if p.dim() <= 1]},
    ]
    opt = torch.optim.AdamW(groups)
    got = dtcore.load_checkpoint(path, model=model, optimizer=opt)
    state = {f"model/{k}": v for k, v in model.state_dict().items()}
    for i, entry in opt.state_dict()["state"].items():
        state.update({f"optim/{i}/{k}": v for k, v in entry.items() if isinstance(v, torch.Tensor)})
    return got["step"], state


@pytest.mark.multirank
@pytest.mark.parametrize("zero,trials", [(2, TRIALS), (3, 1)])
def test_a_rank_killed_mid_save_leaves_the_previous_or_the_new_checkpoint(tmp_path, zero, trials):
    outcomes = []
    for trial in range(trials):
        directory = tmp_path / f"trial{trial}"
        directory.mkdir()
        port = free_port()
        envs = [clean_env(**torchrun_style(r, 2, port)) for r in range(2)]
        results, sessions = run_ranks(
            "checkpoint_worker.py", envs, ("torn", str(directory), str(trial), str(zero)), timeout=90
        )
        assert leftover_processes(sessions) == []
        victim = trial % 2
        assert results[victim].returncode == -9, describe(results)  # its timer fires during or after the save
        step, state = _loaded_state(directory)
        assert step in (1, 2), describe(results)
        reference = load_file(directory / f"reference_{step}.safetensors")
        assert differences(reference, state, skip_master=True) == [], (trial, step)
        outcomes.append(step)
    if trials == TRIALS:  # the kills landed at different points of the save: both outcomes occurred
        assert set(outcomes) == {1, 2}, outcomes


@pytest.mark.multirank
@pytest.mark.parametrize("zero", [2, 3])
def test_an_async_save_holds_its_calls_state_and_exit_completes_it(tmp_path, zero):
    port = free_port()
    envs = [clean_env(**torchrun_style(r, 2, port)) for r in range(2)]
    results, sessions = run_ranks("checkpoint_worker.py", envs, ("async", str(tmp_path), str(zero)), timeout=90)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert leftover_processes(sessions) == []
    step, state = _loaded_state(tmp_path)
    assert step == 3
    assert differences(load_file(tmp_path / "reference.safetensors"), state, skip_master=True) == []
