"""dtcore behind accelerate's `prepare`: one line changes in an accelerate script.

    from dtcore.integrations.accelerate import Accelerator, DtcorePlugin   # was: from accelerate import Accelerator

    accelerator = Accelerator(dtcore_plugin=DtcorePlugin(zero=2), gradient_accumulation_steps=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    # the rest of the loop as it was: accumulate, backward, clip_grad_norm_, save_state, ...

Why a subclass with a plugin argument: that is how accelerate itself takes a data-parallel engine
(`Accelerator(deepspeed_plugin=...)`, `Accelerator(fsdp_plugin=...)`), and accelerate 1.15 leaves
no other seam to a third party: `kwargs_handlers` are looked up by their exact class in a fixed
table (any other class is a KeyError), `prepare_model` builds torch DDP itself, and the config file
of `accelerate launch` refuses keys it does not know. So the config file selects the launch
(`distributed_type: MULTI_GPU`, `num_processes`, `mixed_precision`) and this import selects dtcore;
dtcore's options are the plugin's fields. Everything not listed below is accelerate's own code.

The contract:
- Building it calls `dtcore.init()` first (the process group, its diagnostics and timeouts are
  dtcore's; call dtcore.init(...) yourself before for other arguments). Where dtcore runs on CPU,
  accelerate is built with `cpu=True`: accelerate 1.15 otherwise counts one process per rank on a
  machine without GPUs (`distributed_type` NO), and would neither shard data loaders nor know
  which process is the main one. Its world must be dtcore's, else ConfigError.
- `prepare(model)`: accelerate's device placement and autocast, `dtcore.checkpoint_activations` if
  asked, then `dtcore.wrap` with the plugin's options instead of torch DDP. A model
  already wrapped by dtcore is kept as it is. Models are prepared before the other arguments,
  wherever they stand among them.
- `prepare(optimizer)` of a zero>=1 model's parameters: a `dtcore.ShardedOptimizer` of the same
  class over the same param groups (the very dicts, so hyperparameters edited on either reach the
  one that steps) and state. An LR scheduler built over the optimizer given is pointed at it (one
  given to prepare(), or to `accelerator.follow(scheduler)` where it does not go through it). An
  optimizer class that cannot be sharded by element is ShardedOptimizer's ConfigError.
- `backward`, `accumulate`, `no_sync`, `trigger_sync_in_backward`, `unwrap_model`, `save_model`:
  accelerate's, unchanged (a dtcore model is a torch DDP to isinstance). `get_state_dict` of a
  dtcore model gives CPU copies, each tensor in a storage of its own: ZeRO keeps a bucket's
  parameters in one flat buffer, and accelerate's safetensors saving keeps one name per storage.
- `clip_grad_norm_(model.parameters(), ...)` of a zero>=2 model: `dtcore.clip_grad_norm_`, since
  each rank holds only its shard of the gradients; accelerate's otherwise. `clip_grad_value_` of
  such a model is refused (there is no .grad to clip). At zero=3, `save_model` and
  `get_state_dict` gather the weights: every rank calls them, not only the main process.
- `save_state(dir)`: each dtcore model, with the optimizer over its parameters, is a dtcore
  checkpoint in `dir/dtcore_model_<i>` (safetensors shards, no pickle; loads at any number of
  ranks); accelerate saves the rest as usual (other models, schedulers, samplers, RNG states,
  scaler, registered objects). Save hooks see the other models only. `load_state(dir)` reads both.
- Refused with a ConfigError that names the value and the fix, before anything starts: a
  DeepSpeed, FSDP, Megatron-LM or parallelism (TP/CP) plugin or the ACCELERATE_USE_* variable that
  selects one, fp8, fp16 with zero>=1 (its GradScaler unscales whole gradients; bf16 works with
  every stage), `DistributedDataParallelKwargs` (the plugin's fields replace them),
  `InitProcessGroupKwargs` (dtcore.init sets the group up) and a dynamo backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import weakref
from collections.abc import Iterator
from typing import Any

import accelerate
import torch
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

import dtcore

CHECKPOINT_PREFIX = "dtcore_model_"  # save_state's folder for the i-th dtcore model: dtcore_model_0, ...

# Accelerator arguments and the ACCELERATE_USE_* variables `accelerate launch` sets for them: each
# selects another engine that would wrap the model too.
_OTHER_ENGINES = {
    "deepspeed_plugin": ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED"),
    "fsdp_plugin": ("FSDP", "ACCELERATE_USE_FSDP"),
    "megatron_lm_plugin": ("Megatron-LM", "ACCELERATE_USE_MEGATRON_LM"),
    "torch_tp_plugin": ("tensor parallelism", "ACCELERATE_USE_PARALLELISM_CONFIG"),
    "parallelism_config": ("a parallelism config (TP/CP)", "ACCELERATE_USE_PARALLELISM_CONFIG"),
}


@dataclasses.dataclass
class DtcorePlugin:
    """dtcore's options for the models `Accelerator.prepare` wraps: dtcore.wrap's, and activation checkpointing."""

    zero: int = 0
    """ZeRO stage: 0 whole gradients and optimizer state on every rank, 1 optimizer state sharded, 2 gradients
    sharded too, 3 parameters sharded too."""
    bucket_mb: float | str | None = None
    """Gradient bucket size in MiB, or "auto"; None: dtcore.wrap's default. zero=0|1|2 only."""
    comm_dtype: torch.dtype | None = None
    """Reduce gradients in this dtype (torch.bfloat16, torch.float16); None: in the gradients' own."""
    find_unused_parameters: bool = False
    """Allow parameters that get no gradient in some steps."""
    activation_checkpointing: str | None = None
    """A dtcore.checkpoint_activations policy for each prepared model ("auto", "all", "every:2", "selective");
    None: off. A "budget:" policy needs example inputs: call dtcore.checkpoint_activations on the prepared model."""
    wrap_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Further dtcore.wrap keywords, e.g. zero=3's units, prefetch and param_dtype."""

    def wrap_kwargs(self) -> dict[str, Any]:
        """The keywords for dtcore.wrap: the fields that are set, and wrap_options."""
        kwargs = dict(self.wrap_options, zero=self.zero)
        if self.bucket_mb is not None:
            kwargs["bucket_mb"] = self.bucket_mb
        if self.comm_dtype is not None:
            kwargs["comm_dtype"] = self.comm_dtype
        if self.find_unused_parameters:
            kwargs["find_unused_parameters"] = True
        return kwargs


