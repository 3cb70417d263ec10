"""Measuring one step for the checkpoint planner, and a live-tensor memory meter.

profile_blocks() runs the model once forward and backward on example inputs, without
checkpointing, and measures what Note [Checkpoint peak model] (csrc/dtcore/activation/plan.h)
needs per block:
  - activation_bytes: the union of the storages of its tensor inputs and of the storages saved for
    backward while the block runs (seen through torch.autograd.graph.saved_tensors_hooks); a
    storage held by two blocks counts for both (a block's output that it saves itself, as ReLU,
    tanh, sigmoid and softmax do, and that the next block takes as its input), so that whichever of
    the two is checkpointed, what the other holds is counted: conservative where both are kept.
    Parameters and buffers are not counted;
  - input_bytes: the storages of its tensor inputs (what a checkpoint keeps);
  - forward_seconds: the median over a few forward passes of the time inside the block;
  - selective_bytes: its inputs plus the outputs of the operators "selective" keeps (Note
    [Selective checkpoint ops]), which is what torch's selective checkpoint holds, and
    selective_shared_bytes: the part of it also saved for backward (its inputs at least);
  - selective_seconds: forward_seconds times the share of the block's operator time spent outside
    those operators (timed operator by operator in one more pass), the selective recompute cost;
  - whether an operator changes a kept output in place (Note [Selective checkpoint ops]): then
    selective is no option for that block (selective_bytes -1), as for every block on a torch whose
    checkpoint policy does not see operator outputs (selective.SUPPORTED).
Everything saved outside the blocks is the fixed part (a storage saved outside and held by a block,
such as the last block's output, counts in both). The step's real peak (LiveTensorMemory) is
measured too: what it holds beyond the saved storages, each counted once (temporaries such as
gradients flowing backward), is reserved off the budget, so that the budget bounds what the meter
measures. Backward differentiates with respect to the parameters only, as a training step does:
gradients with respect to the blocks' inputs would be held to the end and inflate that peak.
A step that runs out of memory is a ConfigError that asks for smaller example inputs.

The model's state is left as it was: the random-number state is restored, buffers (e.g.
BatchNorm statistics) are put back, and backward runs with torch.autograd.grad, which returns the
gradients instead of accumulating them: no parameter's .grad is touched and no gradient hook
(dtcore.wrap's reducer) fires.

LiveTensorMemory is the CPU stand-in for torch.cuda.max_memory_allocated: a TorchDispatchMode that
sees every tensor an operator creates while it is active and tracks the bytes of those storages
alive at once (weak references tell when a storage is freed). It does not see tensors created
before it was entered (parameters, inputs) nor memory outside tensors.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .. import _C
from . import selective
from .selective import SAVED_OPS, mutated_by
from .selective import storage_key as _storage_key


class LiveTensorMemory(TorchDispatchMode):
    """Peak bytes of tensor storages created while active and alive at the same time.

    `peak_bytes(excluding=tensors)` leaves out the storages of the given tensors (e.g. parameter
    gradients) over their whole life, so that the figure is activations plus temporaries.
    """

    def __init__(self) -> None:
        super().__init__()
        self._ids: dict[int, int] = {}  # live storage key -> event id (keys are reused after a free)
        self._events: list[tuple[int, int]] = []  # (id, +bytes at creation or -bytes at free)
        self._next = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # An output sharing an input's storage (a view, an in-place result) allocated nothing; this
        # also keeps out parameters, first seen here through views such as weight.t().
        inputs = {_storage_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and _storage_key(t) not in inputs:
                self._track(t.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self._ids or storage.nbytes() == 0:
            return  # a view or an in-place result: nothing new allocated
        ident, self._next = self._next, self._next + 1
        self._ids[key] = ident
        self._events.append((ident, storage.nbytes()))
        weakref.finalize(storage, self._free, key, ident, storage.nbytes())

    def _free(self, key: int, ident: int, nbytes: int) -> None:
        if self._ids.get(key) == ident:
            del self._ids[key]
        self._events.append((ident, -nbytes))

    def peak_bytes(self, excluding: Iterable[torch.Tensor | None] = ()) -> int:
        skip = {self._ids.get(_storage_key(t)) for t in excluding if t is not None}
        live = peak = 0
        for ident, delta in self._events:
            if ident not in skip:
                live += delta
                peak = max(peak, live)
        return peak


class _KeptOps(TorchDispatchMode):
    """Per block: bytes of new storages output by SAVED_OPS, and operator time kept / total."""

    def __init__(self, hooks: _BlockHooks, n: int, timing: bool) -> None:
        super().__init__()
        self.hooks, self.timing = hooks, timing
        self.kept_bytes = [0] * n
        self.kept_seconds = [0.0] * n
        self.all_seconds = [0.0] * n
        self.shared_bytes = [0] * n  # kept outputs that are also saved for backward
        self.mutated = [False] * n  # a kept output of the block was changed in place (forward only)
        self.checking = not timing
        self._alive: dict[int, int] = {}  # storage key of a kept output still alive -> its block
        self._shared: set[int] = set()

    def saved(self, t: torch.Tensor) -> None:
        """Called for each tensor saved for backward: is it a kept output too?"""
        key = _storage_key(t)
        if key in self._alive and key not in self._shared:
            self._shared.add(key)
            self.shared_bytes[self._alive[key]] += t.untyped_storage().nbytes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        i = self.hooks.current
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if self.checking and self._alive:  # also after the block: the next one may change its output
            for t in mutated_by(func, args, kwargs or {}):
                block = self._alive.get(_storage_key(t))
                if block is not None:
                    self.mutated[block] = True
        if i is None:
            return out
        if self.timing:
            tensors = _tensors(out)
            if tensors:
                _sync(tensors[0].device)
            elapsed = time.perf_counter() - start
            self.all_seconds[i] += elapsed
            self.kept_seconds[i] += elapsed if func in SAVED_OPS else 0.0
        elif func in SAVED_OPS:  # new outputs: these operators allocate them (never views)
            for key, storage in {_storage_key(t): t.untyped_storage() for t in _tensors(out)}.items():
                self.kept_bytes[i] += storage.nbytes()
                self._alive[key] = i
                weakref.finalize(storage, self._alive.pop, key, None)
        return out


@dataclasses.dataclass
class StepProfile:
    blocks: list  # list[_C.BlockProfile], in forward order
    fixed_bytes: int  # saved outside the blocks, plus the step's temporaries at its peak
    saved_outside_bytes: int  # saved for backward outside the blocks
    measured_peak_bytes: int  # LiveTensorMemory's peak of the profiled step
    selective_mutated: list  # per block: an operator changes a kept output in place (no selective option)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _call(model: torch.nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return model(*example_inputs)
    return model(example_inputs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _BlockHooks:
    """Knows which block is running; times each block's forward; records its inputs."""

    def __init__(self, blocks: list[torch.nn.Module], on_enter: Callable[[int, list[torch.Tensor]], None]) -> None:
        self.current: int | None = None
        self.seconds: list[list[float]] = [[] for _ in blocks]
        self._start = 0.0
        self._handles = []
        for i, block in enumerate(blocks):
            self._handles.append(block.register_forward_pre_hook(self._pre(i, on_enter), with_kwargs=True))
            self._handles.append(block.register_forward_hook(self._post(i)))

    def _pre(self, i: int, on_enter):
        def hook(module, args, kwargs):
            inputs = _tensors((args, kwargs))
            on_enter(i, inputs)
            if inputs:
                _sync(inputs[0].device)
            self.current, self._start = i, time.perf_counter()

        return hook

    def _post(self, i: int):
        def hook(module, args, output):
            outs = _tensors(output)
            if outs:
                _sync(outs[0].device)
            self.seconds[i].append(time.perf_counter() - self._start)
            self.current = None

        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def profile_blocks(
    root: torch.nn.Module, blocks: list[tuple[str, torch.nn.Module]], example_inputs: Any, repeats: int = 3
) -> StepProfile:
    """One measured step of `root` on `example_inputs`; see the module docstring."""
    held = {_storage_key(t) for t in list(root.parameters()) + list(root.buffers())}
    sizes: dict[int, int] = {}  # storage key -> bytes, of every input and saved storage
    holders: list[set[int]] = [set() for _ in blocks]  # per block: its inputs and what it saves
    outside: set[int] = set()  # saved outside the blocks
    input_bytes = [0] * len(blocks)
    kept: list[torch.Tensor] = []  # block inputs, alive through the measured pass so keys stay unique
    measuring = [True]  # the timing passes after the measured one record nothing

    def on_enter(i: int, inputs: list[torch.Tensor]) -> None:
        if not measuring[0]:
            return
        seen: set[int] = set()
        for t in inputs:
            key = _storage_key(t)
            if key in held or key in seen:
                continue
            seen.add(key)
            input_bytes[i] += t.untyped_storage().nbytes()
            sizes[key] = t.untyped_storage().nbytes()
            holders[i].add(key)
            kept.append(t)

    hooks = _BlockHooks([m for _, m in blocks], on_enter)
    kept_ops = _KeptOps(hooks, len(blocks), timing=False)

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in held:
            sizes[key] = t.untyped_storage().nbytes()
            (outside if hooks.current is None else holders[hooks.current]).add(key)
            kept_ops.saved(t)
        return t

    buffers = [b.detach().clone() for b in root.buffers()]
    devices = sorted({p.device.index or 0 for p in root.parameters() if p.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            meter = LiveTensorMemory()
            with meter, kept_ops, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = _call(root, example_inputs)
                kept_ops.checking = False  # in-place changes of kept outputs matter in forward
                losses = [t.float().sum() for t in _tensors(out) if t.requires_grad]
                # Gradients returned, not accumulated: no .grad is touched and no AccumulateGrad hook
                # (dtcore.wrap's reducer, torch DDP) fires. Parameters' gradients are computed as in a
                # real backward, so their temporaries count; the gradients themselves do not. Only the
                # parameters': a gradient asked for a block's input would be held to the end.
                params = [p for p in root.parameters() if p.requires_grad]
                grads = []
                if losses and params:
                    grads = torch.autograd.grad(torch.stack(losses).sum(), params, allow_unused=True)
                del out, losses
            measured = meter.peak_bytes(excluding=grads)
            del grads
            measuring[0] = False
            kept.clear()
            for s in hooks.seconds:
                s.clear()  # the measured pass warmed up; time the next ones
            for _ in range(repeats):
                _call(root, example_inputs)
            op_clock = _KeptOps(hooks, len(blocks), timing=True)
            with op_clock:
                _call(root, example_inputs)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        device = next((str(t.device) for t in _tensors(example_inputs)), "cpu")
        raise _C.ConfigError(
            f"checkpoint_activations: the profile step (one forward and backward of {type(root).__name__} on "
            f"example_inputs, without checkpointing) ran out of memory on {device}: {str(e).splitlines()[0][:200]}. "
            "Fix: pass smaller example_inputs (e.g. a quarter of the batch) with the budget scaled down in the same "
            "proportion (activation memory grows with the batch), or use policy 'all'."
        ) from None
    finally:
        hooks.remove()
        with torch.no_grad():
            for b, saved in zip(root.buffers(), buffers):
                b.copy_(saved)

    activation = [sum(sizes[k] for k in keys) for keys in holders]
    outside_bytes = sum(sizes[k] for k in outside)
    profiles = []
    for i, (name, _) in enumerate(blocks):
        seconds = statistics.median(hooks.seconds[i][:repeats]) if hooks.seconds[i] else 0.0
        share = 1.0 - op_clock.kept_seconds[i] / op_clock.all_seconds[i] if op_clock.all_seconds[i] > 0 else 1.0
        no_selective = kept_ops.mutated[i] or not selective.SUPPORTED  # selective is no option: -1
        profiles.append(
            _C.BlockProfile(
                name,
                activation[i],
                input_bytes[i],
                seconds,
                -1 if no_selective else input_bytes[i] + kept_ops.kept_bytes[i],
                seconds * share,
                -1 if no_selective else input_bytes[i] + kept_ops.shared_bytes[i],
            )
        )
    saved = sum(sizes.values())  # every input and saved storage once
    temporaries = max(0, measured - saved)
    return StepProfile(profiles, outside_bytes + temporaries, outside_bytes, measured, list(kept_ops.mutated))


def _out_of_memory(e: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA and other accelerators), or the CPU allocator's RuntimeError."""
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e) or "out of memory" in str(e)
