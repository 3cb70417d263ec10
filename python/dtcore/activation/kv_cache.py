"""A Hugging Face KV cache handed to a checkpointed block: trained without it, as transformers does.

transformers' models build a KV cache (`use_cache=True`, the config default) also in training and
hand it to every layer, which appends the step's keys and values to it in place. A checkpointed
block runs its forward a second time in backward, which would append them again: with eager
attention the recompute then sees twice the keys (a size mismatch), with "selective" torch's cache
of kept outputs no longer matches, and with sdpa the result is right only because its causal mask
happens to hide the second copy. So, as transformers' own gradient checkpointing does
(GradientCheckpointingLayer), a block in training runs with `use_cache=False` and no cache, and
that is logged once; the cache a training forward returns holds nothing of those blocks. Leaving
the cache out is right only where it holds nothing of this block's layer and does not shape the
attention mask: a cache
that already holds tokens (given by the caller) or one of fixed size (StaticCache) is a ConfigError.
In evaluation (`model.eval()`) a block with a cache runs its plain forward, as transformers' layers
do: the cache is what the caller asked for. Under torch.no_grad() nothing is checkpointed anyway.

transformers is never imported here: a cache exists only if the model's code imported it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NamedTuple

import torch

from .. import _C

log = logging.getLogger("dtcore.activation")

_said: set[type] = set()  # block classes whose cache was left out, logged once each


class _CacheTypes(NamedTuple):
    cache: tuple[type, ...]  # each a tuple, empty where transformers lacks the class: isinstance is False
    dynamic: tuple[type, ...]
    encoder_decoder: tuple[type, ...]


_types: _CacheTypes | None = None
_NONE = _CacheTypes((), (), ())


def _cache_types() -> _CacheTypes:
    """transformers' cache classes, looked up once its cache module is loaded (no cache exists before)."""
    global _types
    if _types is None:
        module = sys.modules.get("transformers.cache_utils")
        if module is None:
            return _NONE

        def named(name: str) -> tuple[type, ...]:
            c = getattr(module, name, None)
            return (c,) if isinstance(c, type) else ()

        _types = _CacheTypes(named("Cache"), named("DynamicCache"), named("EncoderDecoderCache"))
    return _types


def has_cache(args: tuple, kwargs: dict) -> bool:
    """Whether a transformers Cache is among a block call's arguments."""
    cache = _cache_types().cache
    return any(isinstance(v, cache) for v in (*args, *kwargs.values()))


def layer_index(block: torch.nn.Module) -> int | None:
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


def _refusal(block: torch.nn.Module, name: str, what: str, why: str, per_block: bool = True) -> _C.ConfigError:
    # per_block: leaving this one block out of checkpointing helps (every layer gets the same fixed-size cache)
    return _C.ConfigError(
        f"checkpoint_activations: block '{name}' ({type(block).__name__}) got past_key_values={what} in a training "
        "forward. The block's forward runs again in backward and would write the cache a second time, and running "
        f"it without the cache {why}. Fix: train with use_cache=False and no past_key_values (model(..., "
        "use_cache=False) or model.config.use_cache = False)"
        + (
            ", run forwards that need no gradient under torch.no_grad(), or leave this block out of checkpointing "
            "(blocks=...)."
            if per_block
            else ", or run forwards that need no gradient under torch.no_grad()."
        )
    )


def without_cache(
    block: torch.nn.Module, name: str, index: int | None, args: tuple, kwargs: dict
) -> tuple[tuple, dict]:
    """The block's arguments with every transformers Cache replaced by None and use_cache=False.

    `index` is the block's cache layer (layer_index()). ConfigError where leaving the cache out would
    change the result (see the module docstring).
    """
    types = _cache_types()

    def dropped(value: Any) -> Any:
        if not isinstance(value, types.cache):
            return value
        is_pair = isinstance(value, types.encoder_decoder)
        parts = [value.self_attention_cache, value.cross_attention_cache] if is_pair else [value]
        if not all(isinstance(p, types.dynamic) for p in parts):
            kinds = " / ".join(type(p).__name__ for p in parts)
            raise _refusal(block, name, f"a {kinds}", "would not fit the attention mask built for it", per_block=False)
        tokens = _tokens(value, index)
        if tokens:
            raise _refusal(
                block, name, f"a {type(value).__name__} holding {tokens} token(s)", "would leave those tokens out"
            )
        return None

    args = tuple(dropped(a) for a in args)
    kwargs = {k: dropped(v) for k, v in kwargs.items()}
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    if type(block) not in _said:
        _said.add(type(block))
        log.warning(
            "checkpoint_activations: use_cache=True is incompatible with checkpointing: the checkpointed %s "
            "blocks run with use_cache=False and no past_key_values while training, as in transformers' gradient "
            "checkpointing (their forward runs again in backward and would write the KV cache a second time). The "
            "cache a training forward returns holds nothing of them; in model.eval() or under torch.no_grad() it is "
            "filled as usual. Set model.config.use_cache = False (or pass use_cache=False) to train without the "
            "cache and silence this.",
            type(block).__name__,
        )
    return args, kwargs
