"""A Hugging Face KV cache handed to a checkpointed block: trained without it, as transformers does.

transformers' models build a KV cache (`use_cache=True`, the config default) also in training and
hand it to every layer, which appends the step's keys and values to it in place. A checkpointed
block runs its forward a second time in backward, which would append them again: with eager
attention the recompute then sees twice the keys (a size mismatch), with "selective" torch's cache
of kept outputs no longer matches, and with sdpa the result is right only because its causal mask
happens to hide the second copy. So, as transformers' own gradient checkpointing does
(GradientCheckpointingLayer), a block in training runs with `use_cache=False` and no cache, and
that is logged once; the cache a training forward returns holds nothing of those blocks. Leaving the cache out is right
only where it holds nothing of this block's layer and does not shape the attention mask: a cache
that already holds tokens (given by the caller) or one of fixed size (StaticCache) is a ConfigError.
In evaluation (`model.eval()`) a block with a cache runs its plain forward, as transformers' layers
do: the cache is what the caller asked for. Under torch.no_grad() nothing is checkpointed anyway.

transformers is never imported here: a cache exists only if the model's code imported it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from .. import _C

log = logging.getLogger("dtcore.activation")

_said: set[str] = set()  # block classes whose cache was left out, logged once each


def _classes(*names: str) -> tuple[type, ...]:
    module = sys.modules.get("transformers.cache_utils")
    return tuple(c for c in (getattr(module, n, None) for n in names) if isinstance(c, type))


def has_cache(args: tuple, kwargs: dict) -> bool:
    """Whether a transformers Cache is among a block call's arguments."""
    cache = _classes("Cache")
    return bool(cache) and any(isinstance(v, cache) for v in (*args, *kwargs.values()))


def _layer_index(block: torch.nn.Module) -> int | None:
    """The cache layer the block writes: the `layer_idx` of its attention (transformers' convention)."""
    for m in block.modules():
        index = getattr(m, "layer_idx", None)
        if isinstance(index, int) and not isinstance(index, bool):
            return index
    return None


def _tokens(cache: Any, index: int | None) -> int:
    if index is None:
        return 0
    try:
        return int(cache.get_seq_length(index))
    except Exception:  # a layer that keeps no keys (linear attention): nothing to repeat there
        return 0


def _refusal(block: torch.nn.Module, name: str, what: str, why: str) -> _C.ConfigError:
    return _C.ConfigError(
        f"checkpoint_activations: block '{name}' ({type(block).__name__}) got past_key_values={what} in a training "
        "forward. The block's forward runs again in backward and would write the cache a second time, and running "
        f"it without the cache {why}. Fix: train with use_cache=False and no past_key_values (model(..., "
        "use_cache=False) or model.config.use_cache = False), run forwards that need no gradient under "
        "torch.no_grad(), or leave this block out of checkpointing (blocks=...)."
    )


def without_cache(block: torch.nn.Module, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The block's arguments with every transformers Cache replaced by None and use_cache=False.

    ConfigError where leaving the cache out would change the result (see the module docstring).
    """
    cache_class, dynamic = _classes("Cache"), _classes("DynamicCache")
    encoder_decoder = _classes("EncoderDecoderCache")

    def dropped(value: Any) -> Any:
        if not cache_class or not isinstance(value, cache_class):
            return value
        parts = (
            [value.self_attention_cache, value.cross_attention_cache]
            if encoder_decoder and isinstance(value, encoder_decoder)
            else [value]
        )
        if not all(dynamic and isinstance(p, dynamic) for p in parts):
            raise _refusal(block, name, f"a {type(value).__name__}", "would not fit the attention mask built for it")
        tokens = _tokens(value, _layer_index(block))
        if tokens:
            raise _refusal(
                block, name, f"a {type(value).__name__} holding {tokens} token(s)", "would leave those tokens out"
            )
        return None

    args = tuple(dropped(a) for a in args)
    kwargs = {k: dropped(v) for k, v in kwargs.items()}
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    kind = type(block).__name__
    if kind not in _said:
        _said.add(kind)
        log.warning(
            "checkpoint_activations: use_cache=True is incompatible with checkpointing: the checkpointed %s "
            "blocks run with use_cache=False and no past_key_values while training, as in transformers' gradient "
            "checkpointing (their forward runs again in backward and would write the KV cache a second time). The "
            "cache a training forward returns holds nothing of them; in model.eval() or under torch.no_grad() it is "
            "filled as usual.",
            kind,
        )
    return args, kwargs
