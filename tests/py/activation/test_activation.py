"""dtcore.checkpoint_activations: exact gradients per policy, blocks, removal, planner, budget, offload path."""

import copy
import dataclasses

import pytest
import torch

import dtcore
from dtcore import _C
from dtcore.activation import LiveTensorMemory
from dtcore.activation.api import CheckpointedForward
from dtcore.activation.offload import Offloader
from dtcore.train.demo.gpt import GPT, GPTConfig
from dtcore.units import parse_bytes

CONFIG = GPTConfig(vocab_size=32, block_size=32, n_layer=4, n_head=4, n_embd=64, dropout=0.1)


def _model(config: GPTConfig = CONFIG) -> GPT:
    torch.manual_seed(0)
    return GPT(config)


def _batch(config: GPTConfig = CONFIG, batch: int = 4):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, config.vocab_size, (batch, config.block_size), generator=g)
    return x, torch.randint(0, config.vocab_size, (batch, config.block_size), generator=g)


def _grads(model: torch.nn.Module, x, y, steps: int = 2) -> list[torch.Tensor]:
    torch.manual_seed(123)  # the same dropout masks for every run
    out = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        model(x, y).backward()
        out.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return out


def _peak(model: torch.nn.Module, x, y) -> int:
    model.zero_grad(set_to_none=True)
    meter = LiveTensorMemory()
    with meter:
        model(x, y).backward()
    return meter.peak_bytes(excluding=[p.grad for p in model.parameters()])


@pytest.mark.parametrize("policy", ["all", "every:2", "selective", "budget", "auto"])
def test_gradients_are_exactly_those_without_checkpointing_with_dropout(policy):
    x, y = _batch()
    reference = _grads(_model(), x, y)
    model = _model()
    if policy == "budget":
        base = dtcore.checkpoint_activations(model, "all", example_inputs=(x, y)).baseline_peak_bytes
        summary = dtcore.checkpoint_activations(model, f"budget:{int(base * 0.6)}", example_inputs=(x, y))
        assert 0 < len(summary.checkpointed) <= 4, summary
    else:
        summary = dtcore.checkpoint_activations(model, policy)
        assert len(summary.checkpointed) == (2 if policy == "every:2" else 4)
    got = _grads(model, x, y)
    for a, b in zip(got, reference):
        assert torch.equal(a, b), f"{policy}: max difference {(a - b).abs().max().item()}"


def test_the_peak_model_matches_measured_memory_and_the_budget_holds():
    config = dataclasses.replace(CONFIG, n_layer=6, dropout=0.0, n_embd=128)
    x, y = _batch(config, batch=8)
    base_model = _model(config)
    measured_none = _peak(base_model, x, y)
    for policy in ("all", "every:2", "selective", "budget:0.6", "budget:0.8"):
        model = _model(config)
        if policy.startswith("budget:"):
            budget = int(measured_none * float(policy.split(":")[1]))
            summary = dtcore.checkpoint_activations(model, f"budget:{budget}", example_inputs=(x, y))
        else:
            budget = None
            summary = dtcore.checkpoint_activations(model, policy, example_inputs=(x, y))
        measured = _peak(model, x, y)
        assert abs(summary.baseline_peak_bytes - measured_none) <= 0.05 * measured_none, summary
        # never optimistic, and close: the model holds the budget without wasting it
        assert measured <= summary.predicted_peak_bytes <= 1.1 * measured, (policy, measured, str(summary))
        if budget is not None:
            assert summary.predicted_peak_bytes <= budget and measured <= budget, (measured, budget)
            assert measured >= 0.85 * budget, (measured, budget, str(summary))
        assert measured < measured_none


