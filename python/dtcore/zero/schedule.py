"""zero=3's schedule: the hooks that gather, prefetch, reduce and free units. See Note [Fully sharded units]
(stage3.py) for the order of events and why gathers and reductions go over two communicators.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_map

from .. import _C
from ..reducer.outputs import tensors_in
from .full_state import install_state_hooks
from .unit import Unit

kInFlight = 1  # units whose reduce-scatters may be in flight at once (their whole gradients held)

# Note [Same units on every rank]
# Each gather pairs with the other ranks' gather of the same number on the gathers' communicator.
# Transformer layers are alike in size, so a rank that skips a unit another runs would pair its
# gathers with other units' without any size mismatch to stop it. Each rank keeps a running hash of
# the units it gathered since the last synced backward; the end of each synced backward compares
# them with one all-reduce of two integers (max of h and of -h), which the used map rides along with. A
# difference raises inside backward, before any optimizer step uses this step's gradients.


class Schedule:
    """The hooks of one FullyShardedModel and the state of the step in flight."""

    def __init__(self, model: Any, units: list[Unit], gather_comm: Any, reduce_comm: Any) -> None:
        self.model = model
        self.units = units
        self.root = units[0]
        self.gather_comm, self.reduce_comm = gather_comm, reduce_comm
        opts = model._options
        self.prefetch = opts["prefetch"]
        self.reshard_after_forward = opts["reshard_after_forward"]
        self.param_dtype = opts["param_dtype"]
        self.comm_dtype = opts["comm_dtype"]
        self.find_unused = opts["find_unused_parameters"]
        self.unit_of = {id(p): u for u in units for g in u.groups for p in g.params}
        self.trainable = model._trainable  # ShardedOptimizer's numbering
        self.index = {id(p): i for i, p in enumerate(self.trainable)}
        # the forward order of the last forward with grad (the prefetch order); registration order first
        self.forward_order: list[Unit] = units[1:]
        self.seen: list[Unit] = []  # the units this step's forward ran, in order
        # a running hash of the units gathered since the last synced backward: Note [Same units on every rank]
        self.trace = 0
        self.sync = True  # whether the coming backward reduces (False inside no_sync)
        self.in_backward = False
        self.reduce_order: list[Unit] = []
        self.backward_order: list[Unit] = []
        self.next_reduce = 0
        # per unit reduced and not yet added: [(group, work, sent, received)]; at most kInFlight units
        self.pending: list[list[tuple[Any, Any, torch.Tensor, torch.Tensor]]] = []
        self.device = model.device
        self.used: set[int] = set()  # trainable parameters with a gradient on this rank since the last reduction
        self.without_grad: set[int] = set(range(len(self.trainable)))  # no rank gave one since zero_grad()
        self.handles = []
        root_module = model.module
        self.handles.append(root_module.register_forward_pre_hook(self._root_pre_forward, with_kwargs=True))
        self.handles.append(root_module.register_forward_hook(self._root_post_forward))
        for u in units[1:]:
            self.handles.append(u.module.register_forward_pre_hook(self._pre_forward(u), with_kwargs=True))
            self.handles.append(u.module.register_forward_hook(self._post_forward(u)))
        for p in self.trainable:
            self.handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        install_state_hooks(model.module, units, gather_comm)

    # --- forward --------------------------------------------------------------------------

    def start_forward(self, synced: bool) -> None:
        """The wrapper's forward: whether the next backward reduces (a forward without grad has no backward:
        it leaves the decision to the forward before it)."""
        if torch.is_grad_enabled():
            self.sync = synced

    def _root_pre_forward(self, module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
        if self.in_backward:
            if _inside_backward():
                return None  # a recompute
            self._abandon_backward()  # the last backward raised: autograd ran no callback
        for u in self.units[1:]:  # a unit left gathered by a forward without backward
            if u.gathered and not self.reshard_after_forward:
                u.free()
        self.seen = []
        self._gather(self.root)
        self._prefetch(self.forward_order, -1)
        self.root.wait()
        return self._cast_inputs(args, kwargs)

    def _root_post_forward(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self.in_backward:
            return
        if self.seen and torch.is_grad_enabled():
            self.forward_order = list(dict.fromkeys(self.seen))
        for u in self.units[1:]:  # prefetched, but this forward did not reach it
            if u.gathered and (self.reshard_after_forward or not torch.is_grad_enabled()):
                u.free()
        needing = tensors_needing_grad(out) if torch.is_grad_enabled() else []
        if needing:  # kept to the end of the backward; gathered again if a forward without grad freed it meanwhile
            register_multi_grad_hook(needing, lambda grad: self._pre_backward(self.root), mode="any")
        else:
            self.root.free()  # no backward comes from this forward: evaluation, generation

    def _pre_forward(self, unit: Unit) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
            self._gather(unit)
            if not self.in_backward:  # a recompute (checkpoint_activations) inside backward prefetches nothing
                self.seen.append(unit)
                order = self.forward_order
                self._prefetch(order, order.index(unit) if unit in order else len(order))
            unit.wait()
            if torch.is_grad_enabled() and not self.in_backward:  # Note [Fully sharded units]: post-backward
                inputs = tensors_needing_grad((args, kwargs))
                if inputs:
                    register_multi_grad_hook(inputs, lambda grads: self._post_backward(unit), mode="all")
            return self._cast_inputs(args, kwargs)

        return hook

    def _cast_inputs(self, args: Any, kwargs: Any) -> Any:
        if self.param_dtype is None:
            return None
        return tree_map(self._cast, (args, kwargs))  # as FSDP2's cast_forward_inputs

    def _cast(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != self.param_dtype:
            return x.to(self.param_dtype)
        return x

    def _post_forward(self, unit: Unit) -> Any:
        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            if self.in_backward:
                return  # a recompute: its backward follows at once
            needing = tensors_needing_grad(out) if torch.is_grad_enabled() else []
            if needing:
                register_multi_grad_hook(needing, lambda grads: self._pre_backward(unit), mode="any")
            if self.reshard_after_forward or not needing:
                unit.free()

        return hook

    def _prefetch(self, order: list[Unit], at: int) -> None:
        for u in order[at + 1 : at + 1 + self.prefetch]:
            self._gather(u)

    def _gather(self, unit: Unit) -> None:
        if not unit.gathered:  # neither gathered nor in flight
            self.trace = hash((self.trace, unit.index))  # ints and tuples hash alike in every process
            unit.gather(self.gather_comm)

    # --- backward -------------------------------------------------------------------------

    def _begin_backward(self) -> None:
        if self.in_backward:
            return
        self.in_backward = True
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        ran = list(reversed(list(dict.fromkeys(self.seen))))
        rest = [u for u in reversed(self.units[1:]) if u not in ran]
        self.reduce_order = ran + rest + [self.root]
        self.backward_order = ran + rest  # the prefetch order in backward: the root is gathered throughout
        self.next_reduce = 0
        for u in self.units:
            u.got, u.reduced, u.done = set(), False, False

    def _pre_backward(self, unit: Unit) -> None:
        self._begin_backward()
        self._gather(unit)
        if unit is not self.root:
            self._prefetch(self.backward_order, self.backward_order.index(unit))
        unit.wait()
        if not unit.reduced:
            for g in unit.groups:
                g.lend_grads()

    def _on_grad(self, p: torch.Tensor) -> None:
        self._begin_backward()
        unit = self.unit_of[id(p)]
        if unit.reduced:
            raise _C.ConfigError(
                f"zero=3: parameter {self._name(p)} got a second gradient in one backward, after unit "
                f"{unit.label} was reduced (reentrant activation checkpointing, or a parameter of one unit used by "
                "another's forward). Fix: use checkpoint_activations (non-reentrant), or put the module that holds "
                "it in the unit that uses it (units=)."
            )
        unit.got.add(id(p))
        self.used.add(self.index[id(p)])
        if unit.ready:
            self._reduce_ready()

    def _post_backward(self, unit: Unit) -> None:
        """Every input of the unit has its gradient: the unit's backward is over, whatever its parameters
        got. Reduced (zeros where a parameter got none) and wholly freed."""
        if not self.in_backward:
            return  # torch.autograd.grad of the inputs alone: no parameter backward
        unit.done = True
        if unit.reduced:
            unit.free()
        else:
            self._reduce_ready()

    def _reduce_ready(self, final: bool = False) -> None:
        while self.next_reduce < len(self.reduce_order):
            unit = self.reduce_order[self.next_reduce]
            if not (final or unit.ready):
                return
            self._reduce(unit)
            self.next_reduce += 1

    def _reduce(self, unit: Unit) -> None:
        unit.reduced = True
        issued = []
        for g in unit.groups:
            if not g.requires_grad:
                continue
            if not self.sync:
                g.keep_grads()
                continue
            dtype = self.comm_dtype or g.compute_dtype
            sent = g.take_grads(dtype)
            received = torch.empty(g.shard_numel, dtype=dtype, device=g.device)
            work = self.reduce_comm.reduce_scatter(received, sent, "avg")
            issued.append((g, work, sent, received))
        if issued:
            self.pending.append(issued)
            self._add_reduced(keep=kInFlight)
        if unit is not self.root:
            # a frozen group may still be read by the unit's backward until its post-backward (done)
            unit.free(frozen=unit.done)

    def _add_reduced(self, keep: int) -> None:
        """Waits for the reductions of all but the last `keep` units and adds them into the shards, so that
        no more than `keep` units' whole gradients are held (the rest of the backward runs meanwhile)."""
        while len(self.pending) > keep:
            for g, work, _, received in self.pending.pop(0):
                if g.device.type == "cuda":
                    work.wait_on_stream()  # Note [Waiting on the stream]: the add is ordered after it
                else:
                    work.wait()
                g.add_reduced(received)

    def _end_backward(self) -> None:
        try:
            self._reduce_ready(final=True)
            self._add_reduced(keep=0)
            if self.sync:
                self._settle()
        finally:
            self.pending = []
            for u in self.units:
                u.free()
            self.in_backward = False

    def _abandon_backward(self) -> None:
        """A backward that raised (out of memory, an error from a hook) ends without the callback: its
        reductions in flight are waited for and dropped, every unit freed, so that the next step starts
        clean. The gradient shards keep what earlier backward passes added; this one's partial sums are
        not added."""
        for issued in self.pending:
            for _, work, _, _ in issued:
                work.wait()
        self.pending = []
        for u in self.units:
            u.free()
            for g in u.groups:
                if g.requires_grad:
                    g.lent = None
                    for p in g.params:
                        p.grad = None
        self.in_backward = False
        self.used = set()

    def _settle(self) -> None:
        """The end of a synced backward: one small all-reduce checks that every rank gathered the same
        units (Note [Same units on every rank]) and sums the used map. Without find_unused_parameters a
        parameter some rank gave no gradient is an error on every rank, inside backward, before a step."""
        trace, self.trace = self.trace, 0
        n = len(self.trainable)
        summed = torch.zeros(3 + n, dtype=torch.int64, device=self.device)  # h, -h, any rank missing one, used
        summed[0], summed[1] = trace, -trace
        summed[3:][list(self.used)] = 1
        missing = [i for i in range(n) if i not in self.used]
        summed[2] = int(bool(missing) and not self.find_unused)
        self.reduce_comm.all_reduce(summed, "max").wait()
        used = summed[3:].nonzero().flatten().tolist()
        self.used = set()
        if int(summed[0]) != -int(summed[1]):
            raise _C.ConfigError(
                f"zero=3 on rank {self.reduce_comm.rank}: the ranks did not gather the same units in this step (this "
                f"rank ran {', '.join(u.label for u in dict.fromkeys(self.seen)) or 'none'} in its forward), so a "
                "rank's gather met another unit's on another rank: this step's gradients are not used. Every rank must "
                "run the same units in the same order. Fix: keep rank-dependent control flow inside a unit (with "
                "find_unused_parameters=True for the parameters it leaves without a gradient), or put the module that "
                "some ranks skip in the root unit (units=)."
            )
        self.without_grad -= set(used)
        if int(summed[2]):
            names = ", ".join(self._name(self.trainable[i]) for i in missing[:10]) or "none here (another rank's)"
            raise _C.ConfigError(
                f"zero=3 on rank {self.reduce_comm.rank}: parameters got no gradient in this backward on some rank "
                f"(on this rank {len(missing)}: {names}). Their gradients were reduced as zeros, which the optimizer "
                "would step (weight decay, momentum) where torch leaves them alone. Fix: dtcore.wrap(..., zero=3, "
                "find_unused_parameters=True), or make every parameter take part in the loss."
            )

    def arm_sync(self) -> None:
        self.sync = True

    def zero_grad(self, set_to_none: bool) -> None:
        for u in self.units:
            for g in u.groups:
                if g.grad is not None:
                    if set_to_none:
                        g.has_grad = False
                    else:
                        g.grad.zero_()
                        g.has_grad = True
                g.accumulated = None
        if set_to_none:
            self.without_grad = set(range(len(self.trainable)))
        else:
            self.without_grad = set()

    def params_without_grad(self) -> list[int]:
        return sorted(self.without_grad)

    def _name(self, p: torch.Tensor) -> str:
        for u in self.units:
            for g in u.groups:
                for n, q in zip(g.names, g.params, strict=True):
                    if q is p:
                        return f"'{n}'"
        return "?"


def tensors_needing_grad(out: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(out) if t.requires_grad]


def _inside_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (FSDP2 asks it the same way)."""
    return torch._C._current_graph_task_id() != -1
