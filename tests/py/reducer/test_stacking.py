"""Two gradient reducers on the same parameters are refused on either side, before a wrong step."""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import dtcore

from launch_helpers import run_job

WRONG = "two gradient reducers on the same parameters both write their .grad during backward"


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


class Holder(torch.nn.Module):
    """A model with a wrapped (or any) submodule."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.head(self.inner(x))


def test_dtcore_wrap_of_a_torch_ddp_or_dtcore_model_names_both(fresh_dtcore):
    dtcore.init(timeout=30)
    with pytest.raises(dtcore.ConfigError) as e:
        dtcore.wrap(TorchDDP(mlp()))
    assert str(e.value).startswith(
        "dtcore.wrap() over a model already wrapped by torch.nn.parallel.DistributedDataParallel (the module passed)"
    )
    assert WRONG in str(e.value) and "pass the wrapper's .module" in str(e.value)
    assert "accelerator.prepare() and keep the dtcore model as it is" in str(e.value)

    with pytest.raises(
        dtcore.ConfigError, match=r"already wrapped by dtcore's DistributedModel \(its submodule 'inner'\)"
    ):
        dtcore.wrap(Holder(dtcore.wrap(mlp())))
    with pytest.raises(dtcore.ConfigError, match=r"already wrapped by dtcore's DistributedDataParallel \(the module"):
        dtcore.wrap(dtcore.DistributedDataParallel(mlp()))
    with pytest.raises(dtcore.ConfigError, match=r"already wrapped by dtcore's DistributedDataParallel \(the module"):
        dtcore.DistributedDataParallel(dtcore.DistributedDataParallel(mlp()))  # not named torch DDP's


def test_a_second_dtcore_wrapper_takes_the_parameters_over_and_the_first_refuses(fresh_dtcore):
    dtcore.init(timeout=30)
    net = mlp()
    first = dtcore.wrap(net)
    first(torch.ones(2, 3)).sum().backward()
    kept = net[0].weight.grad.clone()
    second = dtcore.DistributedDataParallel(net, find_unused_parameters=True)  # the same module again
    assert torch.equal(net[0].weight.grad, kept)  # the gradients move into the new buckets
    second(torch.ones(2, 3)).sum().backward()
    assert torch.equal(net[0].weight.grad, 2 * kept)  # one reducer accumulates: only the second's hooks run
    for use in (lambda: first(torch.ones(2, 3)), lambda: first.zero_grad()):
        with pytest.raises(dtcore.ConfigError) as e:
            use()
        assert str(e.value).startswith(
            "this DistributedModel of Sequential was replaced by a newer DistributedDataParallel of Sequential built "
            "over the same parameters"
        )
        assert "Fix: use the newer wrapper" in str(e.value)
    third = dtcore.wrap(Holder(net))  # the plain module inside another: taken over from the second too
    with pytest.raises(dtcore.ConfigError, match="was replaced by a newer DistributedModel of Holder"):
        second(torch.ones(2, 3))
    third(torch.ones(2, 3)).sum().backward()
    assert net[0].weight.grad is not None


def test_a_second_wrapper_with_an_option_it_refuses_leaves_the_first_working(fresh_dtcore):
    dtcore.init(timeout=30)
    net = mlp()
    first = dtcore.wrap(net)
    for bad, words in (({"bucket_mb": 0}, "bucket_mb=0 is not a positive size"), ({"zero": 5}, "zero=5")):
        with pytest.raises(dtcore.ConfigError, match=words):
            dtcore.wrap(net, **bad)
    first(torch.ones(2, 3)).sum().backward()  # checked before it took anything over
    assert net[0].weight.grad is not None


def test_a_zero_wrapper_is_not_taken_over(fresh_dtcore):
    dtcore.init(timeout=30)
    net = mlp()
    first = dtcore.wrap(net, zero=1)  # noqa: F841  (alive: its ShardedOptimizer would step from its shards)
    with pytest.raises(dtcore.ConfigError) as e:
        dtcore.wrap(net)
    assert (
        "parameter '0.weight' is already reduced by a DistributedModel(zero=1) of Sequential that is still alive"
        in (str(e.value))
    )
    assert "drop every reference to the earlier wrapper (and its optimizer) first" in str(e.value)


def test_torch_ddp_around_a_dtcore_model_fails_at_construction(fresh_dtcore):
    dtcore.init(timeout=30)
    wrapped = dtcore.wrap(mlp())
    with pytest.raises(dtcore.ConfigError) as e:
        TorchDDP(wrapped)
    assert str(e.value).startswith(
        "torch.nn.parallel.DistributedDataParallel over a model already wrapped by dtcore's DistributedModel of "
        "Sequential (torch DDP's constructor was given this model)"
    )
    assert WRONG in str(e.value) and "keep one of the two" in str(e.value)


def test_torch_ddp_around_a_model_holding_a_dtcore_model_fails_at_the_first_forward(fresh_dtcore):
    dtcore.init(timeout=30)
    outer = TorchDDP(Holder(dtcore.wrap(mlp())))  # torch DDP reads only the root's attributes
    with pytest.raises(dtcore.ConfigError) as e:
        outer(torch.ones(2, 3))
    assert (
        "over a model already wrapped by dtcore's DistributedModel of Sequential (a torch DDP of Holder runs its "
        in (str(e.value))
    )
    with torch.no_grad():  # refused in evaluation too: the check does not depend on grad mode
        with pytest.raises(dtcore.ConfigError, match="a torch DDP of Holder runs its forward"):
            outer(torch.ones(2, 3))


def test_a_module_torch_ddp_already_reduces_is_refused_at_wrap(fresh_dtcore):
    dtcore.init(timeout=30)
    net = mlp()
    ddp = TorchDDP(net)  # noqa: F841  (alive: its reducer's hooks stay on net's parameters)
    with pytest.raises(dtcore.ConfigError) as e:
        dtcore.wrap(net)  # the plain module, not the torch wrapper: only its parameters tell
    assert "parameter '0.weight' already carries another reducer's gradient hook (torch.nn.parallel." in str(e.value)
    assert "Fix: use one data-parallel wrapper" in str(e.value)


def test_torch_ddp_built_later_over_the_wrapped_module_fails_at_the_next_backward(fresh_dtcore):
    dtcore.init(timeout=30)
    net = mlp()
    model = dtcore.wrap(net)
    ddp = TorchDDP(net)  # over the module dtcore wrapped, not over the wrapper
    with pytest.raises(dtcore.ConfigError, match="got another reducer's gradient hook after dtcore wrapped it"):
        ddp(torch.ones(2, 3)).sum().backward()
    with pytest.raises(dtcore.ConfigError, match="got another reducer's gradient hook"):
        model(torch.ones(2, 3)).sum().backward()  # through dtcore's wrapper too, while torch's hooks are there


def test_fsdp_and_fully_shard_models_are_refused(fresh_dtcore):
    dtcore.init(timeout=30)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    sharded = mlp()
    fully_shard(sharded[0], mesh=init_device_mesh("cpu", (1,)))
    with pytest.raises(dtcore.ConfigError) as e:
        dtcore.wrap(sharded)
    assert "already wrapped by torch FSDP2 (fully_shard) (its submodule '0')" in str(e.value)
    assert "build the model without fully_shard" in str(e.value)
    with pytest.warns(UserWarning, match="NO_SHARD"):  # torch's note for a world of one
        fsdp = FullyShardedDataParallel(mlp(), device_id=torch.device("cpu"))
    with pytest.raises(dtcore.ConfigError, match=r"already wrapped by torch FSDP \(FullyShardedDataParallel\)"):
        dtcore.wrap(fsdp)


@pytest.mark.multirank
def test_accelerate_prepare_and_dtcore_wrap_in_either_order_are_refused_and_dtcore_trains_under_accelerate():
    for j in run_job("accelerate_worker.py", 2):
        assert j["distributed_type"] == "DistributedType.MULTI_CPU" and j["prepared"] == "DistributedDataParallel"
        assert j["bad"] == [] and j["syncs"] == 2 and j["reductions"] == 3, j
        wrap_prepared, prepare_wrapped = j["errors"]["wrap_prepared"], j["errors"]["prepare_wrapped"]
        assert "dtcore.wrap() over a model already wrapped by torch.nn.parallel.DistributedDataParallel" in (
            wrap_prepared
        )
        assert "torch.nn.parallel.DistributedDataParallel over a model already wrapped by dtcore's" in prepare_wrapped
        for e in (wrap_prepared, prepare_wrapped):
            assert WRONG in e and "pass only the optimizer and data loaders to accelerator.prepare()" in e


class _Fails(torch.autograd.Function):
    """Passes its input on; its backward raises (after the layers above it got their gradients)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward failed on purpose")