def test_blocks_are_found_by_run_class_name_and_pattern():
    model = _model()
    names = [f"blocks.{i}" for i in range(4)]
    assert dtcore.checkpoint_activations(model).checkpointed == names
    from dtcore.train.demo.gpt import Block

    assert dtcore.checkpoint_activations(model, blocks=Block).checkpointed == names
    assert dtcore.checkpoint_activations(model, blocks="Block").checkpointed == names
    assert dtcore.checkpoint_activations(model, blocks="blocks.*").checkpointed == names  # outermost only
    assert dtcore.checkpoint_activations(model, blocks=["blocks.0", "blocks.2"]).checkpointed == [
        "blocks.0",
        "blocks.2",
    ]
    with pytest.raises(
        dtcore.ConfigError,
        match=r"blocks='Nope' matches no module of GPT\. Repeated blocks found: "
        r"4 x Block \(blocks\.0 \.\. blocks\.3\).*Fix:",
    ):
        dtcore.checkpoint_activations(model, blocks="Nope")
    with pytest.raises(dtcore.ConfigError, match=r"\['blocks\.9'\] match no module of GPT"):
        dtcore.checkpoint_activations(model, blocks=["blocks.0", "blocks.9"])
    with pytest.raises(dtcore.ConfigError, match="found no repeated blocks in Sequential.*Fix: name the blocks"):
        dtcore.checkpoint_activations(
            torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        )


def test_removal_restores_the_model_and_a_new_policy_replaces_the_old():
    x, y = _batch()
    model = _model()
    keys, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    reference = _grads(_model(), x, y)
    dtcore.checkpoint_activations(model, "all")
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    summary = dtcore.checkpoint_activations(model, "every:3")  # replaces "all"
    wrapped = [n for n, m in model.named_modules() if isinstance(m.__dict__.get("forward"), CheckpointedForward)]
    assert wrapped == summary.checkpointed == ["blocks.0", "blocks.3"]
    copied = copy.deepcopy(model)  # the copy's blocks run their own forward
    assert copied.blocks[0].forward.module is copied.blocks[0]
    removed = dtcore.checkpoint_activations(model, policy=None)
    assert removed.policy == "none" and [b.name for b in removed.blocks] == ["blocks.0", "blocks.3"]
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    for a, b in zip(_grads(model, x, y), reference):
        assert torch.equal(a, b)


def test_the_summary_prints_blocks_modes_sizes_and_estimates():
    x, y = _batch()
    model = _model()
    plain = str(dtcore.checkpoint_activations(model, "every:2"))
    assert "policy every:2, 2 of 4 Block block(s) checkpointed, offload off" in plain
    assert "| blocks.0 | full |" in plain and "| blocks.1 | keep |" in plain
    summary = dtcore.checkpoint_activations(model, "selective", example_inputs=(x, y))
    text = str(summary)
    assert "| block | checkpoint | held if kept | if full | if selective |" in text
    assert "| blocks.3 | selective |" in text and "activation peak (estimated):" in text
    assert all(b.activation_bytes > b.selective_bytes > b.input_bytes > 0 for b in summary.blocks)
    assert all(b.forward_seconds > b.selective_seconds > 0 for b in summary.blocks)
    assert "CheckpointSummary(policy='selective'" in repr(summary)


@pytest.mark.parametrize(
    "policy,message",
    [
        ("sometimes", "policy='sometimes' is not a checkpoint policy. Fix: pass one of 'all', 'every:<k>'"),
        ("every:0", "'0' is not a positive whole number of blocks. Fix: pass e.g. 'every:2'"),
        ("every:two", "'two' is not a positive whole number"),
        (
            "budget:2XB",
            "the budget '2XB' is not a size in bytes. Fix: pass a positive number of bytes or a number "
            "with a unit, e.g. 2GB",
        ),
        ("budget:-1GB", "is not a size in bytes"),
        (42, "policy=42 is not a policy"),
    ],
)
def test_bad_policies_are_config_errors_with_the_fix(policy, message):
    with pytest.raises(dtcore.ConfigError) as e:
        dtcore.checkpoint_activations(_model(), policy)
    assert message in str(e.value)


