"""ShardedOptimizer's step: one step of the inner optimizer over every piece, then every bucket's
gather; the parameters end as torch's optimizer over the whole model leaves them; a parameter the
wrapper ignores is refused by name."""

import copy

import pytest
import torch

import dtcore


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)
    )


def _train(model, opt, steps: int, x: torch.Tensor) -> None:
    for _ in range(steps):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _record(opt, events: list[str]) -> None:
    """Appends "step" at each inner step and "gather B" at each bucket's gather."""
    inner_step, gather = opt._inner.step, opt._gather

    def step(*args, **kwargs):
        events.append("step")
        return inner_step(*args, **kwargs)

    def gathered(communicator, b):
        events.append(f"gather {b}")
        return gather(communicator, b)

    opt._inner.step, opt._gather = step, gathered


@pytest.mark.parametrize("zero", [1, 2])
def test_one_step_then_every_bucket_is_gathered_and_matches_adamw(fresh_dtcore, zero):
    dtcore.init(timeout=30)
    net = _net()
    plain = copy.deepcopy(net)
    model = dtcore.wrap(net, zero=zero, bucket_mb=0.01, first_bucket_mb=0.001)  # several buckets
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.1)
    x = torch.randn(8, 16)
    _train(model, opt, 1, x)
    _train(plain, plain_opt, 1, x)
    events: list[str] = []
    _record(opt, events)
    _train(model, opt, 3, x)
    _train(plain, plain_opt, 3, x)

    n = len(opt._buckets)
    assert n > 2, n
    assert events == (["step"] + [f"gather {b}" for b in range(n)]) * 3, events
    for p, q in zip(net.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1.3e-6, atol=1e-6)
    steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
    assert steps == {4.0}, steps  # each parameter stepped once per step


@pytest.mark.parametrize("zero", [1, 3])
def test_fp64_parameters_are_stepped_in_fp64_and_match_adamw_exactly(fresh_dtcore, zero):
    # master_dtype (fp32) copies only parameters of less precision: an fp32 copy of fp64 would round each update.
    dtcore.init(timeout=30)
    net = _net().double()
    plain = copy.deepcopy(net)
    model = dtcore.wrap(net, zero=zero)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    x = torch.randn(8, 16, dtype=torch.float64)
    _train(model, opt, 3, x)
    _train(plain, plain_opt, 3, x)
    got = {k.removeprefix("module."): v for k, v in model.state_dict().items()}  # (zero=3: gathered whole)
    want = plain.state_dict()
    assert list(got) == list(want)
    for key, value in got.items():
        assert value.dtype == torch.float64, key
        torch.testing.assert_close(value, want[key], rtol=1e-12, atol=1e-12)
    assert all(v.dtype == torch.float64 for s in opt.state_dict()["state"].values() for v in s.values() if v.dim())


class CountingSGD(torch.optim.SGD):
    """An SGD with a step of its own, which counts its calls."""

    calls = 0

    def step(self, closure=None):
        CountingSGD.calls += 1
        return super().step(closure)


def test_an_optimizer_with_its_own_step_is_stepped_once_per_step_and_matches_sgd(fresh_dtcore):
    dtcore.init(timeout=30)
    net = _net()
    plain = copy.deepcopy(net)
    model = dtcore.wrap(net, zero=2, bucket_mb=0.01, first_bucket_mb=0.001)
    opt = dtcore.ShardedOptimizer(model, CountingSGD, lr=1e-2, momentum=0.9)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn(8, 16)
    _train(model, opt, 1, x)
    CountingSGD.calls = 0
    _train(model, opt, 3, x)
    _train(plain, plain_opt, 4, x)
    assert len(opt._buckets) > 2 and CountingSGD.calls == 3
    for p, q in zip(net.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1.3e-6, atol=1e-6)


def test_a_parameter_the_wrapper_ignores_is_refused_by_name(fresh_dtcore):
    dtcore.init(timeout=30)
    net = _net()
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, ["2.weight"])
    model = dtcore.wrap(net, zero=1)
    with pytest.raises(dtcore.ConfigError, match=r"parameter '2.weight', which the wrapper ignores.*Fix:"):
        dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2)
    others = [p for n, p in net.named_parameters() if n != "2.weight"]
    dtcore.ShardedOptimizer(model, torch.optim.AdamW, others, lr=1e-2)  # without it: accepted


def test_add_param_group_refuses_what_the_constructor_refuses_and_keeps_the_groups(fresh_dtcore):
    dtcore.init(timeout=30)
    net = _net()
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, ["2.weight"])
    model = dtcore.wrap(net, zero=1)
    named = dict(net.named_parameters())
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, [named["0.weight"]], lr=1e-2)
    with pytest.raises(dtcore.ConfigError, match=r"parameter '2.weight', which the wrapper ignores"):
        opt.add_param_group({"params": [named["2.weight"]]})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [named["0.bias"]], "lr": 1e-3})
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1]
