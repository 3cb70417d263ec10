"""Values that ride along in a checkpoint (dtcore/checkpoint/values.py): the JSON text of encode_json (a
walk in dtcore._C) against a plain Python walk of the same rules, the round trip through decode, and the
refusals, which name where the value is."""

from __future__ import annotations

import argparse
import collections
import enum
import json
import math

import numpy
import pytest
import torch

import dtcore
from dtcore.checkpoint import values

TAGS = values.TAGS  # each of them decode() must give back as a key


def reference(value, tensors, where):
    """values.py's rules, walked in Python (the format's docstring, line by line)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        tensors.append((where, value.detach().contiguous()))
        return {"__tensor__": where}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, argparse.Namespace):
        return {"__namespace__": reference(vars(value), tensors, where)}
    if isinstance(value, (list, tuple)):
        items = [reference(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k in TAGS for k in value):
            return {k: reference(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
        return {
            "__items__": [
                [reference(k, tensors, f"{where}.key"), reference(v, tensors, f"{where}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    if isinstance(value, numpy.ndarray):
        tensors.append((where, torch.from_numpy(value)))
        return {"__ndarray__": where}
    if isinstance(value, numpy.generic):
        return value.item()
    raise AssertionError(value)


class Color(enum.IntEnum):
    RED = 3


Pair = collections.namedtuple("Pair", "a b")


class Dispatching(torch.Tensor):
    """A tensor subclass whose operations run Python (as DTensor's)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.inner if isinstance(t, Dispatching) else t  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def _moved(ordered: collections.OrderedDict) -> collections.OrderedDict:
    ordered.move_to_end("b")  # items() now gives another order than the dict's own storage
    return ordered


def _value():
    return {
        "plain": [None, True, False, 0, -1, 2**70, -(2**64), Color.RED, 0.1, -0.0, 100.0, 1e16, 1e-7, 2.5e-300],
        "odd floats": [math.inf, -math.inf, numpy.float64(0.25)],
        "text": ['quote " back \\ slash', "tab\tnew\nline\r\x00\x1f\x7f", "é ü ß", "𝄞 and \ud800 alone", ""],
        "rng": {"python": [3, torch.arange(5), None], "numpy": ["MT19937", numpy.arange(4, dtype=numpy.uint32), 2]},
        "tuples": (1, (2.0, "x"), Pair(4, [5]), torch.Size([2, 3]), ()),
        "keys": {1: "int", (2, "t"): {"__tensor__": "not a tag's value"}, None: [torch.ones(2, dtype=torch.bfloat16)]},
        "tag as key": {"__tuple__": 1},
        "tags as keys": [{tag: 0} for tag in sorted(TAGS)],
        "args": argparse.Namespace(lr=0.1, sub=argparse.Namespace(scale=torch.ones(2)), sizes=(4, 8)),
        "containers": _moved(collections.OrderedDict(b=collections.defaultdict(list, x=[1]), a={}, c=[2])),
        "dtype": [torch.float32, torch.bfloat16],
        "numpy scalars": [numpy.int64(7), numpy.bool_(True), numpy.float32(0.5)],
        'a "key"\n': torch.zeros(2, 3).t(),  # not contiguous: stored contiguous
        "nested": [[[{"deep": torch.tensor(1.5)}]]],
    }


def test_the_json_text_is_that_of_the_rules_walked_in_python():
    ours, theirs = [], []
    text = values.encode_json(_value(), ours, "extra")
    assert text == json.dumps(reference(_value(), theirs, "extra"))
    assert [k for k, _ in ours] == [k for k, _ in theirs]
    assert "extra['keys'][None][0]" in [k for k, _ in ours] and "extra['a \"key\"\\n']" in [k for k, _ in ours]
    for (_, a), (_, b) in zip(ours, theirs):
        assert a.is_contiguous() and a.dtype == b.dtype and a.tolist() == b.tolist()


def test_decode_gives_back_what_was_encoded():
    tensors: list = []
    encoded = values.encode(_value(), tensors, "extra")
    found = dict(tensors)
    back = values.decode(encoded, lambda key: found[key])
    value = _value()
    assert back["plain"] == value["plain"] and back["text"] == value["text"]
    assert back["tuples"][:2] == (1, (2.0, "x")) and back["tuples"][2] == (4, [5]) and back["tuples"][4] == ()
    assert back["keys"][1] == "int" and back["keys"][(2, "t")] == {"__tensor__": "not a tag's value"}
    assert torch.equal(back["keys"][None][0], value["keys"][None][0]) and back["tag as key"] == {"__tuple__": 1}
    assert back["dtype"] == [torch.float32, torch.bfloat16] and back["numpy scalars"] == [7, True, 0.5]
    assert isinstance(back["rng"]["numpy"][1], numpy.ndarray) and back["rng"]["numpy"][1].tolist() == [0, 1, 2, 3]
    assert math.copysign(1, back["plain"][9]) == -1 and back["plain"][5] == 2**70
    assert torch.equal(back['a "key"\n'], value['a "key"\n']) and back["nested"][0][0][0]["deep"].item() == 1.5
    assert back["tags as keys"] == value["tags as keys"] and type(back["args"].sub) is argparse.Namespace
    assert (back["args"].lr, back["args"].sizes) == (0.1, (4, 8)) and torch.equal(back["args"].sub.scale, torch.ones(2))


def test_what_needs_pickle_is_refused_naming_where_it_is():
    with pytest.raises(dtcore.CheckpointError, match=r"extra\['a'\]\[1\]\.key is a builtins.object"):
        values.encode_json({"a": [0, {object(): 1}]}, [], "extra")
    with pytest.raises(dtcore.CheckpointError, match=r"extra\['f'\]\[\(1, 'x'\)\] is a builtins.function"):
        values.encode_json({"f": {(1, "x"): lambda: 0}}, [], "extra")
    with pytest.raises(dtcore.CheckpointError, match=r"extra\['t'\] is a numpy.datetime64 \(.*\), which a checkpoint"):
        values.encode_json({"t": numpy.datetime64("2026-01-01")}, [], "extra")
    with pytest.raises(dtcore.CheckpointError, match=r"extra\['d'\] is a .*Dispatching, a tensor whose operations"):
        values.encode_json({"d": Dispatching(torch.ones(2))}, [], "extra")
    with pytest.raises(ValueError, match="4300"):  # Python's own limit on an int's digits, as json.dumps says it
        values.encode_json({"big": 10**5000}, [], "extra")
    loop: list = []
    loop.append(loop)
    with pytest.raises(dtcore.CheckpointError, match=r"extra(\[0\])+ is nested more than 500 deep"):
        values.encode_json(loop, [], "extra")


@pytest.mark.parametrize(
    "value, held_as",
    [
        (Color.RED, "int"),
        (numpy.float64(0.5), "float"),
        (numpy.int64(3), "int"),
        (Pair(1, 2), "tuple"),
        (torch.Size([2]), "tuple"),
        (collections.OrderedDict(a=1), "dict"),
        (torch.nn.Parameter(torch.ones(1)), "torch.Tensor"),
    ],
)
def test_exact_refuses_what_comes_back_as_its_base_type_and_only_that(value, held_as):
    values.check_extra({"x": [value]}, "hp")  # held, as its base type
    with pytest.raises(
        dtcore.CheckpointError,
        match=rf"hp\['x'\]\[0\] is a .*, which a checkpoint gives back as a "
        rf"plain {held_as}, not as the type it was saved as. Fix: drop it",
    ):
        values.check_extra({"x": [value]}, "hp", exact=True, fix="drop it")
    values.check_extra({"x": [1, 0.5, "s", None, True, (1,), {"a": torch.ones(1)}, numpy.ones(2)]}, "hp", exact=True)
    values.check_extra(argparse.Namespace(a=[1]), "hp", exact=True)


def test_a_meta_tensor_is_refused_and_a_check_needs_no_list_of_tensors():
    for exact in (False, True):
        with pytest.raises(
            dtcore.CheckpointError, match=r"hp\['m'\] is a meta tensor .* Fix: save a tensor with values"
        ):
            values.check_extra({"m": torch.empty(2, device="meta")}, "hp", exact=exact)
    text = values.encode_json({"t": torch.ones(2)}, None, "hp")  # a check (check_extra): no list to append to
    assert json.loads(text) == {"t": {"__tensor__": "hp['t']"}}
