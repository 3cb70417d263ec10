"""`dtcore.Trainer`: the training loop for any nn.Module on any launcher, readable top to bottom.

One step: accumulate micro-batches (no_sync on all but the last) under autocast, clip, step,
schedule; then one small all-reduce for the job's loss, tokens and the preemption flag, the
metrics line, evaluation and checkpoints. See docs/train.md.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import itertools
import json
import logging
import math
import os
import signal
import socket
import statistics
import time
from collections import deque
from typing import Any

import torch

from .. import _C
from ..activation import checkpoint_activations
from ..bootstrap import get_context, init, is_initialized
from ..bootstrap.join import _seed_everything
from ..checkpoint import abandon, latest, load_checkpoint, save_checkpoint, wait, write_json
from ..checkpoint import memory as memory_checkpoints
from ..checkpoint.manifest import read as read_manifest
from ..comm import agree, all_reduce, barrier
from ..reducer import DistributedModel
from ..zero import ShardedOptimizer, clip_grad_norm_, wrap
from . import memory, metrics, restarts
from .config import TrainConfig
from .resume import EXIT_PREEMPTED, Preemption
from .rng import rng_state, set_rng_state

log = logging.getLogger("dtcore.train")


class Preempted(SystemExit):
    """Raised by fit() after a preemption signal and a saved checkpoint; exits with EXIT_PREEMPTED."""


def accumulation_steps(config: TrainConfig, world: int) -> int:
    """Micro-batches per step: total_batch_size / (device_batch_size x world); ConfigError unless whole."""
    t = config.training
    per_pass = t.device_batch_size * world
    total = t.total_batch_size or per_pass
    if t.device_batch_size < 1 or total % per_pass:
        lower, upper = max(per_pass, total // per_pass * per_pass), (total // per_pass + 1) * per_pass
        raise _C.ConfigError(
            f"training.total_batch_size={total} is not a multiple of device_batch_size x world size = "
            f"{t.device_batch_size} x {world} = {per_pass}, so the micro-batches per step would not be whole. "
            f"Fix: --training.total_batch_size={lower} or {upper}, or a device_batch_size that divides "
            f"{total} / {world}."
        )
    return total // per_pass


def constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults that its class's constructor takes, to build another of the same class.
    A class may keep more in its defaults than its constructor accepts (torch's AdamW, an Adam with
    decoupled_weight_decay=True, keeps that key but takes no such argument)."""
    parameters = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in parameters}


def _use_deterministic_algorithms(device: torch.device) -> None:
    """training.deterministic: torch's deterministic kernels; cuBLAS needs a fixed workspace for them
    (read when its handle is made: before the first matmul), as Lightning's deterministic=True sets."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def _check(config: TrainConfig) -> None:
    t, o = config.training, config.optim
    for key, value in (
        ("training.num_iterations", t.num_iterations),
        ("training.device_batch_size", t.device_batch_size),
        ("optim.lr", o.lr),
    ):
        if value <= 0:
            raise _C.ConfigError(f"{key}={value} must be > 0. Fix: give a positive value.")
    for key, value in (
        ("training.warmup_steps", t.warmup_steps),
        ("training.eval_every", t.eval_every),
        ("checkpoint.every", config.checkpoint.every),
        ("checkpoint.memory_every", config.checkpoint.memory_every),
    ):
        if value < 0:
            raise _C.ConfigError(f"{key}={value} must be >= 0. Fix: 0 turns it off.")
    if t.compile:
        backends = torch.compiler.list_backends(exclude_tags=())
        if t.compile_backend not in backends:
            close = difflib.get_close_matches(t.compile_backend, backends, n=1, cutoff=0.5)
            raise _C.ConfigError(
                f"training.compile_backend={t.compile_backend!r} is not a backend torch.compile knows"
                + (f" (closest: {close[0]!r})" if close else "")
                + f". Backends: {', '.join(backends)}. Fix: --training.compile_backend=inductor (code generation) or "
                "aot_eager (no code generation, for debugging), or --training.compile=false."
            )


def lr_factor(config: TrainConfig, step: int) -> float:
    """Warmup from 0 to 1 over warmup_steps, then cosine down to min_lr_ratio at num_iterations (or constant)."""
    t = config.training
    if step < t.warmup_steps:
        return (step + 1) / t.warmup_steps
    if t.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.num_iterations - t.warmup_steps))
    ratio = config.optim.min_lr_ratio
    return ratio + (1.0 - ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


def _tokens(batch: Any) -> int:
    """Tokens in a batch: the elements of its first tensor (input_ids for a dict that has them)."""
    if isinstance(batch, torch.Tensor):
        return batch.numel()
    values = batch.values() if isinstance(batch, dict) else batch
    if isinstance(batch, dict) and "input_ids" in batch:
        return batch["input_ids"].numel()
    return next((v.numel() for v in values if isinstance(v, torch.Tensor)), 0)


def _peek(data: Any) -> Any:
    """The first batch of `data`, for the budget planner's profile, leaving the data where it was."""
    state = data.state_dict() if hasattr(data, "state_dict") else None
    batch = next(iter(data))
    if state is not None:
        data.load_state_dict(state)
    return tuple(batch) if isinstance(batch, list) else batch


