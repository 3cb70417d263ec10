"""The text of `python -m dtcore.train`: a file given by data.path, its tokenizers, the held-out tail, each
rank's share of an epoch, and the errors for a file that cannot be read or is too short."""

import pytest
import torch

import dtcore
from dtcore.train import DataConfig
from dtcore.train.demo.data import build, from_text, make_corpus


def test_a_text_file_by_path_is_tokenized_split_and_batched(tmp_path):
    path = tmp_path / "corpus.txt"
    text = "".join(f"line {i}: the quick brown fox\n" for i in range(200))
    path.write_text(text)
    tokenizer, train, held = build(DataConfig(path=str(path), eval_fraction=0.1), 16, 4, 0, 1, 0)
    assert tokenizer.vocab_size == len(set(text))
    assert len(train.tokens) == int(len(text) * 0.9) and len(held.tokens) == len(text) - len(train.tokens)
    x, y = train.next_batch()
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])  # targets: inputs shifted by one
    decoded = "".join(tokenizer.chars[i] for i in x[0].tolist())
    assert decoded in text
    _, as_bytes, _ = build(DataConfig(path=str(path), tokenizer="byte"), 16, 4, 0, 1, 0)
    assert as_bytes.tokens[:5].tolist() == list(b"line ")


def test_ranks_take_disjoint_sequences_of_an_epoch(tmp_path):
    shares = []
    for rank in range(3):
        _, train, _ = build(DataConfig(), 32, 2, rank, 3, 7)
        shares.append(set(train._mine().tolist()))
    assert all(shares[i].isdisjoint(shares[j]) for i in range(3) for j in range(i + 1, 3))
    assert len({len(s) for s in shares}) == 1  # the same number of batches on every rank


def test_a_text_of_the_callers_own_gives_the_same_batches_as_that_text_from_a_file(tmp_path):
    text = make_corpus(chars=20_000)
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    _, by_path, _ = build(DataConfig(path=str(path), eval_fraction=0.0), 32, 4, 1, 2, 5)
    tokenizer, given, held = from_text(text, "char", 32, 4, 1, 2, 5)
    assert held is None and tokenizer.vocab_size == len(set(text))
    for _ in range(by_path.batches_per_epoch + 2):  # into the next epoch
        assert all(torch.equal(a, b) for a, b in zip(by_path.next_batch(), given.next_batch()))


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "data.path="),
        (b"\xff\xfe not utf-8", "cannot read it as UTF-8 text"),
        (b"too short", "fewer than one batch of device_batch_size=4"),
    ],
)
def test_a_file_that_cannot_serve_is_refused_with_the_fix(tmp_path, content, needle):
    path = tmp_path / "text.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(dtcore.ConfigError, match="Fix: ") as e:
        build(DataConfig(path=str(path)), 16, 4, 0, 1, 0)
    assert needle in str(e.value)
