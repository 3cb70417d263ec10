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
  as ever (config, scheduler, RNG states, trainer_state.json; model.safetensors at zero<3), with the
  model and its optimizer as a dtcore checkpoint in `checkpoint-<step>/dtcore` instead of
  optimizer.pt: each rank writes its shard of the optimizer state (no pickle), and it reshards at
  load to another ZeRO stage and another number of processes (Note [Resuming at another world
  size]). A stock Trainer's checkpoint (optimizer.pt, the whole state) resumes too, cut into this
  rank's shards.
- `save_model`: whole weights, loadable by from_pretrained, gathered on every rank (a collective at
  zero=3: every rank calls it) and written by the main one. `evaluate`, `predict`,
  `load_best_model_at_end`: transformers', on the plain model (at zero=3 its forward gathers the
  parameters as in training; the best checkpoint's weights come from its dtcore shards).
- Refused with a ConfigError that names the value and the fix, as the Trainer is built:
  TrainingArguments with deepspeed, fsdp, parallelism_config, torch_compile, fp16 with zero>=1,
  auto_find_batch_size, ddp_broadcast_buffers or ddp_static_graph. ddp_backend="nccl" on a machine
  without GPUs never gets here: TrainingArguments' own process group fails first. At resume, a
  checkpoint whose steps would be other samples here (Note [Resuming at another world size]).
- `hyperparameter_search`: transformers' (untested with its backends, which dtcore does not
  install); each trial's model_init model is wrapped afresh and its TrainingArguments build a new
  Accelerator, as with torch DDP.

