"""Where a device's memory goes: the presets' expected figures and the out-of-memory diagnosis.

`estimate` models a GPT step (parameters, gradients, AdamW state, activations) from the
configuration alone; `oom_report` explains a real torch.OutOfMemoryError on the rank it hit,
from what that rank holds, and lists the fixes in the order that costs least.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from .config import PRESETS, TrainConfig, from_preset
from .demo import data, gpt

GIB = 2**30
kPresetWorld = 8  # the presets' memory figures assume 8 ranks (one node of 8 GPUs) for ZeRO's sharding


@dataclasses.dataclass
class MemoryBreakdown:
    """Bytes per device, by what holds them."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int | None  # None: unknown (a model without activation_bytes())

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + (self.activations or 0)


def model_vocab_size(config: TrainConfig) -> int:
    """The vocabulary the built-in GPT of `config` has (dtcore.train.demo.gpt.shape: model.vocab_size, or the
    tokenizer's where that is 0; the char tokenizer's is read from data.path's text)."""
    return gpt.shape(config.model, data.vocab_size(config.data), f"data.tokenizer={config.data.tokenizer!r}").vocab_size


def gpt_parameters(config: TrainConfig, vocab_size: int | None = None) -> int:
    """The built-in GPT's parameter count (dtcore.train.demo.gpt.GPT, tied embeddings), without building it;
    vocab_size None: the model's own (model_vocab_size)."""
    c = config.model
    vocab_size = model_vocab_size(config) if vocab_size is None else vocab_size
    per_block = 12 * c.n_embd**2 + 13 * c.n_embd
    return c.n_layer * per_block + (vocab_size + c.block_size + 2) * c.n_embd


def estimate(config: TrainConfig, world_size: int, vocab_size: int | None = None) -> MemoryBreakdown:
    """A GPT step's memory per device: fp32 parameters and gradients, AdamW's two fp32 moments, and
    the activations at their peak (dtcore.train.demo.gpt.activation_bytes, Note [GPT activation
    memory]). vocab_size None: the model's own (model_vocab_size)."""
    vocab_size = model_vocab_size(config) if vocab_size is None else vocab_size
    n = gpt_parameters(config, vocab_size)
    zero = config.parallel.zero
    # zero=3 holds 1/N of every parameter, plus the whole parameters (and gradients) of the unit
    # running and the one prefetched: two blocks
    units = 2 * 4 * (12 * config.model.n_embd**2 + 13 * config.model.n_embd) if zero == 3 else 0
    shape = gpt.GPTConfig(**{**dataclasses.asdict(config.model), "vocab_size": vocab_size})
    return MemoryBreakdown(
        parameters=4 * n // (world_size if zero == 3 else 1) + units,
        gradients=4 * n // (world_size if zero >= 2 else 1) + units,
        optimizer_state=8 * n // (world_size if zero >= 1 else 1),
        activations=gpt.activation_bytes(
            shape, config.training.device_batch_size, config.parallel.activation_checkpointing
        ),
    )


def preset_memory(name: str) -> str:
    """The expected memory per device of a preset, as docs and --help show it."""
    config = from_preset(name)
    world = kPresetWorld if config.parallel.zero else 1
    est = estimate(config, world)
    where = f"with {world} ranks" if config.parallel.zero else "any number of ranks"
    if PRESETS[name][1].get("model.n_layer") is None:
        return f"{est.total / 2**20:.0f} MiB ({where})"
    return f"{est.total / GIB:.1f} GiB + CUDA context ({where})"


def _tensor_bytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def measure(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, zero: int, world: int, batch: int, checkpointing: str
):
    """What this rank holds now (parameters, gradients, optimizer state) and the activation estimate of a
    model that gives one (activation_bytes(batch, checkpointing), as the built-in GPT does)."""
    if zero == 3:  # the shards (the parameters' data is empty between uses)
        groups = [g for u in model.units for g in u.groups]
        params = sum(g.shard.numel() * g.shard.element_size() for g in groups)
        grads = sum(g.grad.numel() * g.grad.element_size() for g in groups if g.grad is not None)
    else:
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        grads = params // (world if zero == 2 else 1)
    state = _tensor_bytes(list(optimizer.state.values()))
    if state == 0:  # before the first step (or sharded out of sight): AdamW's two fp32 moments
        state = 2 * sum(p.numel() * 4 for p in model.parameters()) // (world if zero >= 1 else 1)
    inner = getattr(model, "module", model)
    acts = inner.activation_bytes(batch, checkpointing) if hasattr(inner, "activation_bytes") else None
    return MemoryBreakdown(params, grads, state, acts)


def oom_report(
    error: BaseException,
    *,
    where: str,
    rank: int,
    host: str,
    breakdown: MemoryBreakdown,
    config: TrainConfig,
    world: int,
    device: torch.device,
) -> str:
    """The message of the OutOfMemoryError the trainer raises: what holds memory and what to do."""

    def gib(n: int | None) -> str:
        if n is None:
            return "unknown"
        return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.2f} MiB"

    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    lines = [
        f"out of memory on rank {rank} ({host}, {device}) during {where}: {first_line}",
        "Memory of this rank:",
        f"  parameters       {gib(breakdown.parameters)}",
        f"  gradients        {gib(breakdown.gradients)}"
        + (f"  (sharded, zero={config.parallel.zero})" if config.parallel.zero >= 2 else ""),
        f"  optimizer state  {gib(breakdown.optimizer_state)}" + ("  (sharded)" if config.parallel.zero >= 1 else ""),
        f"  activations      {gib(breakdown.activations)}  (estimate for device_batch_size="
        f"{config.training.device_batch_size}, activation_checkpointing={config.parallel.activation_checkpointing})",
    ]
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        lines.append(
            f"  allocator        {gib(torch.cuda.memory_allocated(device))} allocated, "
            f"{gib(torch.cuda.memory_reserved(device))} reserved, {gib(free)} free of {gib(total)}"
        )
    lines.append("Next steps, cheapest first:")
    steps = []
    batch = config.training.device_batch_size
    if batch > 1:
        total = config.training.total_batch_size or batch * world
        steps.append(
            f"--training.device_batch_size={batch // 2} with --training.total_batch_size={total}: half the "
            "activations, the same optimization (twice the micro-batches accumulated)"
        )
    if config.parallel.zero < 2 and world > 1:
        saved = (breakdown.gradients + breakdown.optimizer_state) * (world - 1) // world
        steps.append(
            f"--parallel.zero=2: shards gradients and optimizer state over {world} ranks (saves ~{gib(saved)})"
        )
    if config.parallel.activation_checkpointing == "none":
        steps.append(
            "--parallel.activation_checkpointing=all (or budget:<size>): recompute activations in backward "
            "(~30% more compute)"
        )
    if device.type == "cuda" and "expandable_segments" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        steps.append(
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: less fragmentation when reserved is well above allocated"
        )
    steps.append("a device with more memory, or more ranks with zero=2")
    lines += [f"  {i}. {s}" for i, s in enumerate(steps, 1)]
    return "\n".join(lines)
