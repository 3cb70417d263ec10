"""In-memory checkpoints (Note [In-memory checkpoints] in dtcore/checkpoint/memory.py): each save is a
copy into two mapped slots, the newest step every rank recorded loads through load_checkpoint bit for
bit, a copy cut short is never loaded, and the node directory goes with the launcher that owns it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import dtcore
from dtcore.checkpoint import load_checkpoint
from dtcore.checkpoint import memory as mem


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    m[2].weight.requires_grad_(False)  # frozen until unfrozen: its optimizer state appears late
    return m


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 8, generator=g)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model/{k}": v.clone() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.state.values()):
        out |= {f"optim/{i}/{k}": v.clone() for k, v in s.items()}
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _load(directory: str) -> tuple[dict, dict[str, torch.Tensor]]:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model[2].weight.requires_grad_(True)
    loaded = load_checkpoint(directory, model=model, optimizer=opt)
    return loaded, _state(model, opt)


def test_the_newest_recorded_step_loads_bit_for_bit_and_a_copy_cut_short_is_not_loaded(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    copies = mem.MemoryCheckpoints(str(tmp_path / "node"), rank=0, world=1)
    states = {}
    for step in range(1, 6):
        if step == 3:
            model[2].weight.requires_grad_(True)  # a new optimizer state: the slots are laid out again
        _step(model, opt, step)
        rng = torch.get_rng_state()
        copies.save(step, model=model, optimizer=opt, extra={"step": step}, rank_extra={"rng": rng})
        states[step] = _state(model, opt) | {"rng": rng}
    assert copies.recorded().keys() == {4, 5}

    step, directory = copies.newest()
    loaded, state = _load(directory)
    assert step == 5 and loaded["step"] == 5 and loaded["extra"] == {"step": 5}
    _same(state | {"rng": loaded["rank_extra"]["rng"]}, states[5])

    # A rank killed while copying step 6 leaves that slot without a record: step 5 is the newest then.
    _step(model, opt, 6)
    copies._slots[6 % 2].clear()  # the slot step 6 goes to (step 4's): cleared as a save begins
    assert copies.recorded().keys() == {5}
    step, directory = copies.newest()
    loaded, state = _load(directory)
    assert step == 5
    _same(state | {"rng": loaded["rank_extra"]["rng"]}, states[5])


def test_a_slot_overwritten_after_its_record_was_removed_is_never_loaded(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    copies = mem.MemoryCheckpoints(str(tmp_path / "node"), rank=0, world=1)
    for step in (1, 2):
        _step(model, opt, step)
        copies.save(step, model=model, optimizer=opt)
    expected = _state(model, opt)
    step, directory = copies.newest()
    assert step == 2
    # The manifest newest() wrote must not make the slot look complete once the next save reuses it.
    _step(model, opt, 3)
    copies.save(3, model=model, optimizer=opt)
    _step(model, opt, 4)
    copies.save(4, model=model, optimizer=opt)  # into step 2's slot
    assert copies.recorded().keys() == {3, 4}
    assert not os.path.exists(os.path.join(directory, "manifest.json"))
    step, directory = copies.newest()
    assert step == 4
    _, state = _load(directory)
    assert not all(torch.equal(state[k], expected[k]) for k in expected)


def test_a_tmpfs_too_small_is_refused_naming_sizes_and_the_fix(tmp_path, monkeypatch):
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    copies = mem.MemoryCheckpoints(str(tmp_path / "node"), rank=0, world=1)

    def no_room(*args, **kwargs):
        raise dtcore.CheckpointError("cannot write: No space left on device")

    monkeypatch.setattr(mem._C, "write_safetensors", no_room)
    with pytest.raises(
        dtcore.ConfigError, match=r"need 642.0 KiB \(2 copies.*has .* free: cannot write.*--shm-size.*DTCORE_MEMORY_DIR"
    ):
        copies.save(1, model=model, optimizer=opt)


def test_the_node_directory_goes_when_its_launcher_exits_however_it_exits(tmp_path, monkeypatch):
    monkeypatch.setenv("DTCORE_MEMORY_DIR", str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        directory = mem.open_node_directory("agent:/logs/run-1", launcher.pid)
        assert directory == mem.node_directory("agent:/logs/run-1") and os.path.isdir(directory)
        assert mem.open_node_directory("agent:/logs/run-1", launcher.pid) == directory  # a restart finds it
        assert mem.node_directory("agent:/logs/run-2") != directory
        time.sleep(0.5)
        assert os.path.isdir(directory)  # the reaper waits while the launcher lives
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 10
    while os.path.exists(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(directory)


def test_a_missing_memory_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DTCORE_MEMORY_DIR", str(tmp_path / "nope"))
    with pytest.raises(dtcore.ConfigError, match=r"DTCORE_MEMORY_DIR=.*nope is not a directory"):
        mem.open_node_directory("agent:x", os.getpid())


def test_copies_of_a_job_of_another_size_are_not_taken(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    copies = mem.MemoryCheckpoints(str(tmp_path / "node"), rank=0, world=1)
    _step(model, opt, 1)
    copies.save(1, model=model, optimizer=opt)
    assert copies.recorded() == {1: 1}  # step 1 in slot 1 % 2
    # The same directory seen by rank 0 of 2: its share of the replicated state was cut for 1 rank.
    assert mem.MemoryCheckpoints(str(tmp_path / "node"), rank=0, world=2).recorded() == {}


class _Late(torch.nn.Module):
    """A channels_last convolution (its weight is no view when flattened) and a buffer that starts as None."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.register_buffer("ema", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        with torch.no_grad():
            if self.ema is None:
                self.ema = y.mean().reshape(1)
            else:
                self.ema.mul_(0.9).add_(0.1 * y.mean())
        return y


