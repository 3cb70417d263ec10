"""A wrapped model's .to(), .cuda(), .half(): refused where a parameter or buffer would get new storage
(the buckets and ZeRO shards hold the old one), left undone where each would keep its device and dtype."""

import pytest
import torch

import dtcore


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    return model


def train(model: torch.nn.Module, zero: int) -> list[torch.Tensor]:
    opt_class = torch.optim.SGD
    opt = (
        dtcore.ShardedOptimizer(model, opt_class, model.parameters(), lr=0.1)
        if zero
        else opt_class(model.parameters(), lr=0.1)
    )
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 10
    for _ in range(2):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.module.parameters()]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_a_conversion_that_would_move_the_tensors_is_refused_and_one_that_would_not_is_left_undone(fresh_dtcore, zero):
    dtcore.init(timeout=30)
    expected = train(dtcore.wrap(net(), zero=zero), zero)

    model = dtcore.wrap(net(), zero=zero)
    storage = [t.data_ptr() for t in (*model.parameters(), *model.buffers())]
    # accelerate's CPU is "cpu:<rank>": torch copies every tensor for it, though device and dtype stay.
    assert model.to(torch.device("cpu:0")) is model and model.to("cpu", torch.float32) is model
    assert model.float() is model and model.cpu() is model
    assert [t.data_ptr() for t in (*model.parameters(), *model.buffers())] == storage
    with pytest.raises(dtcore.ConfigError) as e:
        model.half()
    assert f"(dtcore.wrap, zero={zero}): converting its torch.float32 tensors on cpu to torch.float16 on cpu" in str(
        e.value
    )
    assert "Fix: move or convert the module before dtcore.wrap" in str(e.value)
    assert [t.data_ptr() for t in (*model.parameters(), *model.buffers())] == storage  # nothing moved
    assert all(p.dtype == torch.float32 for p in model.parameters())
    got = train(model, zero)  # the optimizer still steps the parameters the buckets reduce
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