def _call(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    out = (
        model(**batch)
        if isinstance(batch, dict)
        else model(*batch)
        if isinstance(batch, (list, tuple))
        else model(batch)
    )
    if isinstance(out, torch.Tensor):
        return out
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise _C.ConfigError(
            f"the model returned {type(out).__name__}, not a loss. Fix: return the loss tensor from forward "
            "(or an object or dict with a `loss` tensor, as Hugging Face models given labels do)."
        )
    return loss


class Trainer:
    """The training loop for any nn.Module on any launcher.

    trainer = dtcore.Trainer(model, optimizer, train_data, config)   # config: dtcore.TrainConfig
    trainer.fit()

    model: an nn.Module (wrapped here with dtcore.wrap, zero and bucket_mb from config.parallel) or
      one already wrapped. Called as model(*batch) for a tuple, model(**batch) for a dict, model(batch)
      otherwise; it returns the loss (a tensor, or an object or dict with `loss`).
    optimizer: a torch optimizer over the model's parameters, or None for AdamW from config.optim
      (fused on CUDA). With parallel.zero >= 1 it becomes a dtcore.ShardedOptimizer of the same class
      and defaults. training.compile compiles the wrapped model in place (model.compile()).
    train_data: this rank's batches, an iterable restarted when exhausted. Resume is exact when it
      has state_dict()/load_state_dict() (dtcore.train.demo.data.TokenData has); otherwise the batches
      taken are counted and skipped on resume, exact when iterating it again yields the same batches.
    eval_data: batches for evaluation (the same first ones each time); flops_per_token: for MFU
      (default: the model's flops_per_token(), else 6 x its parameters).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        train_data: Any,
        config: TrainConfig | None = None,
        *,
        eval_data: Any = None,
        flops_per_token: float | None = None,
    ) -> None:
        self.config = config = config if config is not None else TrainConfig()
        _check(config)
        self.ctx = ctx = get_context() if is_initialized() else init(seed=config.training.seed)
        self.rank, self.world, self.device = ctx.rank, ctx.world_size, ctx.device
        self.host = socket.gethostname()
        self.accum = accumulation_steps(config, self.world)
        _seed_everything(config.training.seed, self.rank)  # per-rank seeds: seed + rank
        if config.training.deterministic:
            _use_deterministic_algorithms(self.device)  # before wrapping: bucket_mb="auto" asks
        par = config.parallel
        inner = (model.module if isinstance(model, DistributedModel) else model).to(self.device)
        if par.activation_checkpointing != "none":
            example = _peek(train_data) if par.activation_checkpointing.startswith("budget:") else None
            checkpoint_activations(inner, par.activation_checkpointing, example_inputs=_to(example, self.device))
        # before wrapping: with zero=3 the parameters' data is empty between uses
        self.flops_per_token = flops_per_token or _flops_per_token(model, inner)
        if isinstance(model, DistributedModel):
            if model.zero != par.zero:
                raise _C.ConfigError(
                    f"the model was wrapped with zero={model.zero} but parallel.zero={par.zero}. Fix: pass the "
                    "unwrapped model (the Trainer wraps it) or make the two agree."
                )
            self.model = model
        else:
            # zero=3 reduces by unit: bucket_mb is zero=0/1/2's
            self.model = wrap(model, zero=par.zero, **({} if par.zero == 3 else {"bucket_mb": par.bucket_mb}))
        if self.device.type == "cuda":  # fp32 matmuls (what autocast leaves in fp32, and precision=fp32) on TF32
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if config.training.compile:
            # In place (nn.Module.compile): the same object, so state_dict keys, no_sync and checkpoints are
            # unchanged. After wrapping, so that graphs split at bucket boundaries and the compiled backward
            # overlaps its collectives (Note [dtcore under torch.compile]); zero=3 compiles each unit's
            # forward (Note [zero=3 and torch.compile]); and after activation checkpointing, which it traces.
            # Evaluation, under no_grad and in eval mode, compiles its own graphs once.
            self.model.compile(backend=config.training.compile_backend)
            if self.rank == 0:
                log.info(
                    "training.compile: torch.compile(backend=%r) compiles the model in the first step (and the first "
                    "evaluation): those take longer",
                    config.training.compile_backend,
                )
        self.optimizer = self._optimizer(optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(config, s))
        self.train_data, self.eval_data = train_data, eval_data
        self.autocast_dtype, self.scaler = self._precision(config.training.precision)
        self.step = 0
        self.batches_taken = 0  # for data without state_dict(): skipped again on resume
        self.in_memory: memory_checkpoints.MemoryCheckpoints | None = None  # checkpoint.memory_every's copies
        self._rng_to_restore: Any = None  # a resumed rank's RNG states, set once its data is in place
        self.preemption = Preemption()

    def _optimizer(self, optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer:
        o, zero = self.config.optim, self.config.parallel.zero
        if optimizer is None:
            cls, defaults = torch.optim.AdamW, {"lr": o.lr, "betas": (o.beta1, o.beta2), "weight_decay": o.weight_decay}
            if self.device.type == "cuda":
                # One kernel launch for the whole step. Also right through ShardedOptimizer: its inner AdamW
                # steps contiguous 1-D pieces (and empty proxies) on the device, and the scalar state it
                # loads (step) moves to the pieces' device, where fused AdamW keeps it (checked with the
                # CPU's fused AdamW at zero=2 and 3: resumed runs log the uninterrupted run's losses).
                defaults["fused"] = True
            return ShardedOptimizer(self.model, cls, **defaults) if zero else cls(self.model.parameters(), **defaults)
        if zero == 0 or isinstance(optimizer, ShardedOptimizer):
            return optimizer
        if len(optimizer.param_groups) != 1:
            raise _C.ConfigError(
                f"parallel.zero={zero} needs the optimizer rebuilt as a dtcore.ShardedOptimizer, which the Trainer "
                f"does only for one param group; this one has {len(optimizer.param_groups)}. Fix: pass "
                "dtcore.ShardedOptimizer(wrapped_model, cls, params=groups, ...)."
            )
        return ShardedOptimizer(self.model, type(optimizer), **constructor_defaults(optimizer))

    def _precision(self, precision: str) -> tuple[torch.dtype | None, Any]:
        cuda = self.device.type == "cuda"
        if precision == "auto":
            precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
        zero = self.config.parallel.zero
        if precision == "fp16" and zero >= 2:
            raise _C.ConfigError(
                f"training.precision=fp16 with parallel.zero={zero}: the gradient scaler cannot unscale sharded "
                "gradients. Fix: --training.precision=bf16, or --parallel.zero=1."
            )
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
        scaler = torch.amp.GradScaler(self.device.type) if precision == "fp16" else None
        return dtype, scaler

    # The loop ---------------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """Trains to training.num_iterations; returns {"step", "losses", "eval_losses"}. Raises
        Preempted (a SystemExit with EXIT_PREEMPTED) after a preemption signal and its checkpoint."""
        c = self.config
        run_dir = c.logging.run_dir
        main = self.rank == 0
        info_path = os.path.join(run_dir, "run.json")
        launch = restarts.launch_id()
        # A restarted job resumes and keeps its run directory: the one its first start wrote (run.json says)
        restart = restarts.restart_count() if launch and _read_json(info_path).get("launch") == launch else 0
        if self.world > 1:  # every rank decides alike (a file system's caches may lag)
            restart = agree.gather(restart)[0]
        reached = restarts.last_step(metrics.MetricsFile.path_of(run_dir, self.rank)) if restart and main else None
        self.in_memory = self._memory_checkpoints(launch, run_dir)
        self._resume(os.path.join(run_dir, "checkpoints"), restart)
        resumed_from = self.step
        if self.step == 0 and not restart:
            if main:
                _set_aside_earlier_run(run_dir)
            if self.world > 1:
                barrier()  # no rank opens its metrics file before an earlier run's is moved away
        hosts = self._hosts()
        peak = metrics.peak_flops(self.device, c.logging.peak_tflops)
        if main:
            os.makedirs(run_dir, exist_ok=True)
            run = {"config": c.to_dict(), "world_size": self.world, "num_iterations": c.training.num_iterations}
            run |= {"started": time.time(), "hosts": hosts, "model_flops_per_token": self.flops_per_token}
            run |= {"peak_flops_per_device": peak, "launch": launch, "restarts": []}
            if restart:  # the same run: its start and the restarts before this one stay
                run |= {k: v for k, v in _read_json(info_path).items() if k in ("started", "restarts")}
            write_json(info_path, run)
        trackers = self._trackers(main, run_dir)
        batches = self._batches()
        if self._rng_to_restore is not None:  # replaying the data to its position may draw random numbers
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
        progress = metrics.Progress(main, c.logging.progress, c.training.num_iterations, self.step, c.logging.log_every)
        record = metrics.MetricsProcessor(
            run_dir,
            rank=self.rank,
            host=self.host,
            world=self.world,
            device=self.device,
            flops_per_token=self.flops_per_token,
            peak_flops=peak,
            window=c.logging.straggler_window,
            progress=progress,
            trackers=trackers,
        )
        losses, eval_losses = [], []
        self.preemption.install()
        status = "FAILED"  # how the MLflow run ends
        in_progress = self.step + 1  # the step an exception let through came from: Note [Restarts] (dtcore.launch)
        try:
            self.model.train()
            while self.step < c.training.num_iterations:
                in_progress = self.step + 1
                t0, waited = time.perf_counter(), _C.wait_seconds()
                lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
                loss, tokens = self._train_step(batches)
                self.step += 1
                step_time, waited = time.perf_counter() - t0, _C.wait_seconds() - waited
                if self.in_memory is not None:
                    self.in_memory.confirm()  # the last copy on two nodes before any rank completes this step
                # One small all-reduce per step: the job's loss and tokens, and whether any rank was signalled.
                flags = [loss, float(tokens), float(self.preemption.requested)]
                summed, job_tokens, stop = all_reduce(torch.tensor(flags, device=self.device), op="sum").tolist()
                job_loss = summed / self.world
                record.train(
                    self.step,
                    loss=loss,
                    job_loss=job_loss,
                    lr=lr,
                    step_time_s=step_time,
                    wait_s=waited,
                    tokens=tokens,
                    job_tokens=job_tokens,
                )
                losses.append(job_loss)
                if restart and main and self.step == resumed_from + 1:
                    self._record_restart(record, run, info_path, restart, resumed_from, reached)
                if self.step % c.logging.straggler_window == 0:
                    self._stragglers(record.own_times, hosts)
                last = self.step == c.training.num_iterations
                if (
                    c.training.eval_every
                    and (self.step % c.training.eval_every == 0 or last)
                    and self.eval_data is not None
                ):
                    eval_loss = self._evaluate()
                    record.eval(self.step, eval_loss)
                    eval_losses.append(eval_loss)
                if stop > 0:
                    self._save(run_dir, complete=True)
                    status = "KILLED"
                    self._preempted(main)
                if (c.checkpoint.every and self.step % c.checkpoint.every == 0) or (last and c.checkpoint.at_end):
                    self._save(run_dir, complete=last)
                if self.in_memory is not None and self.step % c.checkpoint.memory_every == 0 and not last:
                    self.in_memory.save(self.step, model=self.model, optimizer=self.optimizer, **self._state_extras())
                record.publish()  # the step's scalars to the trackers, after its checkpoints (MetricsProcessor)
            status = "FINISHED"
        except Exception as e:
            e.dtcore_step = in_progress  # type: ignore[attr-defined]  (the launcher's test for a bug)
            abandon(f"the run failed in step {in_progress}")  # its peers may be gone: exit without waiting
            raise
        finally:
            self.preemption.uninstall()
            record.close(status)
        wait()  # the last asynchronous save, complete (or its error raised), before the run says it is done
        if self.in_memory is not None:
            self.in_memory.confirm()  # the last copy's replica, received by the ranks that keep it
        if c.logging.plot:
            if self.world > 1:
                barrier()  # every rank's metrics file is complete before rank 0 reads them
            if main:
                _plot(run_dir)
        return {"step": self.step, "losses": losses, "eval_losses": eval_losses}

    def _trackers(self, main: bool, run_dir: str) -> metrics.Trackers:
        """Rank 0's TensorBoard and MLflow; one that cannot start is a ConfigError on every rank, before the
        first step (not rank 0 alone gone and the others waiting in its first all-reduce)."""
        c, trackers, problem = self.config, None, None
        try:
            trackers = metrics.Trackers(main, run_dir, c.logging.tensorboard, c.logging.mlflow, c.to_dict())
        except _C.ConfigError as e:
            problem = str(e)
        if self.world > 1:
            problem = agree.gather(problem)[0]
        if problem is not None:
            if trackers is not None:
                trackers.close("FAILED")
            raise _C.ConfigError(problem if main else f"rank 0: {problem}")
        return trackers

    def _train_step(self, batches) -> tuple[float, int]:
        """One optimizer step over `accum` micro-batches; (this rank's mean loss, its tokens)."""
        total, tokens, where = torch.zeros((), device=self.device), 0, "forward"
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        try:
            for micro in range(self.accum):
                batch = _to(next(batches), self.device)
                tokens += _tokens(batch)
                sync = micro == self.accum - 1  # no_sync on all but the last micro-batch
                with contextlib.nullcontext() if sync else self.model.no_sync():
                    where = f"forward of micro-batch {micro + 1}/{self.accum}"
                    with autocast:
                        loss = _call(self.model, batch)
                    where = f"backward of micro-batch {micro + 1}/{self.accum}"
                    scaled = loss / self.accum
                    (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                total += loss.detach().float()
            where = "optimizer step"
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            if self.config.optim.grad_clip > 0:
                clip_grad_norm_(self.model, self.config.optim.grad_clip)
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.model.zero_grad(set_to_none=True)
            self.scheduler.step()
            return total.item() / self.accum, tokens
        except torch.OutOfMemoryError as e:
            raise self._oom(e, where) from None

    def _oom(self, error: BaseException, where: str) -> torch.OutOfMemoryError:
        c = self.config
        breakdown = memory.measure(
            self.model,
            self.optimizer,
            c.parallel.zero,
            self.world,
            c.training.device_batch_size,
            c.parallel.activation_checkpointing,
        )
        report = memory.oom_report(
            error,
            where=f"step {self.step + 1}, {where}",
            rank=self.rank,
            host=self.host,
            breakdown=breakdown,
            config=c,
            world=self.world,
            device=self.device,
        )
        log.error("%s", report)
        return torch.OutOfMemoryError(report)

    def _batches(self):
        """train_data as an endless iterator, from where a resume left it."""
        data = self.train_data
        skip = 0 if hasattr(data, "load_state_dict") else self.batches_taken
        self.batches_taken -= skip  # counted again as they are skipped

        def endless():
            while True:
                empty = True
                for batch in data:
                    empty = False
                    self.batches_taken += 1
                    yield batch
                if empty:
                    raise _C.ConfigError("train_data yielded no batch. Fix: give the Trainer a non-empty iterable.")

        it = endless()
        for _ in itertools.islice(it, skip):
            pass
        return it

    @torch.no_grad()
    def _evaluate(self) -> float:
        """Mean loss over eval_batches micro-batches per rank, averaged over ranks (the same on each)."""
        data = self.eval_data
        if hasattr(data, "load_state_dict"):
            data.load_state_dict({"epoch": 0, "taken": 0})  # the same batches every evaluation
        limit = self.config.training.eval_batches
        if hasattr(data, "batches_per_epoch"):
            limit = min(limit, data.batches_per_epoch)
        # the same count on every rank: under zero=3 each forward gathers, a collective
        limit = int(all_reduce(torch.tensor([limit], dtype=torch.float64, device=self.device), op="min").item())
        self.model.eval()
        total, n = torch.zeros((), device=self.device), 0
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype
            else contextlib.nullcontext()
        )
        for batch in itertools.islice(iter(data), limit):
            with autocast:
                total += _call(self.model, _to(batch, self.device)).float()
            n += 1
        self.model.train()
        return all_reduce((total / max(n, 1)).reshape(1), op="avg").item()

    def _stragglers(self, own_times: deque[float], hosts: list[str]) -> None:
        medians = torch.zeros(self.world, dtype=torch.float64, device=self.device)
        medians[self.rank] = statistics.median(own_times)
        medians = all_reduce(medians, op="sum").tolist()
        if self.rank == 0:
            for slow in metrics.stragglers(medians, hosts, self.config.logging.straggler_ratio):
                log.warning("straggler at step %d: %s", self.step, slow)

    def _hosts(self) -> list[str]:
        roster = self.ctx.rendezvous.roster() if self.ctx.rendezvous is not None else []
        by_rank = {e.rank: e.host for e in roster}
        return [by_rank.get(r, self.host if r == self.rank else "?") for r in range(self.world)]

    # Checkpoints ------------------------------------------------------------------------------

    def _save(self, run_dir: str, complete: bool) -> None:
        """A checkpoint of this step; with `complete`, returns once its manifest is written."""
        path = os.path.join(run_dir, "checkpoints", f"step_{self.step:08d}")
        save_checkpoint(
            path,
            model=self.model,
            optimizer=self.optimizer,
            step=self.step,
            async_save=self.config.checkpoint.async_save and not complete,
            **self._state_extras(),
        )
        if complete:
            wait()

    def _state_extras(self) -> dict[str, Any]:
        """A checkpoint's extra= (schedule, scaler: rank 0's is kept) and rank_extra= (RNG states, data position)
        of this step."""
        data = self.train_data
        extra = None
        if self.rank == 0:
            extra = {"scheduler": self.scheduler.state_dict(), "world_size": self.world}
            extra["scaler"] = self.scaler.state_dict() if self.scaler is not None else None
        rank_extra = {"rng": rng_state(), "batches_taken": self.batches_taken}
        rank_extra["data"] = data.state_dict() if hasattr(data, "state_dict") else None
        return {"extra": extra, "rank_extra": rank_extra}

    def _memory_checkpoints(self, launch: str | None, run_dir: str) -> memory_checkpoints.MemoryCheckpoints | None:
        """checkpoint.memory_every's copies (Note [In-memory checkpoints]), under a launcher that restarts."""
        every = self.config.checkpoint.memory_every
        if every <= 0:
            return None
        max_restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "")
        if launch is None or not max_restarts.isdigit() or int(max_restarts) == 0:
            if self.rank == 0:
                log.warning(
                    "checkpoint.memory_every=%d is off: no launcher restarts this job, and the copies are only read "
                    "by a restart. Fix: launch with python -m dtcore.launch --max-restarts N (or torchrun "
                    "--max-restarts N), or drop checkpoint.memory_every",
                    every,
                )
            return None
        # The copies live as long as the node's launcher (torch's agent), whose children the ranks are; one
        # directory per launch of it (two launches in one SLURM allocation have their own) and run directory.
        ctx = get_context()
        key = f"{restarts.agent_log_dir() or launch}|{os.path.abspath(run_dir)}"
        parent = os.getppid()
        me = [ctx.node_rank, parent]
        seen = agree.gather(me) if self.world > 1 else [me]
        nodes = [node for node, _ in seen]
        error, directory = memory_checkpoints.refuse_ranks(seen, ctx.node_rank), ""
        if error is None:
            try:
                directory = memory_checkpoints.open_node_directory(key, parent)
            except _C.ConfigError as e:
                error = str(e)
        errors = agree.gather(error) if self.world > 1 else [error]  # every rank fails alike, none waits
        failed = next(((r, e) for r, e in enumerate(errors) if e), None)
        if failed is not None:
            raise _C.ConfigError(failed[1] if failed[0] == self.rank else f"rank {failed[0]}: {failed[1]}")
        return memory_checkpoints.MemoryCheckpoints(
            directory, self.rank, self.world, every=every, nodes=nodes, timeout=ctx.timeout
        )

    def _record_restart(
        self,
        record: metrics.MetricsProcessor,
        run: dict,
        info_path: str,
        restart: int,
        resumed: int,
        reached: int | None,
    ) -> None:
        """Rank 0, after the first step of a restarted job: the failure in the metrics and in run.json."""
        line = restarts.restart_line(restart, resumed, reached, self.step, self.rank)
        record.file.write(line)
        run["restarts"].append({k: v for k, v in line.items() if k not in ("kind", "rank")})
        write_json(info_path, run)
        cause = f"rank {line['failed_rank']} on {line['failed_host']}: {line['cause']}" if line["cause"] else "?"
        lost = "?" if line["steps_lost"] is None else line["steps_lost"]
        back = "" if line["recover_s"] is None else f", training again {line['recover_s']:.1f} s after the failure"
        log.warning(
            "restart %d after a failure (%s): resumed at step %d, %s step(s) lost%s",
            restart,
            cause,
            resumed,
            lost,
            back,
        )

    def _resume(self, checkpoints: str, restart: int = 0) -> None:
        resume = self.config.checkpoint.resume
        if restart:  # the newest state of this run, whatever the first start resumed from (restarts.py)
            path = latest(checkpoints) or (None if resume in ("none", "auto") else resume)
            in_memory = self.in_memory.newest() if self.in_memory is not None else None
            source = path
            if in_memory is not None and (path is None or in_memory[0] > int(read_manifest(path)["step"])):
                path = in_memory[1]
                source = f"the in-memory checkpoint of step {in_memory[0]}"  # in each node's own directory
        elif resume == "none":
            return
        else:
            path = source = latest(checkpoints) if resume == "auto" else resume
        if self.world > 1:  # every rank resumes from the same one, or none does (a file system's caches may lag)
            seen = agree.gather(source)
            if any(p != seen[0] for p in seen):
                odd = next(r for r, p in enumerate(seen) if p != seen[0])
                raise _C.CheckpointError(
                    f"--checkpoint.resume={resume}: rank 0 found {seen[0]}, rank {odd} found {seen[odd]}. Fix: keep "
                    "checkpoints on a file system every node sees alike, at the same path."
                )
        if path is None:
            why = f"restart {restart}" if restart else "--resume auto"
            log.info("%s: no complete checkpoint in %s, starting fresh", why, checkpoints)
            return
        loaded = load_checkpoint(path, model=self.model, optimizer=self.optimizer)
        self.step = int(loaded["step"])
        extra = loaded["extra"]
        self.scheduler.load_state_dict(extra["scheduler"])
        if self.scaler is not None and extra.get("scaler") is not None:
            self.scaler.load_state_dict(extra["scaler"])
        mine = loaded["rank_extra"]
        if mine is None:
            log.warning(
                "resumed from %s, saved by %s ranks, on %s: model, optimizer and schedule restored; data position "
                "and random generators start afresh (exact resume needs the same world size)",
                loaded["path"],
                extra["world_size"],
                self.world,
            )
            _seed_everything(self.config.training.seed + self.step, self.rank)
            return
        self._rng_to_restore = mine["rng"]  # after the data is replayed to its position: see fit()
        self.batches_taken = int(mine["batches_taken"])
        if mine["data"] is not None and hasattr(self.train_data, "load_state_dict"):
            self.train_data.load_state_dict(mine["data"])
        log.info("resumed from %s at step %d", loaded["path"], self.step)

    def _preempted(self, main: bool) -> None:
        p = self.preemption
        if p.requested:
            name = signal.Signals(p.signum).name
            log.warning(
                "%s: checkpoint of step %d complete %.2f s after the signal; exiting with %d (resume with "
                "--checkpoint.resume=auto)",
                name,
                self.step,
                time.monotonic() - (p.received_at or time.monotonic()),
                EXIT_PREEMPTED,
            )
        elif main:
            log.warning(
                "another rank was signalled: checkpoint of step %d saved; exiting with %d", self.step, EXIT_PREEMPTED
            )
        raise Preempted(EXIT_PREEMPTED)


def _plot(run_dir: str) -> None:
    """logging.plot: the PNGs of python -m dtcore.plot, written by rank 0 at the end of the run."""
    try:
        import matplotlib  # noqa: F401  (optional: the plots are the only thing that needs it)
    except ImportError:
        log.warning("matplotlib is not installed: no plots of this run. Fix: pip install matplotlib")
        return
    from .rundir import plot, run

    written, _ = plot.plot(run.load(run_dir))
    log.info("plots of this run: %s", ", ".join(written))


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _set_aside_earlier_run(run_dir: str) -> None:
    """A fresh run (nothing resumed) into a directory an earlier run wrote: the earlier run is moved
    to RUN_DIR.<its start time>, so that metrics, plots and `--resume auto` never mix two runs, and
    nothing of it is lost."""
    earlier = os.path.join(run_dir, "run.json")
    if not os.path.exists(earlier) and not os.path.isdir(os.path.join(run_dir, "metrics")):
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(run_dir)))
    target = f"{run_dir}.{stamp}"
    for n in itertools.count(1):
        if not os.path.exists(target):
            break
        target = f"{run_dir}.{stamp}-{n}"
    os.rename(run_dir, target)
    log.info("this run starts afresh in %s; the earlier run there was moved to %s", run_dir, target)


def _flops_per_token(model: torch.nn.Module, inner: torch.nn.Module) -> float:
    """The model's training FLOPs per token: its own count, else 6 per parameter (Kaplan et al.)."""
    if isinstance(model, DistributedModel) and model.zero == 3:  # already sharded: the units know the sizes
        return 6.0 * sum(g.numel for u in model.units for g in u.groups)
    if hasattr(inner, "flops_per_token"):
        return inner.flops_per_token()
    return 6.0 * sum(p.numel() for p in inner.parameters())
