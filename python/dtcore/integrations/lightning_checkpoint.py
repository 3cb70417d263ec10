"""What DtcoreStrategy's checkpoints (lightning.py) check in the rest of Lightning's checkpoint dict.

- Hyperparameters. Lightning saves the LightningModule's and the datamodule's hparams in every
  checkpoint; a dtcore checkpoint holds them as plain values, without pickle. Each one must come back
  as it was saved (so that a model can be built again from them): numbers, strings, lists, tuples,
  dicts, tensors, NumPy arrays and argparse.Namespace, of exactly those types. Anything else (a
  Path, an OmegaConf config, an OrderedDict, which would come back as a dict) is a CheckpointError
  that names it and the fix, at the start of fit when a checkpoint callback will save, and at any
  other save (trainer.save_checkpoint), instead of at the first save hours into the run.
- checkpoint["state_dict"]. The weights go between the model and dtcore's files directly (each rank
  its part), not through this dict. Lightning's hooks still see it: the model's own state_dict (views
  of its tensors, no copy, as DDPStrategy gives it; at zero=3, where each rank holds only shards,
  meta tensors: the keys, whole shapes and dtypes, without values). A hook that changes it (keys
  removed, renamed or added, tensors replaced by other values) would change nothing in a dtcore
  checkpoint, so the save, or the load of a dtcore checkpoint, is refused naming the change and the
  hooks that may have made it. What hooks keep under keys of their own is saved and loaded as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_helpers import is_overridden

import dtcore

_SHOWN = 5  # keys named per kind of change in an error


def check_hyperparameters(trainer: Any) -> None:
    """A CheckpointError naming the first hyperparameter (of the LightningModule, then the datamodule) that a
    dtcore checkpoint would not give back as it is."""
    for owner in (trainer.lightning_module, trainer.datamodule):
        hparams = getattr(owner, "hparams", None)
        if not hparams:
            continue
        name = type(owner).__name__
        if not isinstance(hparams, dict):  # save_hyperparameters(cfg) with an OmegaConf config: kept as it is
            kind = f"{type(hparams).__module__}.{type(hparams).__qualname__}"
            raise dtcore.CheckpointError(
                f"{name}.hparams is a {kind}, which a DtcoreStrategy checkpoint cannot hold (it saves hyperparameters "
                "as plain values, without pickle). Fix: save_hyperparameters(OmegaConf.to_container(cfg, "
                "resolve=True)), a dict of plain values."
            )
        for key, value in hparams.items():
            dtcore.checkpoint.check_extra(
                value,
                f"{name}.hparams[{key!r}]",
                exact=True,
                fix=f"save_hyperparameters(ignore=[{key!r}]) to leave it out of the checkpoint, or give it as plain "
                "values, which DtcoreStrategy checkpoints hold without pickle and give back as they were: numbers, "
                "strings, lists, tuples, dicts, tensors, an argparse.Namespace of those (str(path), dict(config), "
                "OmegaConf.to_container(cfg, resolve=True)).",
            )


def model_state(module: torch.nn.Module, wrapper: dtcore.DistributedModel | None) -> dict[str, torch.Tensor]:
    """What Lightning's hooks see as checkpoint["state_dict"]: `module`'s state_dict, as views of its tensors; under
    zero=3 (`wrapper` a FullyShardedModel) meta tensors of the parameters' whole shapes and dtypes, since a
    state_dict() would gather the whole model on every rank."""
    if not isinstance(wrapper, dtcore.FullyShardedModel) or wrapper.module is not module:
        return module.state_dict()
    out: dict[str, torch.Tensor] = {}
    # In state_dict's order and with its keys: each module's parameters, persistent buffers and extra state, then
    # its children's (duplicates under each name).
    for prefix, m in module.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, p in m.named_parameters(recurse=False, remove_duplicate=False):
            out[dot + name] = torch.empty(wrapper.shape_of(p), dtype=wrapper.dtype_of(p), device="meta")
        for name, b in m.named_buffers(recurse=False, remove_duplicate=False):
            if name not in m._non_persistent_buffers_set:  # torch's own record, which state_dict() reads
                out[dot + name] = b.detach()
        if type(m).get_extra_state is not torch.nn.Module.get_extra_state:
            out[dot + "_extra_state"] = m.get_extra_state()
    return out


def check_unedited_for_save(checkpoint: Mapping[str, Any], ours: Mapping[str, Any], trainer: Any, path: Any) -> None:
    """A CheckpointError if the on_save_checkpoint hooks changed checkpoint["state_dict"] from `ours`."""
    edited = changes(checkpoint.get("state_dict"), ours)
    if edited:
        raise dtcore.CheckpointError(
            f"DtcoreStrategy cannot save {path}: {_save_hooks(trainer)} changed checkpoint['state_dict'] ({edited}), "
            "but the weights go from the model itself into the dtcore checkpoint, so the change would be lost. Fix: "
            "leave checkpoint['state_dict'] as it is, and keep what the hook computes under a key of its own "
            "(checkpoint['ema_weights'] = {...} is saved and loaded as it is); or DDPStrategy, whose checkpoint file "
            "holds the edited dict."
        )


def check_unedited_after_load(checkpoint: Mapping[str, Any], ours: Mapping[str, Any], module: Any, path: Any) -> None:
    """A CheckpointError if the LightningModule's on_load_checkpoint changed checkpoint["state_dict"] of the dtcore
    checkpoint at `path` from `ours` (the weights it loaded)."""
    edited = changes(checkpoint.get("state_dict"), ours)
    if edited:
        raise dtcore.CheckpointError(
            f"{type(module).__name__}.on_load_checkpoint changed checkpoint['state_dict'] ({edited}) of the dtcore "
            f"checkpoint {path}, whose weights DtcoreStrategy loaded into the model before the hook ran, so the "
            "change would be lost. Fix: leave checkpoint['state_dict'] of a dtcore checkpoint as it is (it holds this "
            "model's own keys; edits to a Lightning checkpoint file's are applied, as it loads after the hook), and "
            "change weights on the model itself."
        )


def changes(given: Any, ours: Mapping[str, Any]) -> str:
    """What was done to checkpoint["state_dict"] (`given`) against the model's own (`ours`); "" if nothing: the same
    keys, each the same tensor (views of the same memory) or one of the same dtype, shape and values."""
    if given is None:
        return "removed it from the checkpoint"
    if not isinstance(given, Mapping):
        return f"replaced it with a {type(given).__name__}"
    parts = []
    for kind, keys in (
        ("removed or renamed", [k for k in ours if k not in given]),
        ("added", [k for k in given if k not in ours]),
        ("given other values", [k for k in ours if k in given and not _same(given[k], ours[k])]),
    ):
        if keys:
            more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
            parts.append(f"{kind}: {', '.join(map(repr, keys[:_SHOWN]))}{more}")
    return "; ".join(parts)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_meta or b.is_meta:  # no values to compare: the same only if both are meta (zero=3's)
        return a.is_meta and b.is_meta
    if a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True  # a view of the same memory, as each state_dict() of the model gives
    return torch.equal(a.detach().to(b.device), b.detach())


def _save_hooks(trainer: Any) -> str:
    """The on_save_checkpoint hooks that ran for a save (the LightningModule's, the callbacks'), for an error."""
    module = trainer.lightning_module
    hooks = [f"{type(module).__name__}.on_save_checkpoint"] if is_overridden("on_save_checkpoint", module) else []
    hooks += [
        f"{type(c).__name__}.on_save_checkpoint"
        for c in trainer.callbacks
        if is_overridden("on_save_checkpoint", c, parent=Callback)
    ]
    return ", ".join(hooks) or "an on_save_checkpoint hook"
