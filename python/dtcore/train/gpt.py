"""The built-in GPT (a decoder-only transformer, nanoGPT-style) and a generated corpus.

`python -m dtcore.train` trains it, shaped by `shape()` from the model section and the tokenizer;
examples/train_gpt.py, the benchmarks and the tests build it from a GPTConfig. `SHAPES` are the
sizes the benchmarks name.
"""

from __future__ import annotations

import dataclasses
import math
import random

import torch
import torch.nn.functional as F

from .. import _C
from .config import ModelConfig


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


SHAPES = {
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64),  # seconds on a laptop CPU
    "small": GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128),  # ~0.8M parameters
    "20m": GPTConfig(n_layer=6, n_head=8, n_embd=512, block_size=128),  # ~19M: the CPU benchmark
    "gpt2": GPTConfig(vocab_size=50304, n_layer=12, n_head=12, n_embd=768, block_size=1024),  # 124M
}


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
                "dtcore.train.gpt.shape(model, tokenizer_vocab) can decide. Fix: build the GPTConfig with shape()."
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

    def activation_bytes(self, batch_size: int, element_size: int = 2) -> int:
        """Activations kept for backward by one micro-batch of `batch_size` sequences: 34 values per
        token and channel per block (Korthikanti et al. 2022, with fused attention), plus the fp32
        logits and their gradient."""
        c = self.config
        tokens = batch_size * c.block_size
        return 34 * tokens * c.n_embd * c.n_layer * element_size // 2 + 2 * 4 * tokens * c.vocab_size


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_corpus(chars: int = 200_000, seed: int = 0) -> str:
    """Generated text with structure a small model learns quickly: sums and short sentences."""
    rng = random.Random(seed)
    nouns = ["rank", "node", "gpu", "bucket", "tensor", "store", "port", "job", "loss", "step"]
    verbs = ["joins", "waits", "sends", "reduces", "starts", "fails", "holds", "names"]
    parts = []
    size = 0
    while size < chars:
        if rng.random() < 0.5:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            s = f"{a} + {b} = {a + b}. "
        else:
            s = f"the {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)}. "
        parts.append(s)
        size += len(s)
    return "".join(parts)


class CharData:
    """Character-level batches; every rank draws its own, reproducibly (seed + rank)."""

    def __init__(self, text: str, block_size: int, seed: int) -> None:
        self.vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(self.vocab)}
        self.data = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.block_size = block_size
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(len(self.data) - self.block_size - 1, (batch_size,), generator=self.gen)
        x = torch.stack([self.data[s : s + self.block_size] for s in start])  # (B, T)
        y = torch.stack([self.data[s + 1 : s + 1 + self.block_size] for s in start])  # (B, T)
        return x.to(device), y.to(device)


def uniform_loss(vocab: int) -> float:
    return math.log(vocab)