def test_tensors_that_are_no_views_and_tensors_set_after_the_layout_are_copied_as_they_are_now(tmp_path):
    torch.manual_seed(0)
    model = _Late()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    copies = mem.MemoryCheckpoints(str(tmp_path / "node"), rank=0, world=1)
    copies.save(0, model=model, optimizer=opt)  # laid out before the buffer and the optimizer state exist
    for step in (1, 2, 3):
        model(torch.randn(2, 3, 8, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        copies.save(step, model=model, optimizer=opt)
    expected = _state(model, opt)
    _, directory = copies.newest()
    fresh = _Late()
    fresh.ema = torch.zeros(1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    load_checkpoint(directory, model=fresh, optimizer=fresh_opt)
    _same(_state(fresh, fresh_opt), expected)


@pytest.mark.parametrize("change", ["submodule", "data"])
def test_a_submodule_or_a_parameters_data_replaced_after_the_layout_is_copied_as_it_is_now(tmp_path, change):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    copies = mem.MemoryCheckpoints(str(tmp_path / "node"), rank=0, world=1)
    copies.save(0, model=model, optimizer=None)
    if change == "submodule":
        model[1] = torch.nn.Linear(4, 2)  # a head replaced: no table of the old one's changes
    else:
        model[0].weight.data = torch.randn(4, 4)  # the same Parameter, other memory
    copies.save(1, model=model, optimizer=None)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    _, directory = copies.newest()
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    load_checkpoint(directory, model=fresh)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_a_directory_of_another_launch_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DTCORE_MEMORY_DIR", str(tmp_path))
    directory = mem.node_directory("agent:a")
    os.mkdir(directory)
    with open(os.path.join(directory, "launch"), "w") as f:
        f.write("agent:b\n")  # as if two keys had one hash
    with pytest.raises(dtcore.ConfigError, match="belongs to another launch"):
        mem.open_node_directory("agent:a", os.getpid())


class _TwoRanks:
    """agree.gather and barrier between two threads standing for ranks 0 and 1 of one node."""

    def __init__(self) -> None:
        self.meeting = threading.Barrier(2, timeout=30)
        self.values: dict[int, object] = {}
        self.rank = threading.local()

    def gather(self, value):
        self.values[self.rank.value] = value
        self.meeting.wait()
        out = [self.values[0], self.values[1]]
        self.meeting.wait()
        return out

    def barrier(self) -> None:
        self.meeting.wait()

    def run(self, calls):
        results, errors = {}, []

        def one(rank, call):
            self.rank.value = rank
            try:
                results[rank] = call()
            except BaseException as e:
                errors.append(e)
                self.meeting.abort()

        threads = [threading.Thread(target=one, args=(r, c)) for r, c in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        return results


def test_the_ranks_agree_on_the_newest_step_they_all_hold_and_a_newer_copy_is_cleared(tmp_path, monkeypatch):
    group = _TwoRanks()
    monkeypatch.setattr(mem.agree, "gather", group.gather)
    monkeypatch.setattr(mem, "barrier", group.barrier)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ranks = [mem.MemoryCheckpoints(str(tmp_path / "node"), rank=r, world=2) for r in (0, 1)]
    for step in (1, 2):
        _step(model, opt, step)
        for r in ranks:
            r.save(step, model=model, optimizer=opt, rank_extra={"rank": r.rank})
    expected = _state(model, opt)
    _step(model, opt, 3)
    ranks[0].save(3, model=model, optimizer=opt, rank_extra={"rank": 0})  # rank 1 died before its save of step 3
    assert ranks[0].recorded() == {2: 0, 3: 1} and ranks[1].recorded() == {1: 1, 2: 0}

    found = group.run([r.newest for r in ranks])
    assert found[0] == found[1] == (2, str(tmp_path / "node" / "slot0"))
    assert ranks[0].recorded() == {2: 0}  # step 3 of rank 0 alone: cleared, never joined with a later run's
    loaded, state = _load(found[0][1])  # both ranks' halves of the replicated state, at 1 rank
    _same(state, expected)
    assert loaded["step"] == 2


def test_ranks_that_cannot_keep_copies_are_refused_naming_why():
    assert mem.refuse_ranks([[0, 100], [0, 100], [1, 200], [1, 200]], 1) is None
    uneven = mem.refuse_ranks([[0, 100], [0, 100], [1, 200]], 0)
    assert "nodes run different numbers of ranks ({0: 2, 1: 1})" in uneven and "--nproc-per-node" in uneven
    wrapped = mem.refuse_ranks([[0, 100], [0, 101], [1, 200], [1, 200]], 0)
    assert "the parent processes of the ranks of node 0 are [100, 101]" in wrapped and "wrapper script" in wrapped
    assert "node 1 are [1]" in mem.refuse_ranks([[0, 100], [1, 1]], 1)  # an orphan: no launcher owns the copies


def test_the_ring_sends_each_rank_s_copy_to_its_local_index_on_the_next_node():
    from dtcore.checkpoint.replica import ring

    assert ring([0, 0, 1, 1]) == [(2, 2), (3, 3), (0, 0), (1, 1)]
    assert ring([0, 0, 1, 1, 2, 2]) == [(2, 4), (3, 5), (4, 0), (5, 1), (0, 2), (1, 3)]
    assert ring([5, 3, 5, 3]) == [(1, 1), (0, 0), (3, 3), (2, 2)]  # nodes by number, ranks in any order