Note [Resuming at another world size]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The dtcore checkpoint reshards, but the Trainer resumes its own parts by optimizer steps:
trainer_state.json's global_step becomes epochs and batches to skip (skip_first_batches), and the
scheduler counts steps. That is the same data and schedule at another number of processes exactly
when the global batch (processes x per_device_train_batch_size x gradient_accumulation_steps) is
the same (accelerate's sharded loaders deal consecutive batches to the ranks, so a step covers the
same samples however the global batch is split) and an epoch has as many steps (it may not where
the dataset's length is no multiple of the global batch). The dtcore checkpoint's extra records
both; _init_training_state refuses a resume that breaks either with a ConfigError giving the
arguments that fix it. A stock Trainer's checkpoint records neither: a WARNING where its RNG files
say another number of processes saved it. The RNG states (rng_state_<rank>.pth, one per process)
cannot map onto another number of processes: transformers restores what it finds, and a WARNING
says that random draws (dropout) differ from the uninterrupted run's; the data order does not
depend on them (the Trainer's seedable sampler: TrainingArguments.seed and the epoch).

Note [Weights in a checkpoint at zero=3]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
At zero=3 each rank holds a shard of the parameters. Whole weights in every checkpoint would be an
all-gather that puts the whole model in each rank's memory at every save, and a second copy of what
checkpoint/dtcore holds. As the Trainer's DeepSpeed ZeRO-3 without
stage3_gather_16bit_weights_on_model_save (and FSDP's SHARDED_STATE_DICT), a checkpoint then holds
only the shards: no model.safetensors, the config and processing class still. Resuming and
load_best_model_at_end read the weights from the shards; `dtcore.checkpoint.export(
"checkpoint-N/dtcore", "checkpoint-N/model.safetensors")` makes the folder a from_pretrained one,
offline, with no gather. save_model called by the user still writes the whole weights. At zero<3
the weights are whole on every rank: checkpoints keep model.safetensors, as the stock Trainer's.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import inspect
import json
import logging
import os
from typing import Any

import torch
import transformers
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedDataParallelKwargs

# The file names in a checkpoint folder: the LR scheduler's, and the model's weights (whole or by shards, .bin or not).
from transformers.trainer import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SCHEDULER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from transformers.trainer_utils import has_length

import dtcore
from dtcore.integrations.accelerate import Accelerator, DtcorePlugin

__all__ = ["CHECKPOINT_FOLDER", "DtcorePlugin", "Trainer"]

CHECKPOINT_FOLDER = "dtcore"  # in each checkpoint-<step> folder: the model and optimizer as a dtcore checkpoint

log = logging.getLogger(__name__)

_WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
_RESUME_KEY = "trainer_batch"  # in the dtcore checkpoint's extra: what the Trainer's global_step means in samples


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


def _manifest(checkpoint: str) -> dict[str, Any] | None:
    """checkpoint/dtcore's manifest (Note [Checkpoint layout], docs/checkpoint.md), or None: no dtcore checkpoint."""
    path = os.path.join(checkpoint, CHECKPOINT_FOLDER, "manifest.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _weights_only_in_dtcore(checkpoint: str) -> bool:
    """A checkpoint folder whose model weights are only in its dtcore checkpoint (a zero=3 model's)."""
    has_weights = any(os.path.isfile(os.path.join(checkpoint, name)) for name in _WEIGHT_FILES)
    return not has_weights and _manifest(checkpoint) is not None


def _saved_world_size(checkpoint: str) -> int | None:
    """How many processes wrote the checkpoint folder: its dtcore manifest's world_size, else the count of the
    Trainer's RNG files (rng_state_<rank>.pth; rng_state.pth alone: 1), else None."""
    manifest = _manifest(checkpoint)
    if manifest is not None:
        return int(manifest["world_size"])
    ranks = glob.glob(os.path.join(checkpoint, "rng_state_*.pth"))
    if ranks:
        return len(ranks)
    return 1 if os.path.isfile(os.path.join(checkpoint, "rng_state.pth")) else None


def _batch(record: dict[str, int]) -> int:
    return record["world_size"] * record["per_device_train_batch_size"] * record["gradient_accumulation_steps"]


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _described(record: dict[str, int]) -> str:
    per_device, accumulation = record["per_device_train_batch_size"], record["gradient_accumulation_steps"]
    return (
        f"{_batch(record)} ({_processes(record['world_size'])} x per_device_train_batch_size {per_device} x "
        f"gradient_accumulation_steps {accumulation})"
    )


def _batch_fix(saved: dict[str, int], mine: dict[str, int]) -> str:
    """The TrainingArguments that give `mine` the global batch of `saved` at its number of processes."""
    target, world = _batch(saved), mine["world_size"]
    per_device, accumulation = mine["per_device_train_batch_size"], mine["gradient_accumulation_steps"]
    if target % (world * per_device) == 0:
        return f"gradient_accumulation_steps={target // (world * per_device)}"
    if target % (world * accumulation) == 0:
        return f"per_device_train_batch_size={target // (world * accumulation)}"
    return (
        f"resume at {_processes(saved['world_size'])}, or at a number of processes that divides {target} with "
        f"per_device_train_batch_size x gradient_accumulation_steps = {target} / processes"
    )


def _check_resume(checkpoint: str, mine: dict[str, Any]) -> None:
    """ConfigError where the checkpoint's optimizer steps are other samples here (see Note [Resuming at another
    world size]): another global batch, or another number of steps in an epoch past the first epoch's end."""
    manifest = _manifest(checkpoint)
    saved = ((manifest or {}).get("extra") or {}).get(_RESUME_KEY)
    if saved is None:  # a stock Trainer's checkpoint (or one of dtcore before the record): nothing to check against
        world = _saved_world_size(checkpoint)
        if world is not None and world != mine["world_size"]:
            log.warning(
                "%s was saved by %s and resumes at %d: the Trainer resumes "
                "its data position by optimizer steps, which is right only with the global batch "
                "(processes x per_device_train_batch_size x gradient_accumulation_steps) that saved it, and this "
                "checkpoint does not record it. Make sure it is the same.",
                checkpoint,
                _processes(world),
                mine["world_size"],
            )
        return
    where = f"dtcore.integrations.transformers.Trainer resuming from {checkpoint}"
    if _batch(saved) != _batch(mine):
        raise dtcore.ConfigError(
            f"{where}: it was saved with a global batch of {_described(saved)}, this run's is {_described(mine)}. The "
            "Trainer resumes its data position, epochs and learning-rate schedule by optimizer steps, so "
            f"{manifest['step']} steps would be {manifest['step'] * _batch(mine)} samples here where "
            f"{manifest['step'] * _batch(saved)} were trained. Fix: {_batch_fix(saved, mine)}, which gives the "
            f"global batch of {_batch(saved)}."
        )
    before, now = saved.get("steps_per_epoch"), mine["steps_per_epoch"]
    if before is not None and now is not None and before != now and manifest["step"] >= min(before, now):
        raise dtcore.ConfigError(
            f"{where}: an epoch was {before} optimizer steps there and is {now} here (the same global batch, so the "
            "dataset changed, or its length is no multiple of the global batch and its last batch is split otherwise "
            f"at {_processes(mine['world_size'])}), and step {manifest['step']} is past an epoch's end, which the "
            "Trainer's data position counts in this run's epochs: it would skip other samples. Fix: resume at "
            f"{_processes(saved['world_size'])} with the same dataset, or give the dataset a multiple of "
            f"{_batch(saved)} samples."
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

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """transformers' (called once the optimizer is prepared); a scheduler the script gave (Trainer(optimizers=))
        was built over the optimizer a zero>=1 model's ShardedOptimizer replaced, and is pointed at it."""
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if isinstance(self.accelerator, Accelerator):
            self.accelerator.follow(scheduler)
        return scheduler

    # --- checkpoints -------------------------------------------------------------------------------
    # See Note [Resuming at another world size] and Note [Weights in a checkpoint at zero=3] in the module docstring.

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """transformers'; save_model, called inside it, knows that it writes a checkpoint."""
        self._dtcore_checkpointing = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._dtcore_checkpointing = False

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """transformers' save_model (the whole weights); in a checkpoint of a zero=3 model, no weights but the
        config (the dtcore checkpoint beside them holds the shards, ungathered)."""
        model = self.model_wrapped
        if not (
            getattr(self, "_dtcore_checkpointing", False)
            and isinstance(model, dtcore.DistributedModel)
            and model.zero == 3
        ):
            return super().save_model(output_dir, _internal_call=_internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        # As the Trainer's DeepSpeed ZeRO-3 path without stage3_gather_16bit_weights_on_model_save: an empty
        # state_dict writes the config, the processing class and the training arguments (on the writer alone, no
        # collective) and no weights.
        super()._save(output_dir, state_dict={})
        if self.args.should_save:
            # A plain module's branch of transformers' _save writes an empty file; an earlier save's would be stale.
            for name in _WEIGHT_FILES:
                if os.path.isfile(os.path.join(output_dir, name)):
                    os.remove(os.path.join(output_dir, name))
        if self.args.save_only_model:  # no _save_optimizer_and_scheduler follows: the weights are written here
            path = os.path.join(output_dir, CHECKPOINT_FOLDER)
            dtcore.save_checkpoint(path, model=model, step=self.state.global_step, extra=self._resume_record())

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The model and optimizer as a dtcore checkpoint in output_dir/dtcore (every rank its shard), with what the
        data position means (_resume_record); the scheduler as transformers saves it."""
        model = self.model_wrapped
        if not isinstance(model, dtcore.DistributedModel):
            return super()._save_optimizer_and_scheduler(output_dir)
        path = os.path.join(output_dir, CHECKPOINT_FOLDER)
        dtcore.save_checkpoint(
            path,
            model=model,
            optimizer=self._plain_optimizer(),
            step=self.state.global_step,
            extra=self._resume_record(),
        )
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _resume_record(self) -> dict[str, Any]:
        """The dtcore checkpoint's extra: what its global_step means in samples (the global batch's parts) and
        the optimizer steps of an epoch, which _init_training_state checks at resume."""
        return {
            _RESUME_KEY: {
                "world_size": dtcore.get_context().world_size,
                "per_device_train_batch_size": self._train_batch_size,
                "gradient_accumulation_steps": self.args.gradient_accumulation_steps,
                "steps_per_epoch": getattr(self, "_dtcore_steps_per_epoch", None),
            }
        }

    def _init_training_state(
        self,
        max_steps: int,
        num_update_steps_per_epoch: int,
        num_train_epochs: int,
        resume_from_checkpoint: str | None,
        trial: Any,
    ) -> tuple[int, int]:
        """transformers' (it turns the checkpoint's global_step into epochs and batches to skip), after checking
        that the checkpoint's steps mean the same samples here: ConfigError otherwise."""
        # Without a length (an IterableDataset), transformers counts max_steps as one epoch: no epoch to compare.
        dataset = self.train_dataset
        sized = has_length(dataset) and not isinstance(dataset, torch.utils.data.IterableDataset)
        self._dtcore_steps_per_epoch = num_update_steps_per_epoch if sized else None
        if resume_from_checkpoint is not None:
            _check_resume(resume_from_checkpoint, self._resume_record()[_RESUME_KEY])
        return super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        """transformers' loading of the checkpoint's weights into the plain model; a zero=3 checkpoint has them only
        in checkpoint/dtcore, which _load_optimizer_and_scheduler loads into the wrapped model."""
        if not _weights_only_in_dtcore(resume_from_checkpoint):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """From checkpoint/dtcore (resharded to this world and stage) where it exists, else transformers' (a stock
        Trainer's optimizer.pt: its whole state, which a ShardedOptimizer cuts into this rank's shards)."""
        model = self.model_wrapped
        path = os.path.join(checkpoint, CHECKPOINT_FOLDER) if checkpoint is not None else None
        if path is None or not isinstance(model, dtcore.DistributedModel) or not os.path.isdir(path):
            return super()._load_optimizer_and_scheduler(checkpoint)
        # The weights (again, where model.safetensors was loaded before prepare), with the optimizer state.
        dtcore.load_checkpoint(path, model=model, optimizer=self._plain_optimizer())
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """transformers'; a WARNING where the checkpoint was saved by another number of processes, whose RNG states
        (rng_state_<rank>.pth) do not map onto these."""
        saved = _saved_world_size(checkpoint) if checkpoint is not None else None
        world = dtcore.get_context().world_size
        if saved is not None and saved != world:
            log.warning(
                "%s was saved by %s and resumes at %d: their RNG states (rng_state_<rank>.pth) do not map "
                "onto these processes, so random draws (dropout, random data augmentation) differ from the "
                "uninterrupted run's. The weights, optimizer, scheduler and data position are restored exactly.",
                checkpoint,
                _processes(saved),
                world,
            )
        super()._load_rng_state(checkpoint)

    def _load_best_model(self) -> None:
        """transformers'; the best checkpoint of a zero=3 model holds its weights only in checkpoint/dtcore: each rank
        loads its shards from there (no gather)."""
        best = self.state.best_model_checkpoint
        model = self.model_wrapped
        if not (isinstance(model, dtcore.DistributedModel) and _weights_only_in_dtcore(best)):
            return super()._load_best_model()
        log.info("loading the best model from %s (score: %s)", best, self.state.best_metric)
        dtcore.load_checkpoint(os.path.join(best, CHECKPOINT_FOLDER), model=model)

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
