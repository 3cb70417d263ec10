"""copy.deepcopy and torch.save/torch.load of a wrapped model, as torch DDP's: the copy has a
reducer of its own on the current context, or says at use that it has none."""

import copy
import subprocess
import sys
import textwrap

import pytest
import torch

import dtcore

from launch_helpers import clean_env, run_job


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


@pytest.mark.multirank
def test_an_ema_deepcopy_and_a_loaded_copy_train_and_average_as_the_original():
    for j in run_job("copy_worker.py", 2):
        assert j["bad"] == [], j
        assert j["reductions"] == [5, 3, 3], j  # original: 2 steps before the copies, 3 after; each copy 3


@pytest.mark.parametrize("zero", [0, 2])
def test_a_deepcopy_is_a_wrapped_model_with_its_own_reducer(fresh_dtcore, zero):
    dtcore.init(timeout=30)
    model = dtcore.DistributedDataParallel(mlp()) if zero == 0 else dtcore.wrap(mlp(), zero=zero)
    twin = copy.deepcopy(model)
    assert type(twin) is type(model) and twin._reducer is not model._reducer and twin.zero == zero
    assert all(p is not q and torch.equal(p, q) for p, q in zip(twin.parameters(), model.parameters()))
    twin(torch.ones(2, 3)).sum().backward()
    assert twin._reducer.reductions == 1 and model._reducer.reductions == 0
    if zero == 0:
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # the original's untouched
        assert all(p.grad is not None for p in twin.parameters())
    with pytest.raises(dtcore.ConfigError, match="already wrapped by dtcore's"):
        dtcore.wrap(twin)  # a copy is a wrapper too


def test_a_model_unpickled_without_dtcore_says_so_at_use(fresh_dtcore, tmp_path):
    dtcore.init(timeout=30)
    torch.save(dtcore.wrap(mlp()), tmp_path / "model.pt")
    script = textwrap.dedent(
        f"""
        import torch, dtcore
        model = torch.load({str(tmp_path / "model.pt")!r}, weights_only=False)
        model.module(torch.ones(2, 3))  # the plain module needs no context
        try:
            model(torch.ones(2, 3))
        except dtcore.ConfigError as e:
            print("ERROR", e)
        dtcore.init(timeout=30)
        model(torch.ones(2, 3)).sum().backward()  # a context now: the reducer is built at first use
        print("REDUCED", model._reducer.reductions)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (
        "ERROR this DistributedModel of Sequential was unpickled in a process without a dtcore context, so it has "
        "no reducer to average its gradients. Fix: call dtcore.init() before using it" in done.stdout
    ), done.stdout
    assert "REDUCED 1" in done.stdout, done.stdout
