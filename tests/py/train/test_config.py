"""The trainer's configuration: presets, TOML, --key=value, the errors' closest matches, and the
generated reference (--help, docs/train.md) that cannot drift from the dataclasses."""

import dataclasses
import subprocess
import sys

import pytest
import torch

import dtcore
from dtcore.activation import LiveTensorMemory
from dtcore.train import config as cfg
from dtcore.train import memory, reference
from dtcore.train.demo import data
from dtcore.train.demo.gpt import GPT, GPTConfig, activation_bytes, num_parameters, shape
from dtcore.train.trainer import _check, accumulation_steps, lr_factor

from launch_helpers import ROOT, clean_env


def test_presets_overrides_and_unique_field_names():
    c = cfg.parse_args(["--preset", "balanced", "--training.device_batch_size=4", "--lr", "1e-4", "--zero=2"])
    assert (c.model.n_layer, c.training.device_batch_size, c.optim.lr, c.parallel.zero) == (12, 4, 1e-4, 2)
    assert c.training.total_batch_size == 512  # from the preset, untouched
    assert cfg.parse_args(["--progress=false", "--every=0x10"]).logging.progress is False
    assert cfg.parse_args(["--checkpoint.every=0x10"]).checkpoint.every == 16
    assert cfg.parse_args([]) == cfg.from_preset("tiny")  # the defaults are the tiny preset
    assert [cfg.parse_args([f"--bucket_mb={v}"]).parallel.bucket_mb for v in ("auto", "5")] == ["auto", 5.0]


def test_toml_file_with_preset_then_command_line(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('preset = "conservative"\n[training]\nnum_iterations = 7\n[data]\ntokenizer = "char"\n')
    c = cfg.parse_args(["--config", str(path), "--num_iterations=9"])
    assert (c.model.n_embd, c.parallel.zero, c.training.num_iterations, c.data.tokenizer) == (768, 2, 9, "char")


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["--preset", "tinny"], ["'tinny' is not a preset", "Closest: 'tiny'", "tiny, conservative, balanced"]),
        (["--training.num_iteration=5"], ["unknown key 'training.num_iteration'", "'training.num_iterations'"]),
        (["--learning_rate=1"], ["unknown key 'learning_rate'", "Valid keys: model.n_layer"]),
        (["--precision=bf61"], ["training.precision='bf61' is not one of auto, bf16, fp16, fp32", "Closest: 'bf16'"]),
        (["--zero=4"], ["parallel.zero='4' is not one of 0, 1, 2, 3"]),
        (["--device_batch_size=eight"], ["training.device_batch_size='eight' is not a whole number"]),
        (["--progress=maybe"], ["logging.progress='maybe' is not a boolean"]),
        (["--bucket_mb=fast"], ["parallel.bucket_mb='fast' is not float | 'auto'"]),
        (["--lr"], ["--lr has no value"]),
        (["stray"], ["unexpected argument 'stray'"]),
    ],
)
def test_bad_presets_keys_and_values_name_the_closest_match(argv, needles):
    with pytest.raises(dtcore.ConfigError) as e:
        cfg.parse_args(argv)
    for needle in needles:
        assert needle in str(e.value)


