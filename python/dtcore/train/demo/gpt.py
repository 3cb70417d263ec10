"""The built-in GPT (a decoder-only transformer, nanoGPT-style) and what a step of it holds.

`python -m dtcore.train` trains it, shaped by `shape()` from the model section and the tokenizer;
examples/train_gpt.py, the benchmarks and the tests build it from a GPTConfig, or from one of the
named sizes of dtcore.train.config.SHAPES through `shape()`. `activation_bytes()` is its
activation memory, for the presets' estimate and the out-of-memory diagnosis (dtcore.train.memory).

Note [GPT activation memory]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A step's activations peak where backward starts: every block still holds what it keeps, and the
loss's backward runs on the largest tensors of the step, tokens x vocabulary.
  - A block keeps 34 bytes per token and channel in 16-bit (Korthikanti et al. 2022, with fused
    attention: no term in the sequence length squared). Under activation checkpointing every
    policy keeps at least each block's input (2 bytes per token and channel); the block being
    recomputed holds its 34 again.
  - The loss, `cross_entropy(logits.float())`, keeps one tensor of tokens x vocabulary for
    backward: the fp32 log-probabilities (log_softmax's output, which nll_loss reads as well); the
    logits and their fp32 copy are freed once the loss is computed. Its backward first makes the
    log-probabilities' gradient (nll_loss's, dense fp32), then from both the logits' gradient
    (fp32): three fp32 tensors of tokens x vocabulary alive at once, 12 bytes per token and
    vocabulary entry. That is the step's peak (the forward's is 10 under 16-bit autocast: the
    logits, their fp32 copy and the log-probabilities; the saved tensor alone is 4).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from ... import _C
from ..config import ModelConfig


@dataclasses.dataclass
class GPTConfig(ModelConfig):
    """The model section (dtcore.train.ModelConfig) with its vocabulary decided: `shape()` makes one
    from a model section and the tokenizer."""

    vocab_size: int = 64


def shape(model: ModelConfig, tokenizer_vocab: int, tokenizer: str = "the tokenizer") -> GPTConfig:
    """The built-in GPT's shape for a model section, checked: its vocabulary is model.vocab_size, or
    `tokenizer_vocab` where that is 0. The one place the vocabulary is decided (python -m dtcore.train,
    the memory estimate, the benchmarks); `tokenizer` names the tokenizer in errors."""
    if model.n_head < 1 or model.n_embd % model.n_head:
        raise _C.ConfigError(
            f"model.n_embd={model.n_embd} is not a multiple of model.n_head={model.n_head}: the heads split the "
            "width evenly. Fix: change either, e.g. --model.n_embd="
            + str(max(model.n_head, 1) * max(1, model.n_embd // max(model.n_head, 1)))
        )
    vocab = model.vocab_size or tokenizer_vocab
    if vocab < tokenizer_vocab:
        padded = -(-tokenizer_vocab // 64) * 64
        raise _C.ConfigError(
            f"model.vocab_size={model.vocab_size} is smaller than the vocabulary of {tokenizer}, {tokenizer_vocab} "
            f"tokens: tokens {max(model.vocab_size, 0)} to {tokenizer_vocab - 1} would have no embedding row. Fix: "
            f"--model.vocab_size=0 (the tokenizer's, {tokenizer_vocab}) or at least {tokenizer_vocab}, e.g. {padded} "
            "(a multiple of 64)."
        )
    return GPTConfig(**{**dataclasses.asdict(model), "vocab_size": vocab})


class Block(torch.nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(c.n_embd)
        self.qkv = torch.nn.Linear(c.n_embd, 3 * c.n_embd)
        self.proj = torch.nn.Linear(c.n_embd, c.n_embd)
        self.ln2 = torch.nn.LayerNorm(c.n_embd)
        self.fc = torch.nn.Linear(c.n_embd, 4 * c.n_embd)
        self.out = torch.nn.Linear(4 * c.n_embd, c.n_embd)
        self.n_head = c.n_head
        self.dropout = c.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)  # each (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        if c.vocab_size < 1:
            raise _C.ConfigError(
                f"GPT(vocab_size={c.vocab_size}): a model section's 0 means the tokenizer's vocabulary, which only "
                "dtcore.train.demo.gpt.shape(model, tokenizer_vocab) can decide. Fix: build the GPTConfig with shape()."
            )
        self.config = c
        self.tok = torch.nn.Embedding(c.vocab_size, c.n_embd)
        self.pos = torch.nn.Embedding(c.block_size, c.n_embd)
        self.blocks = torch.nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln = torch.nn.LayerNorm(c.n_embd)
        self.head = torch.nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied embeddings
        self.apply(self._init)

    @staticmethod
    def _init(m: torch.nn.Module) -> None:
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            torch.nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))  # (B, T, vocab)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per parameter (forward and backward matmuls) plus attention
        (PaLM's appendix B, as nanoGPT counts them); the position embedding does no matmul."""
        c = self.config
        n = num_parameters(self) - self.pos.weight.numel()
        return 6.0 * n + 12.0 * c.n_layer * c.n_embd * c.block_size

    def activation_bytes(self, batch_size: int, checkpointing: str = "none") -> int:
        """activation_bytes() of this model's shape: the activation estimate that the out-of-memory
        diagnosis reads from a model that gives one (dtcore.train.memory.measure)."""
        return activation_bytes(self.config, batch_size, checkpointing)


def activation_bytes(c: GPTConfig, batch_size: int, checkpointing: str = "none") -> int:
    """The activation memory of one micro-batch of `batch_size` sequences at its peak, the start of
    backward (Note [GPT activation memory]); `checkpointing`: parallel.activation_checkpointing's policy
    (any but none keeps at least the blocks' inputs)."""
    tokens = batch_size * c.block_size
    per_block = 34 * tokens * c.n_embd
    if checkpointing == "none":
        blocks = per_block * c.n_layer
    else:
        blocks = 2 * tokens * c.n_embd * c.n_layer + per_block
    return blocks + 3 * 4 * tokens * c.vocab_size


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def uniform_loss(vocab: int) -> float:
    return math.log(vocab)