def _refuse(what: str, fix: str) -> dtcore.ConfigError:
    return dtcore.ConfigError(f"dtcore.integrations.accelerate.Accelerator with {what}. Fix: {fix}")


def _check_arguments(plugin: DtcorePlugin, kwargs: dict[str, Any], env: dict[str, str]) -> None:
    """ConfigError for what dtcore cannot honour, from the arguments and accelerate launch's variables."""
    for arg, (engine, variable) in _OTHER_ENGINES.items():
        if kwargs.get(arg) is not None:
            raise _refuse(
                f"{arg}={type(kwargs[arg]).__name__}(...): {engine} would wrap the model too",
                f"drop {arg}; dtcore's options are DtcorePlugin's.",
            )
        if env.get(variable, "").lower() in ("true", "1"):
            raise _refuse(
                f"{variable}={env[variable]} (set by accelerate launch for a config or flag that selects {engine})",
                f"launch with a config whose distributed_type is MULTI_GPU (or --multi_gpu), without {engine}.",
            )
    precision = str(kwargs.get("mixed_precision") or env.get("ACCELERATE_MIXED_PRECISION") or "no").lower()
    source = "mixed_precision" if kwargs.get("mixed_precision") else "ACCELERATE_MIXED_PRECISION"
    if precision == "fp8":
        raise _refuse(f"{source}='fp8': dtcore does not train in fp8", "use 'bf16' (or 'no').")
    if precision == "fp16" and plugin.zero >= 1:
        raise _refuse(
            f"{source}='fp16' and DtcorePlugin(zero={plugin.zero}): fp16's GradScaler unscales whole gradients, "
            "which a ShardedOptimizer does not hold",
            "use mixed_precision='bf16' (no scaler), or DtcorePlugin(zero=0) for fp16.",
        )
    dynamo = (
        kwargs.get("dynamo_backend")
        or getattr(kwargs.get("dynamo_plugin"), "backend", None)
        or env.get("ACCELERATE_DYNAMO_BACKEND")
    )
    dynamo = getattr(dynamo, "value", dynamo)  # accelerate's DynamoBackend enum, or its name
    if dynamo is not None and str(dynamo).lower() != "no":
        raise _refuse(f"dynamo backend {dynamo!r}", "leave dynamo_backend unset (and 'no' in the config file).")
    for handler in kwargs.get("kwargs_handlers") or ():
        if isinstance(handler, DistributedDataParallelKwargs):
            raise _refuse(
                f"{handler!r}: torch DDP's options do not reach dtcore",
                "pass DtcorePlugin(bucket_mb=..., find_unused_parameters=..., comm_dtype=...) instead.",
            )
        if isinstance(handler, InitProcessGroupKwargs):
            raise _refuse(
                f"{handler!r}: dtcore.init sets the process group up",
                "call dtcore.init(timeout=...) before building the Accelerator.",
            )


