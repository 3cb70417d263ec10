"""`dtcore.checkpoint_activations()`: recompute the activations of repeated blocks in backward.

The blocks (by default the repeated layers, e.g. a transformer's; see blocks.py) get an
instance-level `forward` that runs the class's forward under torch's non-reentrant checkpoint
(torch.utils.checkpoint, use_reentrant=False, preserve_rng_state=True): parameters, their
identity and the state_dict are untouched, so dtcore.wrap's reducer and later sharding see the
same model, and policy=None takes it off again. Which blocks, and how, is the policy's choice; the
"budget:" policy profiles one step (profile.py) and lets the C++ planner
(csrc/dtcore/activation/plan.h) choose.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint

from .. import _C
from ..units import format_bytes, parse_bytes
from . import selective
from .blocks import Numel, find_blocks
from .kv_cache import has_cache, layer_index, without_cache
from .offload import Offloader
from .profile import StepProfile, profile_blocks
from .selective import mutation_error, selective_context

_POLICIES = "'all', 'every:<k>', 'budget:<size>' (e.g. 'budget:2GB'), 'selective', 'auto' or None"

_offloaders: dict[torch.device, Offloader] = {}  # one side stream per device


def offloader_for(device: torch.device) -> Offloader:
    if device not in _offloaders:
        _offloaders[device] = Offloader(device)
    return _offloaders[device]


class CheckpointedForward:
    """A block's instance-level `forward` while it is checkpointed (removed by policy=None).

    A plain object rather than a closure so that copy.deepcopy and pickling of the model copy it
    with the block it belongs to. It refers to its block weakly (the block refers to it through
    its `forward`): no reference cycle keeps a dropped model alive until the garbage collector
    runs. Its state for copying and pickling holds the block itself, so a copy refers to the copy.
    """

    def __init__(self, module: torch.nn.Module, selective: bool, offload: Offloader | None, name: str = "?") -> None:
        self._module = weakref.ref(module)
        self.previous = module.__dict__.get("forward")  # an instance forward set before us, if any
        self.selective = selective
        self.offload = offload
        self.name = name  # the block's qualified name, for errors
        self.layer_index = layer_index(module)  # its transformers KV-cache layer, if any; see kv_cache.py

    @property
    def module(self) -> torch.nn.Module:
        module = self._module()
        if module is None:
            raise RuntimeError(
                f"dtcore bug: the checkpointed block '{self.name}' no longer exists but its forward was called"
            )
        return module

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_module"] = self.module  # deepcopy / pickle map it to the copied block
        return state

    def __setstate__(self, state: dict) -> None:
        state["_module"] = weakref.ref(state["_module"])
        self.__dict__.update(state)

    def _inner(self):
        return self.previous if self.previous is not None else type(self.module).forward.__get__(self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._inner()
        if not torch.is_grad_enabled():  # evaluation: nothing is saved, nothing to recompute
            return inner(*args, **kwargs)
        # torch's checkpoint saves the random-number state of the devices of its positional tensor
        # arguments, and the offload hooks see the inputs it keeps: pass every tensor positionally,
        # also those given as keyword arguments or inside lists, tuples and dicts.
        if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
            run, tensors = inner, list(args)  # the usual block(x): nothing to flatten
        else:
            if has_cache(args, kwargs):  # a transformers KV cache; see kv_cache.py
                if not self.module.training:  # evaluation: the cache is what the caller asked for
                    return inner(*args, **kwargs)
                args, kwargs = without_cache(self.module, self.name, self.layer_index, args, kwargs)
            flat, spec = tree_flatten((args, kwargs))
            where = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
            tensors = [flat[i] for i in where]

            def run(*tensors: torch.Tensor) -> Any:
                values = list(flat)
                for i, t in zip(where, tensors):
                    values[i] = t
                a, k = tree_unflatten(values, spec)
                return inner(*a, **k)

        # context_fn only for selective: torch.compile (Dynamo) does not trace an explicit no-op one, and
        # calls a partial's function without its arguments; compiled, the in-place check is skipped.
        options = {}
        if self.selective:
            options["context_fn"] = (
                selective_context if torch.compiler.is_compiling() else functools.partial(selective_context, self.name)
            )
        if self.offload is None:
            return checkpoint(run, *tensors, use_reentrant=False, preserve_rng_state=True, **options)
        with self.offload.hooks():  # sees only the inputs the checkpoint keeps; see offload.py
            return checkpoint(run, *tensors, use_reentrant=False, preserve_rng_state=True, **options)


@dataclasses.dataclass
class BlockReport:
    name: str
    mode: str  # "keep" (not checkpointed), "full" or "selective"
    # Measured when profiled (example_inputs), see profile.py:
    activation_bytes: int | None = None  # held when kept
    input_bytes: int | None = None  # held when fully checkpointed
    forward_seconds: float | None = None  # the full recompute cost
    selective_bytes: int | None = None  # held when selectively checkpointed
    selective_seconds: float | None = None  # the selective recompute cost

    @property
    def checkpointed(self) -> bool:
        return self.mode != "keep"


@dataclasses.dataclass
class CheckpointSummary:
    """What checkpoint_activations() did. str() gives a table."""

    policy: str  # as resolved: "all", "every:2", "budget:2GB", "selective" or "none"
    block_class: str
    blocks: list[BlockReport]
    offload: str  # "off", "on (pinned CPU memory, side stream)" or why it does nothing
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None  # Note [Checkpoint peak model], when profiled
    baseline_peak_bytes: int | None = None  # the same with no block checkpointed
    recompute_seconds: float | None = None  # per step, from the profile
    fixed_bytes: int | None = None  # outside the blocks, temporaries included
    measured_peak_bytes: int | None = None  # the profiled step (no checkpointing), LiveTensorMemory

    @property
    def checkpointed(self) -> list[str]:
        return [b.name for b in self.blocks if b.checkpointed]

    def __str__(self) -> str:
        n = len(self.checkpointed)
        lines = [
            f"checkpoint_activations: policy {self.policy}, {n} of {len(self.blocks)} {self.block_class} "
            f"block(s) checkpointed, offload {self.offload}"
        ]
        profiled = any(b.activation_bytes is not None for b in self.blocks)
        lines.append(
            "| block | checkpoint |"
            + (
                " held if kept | if full | if selective | recompute full (ms) | recompute selective (ms) |"
                if profiled
                else ""
            )
        )
        lines.append("| --- | --- |" + (" --- | --- | --- | --- | --- |" if profiled else ""))
        for b in self.blocks:
            row = f"| {b.name} | {b.mode} |"
            if b.activation_bytes is not None:
                no_selective = b.selective_bytes is None  # an in-place change of a kept output
                row += (
                    f" {format_bytes(b.activation_bytes)} | {format_bytes(b.input_bytes or 0)} | "
                    f"{'n/a' if no_selective else format_bytes(b.selective_bytes)} | "
                    f"{1000 * (b.forward_seconds or 0.0):.2f} | "
                    f"{'n/a' if no_selective else f'{1000 * (b.selective_seconds or 0.0):.2f}'} |"
                )
            lines.append(row)
        if self.predicted_peak_bytes is not None:
            text = (
                f"activation peak (estimated): {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
                f"{format_bytes(self.baseline_peak_bytes or 0)}; "
                f"outside the blocks {format_bytes(self.fixed_bytes or 0)}; "
                f"recompute {1000 * (self.recompute_seconds or 0.0):.1f} ms per step"
            )
            if self.budget_bytes is not None:
                text = f"budget {self.policy[len('budget:') :].strip()} ({format_bytes(self.budget_bytes)}); " + text
            lines.append(text)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"CheckpointSummary(policy={self.policy!r}, checkpointed={self.checkpointed!r})\n{self}"


def _parse_policy(policy: str | None) -> tuple[str, int | None]:
    """-> (kind, argument): ("none", None), ("all", None), ("every", k), ("budget", bytes), ("selective", None)."""
    if policy is None:
        return "none", None
    if not isinstance(policy, str):
        raise _C.ConfigError(f"policy={policy!r} is not a policy. Fix: pass one of {_POLICIES}.")
    p = policy.strip()
    if p in ("all", "auto", "selective"):
        return ("all" if p == "auto" else p), None
    if p.startswith("every:"):
        k = p[len("every:") :].strip()
        if k.isdigit() and int(k) >= 1:
            return "every", int(k)
        raise _C.ConfigError(
            f"policy='{policy}': '{k}' is not a positive whole number of blocks. Fix: pass e.g. "
            "'every:2' to checkpoint one block in two."
        )
    if p.startswith("budget:"):
        return "budget", parse_bytes(p[len("budget:") :], f"policy='{policy}': the budget")
    raise _C.ConfigError(f"policy='{policy}' is not a checkpoint policy. Fix: pass one of {_POLICIES}.")


def _unwrap(model: torch.nn.Module) -> tuple[torch.nn.Module, Numel]:
    """The module whose blocks change, and how many elements each of its parameters has."""
    from ..reducer.model import DistributedModel

    if isinstance(model, DistributedModel):
        # The same parameters: the reducer's hooks stay where they are. Under zero=3 a parameter's data is empty
        # between uses; the wrapper knows its whole shape.
        return model.module, lambda p: model.shape_of(p).numel()
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module, torch.Tensor.numel
    return model, torch.Tensor.numel


def _remove(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module, CheckpointedForward]]:
    """Takes every CheckpointedForward off; returns them for _restore()."""
    removed = []
    for name, m in root.named_modules():
        wrapper = m.__dict__.get("forward")
        if isinstance(wrapper, CheckpointedForward):
            if wrapper.previous is None:
                del m.forward
            else:
                m.forward = wrapper.previous
            removed.append((name, m, wrapper))
    return removed


def _restore(removed: list[tuple[str, torch.nn.Module, CheckpointedForward]]) -> None:
    for _, m, wrapper in removed:
        m.forward = wrapper


def _same_on_every_rank(profile: StepProfile) -> StepProfile:
    """With several ranks: every figure becomes its maximum over the ranks, so that every rank plans alike.

    Timings differ between ranks (and sizes, with uneven shards); plans made apart could differ, and
    an infeasible budget would raise on some ranks while the others wait in their first collective.
    """
    from ..bootstrap.context import get_context, is_initialized
    from ..comm import agree

    if not is_initialized() or get_context().world_size < 2:
        return profile
    agree.check_same(
        [p.name for p in profile.blocks],
        what="checkpoint_activations: the blocks",
        item="block",
        fix="build the same model on every rank.",
    )
    rows = [
        [
            p.activation_bytes,
            p.input_bytes,
            p.forward_seconds,
            p.selective_bytes,
            p.selective_seconds,
            p.selective_shared_bytes,
            float(m),
        ]
        for p, m in zip(profile.blocks, profile.selective_mutated)
    ]
    values = agree.maximum(
        [x for row in rows for x in row]
        + [profile.fixed_bytes, profile.saved_outside_bytes, profile.measured_peak_bytes]
    )
    blocks, mutated = [], []
    n = len(profile.blocks)
    for i, p in enumerate(profile.blocks):
        a, x, fs, h, ss, o, m = values[7 * i : 7 * i + 7]
        mutated.append(m > 0)
        blocks.append(_C.BlockProfile(p.name, int(a), int(x), fs, -1 if m > 0 else int(h), ss, -1 if m > 0 else int(o)))
    fixed, outside, measured = (int(v) for v in values[7 * n :])
    return StepProfile(blocks, fixed, outside, measured, mutated)


def _model_device(root: torch.nn.Module) -> torch.device:
    for p in root.parameters():
        return p.device
    return torch.device("cpu")


def checkpoint_activations(
    model: torch.nn.Module,
    policy: str | None = "auto",
    *,
    blocks: Any = None,
    example_inputs: Any = None,
    offload: bool = False,
    profile_repeats: int = 3,
) -> CheckpointSummary:
    """Recompute the activations of `model`'s repeated blocks in backward, in place.

    model: an nn.Module, or a dtcore.wrap / DistributedDataParallel model (its `.module` is used).
    policy:
      "all"          every block keeps only its inputs and recomputes the rest in backward.
      "every:<k>"    blocks 0, k, 2k, ... (earlier blocks: their recompute comes when less is held).
      "budget:<size>"  profiles one step on `example_inputs` and gives each block a mode (kept,
                     fully or selectively checkpointed) so that the activation peak fits the size
                     with the least recompute time ("2GB" = 2*10^9 bytes, "1.5GiB" = 1.5*2^30, or
                     plain bytes); see Note [Checkpoint peak model]. The budget covers the memory of
                     the step's tensors: activations held for backward (in the blocks and outside
                     them), the recompute of one block in backward, and the temporaries the
                     profiled step held at its peak; not parameters, gradients or optimizer state.
                     ConfigError with the smallest achievable figure when no choice fits. With
                     several ranks, every rank plans from the largest figures of all of them.
      "selective"    every block, keeping the outputs of matrix multiplications and attention and
                     recomputing the rest (norms, activations, softmax, dropout): less memory saved
                     than "all", for much less recompute. A block that changes a kept output in place
                     (ReLU(inplace=True) after a Linear) is a ConfigError naming it.
      "auto"         the default, for now the same as "all": choosing a budget needs the memory
                     the rest of training takes (gradients, optimizer state, other processes), which
                     is not known here; pass "budget:<size>" to plan one.
      None           take checkpointing off again; the model is as it was.
    Calling again with another policy replaces the previous one. Gradients are the same as without
    checkpointing: the random-number state is replayed, so dropout masks match. A transformers KV
    cache is left out of checkpointed blocks while training, as transformers does (kv_cache.py).
    blocks: which modules are blocks; by default the repeated layers (a run of sibling modules of one
      class, composite layers before runs of leaf modules such as one attention's projections).
      A class, a class name, or a list of qualified names or fnmatch patterns (e.g. "blocks.*").
    example_inputs: one forward call's positional arguments (a tuple), keyword arguments (a dict),
      or a single tensor. Required by "budget:"; with any other policy, the summary then shows the
      measured sizes and times and the estimated peak.
    offload: with CUDA, the inputs kept by checkpointed blocks go to pinned CPU memory on a side
      stream during forward and come back ahead of their recompute in backward; on CPU, a no-op.
    profile_repeats: forward passes timed per block (median) for "budget:".

    Returns a CheckpointSummary; print it for a table of blocks.
    """
    kind, arg = _parse_policy(policy)
    if not isinstance(profile_repeats, int) or profile_repeats < 1:
        raise _C.ConfigError(
            f"profile_repeats={profile_repeats!r} must be a whole number >= 1 (forward passes "
            "timed per block). Fix: leave the default, 3."
        )
    root, numel = _unwrap(model)
    removed = _remove(root)  # the profile measures the model without them; put back if this call fails
    if kind == "none":
        return CheckpointSummary("none", "", [BlockReport(name, "keep") for name, _, _ in removed], "off")
    try:
        return _apply(root, numel, policy, kind, arg, blocks, example_inputs, offload, profile_repeats)
    except BaseException:
        _remove(root)
        _restore(removed)
        raise


def _apply(
    root: torch.nn.Module,
    numel: Numel,
    policy: str,
    kind: str,
    arg: int | None,
    blocks: Any,
    example_inputs: Any,
    offload: bool,
    profile_repeats: int,
) -> CheckpointSummary:
    if kind == "selective" and not selective.SUPPORTED:
        raise selective.unsupported_error(policy)
    found = find_blocks(root, blocks, numel)
    names = [n for n, _ in found]
    block_class = type(found[0][1]).__name__ if len({type(m) for _, m in found}) == 1 else "mixed"
    device = _model_device(root)
    offloading = offload and device.type == "cuda"
    offload_text = (
        "on (pinned CPU memory, side stream)"
        if offloading
        else "requested, a no-op: the model is on the CPU, there is nothing to move"
        if offload
        else "off"
    )
    if kind == "budget" and example_inputs is None:
        raise _C.ConfigError(
            f"policy='{policy}' needs one step's input to measure the blocks. Fix: pass example_inputs= the "
            "arguments of one forward call, e.g. checkpoint_activations(model, 'budget:2GB', example_inputs=(x, y)) "
            "(a dict for keyword arguments)."
        )
    profile = None
    if example_inputs is not None:
        profile = profile_blocks(root, found, example_inputs, repeats=profile_repeats)
        if kind == "budget":
            profile = _same_on_every_rank(profile)
    if kind == "selective" and profile is not None and any(profile.selective_mutated):
        bad = [n for n, m in zip(names, profile.selective_mutated) if m]
        raise mutation_error(bad, "an in-place operator (seen in the profile)")
    profiles = list(profile.blocks) if profile else []
    if offloading:  # inputs kept by checkpointed blocks live on the host: not held on the device
        profiles = [
            _C.BlockProfile(
                p.name,
                p.activation_bytes,
                0,
                p.forward_seconds,
                p.selective_bytes - p.input_bytes if p.selective_bytes >= 0 else -1,
                p.selective_seconds,
                p.selective_shared_bytes - p.input_bytes if p.selective_bytes >= 0 else -1,
            )
            for p in profiles
        ]

    keep, full, sel = _C.CheckpointMode.keep, _C.CheckpointMode.full, _C.CheckpointMode.selective
    if kind == "all":
        modes = [full] * len(found)
    elif kind == "selective":
        modes = [sel] * len(found)
    elif kind == "every":
        modes = [full if i % arg == 0 else keep for i in range(len(found))]
    else:
        plan = _C.plan_checkpoints(profiles, profile.fixed_bytes, arg)
        if not plan.feasible:
            budget_text = str(policy).strip()[len("budget:") :].strip()
            raise _C.ConfigError(
                f"policy='{policy}' cannot be met: the smallest activation peak that checkpointing blocks of "
                f"{type(root).__name__} reaches is {format_bytes(plan.min_peak_bytes)} ({plan.min_peak_bytes} bytes), "
                f"above the budget of {budget_text} ({format_bytes(arg)}, {arg} bytes); without checkpointing it is "
                f"{format_bytes(plan.baseline_peak_bytes)}, and {format_bytes(profile.fixed_bytes)} of it is outside "
                f"the {len(found)} blocks. Fix: raise the budget to at least {format_bytes(plan.min_peak_bytes)}, or "
                "lower the batch size or sequence length"
                + (", or pass offload=True." if device.type == "cuda" and not offload else ".")
            )
        modes = list(plan.modes)

    offloader = offloader_for(device) if offloading else None
    for (name, module), mode in zip(found, modes):
        if mode != keep:
            module.forward = CheckpointedForward(module, mode == sel, offloader, name)

    resolved = {"every": f"every:{arg}", "budget": str(policy).strip()}.get(kind, kind)
    summary = CheckpointSummary(
        resolved,
        block_class,
        [BlockReport(n, m.name) for n, m in zip(names, modes)],
        offload_text,
        budget_bytes=arg if kind == "budget" else None,
    )
    if profile is not None:
        for report, p in zip(summary.blocks, profile.blocks):
            report.activation_bytes, report.input_bytes, report.forward_seconds = (
                p.activation_bytes,
                p.input_bytes,
                p.forward_seconds,
            )
            if p.selective_bytes >= 0:  # otherwise no option: an in-place change of a kept output
                report.selective_bytes, report.selective_seconds = p.selective_bytes, p.selective_seconds
        summary.predicted_peak_bytes = _C.predicted_peak(profiles, profile.fixed_bytes, modes)
        summary.recompute_seconds = _C.recompute_seconds(profiles, modes)
        summary.baseline_peak_bytes = _C.predicted_peak(profiles, profile.fixed_bytes, [keep] * len(profiles))
        summary.fixed_bytes = profile.fixed_bytes
        summary.measured_peak_bytes = profile.measured_peak_bytes
    return summary
