"""What a checkpoint refuses: incomplete, truncated, altered and pickle-carrying files, models and
optimizers that do not fit, values that would need pickle. In one process (no launcher: world 1)."""

import argparse
import collections
import json
import os
import pickle

import pytest
import torch
from safetensors.torch import load_file

import dtcore
from dtcore.checkpoint import manifest


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _trained(seed=0):
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 6)).square().sum().backward()
        opt.step()
    return model, opt


def _save(directory, step, seed=0):
    model, opt = _trained(seed)
    dtcore.save_checkpoint(directory / f"step_{step}", model=model, optimizer=opt, step=step)
    return model, opt


def _file(directory):
    return directory / manifest.file_name(0)


def test_round_trip_in_one_process_without_init(tmp_path):
    model, opt = _trained()
    extra = {"sched": {"last_epoch": 3, "lrs": [0.1, 0.2]}, 7: (1, "x"), "t": torch.arange(4), "nan": float("inf")}
    dtcore.save_checkpoint(tmp_path / "c", model=model, optimizer=opt, step=2, extra=extra, rank_extra=[1, 2])
    other, other_opt = _trained(seed=1)
    got = dtcore.load_checkpoint(tmp_path / "c", model=other, optimizer=other_opt)
    assert got["step"] == 2 and got["rank_extra"] == [1, 2] and got["path"] == str(tmp_path / "c")
    assert (
        got["extra"]["sched"] == extra["sched"] and got["extra"][7] == (1, "x") and got["extra"]["nan"] == float("inf")
    )
    assert torch.equal(got["extra"]["t"], extra["t"])
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    for i, entry in opt.state_dict()["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, other_opt.state_dict()["state"][i][key])


def test_a_directory_of_steps_gives_the_newest_complete_one(tmp_path):
    _save(tmp_path, 10)
    _save(tmp_path, 20, seed=2)
    _save(tmp_path, 30, seed=3)
    os.remove(tmp_path / "step_30" / manifest.MANIFEST)  # a save that did not finish
    assert dtcore.checkpoint.latest(tmp_path) == str(tmp_path / "step_20")
    got = dtcore.load_checkpoint(tmp_path, model=_model(), optimizer=None)
    assert got["step"] == 20
    assert dtcore.checkpoint.latest(tmp_path / "nothing") is None
    with pytest.raises(
        dtcore.CheckpointError, match=r"no complete checkpoint in .*Incomplete ones .*: step_10, step_20, step_30"
    ):
        os.remove(tmp_path / "step_10" / manifest.MANIFEST)
        os.remove(tmp_path / "step_20" / manifest.MANIFEST)
        dtcore.load_checkpoint(tmp_path, model=_model())


def test_truncated_and_altered_files_are_corrupt_and_named(tmp_path):
    _save(tmp_path, 1)
    path = _file(tmp_path / "step_1")
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(dtcore.CheckpointError, match=rf"{path} is corrupt: .* \(truncated\)"):
        dtcore.load_checkpoint(tmp_path / "step_1", model=_model())
    flipped = bytearray(data)
    flipped[-5] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(dtcore.CheckpointError, match=rf"{path} is corrupt: its SHA-256 is"):
        dtcore.load_checkpoint(tmp_path / "step_1", model=_model())
    (tmp_path / "step_1" / manifest.MANIFEST).write_text("{not json")
    with pytest.raises(dtcore.CheckpointError, match="manifest.json is corrupt"):
        dtcore.load_checkpoint(tmp_path / "step_1", model=_model())


class _Payload:
    """Unpickling this creates a file: proof that code from a checkpoint ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_in_place_of_a_shard_is_never_executed(tmp_path):
    _save(tmp_path, 1)
    marker = tmp_path / "executed"
    path = _file(tmp_path / "step_1")
    path.write_bytes(pickle.dumps({"weights": _Payload(str(marker))}))
    # The manifest is forged to match, so that only the format itself stands in the way.
    doc = json.loads((tmp_path / "step_1" / manifest.MANIFEST).read_text())
    digest = dtcore._C.digest_file(str(path))
    doc["files"][0].update(bytes=digest.bytes, sha256=digest.sha256)
    (tmp_path / "step_1" / manifest.MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(dtcore.CheckpointError, match=rf"{path} cannot be read"):
        dtcore.load_checkpoint(tmp_path / "step_1", model=_model())
    assert not marker.exists()


def test_what_does_not_fit_is_refused_by_name(tmp_path):
    _save(tmp_path, 1)
    bigger = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3), torch.nn.Linear(3, 1))
    with pytest.raises(
        dtcore.CheckpointError, match=r"the model has 2 key\(s\) the checkpoint lacks: 3.bias, 3.weight"
    ):
        dtcore.load_checkpoint(tmp_path / "step_1", model=bigger)
    dtcore.load_checkpoint(tmp_path / "step_1", model=bigger, strict=False)  # the keys both have
    wider = torch.nn.Sequential(torch.nn.Linear(6, 17), torch.nn.Tanh(), torch.nn.Linear(17, 3))
    with pytest.raises(dtcore.CheckpointError, match=r"'0.weight' has shape \[16, 6\] there and \[17, 6\]"):
        dtcore.load_checkpoint(tmp_path / "step_1", model=wider)
    model = _model()
    with pytest.raises(dtcore.CheckpointError, match="holds the state of a AdamW, and the optimizer given is a SGD"):
        dtcore.load_checkpoint(tmp_path / "step_1", model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1))


def test_values_that_need_pickle_are_refused_by_key(tmp_path):
    model = _model()
    with pytest.raises(dtcore.CheckpointError, match=r"extra\['scheduler'\]\['fn'\] is a builtins.function"):
        dtcore.save_checkpoint(tmp_path / "c", model=model, step=0, extra={"scheduler": {"fn": lambda s: s}})
    with pytest.raises(dtcore.ConfigError, match=r"step must be an int"):
        dtcore.save_checkpoint(tmp_path / "c", model=model, step="5")
    with pytest.raises(dtcore.CheckpointError, match=r"extra\['shape'\] is a meta tensor \(a shape and dtype without"):
        dtcore.save_checkpoint(tmp_path / "c", model=model, step=0, extra={"shape": torch.empty(2, device="meta")})
    # an argparse.Namespace comes back as one; exact=True refuses what would come back as its base type
    args = argparse.Namespace(lr=0.1, sizes=(4, 8), sub=argparse.Namespace(scale=torch.ones(2)))
    dtcore.save_checkpoint(tmp_path / "ns", model=model, step=0, extra={"args": args})
    back = dtcore.load_checkpoint(tmp_path / "ns", model=model)["extra"]["args"]
    assert type(back) is argparse.Namespace and type(back.sub) is argparse.Namespace
    assert (back.lr, back.sizes) == (0.1, (4, 8)) and torch.equal(back.sub.scale, torch.ones(2))
    dtcore.checkpoint.check_extra({"args": args}, "hp", exact=True)
    with pytest.raises(dtcore.CheckpointError, match=r"hp\['o'\] is a collections.OrderedDict, which"):
        dtcore.checkpoint.check_extra({"o": collections.OrderedDict(a=1)}, "hp", exact=True)
    dtcore.checkpoint.check_extra({"o": collections.OrderedDict(a=1)}, "hp")  # held, as a dict


def test_tied_weights_are_stored_once_and_export_gives_a_plain_state_dict(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("scale", torch.tensor([2.0]))

    model = Tied()
    dtcore.save_checkpoint(tmp_path / "c", model=model, step=0)
    doc = json.loads((tmp_path / "c" / manifest.MANIFEST).read_text())
    assert doc["aliases"] == {"model/head.weight": "model/embed.weight"}
    out = dtcore.checkpoint.export(tmp_path / "c", tmp_path / "model.safetensors")
    plain = load_file(out)
    assert set(plain) == {"embed.weight", "head.weight", "scale"}
    fresh = Tied()
    fresh.load_state_dict(plain)  # torch alone, without dtcore
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    again = Tied()
    assert dtcore.load_checkpoint(out, model=again)["step"] is None  # and back into a model from the plain file
    assert torch.equal(again.head.weight, model.head.weight)