def test_sizes_decimal_and_binary():
    assert parse_bytes("2GB") == 2_000_000_000
    assert parse_bytes("512MB") == 512_000_000
    assert parse_bytes("1.5GiB") == 1_610_612_736
    assert parse_bytes(" 64 kib ") == 65536
    assert parse_bytes("4096") == parse_bytes(4096) == 4096
    for bad in ("0", "GB", "1.5.2GB", "2 gigabytes", 0, True):
        with pytest.raises(dtcore.ConfigError):
            parse_bytes(bad)


def _wrapped(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m.__dict__.get("forward"), CheckpointedForward)]


def test_a_budget_needs_inputs_and_an_infeasible_one_names_the_smallest_peak():
    x, y = _batch()
    model = _model()
    dtcore.checkpoint_activations(model, "every:2")
    with pytest.raises(dtcore.ConfigError, match=r"needs one step's input.*Fix: pass example_inputs="):
        dtcore.checkpoint_activations(model, "budget:1GB")
    assert _wrapped(model) == ["blocks.0", "blocks.2"]  # a failed call leaves the previous policy in place
    with pytest.raises(dtcore.ConfigError) as e:
        dtcore.checkpoint_activations(model, "budget:10KB", example_inputs=(x, y))
    assert _wrapped(model) == ["blocks.0", "blocks.2"]
    text = str(e.value)
    assert (
        "policy='budget:10KB' cannot be met: the smallest activation peak that checkpointing blocks of GPT reaches is"
        in text
        and "above the budget of 10KB (9.8 KiB, 10000 bytes)" in text
        and "Fix: raise the budget to at least" in text
    )
    with pytest.raises(dtcore.ConfigError, match="blocks='Nope' matches no module"):
        dtcore.checkpoint_activations(model, "all", blocks="Nope")
    assert _wrapped(model) == ["blocks.0", "blocks.2"]
    least = int(text.split("reaches is ")[1].split("(")[1].split(" bytes")[0])
    ok = dtcore.checkpoint_activations(model, f"budget:{least}", example_inputs=(x, y))  # the figure is exact
    assert ok.checkpointed == [f"blocks.{i}" for i in range(4)] and ok.predicted_peak_bytes == least
    assert f"budget {least} (" in str(ok)  # the budget as given, then in binary units


def test_the_profile_leaves_the_model_and_random_state_as_they_were():
    x, y = _batch()
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    )
    before = copy.deepcopy(model.state_dict())
    torch.manual_seed(5)
    inputs = torch.randn(4, 8)
    state = torch.get_rng_state()
    summary = dtcore.checkpoint_activations(model, "all", example_inputs=inputs)
    assert summary.checkpointed == ["2", "3"]  # the run of two Linear layers
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_the_planner_from_python_on_a_synthetic_profile():
    # Greedy by bytes per second takes A then B (9.5 s); B and C shed the same 10 bytes in 9 s.
    blocks = [
        _C.BlockProfile("A", 6, 0, 5.0),
        _C.BlockProfile("B", 5, 0, 4.5),
        _C.BlockProfile("C", 5, 0, 4.5),
        _C.BlockProfile("D", 14, 14, 100.0),
    ]
    plan = _C.plan_checkpoints(blocks, 0, 20)
    assert plan.feasible and [m.name for m in plan.modes] == ["keep", "full", "full", "keep"]
    assert plan.recompute_seconds == 9.0 and plan.peak_bytes == 20 and plan.baseline_peak_bytes == 30
    with_selective = [_C.BlockProfile("x", 16, 1, 10.0, 12, 1.0, 1)] * 3
    plan = _C.plan_checkpoints(with_selective, 0, 44)
    assert [m.name for m in plan.modes] == ["selective", "keep", "keep"]
    infeasible = _C.plan_checkpoints(blocks, 3, 10)
    assert not infeasible.feasible and infeasible.min_peak_bytes == 3 + 14  # A, B, C full; D holds its 14


