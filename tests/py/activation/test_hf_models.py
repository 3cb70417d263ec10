"""dtcore.checkpoint_activations on real Hugging Face models (built from small configs, no weights):
the blocks found are the transformer layers, and training with the KV cache at its default
(use_cache=True) gives the loss and gradients of training without checkpointing, for every policy."""

import re

import pytest
import torch
import transformers

import dtcore
from dtcore.activation import kv_cache
from dtcore.activation.api import CheckpointedForward
from dtcore.activation.offload import Offloader

VOCAB, SEQ = 128, 16
TOKENS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}  # inside the small vocabulary


def _model(kind: str, layers: int = 2, attention: str = "eager", width: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=width, n_head=4, vocab_size=VOCAB, n_positions=2 * SEQ, **TOKENS
        )
        build = transformers.GPT2LMHeadModel
    elif kind == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=layers,
            hidden_size=width,
            intermediate_size=2 * width,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=2 * SEQ,
            pad_token_id=2,
        )
        build = transformers.BertForMaskedLM
    else:
        config = transformers.LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=width,
            intermediate_size=2 * width,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=2 * SEQ,
            attention_dropout=0.1,  # so that the replayed random state matters here too
            **TOKENS,
        )
        build = transformers.LlamaForCausalLM
    config._attn_implementation = attention
    return build(config).train()


LAYERS = {"gpt2": "transformer.h", "bert": "bert.encoder.layer", "llama": "model.layers"}


def _batch() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))


def _step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(5)  # the same dropout masks for every run
    model.zero_grad(set_to_none=True)
    out = model(input_ids=x, labels=x)  # use_cache left at the config's default
    out.loss.backward()
    cache = getattr(out, "past_key_values", None)  # written once by the blocks that are kept, never by a recompute
    assert cache is None or all(cache.get_seq_length(i) in (0, SEQ) for i in range(len(cache))), cache
    return out.loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("layers", [1, 2, 12])
@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama"])
def test_the_blocks_found_are_the_transformer_layers(kind, layers):
    # Shallow models have as long runs of leaf modules (BERT's three embeddings, Llama's q/k/v/o).
    model = _model(kind, layers, width=32)
    summary = dtcore.checkpoint_activations(model, "all")
    assert summary.checkpointed == [f"{LAYERS[kind]}.{i}" for i in range(layers)], summary


@pytest.mark.parametrize("policy", ["all", "selective", "every:2", "budget", "offload"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama"])
def test_training_with_the_default_kv_cache_matches_no_checkpointing(kind, attention, policy):
    x = _batch()
    loss, grads = _step(_model(kind, attention=attention), x)
    model = _model(kind, attention=attention)
    assert model.config.use_cache  # the default (BERT, an encoder, builds no cache with it)
    if policy == "budget":
        inputs = {"input_ids": x, "labels": x}
        base = dtcore.checkpoint_activations(model, "all", example_inputs=inputs).baseline_peak_bytes
        summary = dtcore.checkpoint_activations(model, f"budget:{int(0.7 * base)}", example_inputs=inputs)
    elif policy == "offload":  # a no-op on CPU: the offload path itself, with host copies
        summary = dtcore.checkpoint_activations(model, "all", offload=True)
        offloader = Offloader(torch.device("cpu"), copy_on_cpu=True)
        for name, block in model.named_modules():
            if isinstance(block.__dict__.get("forward"), CheckpointedForward):
                del block.forward  # replace dtcore's wrapper rather than nest inside it
                block.forward = CheckpointedForward(block, False, offloader, name)
    else:
        summary = dtcore.checkpoint_activations(model, policy)
    assert summary.checkpointed and all(re.fullmatch(rf"{LAYERS[kind]}\.\d+", n) for n in summary.checkpointed), summary
    for _ in range(2):  # a second step: nothing left behind by the first
        got_loss, got_grads = _step(model, x)
        torch.testing.assert_close(got_loss, loss)
        torch.testing.assert_close(got_grads, grads)
    if policy == "offload":
        assert offloader.packed > 0


@pytest.mark.parametrize("kind,block", [("gpt2", "GPT2Block"), ("llama", "LlamaDecoderLayer")])
def test_the_cache_left_out_of_checkpointed_blocks_is_logged_once(kind, block, monkeypatch, log_messages):
    monkeypatch.setattr(kv_cache, "_said", set())
    messages = log_messages("dtcore.activation")
    model = _model(kind)
    dtcore.checkpoint_activations(model, "all")
    for _ in range(2):
        _step(model, _batch())
    assert len(messages) == 1, messages
    assert "use_cache=True is incompatible with checkpointing" in messages[0]
    assert f"checkpointed {block} blocks run with use_cache=False and no past_key_values" in messages[0]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_an_evaluation_forward_after_training_still_returns_the_cache(kind, attention):
    x = _batch()
    reference = _model(kind, attention=attention).eval()
    with torch.no_grad():
        want = reference(input_ids=x, use_cache=True).past_key_values
    model = _model(kind, attention=attention)
    dtcore.checkpoint_activations(model, "all")
    _step(model, x)
    model.eval()
    with torch.no_grad():
        cache = model(input_ids=x, use_cache=True).past_key_values
    # With gradients on, as transformers' layers do in evaluation: the plain forward keeps the cache
    # as asked, also through a backward (no recompute writes it again).
    out = model(input_ids=x, use_cache=True)
    out.logits.sum().backward()
    for got in (cache, out.past_key_values):
        assert got.get_seq_length() == SEQ
        for a, b in zip(got.layers, want.layers):
            torch.testing.assert_close((a.keys, a.values), (b.keys, b.values))


def test_a_cache_that_cannot_be_left_out_is_a_config_error():
    x = _batch()
    model = _model("llama")
    dtcore.checkpoint_activations(model, "all")
    with torch.no_grad():
        prefix = model(input_ids=x[:, :8]).past_key_values  # 8 tokens, then train on the rest
    with pytest.raises(
        dtcore.ConfigError,
        match=r"block 'model\.layers\.0' \(LlamaDecoderLayer\) got past_key_values=a DynamicCache holding 8 "
        r"token\(s\) in a training forward.*leave those tokens out\. Fix: train with use_cache=False and no "
        r"past_key_values",
    ):
        model(input_ids=x[:, 8:], past_key_values=prefix, labels=x[:, 8:])
    static = transformers.StaticCache(config=model.config, max_cache_len=2 * SEQ)
    with pytest.raises(
        dtcore.ConfigError, match=r"past_key_values=a StaticCache in a training forward.*use_cache=False"
    ):
        model(input_ids=x, past_key_values=static, labels=x)
