"""dtcore behind Hugging Face's `Trainer`: one line changes in a Trainer script.

    from dtcore.integrations.transformers import Trainer, DtcorePlugin   # was: from transformers import Trainer

    trainer = Trainer(model=model, args=training_args, train_dataset=ds, dtcore_plugin=DtcorePlugin(zero=2))
    trainer.train()                      # or trainer.train(resume_from_checkpoint=True)

Why a Trainer subclass over dtcore's Accelerator: transformers 5.23's Trainer does everything
distributed through `self.accelerator` (prepare of the model and optimizer, clip_grad_norm_,
gather, the data loaders' sharding), and builds it in `create_accelerator_and_postprocess` from
`_build_accelerator_args`. dtcore's accelerate adapter (dtcore.integrations.accelerate) already
turns that prepare() into dtcore.wrap and a ShardedOptimizer; this module hands the Trainer that
Accelerator, built from the same arguments, and adds what the Trainer does outside the
Accelerator: the optimizer in its checkpoints, and save_model's gathering of the weights.
TrainingArguments keep their meaning; dtcore's options are the DtcorePlugin's (the accelerate
adapter's class).

The contract:
- `Trainer(..., dtcore_plugin=DtcorePlugin(zero=...))`: every other argument is transformers'.
  `self.accelerator` is dtcore.integrations.accelerate.Accelerator (dtcore.init() first: it takes
  over a process group TrainingArguments set up, of the same ranks), so training runs on a
  dtcore model (`self.model_wrapped`), with a ShardedOptimizer at zero>=1 and dtcore's
  shard-aware clipping at zero>=2. `self.model` stays the plain model, as with torch DDP.
  TrainingArguments(ddp_find_unused_parameters=True) and ddp_bucket_cap_mb reach dtcore.wrap
  when the plugin leaves them unset.
- Checkpoints (`save_steps`, `resume_from_checkpoint`): the Trainer's checkpoint-<step> folders
  as ever (model.safetensors, scheduler, RNG states, trainer_state.json), with the model and its
  optimizer as a dtcore checkpoint in `checkpoint-<step>/dtcore` instead of optimizer.pt: each
  rank writes its shard of the optimizer state (no pickle), and it reshards at load to another
  ZeRO stage (and, as every dtcore checkpoint, to another number of ranks). A stock Trainer's
  checkpoint (optimizer.pt, the whole state) resumes too, cut into this rank's shards.
- `save_model` (and each checkpoint's model.safetensors): whole weights, loadable by
  from_pretrained, gathered on every rank (a collective at zero=3) and written by the main one.
  `evaluate`, `predict`, `load_best_model_at_end`: transformers', unchanged, on the plain model
  (at zero=3 its forward gathers the parameters as in training).
- Refused with a ConfigError that names the value and the fix, as the Trainer is built:
  TrainingArguments with deepspeed, fsdp, parallelism_config, torch_compile, fp16 with zero>=1,
  ddp_broadcast_buffers or ddp_static_graph. ddp_backend="nccl" on a machine without GPUs never
  gets here: TrainingArguments' own process group fails first.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Any

import torch
import transformers
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedDataParallelKwargs
from transformers.trainer import SCHEDULER_NAME  # the LR scheduler's file in a checkpoint folder

import dtcore
from dtcore.integrations.accelerate import Accelerator, DtcorePlugin

__all__ = ["CHECKPOINT_FOLDER", "DtcorePlugin", "Trainer"]

CHECKPOINT_FOLDER = "dtcore"  # in each checkpoint-<step> folder: the model and optimizer as a dtcore checkpoint


def _refuse(what: str, fix: str) -> dtcore.ConfigError:
    return dtcore.ConfigError(f"dtcore.integrations.transformers.Trainer with {what}. Fix: {fix}")


def _check(args: transformers.TrainingArguments, plugin: DtcorePlugin) -> None:
    """ConfigError for TrainingArguments (and plugin options) that dtcore cannot honour."""
    engines = {
        "deepspeed": args.deepspeed,
        "fsdp": args.fsdp or None,  # TrainingArguments turns fsdp="" into []
        "parallelism_config": args.parallelism_config,
    }
    for name, value in engines.items():
        if value is not None:
            raise _refuse(f"TrainingArguments({name}={value!r}): it would wrap the model too", f"drop {name}.")
    if args.torch_compile:
        raise _refuse(
            "TrainingArguments(torch_compile=True): accelerate's dynamo wrapper would compile around dtcore's reducer",
            "drop torch_compile (and torch_compile_backend/torch_compile_mode).",
        )
    if args.fp16 and plugin.zero >= 1:
        raise _refuse(
            f"TrainingArguments(fp16=True) and DtcorePlugin(zero={plugin.zero}): fp16's GradScaler unscales whole "
            "gradients, which a ShardedOptimizer does not hold",
            "use bf16=True (no scaler), or DtcorePlugin(zero=0) for fp16.",
        )
    if args.auto_find_batch_size:
        raise _refuse(
            "TrainingArguments(auto_find_batch_size=True): its retry after an out-of-memory error wraps the model "
            "again while the optimizer still steps the first wrapper's shards",
            "set per_device_train_batch_size yourself (python -m dtcore.train's OOM report gives the cheapest fixes).",
        )
    for name in ("ddp_broadcast_buffers", "ddp_static_graph"):
        if getattr(args, name) is not None:
            raise _refuse(
                f"TrainingArguments({name}={getattr(args, name)!r}): a torch DDP option dtcore has no counterpart for",
                f"leave {name} unset.",
            )


def _plugin_with_ddp_options(plugin: DtcorePlugin, args: transformers.TrainingArguments) -> DtcorePlugin:
    """The plugin, with TrainingArguments' ddp_find_unused_parameters=True and ddp_bucket_cap_mb where it leaves
    them unset. Only explicit values: the Trainer's own default (find_unused_parameters=True for a PreTrainedModel
    without activation checkpointing) is a guess for torch DDP that dtcore does not need."""
    changes: dict[str, Any] = {}
    if args.ddp_find_unused_parameters and not plugin.find_unused_parameters:
        changes["find_unused_parameters"] = True
    if args.ddp_bucket_cap_mb is not None and plugin.bucket_mb is None:
        changes["bucket_mb"] = float(args.ddp_bucket_cap_mb)
    return dataclasses.replace(plugin, **changes) if changes else plugin


class Trainer(transformers.Trainer):
    """transformers' Trainer, training a dtcore model (a ShardedOptimizer at zero>=1) through dtcore's Accelerator.

    dtcore_plugin: dtcore's options (DtcorePlugin(): zero=0). Every other argument is transformers'.
    See the module docstring for what changes and what is refused.
    """

    def __init__(self, *args: Any, dtcore_plugin: DtcorePlugin | None = None, **kwargs: Any) -> None:
        # Set before transformers' __init__, which builds the accelerator (create_accelerator_and_postprocess).
        self.dtcore_plugin = dtcore_plugin if dtcore_plugin is not None else DtcorePlugin()
        super().__init__(*args, **kwargs)

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        """transformers' Accelerator arguments, checked against what dtcore can honour, kept for dtcore's."""
        _check(self.args, self.dtcore_plugin)
        built = super()._build_accelerator_args(**kwargs)
        self._dtcore_accelerator_args = dict(built)
        return built

    def create_accelerator_and_postprocess(self) -> None:
        """transformers' setup, then dtcore's Accelerator in place of accelerate's, from the same arguments."""
        # transformers builds accelerate's Accelerator inline, after ~60 lines that turn TrainingArguments into
        # its arguments; running them and then replacing the result keeps them transformers' own. The first
        # Accelerator only registers in accelerate's shared state, which the second takes over.
        super().create_accelerator_and_postprocess()
        built = dict(self._dtcore_accelerator_args)
        # Trainer passes torch DDP's options as DistributedDataParallelKwargs, which dtcore's Accelerator refuses:
        # they reach dtcore through the plugin.
        built["kwargs_handlers"] = [
            h for h in built.get("kwargs_handlers") or () if not isinstance(h, DistributedDataParallelKwargs)
        ]
        self.dtcore_plugin = _plugin_with_ddp_options(self.dtcore_plugin, self.args)
        if not dtcore.is_initialized():
            # TrainingArguments(ddp_timeout=1800) is the stock Trainer's wait for its collectives (a long save on
            # the main process while the others wait, for one); dtcore's init() makes it dtcore's.
            dtcore.init(timeout=self.args.ddp_timeout)
        self.accelerator = Accelerator(dtcore_plugin=self.dtcore_plugin, **built)
        # As transformers binds it, to the accelerator that now stands.
        self.gather_function = self.accelerator.gather_for_metrics
        if "use_gather_object" in inspect.signature(self.gather_function).parameters:
            self.gather_function = functools.partial(
                self.gather_function, use_gather_object=self.args.eval_use_gather_object
            )

    # --- checkpoints -------------------------------------------------------------------------------

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The model and optimizer as a dtcore checkpoint in output_dir/dtcore (every rank its shard); the
        scheduler as transformers saves it."""
        model = self.model_wrapped
        if not isinstance(model, dtcore.DistributedModel):
            return super()._save_optimizer_and_scheduler(output_dir)
        path = os.path.join(output_dir, CHECKPOINT_FOLDER)
        dtcore.save_checkpoint(path, model=model, optimizer=self._plain_optimizer(), step=self.state.global_step)
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """From checkpoint/dtcore (resharded to this world and stage) where it exists, else transformers' (a stock
        Trainer's optimizer.pt: its whole state, which a ShardedOptimizer cuts into this rank's shards)."""
        model = self.model_wrapped
        path = os.path.join(checkpoint, CHECKPOINT_FOLDER) if checkpoint is not None else None
        if path is None or not isinstance(model, dtcore.DistributedModel) or not os.path.isdir(path):
            return super()._load_optimizer_and_scheduler(checkpoint)
        # The weights again, as saved with the optimizer state; transformers loaded model.safetensors before prepare.
        dtcore.load_checkpoint(path, model=model, optimizer=self._plain_optimizer())
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))

    def _plain_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer under accelerate's AcceleratedOptimizer: a ShardedOptimizer at zero>=1."""
        optimizer = self.optimizer
        return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """transformers' _save (save_pretrained on the writer) of a dtcore model's whole weights, gathered by all."""
        model = self.model_wrapped
        if (
            state_dict is None
            and isinstance(model, dtcore.DistributedModel)
            and (model.zero == 3 or self.args.should_save)
        ):
            # At zero=3 every rank, before transformers' _save returns on all but the writer: the whole weights are
            # an all-gather of each rank's shards, which the writer alone would wait in until dtcore's timeout.
            # Below, the parameters are whole on every rank: the writer alone copies them.
            state_dict = self.accelerator.get_state_dict(model)
        super()._save(output_dir, state_dict=state_dict)