def test_offload_is_a_noop_on_cpu_and_its_copy_path_keeps_gradients_exact():
    x, y = _batch()
    reference = _grads(_model(), x, y)
    model = _model()
    summary = dtcore.checkpoint_activations(model, "all", offload=True)
    assert "no-op" in summary.offload and "CPU" in summary.offload
    for a, b in zip(_grads(model, x, y), reference):
        assert torch.equal(a, b)
    # The pack / prefetch / unpack path itself, with host copies and no streams.
    dtcore.checkpoint_activations(model, None)
    offloader = Offloader(torch.device("cpu"), copy_on_cpu=True)
    for block in model.blocks:
        block.forward = CheckpointedForward(block, False, offloader)
    for a, b in zip(_grads(model, x, y), reference):
        assert torch.equal(a, b)
    assert offloader.packed == 8  # 4 blocks x 2 steps, one input each
    assert offloader.prefetched == 8  # the last block's on demand, every other one ahead of its use
    dtcore.checkpoint_activations(model, None)


def test_evaluation_without_grad_runs_the_plain_forward():
    x, y = _batch()
    model = _model().eval()
    with torch.no_grad():
        want = model(x, y)
    dtcore.checkpoint_activations(model, "selective")
    with torch.no_grad():
        assert torch.equal(model(x, y), want)