class Accelerator(accelerate.Accelerator):
    """accelerate's Accelerator whose prepare() gives dtcore models (and ShardedOptimizers under ZeRO).

    dtcore_plugin: dtcore's options (DtcorePlugin(): zero=0). Every other keyword is accelerate's.
    See the module docstring for what changes and what is refused.
    """

    def __init__(self, *, dtcore_plugin: DtcorePlugin | None = None, **kwargs: Any) -> None:
        plugin = dtcore_plugin if dtcore_plugin is not None else DtcorePlugin()
        _check_arguments(plugin, kwargs, dict(os.environ))
        ctx = dtcore.init()  # idempotent: a job that called it first keeps its arguments
        if ctx.device.type == "cpu":
            kwargs["cpu"] = True  # see the module docstring: accelerate then counts dtcore's world
        super().__init__(**kwargs)
        # accelerate names the CPU cpu:<local rank>, dtcore cpu: the type must agree, and the GPU's index.
        same_device = self.device.type == ctx.device.type and ctx.device.index in (None, self.device.index)
        if (self.num_processes, self.process_index) != (ctx.world_size, ctx.rank) or not same_device:
            raise _refuse(
                f"accelerate seeing process {self.process_index} of {self.num_processes} on {self.device}, but dtcore "
                f"rank {ctx.rank} of {ctx.world_size} on {ctx.device} (launcher {ctx.launcher})",
                "drop cpu=True where dtcore runs on GPUs, or start dtcore on CPU first: dtcore.init(backend='gloo').",
            )
        self.dtcore_plugin = plugin
        # (the optimizer given, the ShardedOptimizer that replaced it): a scheduler over the first follows
        # the second, in the same prepare() call or a later one. The pair keeps the first alive, so its id stays;
        # free_memory() lets them go.
        self._dtcore_replaced: list[tuple[torch.optim.Optimizer, dtcore.ShardedOptimizer]] = []
        # Every dtcore model this Accelerator wrapped, while it lives. accelerate's free_memory() empties _models
        # between two trainings, but a model trained again (transformers' Trainer.train() called twice: the model
        # stays wrapped, only the optimizer is prepared again) must still be found by its parameters, for the
        # shard-aware clipping and sharding of the optimizer.
        self._dtcore_models: weakref.WeakSet[dtcore.DistributedModel] = weakref.WeakSet()

    # --- prepare ---------------------------------------------------------------------------------

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """accelerate's prepare, with models wrapped by dtcore and optimizers over ZeRO models sharded."""
        placement = list(device_placement) if device_placement is not None else [None] * len(args)
        if len(placement) != len(args):  # accelerate's own error says it
            return super().prepare(*args, device_placement=device_placement)
        items = [
            self.prepare_model(a, device_placement=d) if isinstance(a, torch.nn.Module) else a
            for a, d in zip(args, placement)
        ]
        for i, item in enumerate(items):
            if isinstance(item, torch.optim.Optimizer) and not isinstance(item, AcceleratedOptimizer):
                sharded = self._sharded(item)
                if sharded is not item:
                    # No device placement: AcceleratedOptimizer would round-trip its state_dict, a gather of the
                    # whole state onto every rank and a scatter back, for a state already beside its shards.
                    items[i], placement[i] = sharded, False
        for item in items:
            if isinstance(item, torch.optim.lr_scheduler.LRScheduler):
                self.follow(item)
        return super().prepare(*items, device_placement=placement)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """accelerate's device placement and autocast, then dtcore.wrap with the plugin's options (not torch DDP)."""
        if isinstance(model, dtcore.DistributedModel):
            if any(model is m for m in self._models):  # prepare() prepares models first, then accelerate again
                return model
            # Already on dtcore's device: nothing to place. (accelerate's CPU is "cpu:<rank>", a device other than
            # "cpu" to torch; a wrapped model leaves such a .to() undone, and refuses one that would move it.)
            return super().prepare_model(model, device_placement=False, evaluation_mode=True)
        prepared = super().prepare_model(model, device_placement=device_placement, evaluation_mode=True)
        trainable = any(p.requires_grad for p in prepared.parameters())
        if evaluation_mode or not trainable:
            return prepared  # as accelerate: a model for evaluation only, or without trainable parameters, stays
        if self.dtcore_plugin.activation_checkpointing is not None:
            # Before wrapping: blocks are found by their parameters' sizes, which zero=3 shards away.
            dtcore.checkpoint_activations(prepared, self.dtcore_plugin.activation_checkpointing)
        wrapped = dtcore.wrap(prepared, **self.dtcore_plugin.wrap_kwargs())
        self._dtcore_models.add(wrapped)
        # accelerate's save_state, load_state and clip_grad_norm_ go through self._models: the dtcore
        # model stands there, as accelerate keeps its FSDP models.
        self._models[self._models.index(prepared)] = wrapped
        return wrapped

    def _sharded(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """`optimizer`, or the ShardedOptimizer that replaces it when its parameters are a zero>=1 model's."""
        model = self._model_of({id(p) for group in optimizer.param_groups for p in group["params"]})
        if model is None or model.zero == 0 or isinstance(optimizer, dtcore.ShardedOptimizer):
            return optimizer
        cls = type(optimizer)
        # defaults may hold keys the constructor does not take (AdamW's decoupled_weight_decay); the
        # group dicts keep every key.
        accepted = inspect.signature(cls).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        sharded = dtcore.ShardedOptimizer(model, cls, optimizer.param_groups, **defaults)
        if optimizer.state:  # a state loaded before prepare: cut into this rank's shards
            sharded.load_state_dict(optimizer.state_dict())
        self._dtcore_replaced.append((optimizer, sharded))
        return sharded

    def follow(self, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        """Points a scheduler built over an optimizer that prepare() replaced at its ShardedOptimizer (prepare()
        does it for the schedulers it is given; this is for one that does not go through prepare(), as a
        scheduler given to transformers' Trainer). Any other scheduler is left as it is."""
        sharded = next((new for old, new in self._dtcore_replaced if scheduler.optimizer is old), None)
        if sharded is None:
            return
        # torch's LRScheduler wraps its optimizer's step when built, to warn when scheduler.step() comes
        # first; a scheduler that changes no learning rate (ConstantLR, factor 1, no iterations) wraps the
        # ShardedOptimizer's step alike, and is dropped.
        torch.optim.lr_scheduler.ConstantLR(sharded, factor=1.0, total_iters=0)
        scheduler.optimizer = sharded

    def _model_of(self, params: set[int]) -> dtcore.DistributedModel | None:
        """The prepared dtcore model that holds any of `params` (by id), or None."""
        prepared = [m for m in self._models if isinstance(m, dtcore.DistributedModel)]
        for model in [*prepared, *self._dtcore_models]:
            if params & {id(p) for p in model.parameters()}:
                return model
        return None

    def free_memory(self, *objects: Any) -> Any:
        """accelerate's; also lets go of the optimizers prepare() replaced by ShardedOptimizers."""
        self._dtcore_replaced.clear()
        return super().free_memory(*objects)

    # --- the step ------------------------------------------------------------------------------

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """accelerate's, or dtcore.clip_grad_norm_ for a zero>=2 model (each rank holds a shard of its gradients)."""
        params = list(parameters)
        ids = {id(p) for p in params}
        model = self._model_of(ids)
        if model is None or model.zero < 2:
            return super().clip_grad_norm_(params, max_norm, norm_type)
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        if not trainable <= ids:
            raise dtcore.ConfigError(
                f"accelerator.clip_grad_norm_ got {len(trainable & ids)} of the {len(trainable)} trainable parameters "
                f"of a DtcorePlugin(zero={model.zero}) model: its gradients are sharded by bucket, not by parameter, "
                "so only the whole model's norm exists. Fix: pass model.parameters()."
            )
        return dtcore.clip_grad_norm_(model, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """accelerate's; refused for a zero>=2 model, whose .grad is None (each rank holds a shard of its gradients)."""
        params = list(parameters)
        model = self._model_of({id(p) for p in params})
        if model is not None and model.zero >= 2:
            raise dtcore.ConfigError(
                f"accelerator.clip_grad_value_ of a DtcorePlugin(zero={model.zero}) model: after backward its .grad "
                "are None (each rank holds a shard of the gradients in its buckets), so clipping them by value would "
                "clip nothing. Fix: clip by norm (accelerator.clip_grad_norm_(model.parameters(), max_norm)), or use "
                "DtcorePlugin(zero=1), whose gradients are whole."
            )
        return super().clip_grad_value_(params, clip_value)

    # --- saving --------------------------------------------------------------------------------

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """accelerate's; for a dtcore model, copies on the CPU, each tensor in a storage of its own."""
        state = super().get_state_dict(model, unwrap=unwrap)
        if not isinstance(model, dtcore.DistributedModel):
            return state
        # ZeRO keeps a bucket's parameters in one flat buffer, and accelerate's save_model (safetensors)
        # keeps one name per storage: every other parameter of the bucket would be left out of the file.
        return {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for k, v in state.items()}

    # --- save_state / load_state -----------------------------------------------------------------

    def save_state(self, output_dir: str | None = None, safe_serialization: bool = True, **kwargs: Any) -> str:
        """accelerate's save_state; each dtcore model and its optimizer as a dtcore checkpoint in the folder."""
        pairs = self._checkpointed()
        with self._handed_over(pairs):
            location = super().save_state(output_dir, safe_serialization, **kwargs)
        for i, (model, optimizer) in enumerate(pairs):
            path = os.path.join(location, f"{CHECKPOINT_PREFIX}{i}")
            dtcore.save_checkpoint(path, model=model, optimizer=optimizer, step=self.step)
        return location

    def load_state(self, input_dir: str | None = None, load_kwargs: dict | None = None, **kwargs: Any) -> None:
        """accelerate's load_state; each dtcore model and its optimizer from its dtcore checkpoint (any world size)."""
        pairs = self._checkpointed()
        chosen: list[str] = []  # the folder accelerate resolves (the newest, under automatic checkpoint naming)
        handle = self.register_load_state_pre_hook(lambda models, folder: chosen.append(folder))
        try:
            with self._handed_over(pairs):
                super().load_state(input_dir, load_kwargs, **kwargs)
        finally:
            handle.remove()
        for i, (model, optimizer) in enumerate(pairs):
            dtcore.load_checkpoint(os.path.join(chosen[0], f"{CHECKPOINT_PREFIX}{i}"), model=model, optimizer=optimizer)

    def _checkpointed(self) -> list[tuple[dtcore.DistributedModel, torch.optim.Optimizer | None]]:
        """Each prepared dtcore model, with the (unwrapped) optimizer over its parameters or None."""
        pairs = []
        for model in self._models:
            if not isinstance(model, dtcore.DistributedModel):
                continue
            mine = {id(p) for p in model.parameters()}
            over = [
                o.optimizer for o in self._optimizers if mine & {id(p) for g in o.param_groups for p in g["params"]}
            ]
            if len(over) > 1:
                raise dtcore.ConfigError(
                    f"save_state/load_state with {len(over)} optimizers over one dtcore model "
                    f"({type(model.module).__name__}): a dtcore checkpoint holds one. Fix: one optimizer with a param "
                    "group per set of hyperparameters."
                )
            pairs.append((model, over[0] if over else None))
        return pairs

    @contextlib.contextmanager
    def _handed_over(self, pairs: list[tuple[Any, Any]]) -> Iterator[None]:
        """accelerate's own save_state/load_state without the models and optimizers dtcore checkpoints."""
        models, optimizers = list(self._models), list(self._optimizers)
        mine = {id(x) for pair in pairs for x in pair if x is not None}
        self._models[:] = [m for m in models if id(m) not in mine]
        self._optimizers[:] = [o for o in optimizers if id(o.optimizer) not in mine]
        try:
            yield
        finally:
            self._models[:], self._optimizers[:] = models, optimizers
