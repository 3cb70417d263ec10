"""zero=3 checkpoints (real processes, Gloo): each rank writes and reads only its shards' ranges, and
a checkpoint reshards across world sizes and every ZeRO stage, bitwise. The model (zero3_worker's
Quirks) has a tied embedding and head, frozen parameters, BatchNorm buffers and a non-persistent
buffer."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import dtcore
from dtcore.checkpoint.load import read_flat

from launch_helpers import run_job


def _run(world, *args):
    return run_job("checkpoint_worker.py", world, *args, timeout=180)


def _load(tmp_path, world, zeros, *options):
    for j in _run(world, "load", tmp_path, zeros, "quirks", *options):
        assert j["bad"] == [], (world, zeros, j)


@pytest.mark.multirank
def test_a_zero3_checkpoint_loads_at_other_world_sizes_and_into_every_stage(tmp_path):
    _run(4, "save", tmp_path, 3, "quirks")
    # export reads logical tensors: the shards of 4 ranks make whole ones, a tied pair under both keys
    exported = load_file(dtcore.checkpoint.export(tmp_path, tmp_path / "export.safetensors"))
    reference = {k.removeprefix("model/"): v for k, v in load_file(tmp_path / "reference.safetensors").items()}
    reference = {k: v for k, v in reference.items() if "/" not in k}  # the model's, not the optimizer's
    assert set(exported) == set(reference) and "head.weight" in exported and "scratch" not in exported
    assert all(exported[k].dtype == v.dtype and torch.equal(exported[k], v) for k, v in reference.items())
    _load(tmp_path, 1, "3,0")
    _load(tmp_path, 2, "3,1", "errors")  # errors: the exported file into zero=3, and what is refused
    _load(tmp_path, 3, "3,2")


@pytest.mark.multirank
def test_a_zero2_checkpoint_loads_into_zero3(tmp_path):
    # and a zero=0 one: test_resharding.py (its replicated layout is zero=2's for the model)
    _run(2, "save", tmp_path, 2, "quirks")
    _load(tmp_path, 3, "3")


class _Counted:
    """A safetensors slice that counts the elements read through it."""

    def __init__(self, where):
        self.where, self.read = where, 0

    def __getitem__(self, index):
        out = self.where[index]
        self.read += out.numel()
        return out


def test_a_range_of_a_flattened_tensor_reads_that_range_and_nothing_else(tmp_path):
    # as _load_weights_file reads a zero=3 shard's part of each parameter from a plain weights file
    tensors = {"cube": torch.arange(2 * 3 * 4.0).reshape(2, 3, 4), "row": torch.arange(5.0), "one": torch.tensor(7.0)}
    save_file(tensors, tmp_path / "t.safetensors")
    with safe_open(tmp_path / "t.safetensors", framework="pt") as f:
        for key, value in tensors.items():
            flat = value.reshape(-1)
            for lo in range(flat.numel()):
                for hi in range(lo + 1, flat.numel() + 1):
                    where = _Counted(f.get_slice(key))
                    assert torch.equal(read_flat(where, tuple(value.shape), lo, hi), flat[lo:hi]), (key, lo, hi)
                    assert where.read == hi - lo, (key, lo, hi)