@pytest.mark.multirank
@pytest.mark.parametrize("policy", ["all", "selective", "budget"])
def test_inside_dtcore_wrap_with_two_ranks_and_no_sync(policy):
    from launch_helpers import clean_env, describe, free_port, leftover_processes, run_ranks, torchrun_style

    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("activation_worker.py", envs, args=(policy,), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    reports = [r.json() for r in results]
    for j in reports:
        assert j["bad"] == [] and j["checkpointed"] > 0, j
    if policy == "budget":  # the ranks plan from the same (largest) figures
        assert reports[0]["uneven_modes"] == reports[1]["uneven_modes"], reports
        assert "full" in reports[0]["uneven_modes"], reports
        assert [j["infeasible"] for j in reports] == ["ConfigError", "ConfigError"], reports
    assert not leftover_processes(sessions)


def test_a_zero3_model_has_its_blocks_found_by_their_whole_sizes(fresh_dtcore):
    # Under zero=3 a parameter's data is empty between uses: the blocks are those of the unwrapped model.
    dtcore.init(timeout=30)
    x, y = _batch()
    plain = dtcore.wrap(_model(), zero=3)
    checkpointed = dtcore.wrap(_model(), zero=3)
    summary = dtcore.checkpoint_activations(checkpointed, "all")
    assert [b.name for b in summary.blocks] == [f"blocks.{i}" for i in range(CONFIG.n_layer)]
    want, got = (_shard_grads(m, x, y) for m in (plain, checkpointed))
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def _shard_grads(model: torch.nn.Module, x, y) -> list[torch.Tensor]:
    torch.manual_seed(123)  # the same dropout masks for both
    model(x, y).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


class _SavesItsOutput(torch.nn.Module):
    """Linear -> tanh -> Linear -> ReLU: ReLU saves its output, which is the next block's input."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc2(torch.tanh(self.fc1(x))))


def _stack(block, n: int = 8, d: int = 256) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d, d), *[block(d) for _ in range(n)], torch.nn.Linear(d, 1))


def _peak_of(model: torch.nn.Module, x: torch.Tensor) -> int:
    model.zero_grad(set_to_none=True)
    meter = LiveTensorMemory()
    with meter:
        model(x).sum().backward()
    return meter.peak_bytes(excluding=[p.grad for p in model.parameters()])


def test_a_block_output_saved_by_the_block_and_taken_by_the_next_counts_for_both():
    # Block i saves its ReLU output, block i+1's input: a checkpointed i and a kept i+1 must still count it.
    x = torch.randn(512, 256)
    measured_none = _peak_of(_stack(_SavesItsOutput), x)
    baseline = dtcore.checkpoint_activations(_stack(_SavesItsOutput), "all", example_inputs=x).baseline_peak_bytes
    assert measured_none <= baseline
    for policy in ["all", "every:2"] + [f"budget:{int(baseline * f)}" for f in (0.6, 0.7, 0.8, 0.9)]:
        model = _stack(_SavesItsOutput)
        summary = dtcore.checkpoint_activations(model, policy, example_inputs=x)
        measured = _peak_of(model, x)
        assert measured <= summary.predicted_peak_bytes, (policy, measured, str(summary))  # never optimistic
        if summary.budget_bytes is not None:
            assert measured <= summary.budget_bytes, (policy, measured, str(summary))


class _Relu(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_the_profiled_peak_is_that_of_a_training_step():
    # Gradients with respect to the blocks' inputs are not part of a step: they must not inflate the peak.
    x = torch.randn(512, 256)
    measured = _peak_of(_stack(_Relu), x)
    summary = dtcore.checkpoint_activations(_stack(_Relu), "all", example_inputs=x)
    assert abs(summary.measured_peak_bytes - measured) <= 0.02 * measured, (summary.measured_peak_bytes, measured)


class _InPlace(torch.nn.Module):
    """Linear followed by an in-place ReLU: selective keeps the Linear's output, which ReLU then changes."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc, self.act, self.fc2 = torch.nn.Linear(d, d), torch.nn.ReLU(inplace=True), torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc(x)))


def test_selective_refuses_in_place_changes_of_kept_outputs_and_budget_plans_avoid_them():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_InPlace() for _ in range(3)])
    x = torch.randn(64, 16)
    reference = copy.deepcopy(model)
    reference(x).sum().backward()
    dtcore.checkpoint_activations(model, "selective")  # no profile: found in the first forward
    with pytest.raises(
        dtcore.ConfigError,
        match=r"block '0': the in-place operator aten\.relu_\.default changes "
        r"the output of a matrix multiplication.*Fix: use policy 'all'",
    ):
        model(x)
    dtcore.checkpoint_activations(model, "all")
    with pytest.raises(dtcore.ConfigError, match=r"blocks '0', '1', '2': an in-place operator .*Fix: use policy"):
        dtcore.checkpoint_activations(model, "selective", example_inputs=x)  # found by the profile
    assert _wrapped(model) == ["0", "1", "2"]
    # A budget plan never picks selective for them, even where it would be cheapest.
    profile = dtcore.checkpoint_activations(model, "all", example_inputs=x)
    assert all(b.selective_bytes is None for b in profile.blocks) and "n/a" in str(profile)
    for fraction in (0.8, 0.9, 1.0):
        summary = dtcore.checkpoint_activations(
            model, f"budget:{int(profile.baseline_peak_bytes * fraction)}", example_inputs=x
        )
        assert "selective" not in [b.mode for b in summary.blocks]
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.equal(p.grad, q.grad)


def test_on_a_torch_whose_policy_sees_no_outputs_selective_is_refused_and_budgets_plan_whole_blocks(monkeypatch):
    from dtcore.activation import selective

    monkeypatch.setattr(selective, "SUPPORTED", False)
    model = _model()
    x, y = _batch()
    with pytest.raises(
        dtcore.ConfigError, match=r"policy='selective'.*needs torch 2\.13 or newer.*Fix: use policy 'all'"
    ):
        dtcore.checkpoint_activations(model, "selective")
    assert _wrapped(model) == []  # refused before anything was wrapped
    profile = dtcore.checkpoint_activations(model, "all", example_inputs=(x, y))
    assert all(b.selective_bytes is None for b in profile.blocks)
    summary = dtcore.checkpoint_activations(
        model, f"budget:{int(profile.baseline_peak_bytes * 0.9)}", example_inputs=(x, y)
    )
    assert "selective" not in [b.mode for b in summary.blocks] and "full" in [b.mode for b in summary.blocks]