def test_bad_toml_value_names_file_and_table(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[optim]\nlr = true\n")
    with pytest.raises(dtcore.ConfigError, match=r"bad.toml \[optim\]: optim.lr=True is not a number"):
        cfg.parse_args(["--config", str(path)])


def test_accumulation_must_divide_and_names_the_numbers():
    c = cfg.TrainConfig()
    c.training.device_batch_size, c.training.total_batch_size = 8, 64
    assert accumulation_steps(c, 2) == 4
    c.training.total_batch_size = 100
    with pytest.raises(dtcore.ConfigError) as e:
        accumulation_steps(c, 2)
    assert "total_batch_size=100 is not a multiple of device_batch_size x world size = 8 x 2 = 16" in str(e.value)
    assert "--training.total_batch_size=96 or 112" in str(e.value)


def test_every_field_has_a_docstring_in_help_and_docs():
    text = reference.help_text()
    for section, cls in cfg.sections():
        docs = cfg.field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{section}.{f.name} has no docstring"
            assert f"--{section}.{f.name}=" in text
    for name in cfg.PRESETS:
        assert name in text
    for code, _ in reference.EXIT_STATUS:
        assert f"\n  {code} " in text


def test_docs_reference_is_generated_from_the_dataclasses():
    path = ROOT / "docs" / "train.md"
    text = path.read_text()
    assert reference.docs_with_reference(text) == text, (
        "docs/train.md is out of date: python -m dtcore.train.reference docs/train.md"
    )


def test_preset_memory_estimates_grow_with_batch_and_fall_with_sharding():
    small = memory.estimate(cfg.from_preset("balanced"), 8)
    big = memory.estimate(cfg.from_preset("aggressive"), 8)
    assert big.activations > small.activations and big.optimizer_state > small.optimizer_state  # zero 0 vs 1
    c = cfg.TrainConfig(model=cfg.ModelConfig(n_layer=3, n_head=2, n_embd=48, block_size=32))
    built = GPT(shape(c.model, 40))
    assert memory.gpt_parameters(c, 40) == num_parameters(built)  # the estimate counts what the model has


@pytest.mark.parametrize("preset", ["conservative", "balanced", "sharded", "aggressive"])
def test_gpu_presets_are_gpt2_small_with_its_padded_vocabulary_124m_parameters(preset):
    c = cfg.from_preset(preset)
    assert c.model.vocab_size == 50304 and c.training.compile and c.training.compile_backend == "inductor"
    assert memory.model_vocab_size(c) == 50304  # not the byte tokenizer's 256
    with torch.device("meta"):  # shapes only: no 124M parameters allocated
        model = GPT(shape(c.model, data.vocab_size(c.data)))
    n = num_parameters(model)
    assert n == memory.gpt_parameters(c) == 124_475_904  # nanoGPT's "124M" (position embeddings included)
    assert model.flops_per_token() == 6 * (n - 1024 * 768) + 12 * 12 * 768 * 1024
    est = memory.estimate(c, 8)
    tokens = c.training.device_batch_size * 1024
    assert est.activations > 12 * tokens * 50304  # the fp32 logits of the real vocabulary, and more
    assert memory.estimate(c, 8, vocab_size=256).total < est.total


def test_the_estimate_and_the_oom_report_share_one_activation_formula_whose_logits_term_is_the_peak():
    c = cfg.from_preset("conservative")  # activation_checkpointing=all
    gpt2 = shape(c.model, data.vocab_size(c.data))
    with torch.device("meta"):
        model = GPT(gpt2)
    batch, policy = c.training.device_batch_size, c.parallel.activation_checkpointing
    assert (
        memory.estimate(c, 8).activations
        == model.activation_bytes(batch, policy)
        == activation_bytes(gpt2, batch, policy)
    )

    def peak(vocab: int, batch: int) -> int:
        torch.manual_seed(0)
        small = GPT(GPTConfig(vocab_size=vocab, n_layer=1, n_head=2, n_embd=16, block_size=32))
        tokens = torch.randint(vocab, (batch, 32))
        with LiveTensorMemory() as live:
            small(tokens, tokens).backward()
        return live.peak_bytes()

    # What grows with the vocabulary alone (the embedding, its gradient) cancels: left is tokens x vocabulary,
    # 12 bytes each at the peak (Note [GPT activation memory]): 64 tokens more, 2000 entries more.
    measured = (peak(3000, 4) - peak(1000, 4)) - (peak(3000, 2) - peak(1000, 2))
    assert measured == 12 * 64 * 2000
    small = GPTConfig(vocab_size=1000, n_layer=1, n_head=2, n_embd=16, block_size=32)
    assert (
        activation_bytes(dataclasses.replace(small, vocab_size=3000), 1) - activation_bytes(small, 1) == 12 * 32 * 2000
    )


def test_a_vocabulary_smaller_than_the_tokenizers_is_refused_with_both_values_and_the_fix():
    assert shape(cfg.ModelConfig(), 58).vocab_size == 58  # 0: the tokenizer's
    assert shape(cfg.ModelConfig(vocab_size=64), 58).vocab_size == 64  # padded: rows no target names
    with pytest.raises(dtcore.ConfigError) as e:
        shape(cfg.ModelConfig(vocab_size=200), 256, "data.tokenizer='byte'")
    message = str(e.value)
    assert "model.vocab_size=200 is smaller than the vocabulary of data.tokenizer='byte', 256 tokens" in message
    assert "Fix: --model.vocab_size=0 (the tokenizer's, 256) or at least 256, e.g. 256" in message
    c = cfg.parse_args(["--preset", "balanced", "--model.vocab_size=100"])
    with pytest.raises(dtcore.ConfigError, match="model.vocab_size=100 is smaller than"):
        memory.estimate(c, 8)


def test_compile_backend_is_checked_only_when_compile_is_on():
    c = cfg.parse_args(["--training.compile_backend=inductr"])
    _check(c)  # compile off: the backend is not read
    c.training.compile = True
    with pytest.raises(dtcore.ConfigError) as e:
        _check(c)
    message = str(e.value)
    assert "training.compile_backend='inductr' is not a backend torch.compile knows (closest: 'inductor')" in message
    assert "Fix: --training.compile_backend=inductor" in message and "aot_eager" in message
    c.training.compile_backend = "aot_eager"
    _check(c)


def test_help_from_the_command_line_and_bad_key_exit_status():
    env = clean_env()
    ok = subprocess.run([sys.executable, "-m", "dtcore.train", "--help"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "--parallel.activation_checkpointing=" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "dtcore.train", "--lrr=1"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "Did you mean 'lr'?" in bad.stderr, bad.stderr
    heads = subprocess.run(
        [sys.executable, "-m", "dtcore.train", "--n_embd=100", "--n_head=3"], env=env, capture_output=True, text=True
    )
    assert heads.returncode == 2 and "model.n_embd=100 is not a multiple of model.n_head=3" in heads.stderr
    vocab = subprocess.run(
        [sys.executable, "-m", "dtcore.train", "--data.tokenizer=byte", "--model.vocab_size=255"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert vocab.returncode == 2 and "model.vocab_size=255 is smaller than the vocabulary of data.tokenizer='byte'" in (
        vocab.stderr
    )


def test_warmup_then_cosine_to_the_floor_or_constant():
    c = cfg.parse_args(["--num_iterations=100", "--warmup_steps=10", "--min_lr_ratio=0.1"])
    assert [lr_factor(c, s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])  # linear from lr / warmup
    assert lr_factor(c, 10) == pytest.approx(1.0) and lr_factor(c, 55) == pytest.approx(0.55)  # cosine midpoint
    assert lr_factor(c, 100) == pytest.approx(0.1) and lr_factor(c, 150) == pytest.approx(0.1)  # the floor
    c.training.schedule = "constant"
    assert lr_factor(c, 50) == lr_factor(c, 99) == 1.0
