"""Lightning: `Trainer(strategy=DtcoreStrategy(zero=2))`, dtcore in place of Lightning's DDP strategy.

    from dtcore.integrations.lightning import DtcoreStrategy
    trainer = lightning.Trainer(strategy=DtcoreStrategy(zero=2), devices=2, num_nodes=1)
    # or, once this module is imported: strategy="dtcore" (zero=0), "dtcore_zero1", "dtcore_zero2", "dtcore_zero3"

The seam is Lightning's own: a ParallelStrategy, as DDPStrategy and FSDPStrategy are. Lightning keeps
what it owns (its launcher starts the processes, its cluster environment says each one's rank
under torchrun, SLURM or its own launcher, its loops, callbacks and precision plugin run the step);
the strategy hands each piece that touches other ranks to dtcore's public API:

- setup_environment: dtcore.init() with the ranks, world size and main address Lightning's cluster
  environment gives, as explicit arguments, so that dtcore and Lightning cannot disagree on them;
  Gloo on Lightning's CPU accelerator (even where CUDA exists), NCCL on its CUDA accelerator.
- setup (fitting): dtcore.wrap(module, zero=...); with zero>=1 each optimizer that
  configure_optimizers returned becomes a dtcore.ShardedOptimizer of the same class, groups and
  hyperparameters, and its LR schedulers are pointed at it (lightning_zero.py).
- reduce, all_gather, broadcast, barrier: dtcore's collectives (timeouts, and the rank that is
  missing named, instead of a hang); block_backward_sync: the wrapper's no_sync().
- clipping: under zero>=2 a rank holds only its shard of each gradient (.grad is None), so Lightning's
  clip_grad_norm_ over .grad would see nothing; the precision plugin's clip_grad_by_norm becomes
  dtcore.clip_grad_norm_ (the global norm over the shards). Clipping by value is refused there
  (lightning_zero.py).
- checkpoints: a dtcore checkpoint (a directory of safetensors files and a manifest, no pickle) at
  the path Lightning chose, written by every rank, holding the model, the optimizer (each rank its
  shard) and, as `extra`, everything else Lightning put in its checkpoint dict (epoch, global step,
  loops, callbacks, LR schedulers, hyperparameters). It loads at any number of ranks and ZeRO stage
  (resharded). A Lightning checkpoint file (e.g. saved by DDPStrategy) loads too. Hyperparameters a
  checkpoint would not give back as they are, and hooks that edit checkpoint["state_dict"] of a dtcore
  checkpoint, are refused (lightning_checkpoint.py).

Refused, with the fix: devices= and num_nodes= that do not match the ranks the launcher made (Lightning
checks only their product); precision plugins other than Lightning's 32/64-true, 16/bf16-true and
16/bf16-mixed; 16-mixed (a GradScaler that unscales .grad) with zero>=1; accelerators other than
CPU and CUDA; a custom CheckpointIO (dtcore writes the checkpoint itself); process groups other than
the whole job; more than one optimizer in a checkpoint.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment, TorchCheckpointIO
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy, StrategyRegistry
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

import dtcore

from . import lightning_checkpoint, lightning_zero

_OPS = {"sum": "sum", "mean": "avg", "avg": "avg", "max": "max", "min": "min"}


class DtcoreStrategy(ParallelStrategy):
    """Lightning's data-parallel strategy on dtcore: ZeRO stage `zero` (0: as DDP; 1: optimizer state
    sharded; 2: gradients too; 3: parameters too). `bucket_mb`, `comm_dtype` and
    `find_unused_parameters` are dtcore.wrap's (None: dtcore's default); `timeout` (seconds or a
    timedelta) is dtcore.init's, for the rendezvous and every collective."""

    strategy_name = "dtcore"

    def __init__(
        self,
        zero: int = 0,
        *,
        bucket_mb: float | str | None = None,
        comm_dtype: torch.dtype | None = None,
        find_unused_parameters: bool = False,
        timeout: float | datetime.timedelta | None = None,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
            raise dtcore.ConfigError(
                f"DtcoreStrategy(zero={zero!r}) is not a ZeRO stage. Fix: zero=0 (as DDP), 1 (optimizer state "
                "sharded), 2 (gradients sharded too) or 3 (parameters sharded too)."
            )
        self._zero = zero  # before the base class sets the precision plugin, whose check reads it
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision_plugin=precision_plugin,
        )
        self._wrap_options: dict[str, Any] = {"find_unused_parameters": find_unused_parameters}
        if bucket_mb is not None:
            self._wrap_options["bucket_mb"] = bucket_mb
        if comm_dtype is not None:
            self._wrap_options["comm_dtype"] = comm_dtype
        self._timeout = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        self._num_nodes = 1
        # The wrapper of the last fit: Lightning unwraps self.model at teardown, and a save after fit()
        # (trainer.save_checkpoint) must still reach the ZeRO optimizer's model through it.
        self._distributed: dtcore.DistributedModel | None = None
        self._layers_synced = False  # Lightning's LayerSync applied by setup(), reverted by teardown()
        # The dtcore checkpoint directory load_checkpoint() loaded the weights from (before the hooks ran), or None
        # for a Lightning checkpoint file, whose weights load_model_state_dict() loads (after the hooks).
        self._loaded_directory: Path | None = None

    @property
    def zero(self) -> int:
        """The ZeRO stage this strategy wraps the model with."""
        return self._zero

    # --- the world, as Lightning's cluster environment sees it -----------------------------------

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def is_distributed(self) -> bool:
        """Read by Lightning's connector (for strategies it does not know) to add a DistributedSampler."""
        return True

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}

    def _configure_launcher(self) -> None:
        # Lightning's own launcher for DDP's default start method: re-runs the script once per extra
        # local device unless the environment (torchrun, SLURM) started the processes itself.
        assert self.cluster_environment is not None
        self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def set_world_ranks(self) -> None:
        """Global rank and world size from the node rank and devices per node, as DDPStrategy sets them."""
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    def setup_environment(self) -> None:
        """Checks the accelerator and the world, then dtcore.init() with the ranks Lightning's environment gives."""
        self._check_accelerator()
        self._check_world()
        super().setup_environment()
        reset_seed()  # as DDPStrategy: a process the launcher started gets the seed seed_everything set
        self.set_world_ranks()
        env = self.cluster_environment
        assert env is not None
        # A context the script made first (dtcore.init() before the Trainer) keeps its store, wherever it
        # serves it; init() still refuses it unless its ranks are the ones Lightning gives.
        store = {} if dtcore.is_initialized() else {"master_addr": env.main_address, "master_port": env.main_port}
        ctx = dtcore.init(
            backend="gloo" if self.root_device.type == "cpu" else "nccl",
            timeout=self._timeout,
            rank=self.global_rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            local_world_size=self.num_processes,
            node_rank=self.node_rank,
            num_nodes=self.num_nodes,
            **store,
        )
        if ctx.device != self.root_device:
            raise dtcore.ConfigError(
                f"rank {ctx.rank}: Lightning runs this process on {self.root_device}, but dtcore on {ctx.device}. "
                "Fix: give Trainer(devices=...) the devices of this node in local-rank order (devices='auto')."
            )

    def _check_world(self) -> None:
        """devices= and num_nodes= against the launcher's ranks (Lightning checks only their product)."""
        expected = self.node_rank * self.num_processes + self.local_rank
        if self.local_rank >= self.num_processes or self.global_rank != expected:
            raise dtcore.ConfigError(
                f"the launcher made this process rank {self.global_rank} of {self.world_size}, local rank "
                f"{self.local_rank} on node {self.node_rank}, but Trainer(devices={self.num_processes}, "
                f"num_nodes={self.num_nodes}) puts local rank {self.local_rank} of node {self.node_rank} at rank "
                f"{expected}. Fix: devices= the number of processes the launcher starts on each node "
                "(torchrun's --nproc-per-node, SLURM's --ntasks-per-node) and num_nodes= the number of nodes."
            )

    def _check_accelerator(self) -> None:
        if not isinstance(self.accelerator, (CPUAccelerator, CUDAAccelerator)):
            raise dtcore.ConfigError(
                f"DtcoreStrategy runs on CPUs (Gloo) and CUDA GPUs (NCCL); Trainer(accelerator=...) chose "
                f"{type(self.accelerator).__name__}. Fix: accelerator='cpu' or accelerator='cuda'."
            )

    # --- model and optimizers --------------------------------------------------------------------

    def setup(self, trainer: Any) -> None:
        """Fitting: dtcore.wrap the module, shard the optimizers (zero>=1); evaluating: rank 0's weights everywhere."""
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting and trainer.checkpoint_callbacks:
            # Before any step, rather than at the first save: See lightning_checkpoint.py.
            lightning_checkpoint.check_hyperparameters(trainer)
        if fitting and self._layer_sync:  # Trainer(sync_batchnorm=True): on torch's group, which dtcore.init set up
            self.model = self._layer_sync.apply(self.model)
            self._layers_synced = True
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if fitting:
            self._distributed = dtcore.wrap(self.model, zero=self._zero, **self._wrap_options)
            self.model = self._distributed
            self.setup_optimizers(trainer)
        elif trainer.state.fn == TrainerFn.PREDICTING and self._zero == 3:
            # Lightning's predict sampler (UnrepeatedDistributedSamplerWrapper) gives the ranks different numbers
            # of batches, and each zero=3 forward gathers the parameters from every rank: the rank with a batch
            # more would wait in that gather until the timeout.
            raise dtcore.ConfigError(
                "trainer.predict with DtcoreStrategy(zero=3): the ranks get different numbers of batches to predict, "
                "and every zero=3 forward is a collective. Fix: predict with DtcoreStrategy(zero=2) (a zero=3 "
                "checkpoint loads there, resharded) or DDPStrategy."
            )
        elif self._distributed is not None and self._distributed.module is self.model:
            # Evaluating what an earlier fit wrapped: through its wrapper, which under zero=3 holds the
            # parameters (in shards, gathered by its forward). Without gradients it reduces nothing.
            self.model = self._distributed
        else:
            # Nothing to reduce when evaluating: rank 0's weights everywhere, as DDPStrategy does.
            for t in [*self.model.parameters(), *self.model.buffers()]:
                dtcore.broadcast(t.data, src=0)
        self.setup_precision_plugin()

    def model_to_device(self) -> None:
        """Moves the (not yet wrapped) module to this rank's device."""
        assert self.model is not None
        self.model.to(self.root_device)

    def setup_optimizers(self, trainer: Any) -> None:
        """Lightning's optimizers from configure_optimizers; with zero>=1 each becomes a dtcore.ShardedOptimizer."""
        super().setup_optimizers(trainer)
        if self._zero >= 1:
            self.optimizers = lightning_zero.sharded_optimizers(
                self._distributed, self.optimizers, self.lr_scheduler_configs
            )

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Gradient accumulation: backward passes inside accumulate locally; the next one reduces the sum."""
        if isinstance(self.model, dtcore.DistributedModel):
            with self.model.no_sync():
                yield None
        else:
            yield None

    @property
    def precision_plugin(self) -> Precision:
        return self._precision_plugin if self._precision_plugin is not None else Precision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        if plugin is not None:
            plugin = lightning_zero.checked_precision(plugin, self._zero)
        self._precision_plugin = plugin

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        if io is not None and type(io) is not TorchCheckpointIO:
            raise dtcore.ConfigError(
                f"DtcoreStrategy writes its checkpoints itself (dtcore.save_checkpoint: every rank its own files), so "
                f"the CheckpointIO plugin {type(io).__name__} would be ignored. Fix: leave plugins= without a "
                "CheckpointIO (dtcore.save_checkpoint(..., async_save=True) is dtcore's asynchronous save)."
            )
        self._checkpoint_io = io

    def teardown(self) -> None:
        """Leaves the LightningModule unwrapped (and its LayerSync reverted), as DDPStrategy does."""
        if isinstance(self.model, dtcore.DistributedModel):
            self.model = self.lightning_module  # unwrapped, as DDPStrategy leaves it
        if self._layers_synced:
            assert self._layer_sync is not None and self.model is not None
            self.model = self._layer_sync.revert(self.model)
            self._layers_synced = False
        super().teardown()

    # --- collectives -----------------------------------------------------------------------------

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """dtcore.all_reduce of a copy of `tensor` ("mean" averages; an integer tensor's average is a float)."""
        if not isinstance(tensor, torch.Tensor) or not dtcore.is_initialized():
            return tensor
        _whole_job(group, "reduce")
        op = _op_name(reduce_op)
        out = tensor.detach().clone()
        if op == "avg" and not out.is_floating_point():
            out = out.float()  # an average of integers, as Lightning's DDP reduce gives it
        return dtcore.all_reduce(out, op=op)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """dtcore.all_gather of `tensor` (stacked by rank); with sync_grads, gradients flow back to each rank's row."""
        if not dtcore.is_initialized():
            return tensor
        _whole_job(group, "all_gather")
        if sync_grads:
            return _GatherWithGrad.apply(tensor)
        return dtcore.all_gather(tensor.contiguous())

    def barrier(self, name: str | None = None) -> None:
        """dtcore.barrier() (with the job's timeout)."""
        if dtcore.is_initialized():
            dtcore.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s Python object on every rank."""
        if not dtcore.is_initialized():
            return obj
        # Lightning broadcasts any Python object (paths, flags, tuner results), as torch's
        # broadcast_object_list does: pickled, between the ranks of this one job only.
        mine = self.global_rank == src
        data = pickle.dumps(obj) if mine else b""
        size = dtcore.broadcast(torch.tensor([len(data)], dtype=torch.int64, device=self.root_device), src=src)
        if mine:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.root_device)
        else:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.root_device)
        dtcore.broadcast(payload, src=src)
        return obj if mine else pickle.loads(payload.cpu().numpy().tobytes())

    # --- checkpoints: See the module's docstring -------------------------------------------------

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # dtcore loads into the wrapped model and the sharded optimizer, once they exist

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False  # load_checkpoint restores the optimizer (resharded) itself

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """For the hooks: the model's state_dict as views (zero=3: meta tensors). The weights go from the model
        straight into dtcore's files; save_checkpoint refuses a hook's edit of this dict (lightning_checkpoint.py)."""
        module = self.lightning_module
        assert module is not None
        return lightning_checkpoint.model_state(module, self._distributed)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Empty: each rank writes its own shard, where a state_dict() here would gather the whole state."""
        return {}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """A dtcore checkpoint (a directory) at `filepath`: model, optimizer shards, and Lightning's state as extra."""
        if storage_options is not None:
            raise dtcore.ConfigError(
                "DtcoreStrategy.save_checkpoint(storage_options=...): dtcore writes to a local or shared file system "
                "path, without a CheckpointIO. Fix: drop storage_options."
            )
        path = Path(filepath)
        module = self.lightning_module
        assert module is not None
        trainer = module.trainer
        lightning_checkpoint.check_hyperparameters(trainer)
        lightning_checkpoint.check_unedited_for_save(checkpoint, self.lightning_module_state_dict(), trainer, path)
        extra = dict(checkpoint)
        extra.pop("state_dict", None)
        states = extra.pop("optimizer_states", None)  # absent: a weights-only checkpoint
        optimizer = self._checkpointed_optimizer("save", path) if states is not None else None
        if self.is_global_zero and path.is_file():
            path.unlink()  # a file checkpoint at this path (an earlier run's) gives way to the directory
        dtcore.save_checkpoint(
            path, model=self._saved_model(), optimizer=optimizer, step=int(extra.get("global_step", 0)), extra=extra
        )

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Loads a dtcore checkpoint directory (resharded) or a Lightning checkpoint file; returns Lightning's state."""
        module = self.lightning_module
        assert module is not None
        path = Path(checkpoint_path)
        fitting = module.trainer.state.fn == TrainerFn.FITTING
        if path.is_file():  # a Lightning checkpoint file, e.g. DDPStrategy's
            return self._load_file(path, weights_only)
        optimizer = self._checkpointed_optimizer("load", path) if fitting else None
        got = dtcore.load_checkpoint(path, model=self._saved_model(), optimizer=optimizer, strict=module.strict_loading)
        checkpoint = dict(got["extra"])
        # For on_load_checkpoint hooks: the loaded weights (zero=3: meta tensors), which they must leave as they are.
        checkpoint["state_dict"] = lightning_checkpoint.model_state(module, self._distributed)
        self._loaded_directory = path
        return checkpoint

    def _load_file(self, path: Path, weights_only: bool | None) -> dict[str, Any]:
        if self._zero == 3:
            raise dtcore.ConfigError(
                f"{path} is a Lightning checkpoint file, whose whole weights a zero=3 model cannot take on each rank. "
                "Fix: resume it with DtcoreStrategy(zero=2) (or 0/1) once; its checkpoints then load at zero=3."
            )
        self._loaded_directory = None  # its weights load after the hooks, which may edit them (load_model_state_dict)
        return self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Called after the LightningModule's on_load_checkpoint: a Lightning checkpoint file's weights (as the hook
        left them, as under DDPStrategy) and optimizer states; a dtcore checkpoint's were loaded by load_checkpoint,
        so a change the hook made to checkpoint["state_dict"] is refused (lightning_checkpoint.py)."""
        module = self.lightning_module
        assert module is not None
        if self._loaded_directory is not None:
            ours = lightning_checkpoint.model_state(module, self._distributed)
            lightning_checkpoint.check_unedited_after_load(checkpoint, ours, module, self._loaded_directory)
            return
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
        if module.trainer.state.fn == TrainerFn.FITTING and "optimizer_states" in checkpoint:
            for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
                optimizer.load_state_dict(state)  # a ShardedOptimizer cuts its shard of the whole state

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Nothing: load_checkpoint (a dtcore checkpoint) or load_model_state_dict (a file) loaded the optimizer."""

    def _saved_model(self) -> torch.nn.Module:
        """The wrapper of this LightningModule's last fit (a ZeRO optimizer's model), else the module."""
        module = self.lightning_module
        assert module is not None
        wrapper = self._distributed
        return wrapper if wrapper is not None and wrapper.module is module else module

    def _checkpointed_optimizer(self, verb: str, path: Path) -> torch.optim.Optimizer | None:
        if len(self.optimizers) > 1:
            raise dtcore.ConfigError(
                f"DtcoreStrategy cannot {verb} {path}: a dtcore checkpoint holds one optimizer, and "
                f"configure_optimizers returned {len(self.optimizers)}. Fix: one optimizer over parameter groups (a "
                "learning rate per group), or save_weights_only=True in ModelCheckpoint."
            )
        return self.optimizers[0] if self.optimizers else None

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Registers "dtcore" (zero=0) and "dtcore_zero1".."dtcore_zero3" with Lightning's StrategyRegistry."""
        strategy_registry.register("dtcore", cls, description="dtcore's data-parallel strategy (zero=0, as DDP)")
        for stage in (1, 2, 3):
            strategy_registry.register(
                f"dtcore_zero{stage}", cls, description=f"dtcore with ZeRO stage {stage}", zero=stage
            )


def _whole_job(group: Any, what: str) -> None:
    if group is not None and group is not torch.distributed.group.WORLD:
        raise dtcore.ConfigError(
            f"DtcoreStrategy.{what}(group={group!r}): dtcore's collectives run over the whole job. Fix: group=None."
        )


def _op_name(reduce_op: Any) -> str:
    name = reduce_op if isinstance(reduce_op, str) else getattr(reduce_op, "name", str(reduce_op))
    op = _OPS.get(str(name).lower())
    if op is None:
        raise dtcore.ConfigError(
            f"DtcoreStrategy.reduce(reduce_op={reduce_op!r}) is not a reduction dtcore runs. Fix: 'mean', 'sum', "
            "'max' or 'min'."
        )
    return op


class _GatherWithGrad(torch.autograd.Function):
    """all_gather(sync_grads=True): each rank's gradient is the sum over ranks of its row's gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return dtcore.all_gather(tensor.contiguous())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        total = dtcore.all_reduce(grad.contiguous().clone(), op="sum")
        return total[dtcore.get_context().rank]


DtcoreStrategy.register_strategies(StrategyRegistry)
