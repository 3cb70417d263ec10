"""dtcore's models are torch DistributedDataParallel instances to the tools that check (accelerate,
transformers); every member inherited from torch's class works or refuses with a ConfigError."""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import dtcore
from dtcore.reducer import torch_face


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


@pytest.fixture
def accelerator(fresh_dtcore):
    """A real accelerate.Accelerator on CPU in this one process, its singletons reset afterwards."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    dtcore.init(timeout=30)
    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()


def test_both_wrappers_are_torch_ddp_instances(fresh_dtcore):
    dtcore.init(timeout=30)
    for model in (dtcore.wrap(mlp()), dtcore.DistributedDataParallel(mlp())):
        assert isinstance(model, TorchDDP) and isinstance(model, dtcore.DistributedModel)
        assert list(model.state_dict())[0] == "module.0.weight"  # torch DDP's keys


def test_torch_ddp_members_work_or_refuse_clearly(fresh_dtcore):
    """See Note [torch DDP's members]: the whole class, and a real torch DDP instance's attributes."""
    dtcore.init(timeout=30)
    model = dtcore.wrap(mlp())
    refused = []
    for name in vars(TorchDDP):
        if name in torch_face._WORKS | torch_face._OWN | torch_face._CLASS_MACHINERY:
            continue
        with pytest.raises(
            dtcore.ConfigError, match=rf"^DistributedModel\.{name} is not supported on a dtcore model: .+\. Fix: "
        ):
            value = getattr(model, name)  # a property raises here, a method when called
            value(None, None)
        refused.append(name)
    assert {"_register_fused_optim", "gather"} <= set(refused)
    they_work = {"join", "join_hook", "register_comm_hook", "_register_buffer_comm_hook", "_set_static_graph"}
    they_work |= {"_set_ddp_sink_clone"}
    assert not they_work & set(refused)

    real = TorchDDP(mlp())
    for name in set(vars(real)) - set(vars(torch.nn.Module())):
        try:
            getattr(model, name)
        except dtcore.ConfigError as e:  # MissingTorchState; hasattr stays False for probing code
            assert name in torch_face._TORCH_STATE and not hasattr(model, name), name
            assert isinstance(e, AttributeError) and str(e).startswith(f"DistributedModel.{name} is not available")
            assert "it belongs to torch's own reducer" in str(e) and "Fix: use dtcore's API" in str(e)
    with pytest.raises(AttributeError, match="has no attribute 'not_a_member'"):  # others: torch's own error
        model.not_a_member  # noqa: B018
    with pytest.raises(dtcore.ConfigError, match=r"reducer\.rebuild_buckets.*only reducer\.prepare_for_backward"):
        model.reducer.rebuild_buckets()

    # What works as on torch DDP.
    assert model.train(False) is model and not model.module.training
    assert model.broadcast_buffers and model.require_backward_grad_sync and model.find_unused_parameters is False
    model.broadcast_buffers = False
    assert model.forward_sync_buffers is False
    with model.no_sync():
        assert model.require_backward_grad_sync is False
    assert len(list(TorchDDP._get_data_parallel_params(model.module))) == 6
    with pytest.raises(dtcore.ConfigError, match="Fix: call it on the plain module before wrapping"):
        TorchDDP._set_params_and_buffers_to_ignore_for_model(model, ["module.0.bias"])


def test_outputs_are_cloned_unless_sink_clone_is_false_and_it_takes_a_bool(fresh_dtcore):
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoClone(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket == torch.ops.aten.clone:
                raise RuntimeError("clone encountered")
            return func(*args, **(kwargs or {}))

    dtcore.init(timeout=30)
    model = dtcore.wrap(mlp(), find_unused_parameters=True)
    model._set_ddp_sink_clone(False)  # as torch's sink_noclone test: nothing cloned
    with NoClone():
        model(torch.randn(2, 3)).sum().backward()
    model._set_ddp_sink_clone(True)  # torch's default: the outputs may then be changed in place
    with NoClone(), pytest.raises(RuntimeError, match="clone encountered"):
        model(torch.randn(2, 3))
    with pytest.raises(dtcore.ConfigError, match=r"_set_ddp_sink_clone\('no'\): expected True or False"):
        model._set_ddp_sink_clone("no")


def test_accelerate_unwraps_and_saves_without_the_module_prefix(accelerator, tmp_path):
    from safetensors.torch import load_file

    net = mlp()
    model = dtcore.wrap(net)
    assert accelerator.unwrap_model(model) is net
    assert list(accelerator.get_state_dict(model)) == list(net.state_dict())
    accelerator.save_model(model, tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert sorted(saved) == sorted(net.state_dict())
    assert all(torch.equal(saved[k], v) for k, v in net.state_dict().items())


def test_transformers_save_pretrained_through_accelerate_unwrap_roundtrips(accelerator, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = dtcore.wrap(GPT2LMHeadModel(config))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 64, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()  # saved weights are trained ones, not the initial ones

    accelerator.unwrap_model(model).save_pretrained(tmp_path)
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path)
    trained = model.module.state_dict()
    assert sorted(loaded.state_dict()) == sorted(trained)
    assert all(torch.equal(v, trained[k]) for k, v in loaded.state_dict().items())
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