@pytest.mark.parametrize("order", ["checkpoint_then_compile", "compile_then_checkpoint"])
@pytest.mark.parametrize("policy", ["all", "selective"])
def test_torch_compile_in_either_order(order, policy):
    config = dataclasses.replace(CONFIG, n_layer=2, block_size=16, dropout=0.0)
    x, y = _batch(config, batch=2)
    reference = _model(config)
    reference(x, y).backward()
    model = _model(config)
    torch._dynamo.reset()
    if order == "checkpoint_then_compile":
        dtcore.checkpoint_activations(model, policy)
        compiled = torch.compile(model, backend="aot_eager")
    else:
        compiled = torch.compile(model, backend="aot_eager")
        dtcore.checkpoint_activations(compiled, policy)
    compiled(x, y).backward()
    assert len(_wrapped(model)) == 2
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)


class _Masked(torch.nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d, d)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, extra=()) -> torch.Tensor:
        for t in extra:
            x = x + t
        return x + self.drop(torch.tanh(self.fc(x))) * mask


class _MaskedStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([_Masked() for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x > 0).float() * 2
        for block in self.blocks:
            x = block(x, mask=mask, extra=[mask * 0.5])  # a keyword tensor, and one inside a list
        return x


def test_keyword_and_nested_tensors_are_checkpoint_inputs():
    x = torch.randn(8, 16, requires_grad=True)

    def grads(model: torch.nn.Module) -> list[torch.Tensor]:
        torch.manual_seed(3)
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x).sum().backward()
        return [p.grad for p in model.parameters()] + [x.grad]

    reference = grads(_MaskedStack())
    model = _MaskedStack()
    dtcore.checkpoint_activations(model, "all")
    for a, b in zip(grads(model), reference):
        assert torch.equal(a, b)
    # The offload hooks see every tensor the checkpoint keeps: x, mask and the list's tensor per block.
    dtcore.checkpoint_activations(model, None)
    offloader = Offloader(torch.device("cpu"), copy_on_cpu=True)
    for name, block in model.blocks.named_children():
        block.forward = CheckpointedForward(block, False, offloader, name)
    for a, b in zip(grads(model), reference):
        assert torch.equal(a, b)
    assert offloader.packed == 3 * 4


class _Greedy(torch.nn.Linear):
    """Asks for more memory than any machine has when the batch is over 16 rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 16:
            torch.empty(1 << 55, dtype=torch.uint8)  # 32 PiB: the allocator refuses
        return super().forward(x)


def test_a_profile_that_runs_out_of_memory_asks_for_smaller_inputs():
    model = torch.nn.Sequential(_Greedy(8, 8), _Greedy(8, 8))
    dtcore.checkpoint_activations(model, "all")
    with pytest.raises(
        dtcore.ConfigError,
        match=r"the profile step .* ran out of memory on cpu: .*Fix: pass smaller "
        r"example_inputs .* with the budget scaled down",
    ):
        dtcore.checkpoint_activations(model, "budget:1MB", example_inputs=torch.randn(64, 8))
    assert _wrapped(model) == ["0", "1"]
    summary = dtcore.checkpoint_activations(model, "budget:1MB", example_inputs=torch.randn(16, 8))
    assert summary.budget_bytes == 1_000_000


def test_a_checkpointed_model_is_freed_without_the_cycle_collector_and_copies_refer_to_themselves():
    import gc
    import pickle
    import weakref

    model = _model()
    dtcore.checkpoint_activations(model, "all")
    copied = pickle.loads(pickle.dumps(model))
    assert copied.blocks[1].forward.module is copied.blocks[1]
    assert copy.deepcopy(model).blocks[2].forward.module is not model.blocks[2]
    alive = weakref.ref(model.blocks[0])
    gc.disable()
    try:
        del model
        assert alive() is None
    finally:
        gc.enable()