def test_after_a_backward_that_raised_remove_autograd_hooks_and_a_new_wrapper_work(fresh_dtcore):
    dtcore.init(timeout=30)
    net = mlp()
    first = dtcore.DistributedDataParallel(net)
    with pytest.raises(RuntimeError, match="backward failed on purpose"):
        first(_Fails.apply(torch.ones(2, 3, requires_grad=True))).sum().backward()  # its reduction started
    first._remove_autograd_hooks()  # as torch DDP's (torch's test_ddp_remove_autograd_hooks)
    with pytest.raises(dtcore.ConfigError) as e:
        first(torch.ones(2, 3))
    assert str(e.value).startswith(
        "this DistributedDataParallel of Sequential had its gradient hooks removed (_remove_autograd_hooks()): it no "
        "longer averages gradients, so it refuses forward and backward. Fix: wrap the module again"
    )
    net.zero_grad()
    second = dtcore.DistributedDataParallel(net)
    second(torch.ones(2, 3)).sum().backward()
    assert net[0].weight.grad is not None
    third = dtcore.wrap(net)  # and one that raised, taken over without _remove_autograd_hooks
    with pytest.raises(RuntimeError, match="backward failed on purpose"):
        third(_Fails.apply(torch.ones(2, 3, requires_grad=True))).sum().backward()
    dtcore.wrap(net)(torch.ones(2, 3)).sum().backward()
