"""ZeRO's flat parameters (Note [Flat parameters]): after the first step each bucket's parameters are
views of one buffer, the Parameter objects kept, and what saves a model still works on them."""

import pytest
import torch

import dtcore


def _trained_gpt2(zero: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    dtcore.init(timeout=30)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    net = GPT2LMHeadModel(config)
    model = dtcore.wrap(net, zero=zero, bucket_mb=0.02, first_bucket_mb=0.01)  # several buckets
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-2)
    ids = torch.randint(0, 64, (2, 16))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return net, model, ids


@pytest.mark.parametrize("zero", [1, 2])
def test_parameters_are_views_of_their_buckets_buffer_and_keep_their_identity(fresh_dtcore, zero):
    from transformers import GPT2Config, GPT2LMHeadModel

    dtcore.init(timeout=30)
    torch.manual_seed(0)
    net = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    before = [(id(p), p.detach().clone()) for p in net.parameters()]
    model = dtcore.wrap(net, zero=zero, bucket_mb=0.02, first_bucket_mb=0.01)
    opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=0.0)  # lr 0: values must not change
    ids = torch.randint(0, 64, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert [id(p) for p in net.parameters()] == [i for i, _ in before]
    assert all(torch.equal(p, v) for p, (_, v) in zip(net.parameters(), before, strict=True)), "values moved"
    layout = model._reducer.bucket_layout()
    params = model._trainable
    assert len(layout) > 1
    for bucket in layout:
        base = params[bucket[0][0]]
        for i, offset, _ in bucket:  # each parameter at its place in the bucket's one buffer
            p = params[i]
            assert p.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
            assert p.data_ptr() == base.untyped_storage().data_ptr() + offset * p.element_size()
            assert p.is_contiguous() and p.requires_grad
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(layout)


@pytest.mark.parametrize("zero", [1, 2])
def test_safetensors_and_save_pretrained_save_the_flat_views(fresh_dtcore, tmp_path, zero):
    from safetensors.torch import load_file, save_file
    from transformers import GPT2LMHeadModel

    net, model, ids = _trained_gpt2(zero)
    state = net.state_dict()
    state.pop("lm_head.weight")  # tied to transformer.wte.weight: one tensor, as safetensors requires
    save_file(state, tmp_path / "flat.safetensors")
    saved = load_file(tmp_path / "flat.safetensors")
    assert sorted(saved) == sorted(state) and all(torch.equal(saved[k], v) for k, v in state.items())

    net.save_pretrained(tmp_path / "hf")
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    trained = net.state_dict()
    assert sorted(loaded.state_dict()) == sorted(trained)
    assert all(torch.equal(v, trained[k]) for k, v in loaded.state_dict().items())
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
