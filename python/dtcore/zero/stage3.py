"""`dtcore.wrap(model, zero=3)`: every parameter sharded; a unit is gathered while it runs.

Note [Fully sharded units]
A unit (units.py) is gathered before its forward and freed after it; gathered again before its
backward and freed once its gradients are reduce-scattered into each rank's shard (flat.py, Note
[Fully sharded storage]). The root unit (what no other unit holds: embeddings, the output head,
final norms, and any parameter two units share) is gathered when the model's forward starts and
kept to the end of the backward.

Forward: a unit's pre-hook waits for its gather (issued earlier by a prefetch, or now) and issues
the gathers of the next `prefetch` units, in the order the previous forward used them (the first:
registration order). Its post-hook frees it (reshard_after_forward=True) and hooks its outputs so
that the first gradient to reach them gathers it again and prefetches the units before it.

Backward: a unit is ready to reduce when every trainable parameter of it has its gradient (each
parameter's post-accumulate-grad hook counts it) or when its backward is over (a hook on its forward
inputs fires once all of them have their gradient, as FSDP2's post-backward: then a parameter
without a gradient gets zeros). Its gradients are flattened and reduce-scattered (averaged, in
comm_dtype if set) and its parameters freed; its frozen parameters only once its backward is over,
as the backward may still read them. Units are reduced in one order on every rank, the reverse of
this step's forward (units the forward did not reach after, the root last): a unit ready early
waits for those before it, as torch DDP launches its buckets. A unit's gradients accumulate in one
flat buffer lent to its parameters as their .grad views when its backward starts (flat.py's
lend_grads), so they exist once and need no copy to be sent. At most kInFlight (1) unit's
reduction is in flight: issuing the next waits for it and adds it into the shards, so that a rank
holds about two units' whole gradients (the one in flight, the one being filled) beyond its shards
(two in flight: 8 % more peak memory, no step time gained that runs on 2 CPU cores could tell).
At the end of the backward (a callback queued with autograd's engine) every unit not yet reduced
is, so that every rank issues the same collectives; the reductions are added into the gradient
shards, and every unit is freed. A backward that raised runs no callback: the next forward finds it
unfinished and drops its state.

Gathers go over a communicator of their own (comm/subgroup.py's job_communicator), reductions over
the job's: the points where a rank reduces depend on which of its parameters got gradients (a rank
may use fewer with find_unused_parameters), the points where it gathers do not, so the two streams
never need to agree on an order between them. On a GPU each runs on its communicator's stream, so
that a prefetch overlaps compute.

Parameters without a gradient: the end of each synced backward sums a map of the parameters each
rank used (Note [Same units on every rank], one small all-reduce). With find_unused_parameters=True
one no rank used since zero_grad() has no gradient (ShardedOptimizer skips it, as torch's optimizers
skip a .grad of None). Without it, a parameter some rank gave no gradient raises ConfigError inside
every rank's backward, before any step can use the zeros it was reduced with.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context
from ..comm.collectives import broadcast_tensors
from ..comm.subgroup import job_communicator
from ..reducer import stacking
from ..reducer.model import _DEFAULTS, DistributedModel
from .flat import FlatGroup
from .materialize import materialize, registrations
from .schedule import Schedule
from .unit import Unit
from .units import ROOT, assign, find_units

_GATHER_COMMUNICATOR = "zero3.gather"  # the name every rank gives the gathers' communicator

# Note [zero=3 and torch.compile]
# The hooks gather a unit's parameters into storage that is freed again between uses, and swap the
# parameters' data: AOTAutograd's graphs over the whole model (torch.compile(model), any backend
# but "eager") then fail in backward with a version-counter error. So the wrapper's forward is never
# traced (torch.compiler.disable): torch.compile(model) runs it eagerly and right, without a
# speed-up. model.compile() compiles what can be: each unit's forward, between the hooks, which stay
# eager; the gradients are those of the eager model.


class FullyShardedModel(DistributedModel):
    """`module` with every parameter sharded over the ranks (ZeRO-3); see dtcore.wrap.

    units: which module subtrees are gathered together (units.py); None: each repeated layer.
    prefetch: how many units ahead are gathered while one computes (0: none).
    reshard_after_forward: free a unit after its forward (True) or keep it for its backward.
    param_dtype: the dtype parameters are gathered and computed in (torch.bfloat16 for mixed
    precision; the shards, and the optimizer's step, stay in the parameters' own dtype).
    comm_dtype: the dtype gradients are reduced in (None: the gathered parameters' dtype).
    init: for a model built on the meta device, a function called on each module that holds
    parameters or buffers once they exist on this rank's device (None: module.reset_parameters()).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        units: Any = None,
        prefetch: int = 1,
        reshard_after_forward: bool = True,
        param_dtype: torch.dtype | None = None,
        comm_dtype: torch.dtype | None = _DEFAULTS.comm_dtype,
        find_unused_parameters: bool = _DEFAULTS.find_unused_parameters,
        broadcast_buffers: bool = True,
        init: Any = None,
    ) -> None:
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise _C.ConfigError(f"zero=3 with prefetch={prefetch!r}: expected an integer >= 0. Fix: prefetch=1.")
        for name, dtype in (("param_dtype", param_dtype), ("comm_dtype", comm_dtype)):
            if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                raise _C.ConfigError(
                    f"zero=3 with {name}={dtype!r}: expected a floating dtype or None. Fix: torch.bfloat16, "
                    "torch.float16, or None."
                )
        if not isinstance(reshard_after_forward, bool):
            raise _C.ConfigError(
                f"zero=3 with reshard_after_forward={reshard_after_forward!r}: expected True or False. Fix: True frees "
                "a unit after its forward, False keeps it gathered for its backward."
            )
        if init is not None and not callable(init):
            raise _C.ConfigError(f"zero=3 with init={init!r}: expected a function of a module. Fix: pass one, or None.")
        options = dict(
            bucket_mb=_DEFAULTS.bucket_mb,
            first_bucket_mb=_DEFAULTS.first_bucket_mb,
            find_unused_parameters=find_unused_parameters,
            comm_dtype=comm_dtype,
            zero=3,
            units=units,
            prefetch=prefetch,
            reshard_after_forward=reshard_after_forward,
            param_dtype=param_dtype,
            init=init,
        )
        stacking.check_wrappable(module)
        self._build(module, options, forward_sync_buffers=broadcast_buffers, init_sync_buffers=True)

    # --- building ---------------------------------------------------------------------------

    def _broadcast_initial(self, init_sync_buffers: bool) -> None:
        """Buffers now; parameters unit by unit in _attach, so that no rank holds two copies of the model."""
        buffers = [b for _, b in self._named_buffers() if not b.is_meta] if init_sync_buffers else []
        if self._comm.size > 1 and buffers:
            broadcast_tensors(buffers, 0, self._comm)

    def _attach(self) -> None:
        opts = self._options
        ctx = get_context()
        self._gather_comm = job_communicator(_GATHER_COMMUNICATOR)
        found = find_units(self.module, opts["units"])
        names = assign(self.module, found, self.parameters_to_ignore)
        modules = [None] + [m for _, m in found]
        labels = [ROOT] + [n for n, _ in found]
        self._units: list[Unit] = []
        holders = registrations(self.module)  # taken while the meta parameters are still the model's
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        any_meta = any(t.is_meta for t in tensors)
        for u, (label, module, unit_names) in enumerate(zip(labels, modules, names, strict=True)):
            owned = _owned_modules(self.module, module, [m for m in modules[1:] if m is not module])
            materialize(owned, ctx.device, opts["init"], label or type(self.module).__name__, holders)
            params = dict(self.module.named_parameters())
            named = [(n, params[n]) for n, _ in unit_names]
            # rank 0's values, and the buffers materialised here (a meta model's), which the wrap's broadcast
            # of buffers could not reach yet
            buffers = [b for m in owned for b in m.buffers(recurse=False)] if any_meta else []
            if self._comm.size > 1 and (named or buffers):
                broadcast_tensors([p.detach() for _, p in named] + buffers, 0, self._comm)
            groups = []
            for key in dict.fromkeys((p.requires_grad, p.dtype) for _, p in named):
                members = [(n, p) for n, p in named if (p.requires_grad, p.dtype) == key]
                kind = (
                    f"{label or '<root>'} ({'trainable' if key[0] else 'frozen'} {str(key[1]).removeprefix('torch.')})"
                )
                group = FlatGroup(kind, members, self._comm.rank, self._comm.size, ctx.device, opts["param_dtype"])
                group.adopt()
                groups.append(group)
            self._units.append(Unit(u, label, module, groups))
        # id(parameter) -> (its FlatGroup, its index there)
        self._layout = {id(p): (g, i) for u in self._units for g in u.groups for i, p in enumerate(g.params)}
        named = self._named_parameters()  # the materialised parameters, sharded
        stacking.take_over(self, [p for _, p in named])
        self._trainable = [p for _, p in named if p.requires_grad]
        stacking.claim(self, [p for _, p in named])
        self._schedule = Schedule(self, self._units, self._gather_comm, self._comm)
        self._live_reducer = None

    def __getstate__(self) -> dict[str, Any]:
        raise _C.ConfigError(
            "a zero=3 model cannot be copied or pickled: each rank holds only its shard of the parameters. Fix: copy "
            "its state with model.state_dict() (full tensors) or dtcore.save_checkpoint, and wrap a new model."
        )

    @property
    def _reducer(self) -> Any:
        raise _C.ConfigError(
            f"{type(self).__name__} (zero=3) has no bucket reducer: communication hooks, join() and the reducer's "
            "logging data are zero=0/1/2 features. Fix: use zero=2, or leave them out with zero=3."
        )

    def _retire(self, what: str, fix: str) -> None:  # a zero=3 model is never taken over: stacking refuses it
        self._retired = (what, fix)

    def _start_logging(self) -> None:
        self._ddp_log = None  # torch DDP's logging data describes buckets, which zero=3 does not have

    def _get_ddp_logging_data(self) -> dict[str, int | str]:
        raise _C.ConfigError(
            "_get_ddp_logging_data describes torch DDP's buckets; a zero=3 model has none. Fix: read model.units "
            "for what each unit gathers, or use zero=2 for the reducer's logging data."
        )

    def _set_static_graph(self) -> None:
        raise _C.ConfigError(
            "static_graph / _set_static_graph() is the bucket reducer's; a zero=3 model reduces each unit when its "
            "backward ends, whatever the graph. Fix: leave it out (find_unused_parameters=True for parameters "
            "without a gradient in some steps)."
        )

    # --- training -------------------------------------------------------------------------

    @torch._disable_dynamo  # See Note [zero=3 and torch.compile]; lazy, as torch.compiler.disable is not
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        stacking.refuse_outer_ddp(self)
        synced = torch.is_grad_enabled() and self.require_backward_grad_sync
        self._schedule.start_forward(synced)
        # As torch DDP: buffers are broadcast before a forward that follows a synced one (the flag is
        # the previous forward's until this one ends).
        sync_buffers = self.require_forward_param_sync and self.forward_sync_buffers
        if sync_buffers:
            self._sync_forward_buffers(0, post_forward=False)
        out = self.module(*args, **kwargs)
        if sync_buffers:
            self._sync_forward_buffers(0, post_forward=True)
        self.require_forward_param_sync = synced
        return out

    @property
    def zero(self) -> int:
        return 3

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """torch.compile for a zero=3 model: each unit's forward is compiled (torch.compile's arguments);
        the gathers and frees around it, and the root unit's own modules, stay eager. See Note [zero=3 and
        torch.compile]."""
        for unit in self._units[1:]:
            unit.module.forward = torch.compile(unit.module.forward, *args, **kwargs)

    @property
    def units(self) -> list[Unit]:
        """The units, the root's first: what each gathers (read-only; See Note [Fully sharded units])."""
        return list(self._units)

    def group_of(self, p: torch.Tensor) -> tuple[FlatGroup, int] | None:
        """(the FlatGroup holding parameter `p`, its index there), or None for a parameter in no unit."""
        return self._layout.get(id(p))

    def shape_of(self, p: torch.Tensor) -> torch.Size:
        """A parameter's whole shape (its own data is empty between uses: Note [Fully sharded storage])."""
        found = self._layout.get(id(p))
        return p.shape if found is None else torch.Size(found[0].shapes[found[1]])

    def dtype_of(self, p: torch.Tensor) -> torch.dtype:
        """A parameter's own dtype: its shard's (gathered, it may be param_dtype)."""
        found = self._layout.get(id(p))
        return p.dtype if found is None else found[0].dtype

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The gradient shards: none (set_to_none, torch's default: a parameter then counts as having no
        gradient until one comes) or zeros."""
        self._schedule.zero_grad(set_to_none)

    def grad_shards(self) -> list[torch.Tensor]:
        """This rank's gradient shard of each trainable group that has one (for clipping)."""
        return [g.grad for u in self._units for g in u.groups if g.requires_grad and g.has_grad]

    def params_without_grad(self) -> list[int]:
        """Indices in the trainable parameters of those without a gradient since zero_grad()."""
        return self._schedule.params_without_grad()

    def _arm_sync_backward(self, outputs: Any) -> None:
        self._schedule.arm_sync()

    @property
    def bucket_params(self) -> list[list[int]]:
        index = {id(p): i for i, p in enumerate(self._trainable)}
        return [[index[id(p)] for p in g.params] for u in self._units for g in u.groups if g.requires_grad]


def _owned_modules(
    root: torch.nn.Module, unit: torch.nn.Module | None, others: list[torch.nn.Module]
) -> list[torch.nn.Module]:
    """The modules a unit materialises: its subtree (the root unit: the model less the other units)."""
    if unit is not None:
        return list(unit.modules())
    inside = {id(m) for o in others for m in o.modules()}
    return [m for m in root.modules() if id(m) not in inside]
