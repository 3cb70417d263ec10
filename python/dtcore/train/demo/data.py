"""Text for the built-in GPT: the corpus that ships with dtcore, a file, or generated text
(make_corpus), tokenized by character or byte, cut into sequences that the ranks share out epoch by
epoch. `python -m dtcore.train` reads the data section (`build`); the benchmarks, examples and
tests give a text (`from_text`).

Every rank draws the same permutation of sequences each epoch (seeded by seed and epoch) and
takes every world_size-th one from its rank on, so the ranks never see the same sequence in an
epoch. The position (epoch, batches taken) is all the state: `state_dict()` / `load_state_dict()`
make resume exact, mid-epoch included.
"""

from __future__ import annotations

import random
from importlib import resources

import torch

from ... import _C
from ..config import DataConfig


def load_text(config: DataConfig) -> str:
    if not config.path:
        return resources.files(__package__).joinpath("corpus.txt").read_text(encoding="utf-8")
    try:
        with open(config.path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise _C.ConfigError(
            f"data.path={config.path!r}: cannot read it as UTF-8 text ({e}). Fix: give a text file, or leave "
            "data.path empty for the corpus that ships with dtcore."
        ) from None


class Tokenizer:
    """char: the text's distinct characters, sorted, are the vocabulary; byte: the 256 byte values."""

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind
        self.chars = sorted(set(text)) if kind == "char" else []
        self._index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars) if self.kind == "char" else 256

    def encode(self, text: str) -> torch.Tensor:
        if self.kind == "byte":
            return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()
        return torch.tensor([self._index[c] for c in text], dtype=torch.long)


def vocab_size(config: DataConfig) -> int:
    """The vocabulary of data.tokenizer on data's text, as build() would make it (byte: without reading it)."""
    return Tokenizer(config.tokenizer, load_text(config) if config.tokenizer == "char" else "").vocab_size


class TokenData:
    """Batches of (inputs, targets), each (device_batch_size, block_size), this rank's share.

    Iterating yields batches forever, epoch after epoch. Sequences are consecutive windows of
    block_size + 1 tokens (targets are the inputs shifted by one).
    """

    def __init__(
        self, tokens: torch.Tensor, block_size: int, batch_size: int, rank: int, world: int, seed: int
    ) -> None:
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.rank, self.world, self.seed = rank, world, seed
        self.sequences = (len(tokens) - 1) // block_size
        self.batches_per_epoch = self.sequences // world // batch_size
        if self.batches_per_epoch == 0:
            raise _C.ConfigError(
                f"the text has {len(tokens)} tokens: {self.sequences} sequences of block_size={block_size}, fewer than "
                f"one batch of device_batch_size={batch_size} for each of {world} ranks. Fix: a longer text "
                "(data.path), or a smaller model.block_size or training.device_batch_size."
            )
        self.epoch = 0
        self.taken = 0  # batches taken in this epoch
        self._order: torch.Tensor | None = None

    def _mine(self) -> torch.Tensor:
        if self._order is None:  # the same permutation on every rank: seeded by seed and epoch only
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.sequences, generator=gen)
            self._order = order[self.rank :: self.world][: self.batches_per_epoch * self.batch_size]
        return self._order

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.taken == self.batches_per_epoch:
            self.epoch, self.taken, self._order = self.epoch + 1, 0, None
        picks = self._mine()[self.taken * self.batch_size : (self.taken + 1) * self.batch_size]
        self.taken += 1
        rows = torch.stack(
            [self.tokens[s * self.block_size : s * self.block_size + self.block_size + 1] for s in picks]
        )
        return rows[:, :-1], rows[:, 1:]  # (B, T) inputs and targets

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.taken, self._order = int(state["epoch"]), int(state["taken"]), None


def build(config: DataConfig, block_size: int, batch_size: int, rank: int, world: int, seed: int):
    """(tokenizer, training data, evaluation data) of the data section `config` (from_text on its text)."""
    text = load_text(config)
    return from_text(text, config.tokenizer, block_size, batch_size, rank, world, seed, config.eval_fraction)


def from_text(
    text: str,
    kind: str,
    block_size: int,
    batch_size: int,
    rank: int,
    world: int,
    seed: int,
    eval_fraction: float = 0.0,
) -> tuple[Tokenizer, TokenData, TokenData | None]:
    """(tokenizer, training data, evaluation data or None) of `text`, tokenized by `kind` (char or byte):
    this rank's batches of (batch_size, block_size), the text's tail (eval_fraction) held out."""
    tokenizer = Tokenizer(kind, text)
    tokens = tokenizer.encode(text)
    cut = int(len(tokens) * (1.0 - eval_fraction))
    train = TokenData(tokens[:cut], block_size, batch_size, rank, world, seed)
    evaluation = None
    if eval_fraction > 0:  # a short held-out tail is evaluated in smaller batches, not refused
        held = tokens[cut:]
        eval_batch = max(1, min(batch_size, (len(held) - 1) // block_size // world))
        evaluation = TokenData(held, block_size, eval_batch, rank, world, seed)
    return tokenizer, train, evaluation


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
