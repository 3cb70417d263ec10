"""`dtcore.ShardedOptimizer`: any elementwise torch optimizer, its state kept for this rank's shard only.

Wrap the model with `dtcore.wrap(model, zero=1)` (optimizer state sharded) or `zero=2` (gradients
sharded too), then `opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=..., weight_decay=...)`.
Each rank owns an equal shard of every gradient bucket (Note [Shard layout], in
csrc/dtcore/reducer/shard_plan.h). The inner torch optimizer is built over this rank's *pieces*
(the parts of parameters in its shards), so its state (AdamW's two moments: 8 of the 16 bytes per
parameter in fp32) exists for 1/N of the model; after its step the updated shards are all-gathered
into every rank's parameters.

A step is one step of the inner optimizer over all of this rank's pieces, then every bucket's
all-gather, all issued before the first is waited for (zero=3 gathers nothing after a step: the
next forward gathers each unit).

At the first step the parameters move into one flat padded buffer per bucket, in the bucket's
layout (Note [Flat parameters], beside [Shard layout]): each Parameter object stays, its `.data`
becomes a view of its place. This rank's shard of a bucket's buffer is then what its pieces step
and what the all-gather sends, in place, one collective per bucket.

A piece of an fp32 (or fp64) parameter is a view of the parameter itself: the optimizer updates
it in place, no copy. A piece of a parameter of less precision (bf16, fp16) gets an fp32 master
copy (`master_dtype`), stepped in fp32 and cast into the parameter before the all-gather
(state.stepped_dtype says which).

Sharding elementwise is exact only for optimizers whose update of an element depends on that
element alone (SGD, Adam, AdamW, ...). Others (Adafactor's factored moments, Muon's
orthogonalisation, LBFGS) would be silently wrong, so they are refused unless `elementwise=True`
says the class is elementwise.

As with torch DDP and a torch optimizer, a parameter no rank gave a gradient since the last
`zero_grad()` (its .grad would be None: find_unused_parameters, Note [Unused parameters keep None]
in csrc/dtcore/reducer/reducer.h) is skipped: no momentum, no weight decay, its state untouched.
zero_grad(set_to_none=False) keeps zeros instead, which are stepped, as torch's would be. So that
every rank knows each parameter's scalar state (AdamW's step, which then differs by parameter),
each rank's inner optimizer holds, for a parameter of which it has no piece, an empty *proxy*
stepped and skipped with it.

`param_groups` are the model's parameters with their hyperparameters, as with any torch
optimizer: LR schedulers and hand edits work; they reach the inner optimizer at each step.
`state_dict()` gathers the whole state in torch's own format (as a torch optimizer over the whole
model would hold it), and `load_state_dict()` takes that format from any world size or from a
plain torch optimizer: the shards are cut anew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context
from ..reducer.model import DistributedModel
from . import flat
from .state import apply_pending, gather_state, scatter_state, stepped_dtype

# Optimizers whose update of an element reads that element's gradient and state only.
ELEMENTWISE = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.Adamax,
    torch.optim.RMSprop,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.ASGD,
    torch.optim.Rprop,
)


class _Piece:
    """One parameter's part in this rank's shard of one bucket, and what the optimizer steps."""

    __slots__ = ("param", "group", "bucket", "param_offset", "shard_offset", "numel", "param_view", "grad", "local")

    def __init__(
        self,
        param: torch.Tensor,
        group: int,
        bucket: int,
        cut: Any,
        values: torch.Tensor,
        grad: torch.Tensor,
        master: torch.dtype | None,
    ) -> None:
        self.param, self.group, self.bucket = param, group, bucket
        self.param_offset, self.shard_offset, self.numel = cut.param_offset, cut.shard_offset, cut.numel
        self.param_view = values  # (numel,): the parameter's values in this rank's shard, stepped in place
        self.grad = grad  # (numel,): the reducer's gradient shard, read in place
        stepped = stepped_dtype(values.dtype, master)  # the stepped values' (zero=3: the shard's, not param_dtype)
        if stepped != values.dtype:
            self.local = self.param_view.to(stepped, copy=True)  # stepped in `master`, cast back
            self.local.grad = grad.to(stepped, copy=True)  # refreshed before each step
        else:
            self.local = self.param_view  # stepped in place: no copy
            self.local.grad = grad

    @property
    def has_master(self) -> bool:
        return self.local is not self.param_view


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer_class` stepping this rank's shard of `model` (dtcore.wrap(model, zero=1|2)).

    params: the model's parameters (default) or torch-style param groups over them.
    master_dtype: pieces of parameters of less precision (bf16, fp16) are stepped in a copy of this dtype, cast
    back after each step (None: never); fp32 and fp64 parameters are stepped as they are.
    elementwise: True asserts that `optimizer_class` updates each element on its own; needed for
    classes dtcore does not know.
    Remaining keyword arguments go to `optimizer_class`.
    """

    _dtcore_sharded = True  # steps a zero=2 model rightly: see reducer/zero_guard.py

    def __init__(
        self,
        model: DistributedModel,
        optimizer_class: type[torch.optim.Optimizer],
        params: Iterable[Any] | None = None,
        *,
        master_dtype: torch.dtype | None = torch.float32,
        elementwise: bool | None = None,
        **defaults: Any,
    ) -> None:
        if not isinstance(model, DistributedModel):
            raise _C.ConfigError(
                f"ShardedOptimizer needs the wrapped model, got {type(model).__name__}. Fix: "
                "model = dtcore.wrap(model, zero=1) (or zero=2), then ShardedOptimizer(model, torch.optim.AdamW, ...)."
            )
        if model.zero == 0:
            raise _C.ConfigError(
                "ShardedOptimizer got a model wrapped with zero=0, whose buckets are not sharded. Fix: "
                "dtcore.wrap(model, zero=1) (optimizer state sharded), zero=2 (gradients sharded too) or zero=3 "
                "(parameters sharded too)."
            )
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise _C.ConfigError(
                f"ShardedOptimizer(optimizer_class={optimizer_class!r}) is not a torch optimizer class. "
                "Fix: pass the class itself, e.g. torch.optim.AdamW, and its arguments as keywords."
            )
        if elementwise is None and not issubclass(optimizer_class, ELEMENTWISE):
            known = ", ".join(c.__name__ for c in ELEMENTWISE)
            raise _C.ConfigError(
                f"ShardedOptimizer cannot tell whether {optimizer_class.__name__} updates each element on its own; "
                "sharding an optimizer that does not (Adafactor, Muon, LBFGS, ...) gives wrong updates. Fix: use one "
                f"of {known}, or pass elementwise=True if {optimizer_class.__name__} is elementwise."
            )
        if elementwise is False:
            raise _C.ConfigError(
                f"ShardedOptimizer(elementwise=False): {optimizer_class.__name__} cannot be sharded by element. "
                "Fix: use it unsharded with dtcore.wrap(model) (zero=0) and a plain torch optimizer."
            )
        self._model = model
        self._optimizer_class = optimizer_class
        self._master_dtype = master_dtype
        self._built_for = -1  # the reducer plan version the pieces were cut from
        self._pieces: list[_Piece] = []
        self._masters: list[_Piece] = []  # the pieces stepped in a master copy
        # id(parameter) -> what the inner optimizer steps for it here: its pieces' locals, or one empty proxy
        self._locals_of: dict[int, list[torch.Tensor]] = {}
        self._proxies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parameter, its proxy)
        self._buckets: list[_FlatBucket] = []  # the parameters' storage: Note [Flat parameters]
        self._inner: torch.optim.Optimizer | None = None
        self._pending_state: dict[Any, Any] | None = None  # loaded before the pieces existed
        groups = list(model.parameters() if params is None else params)
        # A throwaway instance checks the arguments now and fills in the class's defaults.
        super().__init__(groups, optimizer_class([torch.zeros(0)], **defaults).defaults)

    # --- read-only views (checkpoints use these) ---------------------------------------------

    @property
    def model(self) -> DistributedModel:
        """The wrapped model whose shards this optimizer steps."""
        return self._model

    @property
    def optimizer_class(self) -> type[torch.optim.Optimizer]:
        """The torch optimizer class stepping each shard."""
        return self._optimizer_class

    @property
    def numbered_params(self) -> list[torch.Tensor]:
        """The parameters in torch's state_dict numbering (group after group)."""
        return [p for group in self.param_groups for p in group["params"]]

    # --- torch.optim.Optimizer -------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self._inner is not None:
            raise _C.ConfigError(
                "ShardedOptimizer.add_param_group after the first step is not supported: the shards are cut. "
                "Fix: pass every group when building the ShardedOptimizer."
            )
        super().add_param_group(param_group)
        try:
            self._check_groups()  # every group, the constructor's included, comes through here
        except _C.ConfigError:
            self.param_groups.pop()  # refused: the optimizer stays as it was
            raise

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Steps this rank's shard in one step of the inner optimizer, then all-gathers the updated
        parameters into every rank, one collective per bucket."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._ensure_built():
            return loss  # no backward has reduced gradients yet: nothing to step, as torch's would
        assert self._inner is not None
        for inner, group in zip(self._inner.param_groups, self.param_groups, strict=True):
            inner.update({k: v for k, v in group.items() if k != "params"})  # schedulers edit these
        params = self._model._trainable
        without_grad = (params[i] for i in self._without_grad())  # their .grad would be None
        held = {id(t): (t, t.grad) for p in without_grad for t in self._locals_of.get(id(p), ())}
        for piece in self._masters:
            piece.local.grad.copy_(piece.grad)
        for t, _ in held.values():
            t.grad = None  # skipped by the inner optimizer, as torch's skips a None gradient
        try:
            self._inner.step()
        finally:
            for t, grad in held.values():
                t.grad = grad
        for piece in self._masters:
            piece.param_view.copy_(piece.local)
        self._gather_all()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the reduced gradients in place (their buffers and shards are kept). set_to_none=True, as
        torch's, makes a parameter count as holding no gradient until one comes: skipped if none does."""
        self._model.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The whole state in torch's format, gathered from every rank (a collective: call it on all)."""
        return gather_state(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads torch's format (from a ShardedOptimizer at any world size, or a plain torch optimizer)."""
        scatter_state(self, state_dict)

    # --- the shards ------------------------------------------------------------------------

    def _check_groups(self) -> None:
        # Frozen parameters are accepted and never stepped, as a torch optimizer skips a parameter
        # whose .grad is None: fine-tuning passes model.parameters() with a frozen backbone.
        of_model = {id(p) for p in self._model.module.parameters()}
        ignored = {id(p): n for n, p in self._model.module.named_parameters() if n in self._model.parameters_to_ignore}
        seen: set[int] = set()
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) in ignored:
                    raise _C.ConfigError(
                        f"ShardedOptimizer got parameter '{ignored[id(p)]}', which the wrapper ignores "
                        "(_set_params_and_buffers_to_ignore_for_model): it is in no bucket, so no shard of it exists "
                        "to step, and each rank's gradient of it is its own. Fix: leave it out of the ShardedOptimizer "
                        "and step it with a torch optimizer of its own on every rank."
                    )
                if id(p) not in of_model:
                    raise _C.ConfigError(
                        f"ShardedOptimizer got a parameter of shape {tuple(p.shape)} that is not a parameter of the "
                        "wrapped model. Fix: pass model.parameters() (or groups over them) of the model given."
                    )
                if id(p) in seen:
                    raise _C.ConfigError(
                        f"ShardedOptimizer got a parameter of shape {tuple(p.shape)} in two param groups. Fix: list "
                        "each parameter once."
                    )
                seen.add(id(p))
        self._check_not_unfrozen(p for group in self.param_groups for p in group["params"])

    def _check_not_unfrozen(self, params: Iterable[torch.Tensor]) -> None:
        """A parameter frozen when the model was wrapped has no bucket: unfrozen since, it would be neither
        averaged nor stepped. Refused, naming it."""
        reduced = {id(p) for p in self._model._trainable}
        names = {id(p): n for n, p in self._model.module.named_parameters()}
        for p in params:
            if p.requires_grad and id(p) not in reduced and id(p) in names:
                raise _C.ConfigError(
                    f"ShardedOptimizer got parameter '{names[id(p)]}', which requires grad now but was frozen when the "
                    "model was wrapped: it has no bucket, so it would be neither averaged nor stepped. Fix: unfreeze "
                    "it before dtcore.wrap (wrap the module again after changing what is frozen)."
                )

    def _without_grad(self) -> list[int]:
        model = self._model
        return model.params_without_grad() if model.zero == 3 else model._reducer.params_without_grad()

    def _ensure_built(self) -> bool:
        """Cuts the pieces on the reducer's final plan (Note [Shard layout]); False before it is final. A
        zero=3 model's layout is final at wrap (its units)."""
        if self._model.zero == 3:
            if self._inner is None:
                self._cut_units()
                apply_pending(self)
            return True
        reducer = self._model._reducer
        if not reducer.plan_final:
            return False
        if self._built_for == reducer.plan_version:
            return True
        if self._inner is not None:
            raise _C.ConfigError(  # the plan changes only before the first reduction: a dtcore bug if seen
                "the model's buckets changed after ShardedOptimizer's first step; its state no longer matches. "
                "Fix: report this with the model's definition."
            )
        self._cut(reducer)
        self._built_for = reducer.plan_version
        apply_pending(self)
        return True

    def _cut(self, reducer: Any) -> None:
        params = self._model._trainable
        # The parameters move into their buckets' flat buffers first: the pieces are views of those.
        self._buckets = [
            _FlatBucket(s, layout, params) for s, layout in zip(reducer.shards(), reducer.bucket_layout(), strict=True)
        ]
        self._cut_pieces(list(zip(reducer.shards(), reducer.grad_shards(), strict=True)))

    def _cut_pieces(self, shards: list[tuple[Any, torch.Tensor]]) -> None:
        """The pieces of each bucket's (shard, gradient shard), views of its values (`mine`), and the inner
        optimizer over them."""
        params = self._model._trainable
        group_of = {id(p): g for g, group in enumerate(self.param_groups) for p in group["params"]}
        self._pieces = []
        for b, (shard, grad_shard) in enumerate(shards):
            for cut in shard.pieces:
                param = params[cut.param]
                group = group_of.get(id(param))
                if group is None:
                    continue  # reduced but not optimized: gathered as it is
                grad = grad_shard.narrow(0, cut.shard_offset, cut.numel)
                values = self._buckets[b].mine.narrow(0, cut.shard_offset, cut.numel)
                self._pieces.append(_Piece(param, group, b, cut, values, grad, self._master_dtype))
        self._locals_of, self._proxies = {}, []
        for piece in self._pieces:
            self._locals_of.setdefault(id(piece.param), []).append(piece.local)
        # Every optimized parameter has a local tensor here, a proxy if this rank holds no piece of
        # it, so that each rank's optimizer has every parameter's scalar state and the same state
        # keys (state_dict gathers them). A frozen parameter has none: never stepped, no state.
        reduced = {id(p) for p in params}
        self._check_not_unfrozen(p for group in self.param_groups for p in group["params"])
        inner_groups = []
        for group in self.param_groups:
            for param in group["params"]:
                if id(param) not in reduced:
                    self._locals_of[id(param)] = []
                elif id(param) not in self._locals_of:
                    dtype = stepped_dtype(self._model.dtype_of(param), self._master_dtype)
                    proxy = torch.zeros(0, dtype=dtype, device=param.device)
                    proxy.grad = torch.zeros_like(proxy)
                    self._locals_of[id(param)] = [proxy]
                    self._proxies.append((param, proxy))
            local = [t for p in group["params"] for t in self._locals_of[id(p)]]
            if not local:  # a group without parameters
                like = params[0]
                placeholder = torch.zeros(0, dtype=stepped_dtype(like.dtype, self._master_dtype), device=like.device)
                placeholder.grad = torch.zeros_like(placeholder)
                local = [placeholder]
            inner_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": local})
        self._inner = self._optimizer_class(inner_groups)
        self._masters = [piece for piece in self._pieces if piece.has_master]

    def _cut_units(self) -> None:
        """The pieces of a zero=3 model: its units' trainable groups are the buckets, their shards what the
        inner optimizer steps in place (Note [Fully sharded storage] in flat.py)."""
        index = {id(p): i for i, p in enumerate(self._model._trainable)}
        groups = [g for u in self._model.units for g in u.groups if g.requires_grad]
        self._buckets = [_UnitBucket(g, index) for g in groups]
        self._cut_pieces([(b.shard, b.grad) for b in self._buckets])

    def _gather_all(self) -> None:
        """Issues every bucket's gather (_gather), then waits for them all."""
        communicator = get_context().communicator
        works = []
        try:
            for b in range(len(self._buckets)):
                works.append(self._gather(communicator, b))
        finally:
            # On a GPU the wait orders the current stream after each gather and does not block
            # (Note [Waiting on the stream]).
            for work in works:
                if work is not None:  # zero=3 gathers nothing: the next forward does
                    work.wait_on_stream()

    def _gather(self, communicator: Any, b: int) -> Any:
        """This rank's updated shard of bucket `b` into every rank's parameters: one in-place all-gather.

        The parameters are views of their bucket's flat buffer (Note [Flat parameters]), so the
        gather's input is this rank's shard of that buffer and its output the buffer itself.
        """
        bucket = self._buckets[b]
        if bucket.flat is None:
            return None
        return communicator.all_gather(bucket.flat, bucket.mine, f"parameters {b + 1}/{len(self._buckets)}")


class _FlatBucket:
    """One bucket's parameters in one flat padded buffer, in the bucket's layout: Note [Flat parameters].

    Built on the reducer's final plan: each parameter's values are copied into its place and its
    `.data` becomes a view of that place (the Parameter object is kept). `mine` is this rank's
    shard of the buffer, what its pieces step and the all-gather sends.
    """

    def __init__(self, shard: Any, layout: list[tuple[int, int, int]], params: list[torch.Tensor]) -> None:
        self.shard = shard
        first = params[layout[0][0]]
        self.dtype, self.device = first.dtype, first.device
        self.flat = torch.zeros(shard.padded_numel, dtype=self.dtype, device=self.device)  # (N * S,), padding zero
        self.mine = self.flat.narrow(0, shard.begin, shard.shard_numel)  # (S,)
        # (flattened parameter, its offset in the bucket, numel, parameter), in layout order
        self.whole: list[tuple[torch.Tensor, int, int, torch.Tensor]] = []
        for i, offset, numel in layout:
            param = params[i]
            place = self.flat.narrow(0, offset, numel)  # (numel,)
            place.copy_(param.detach().reshape(-1))
            param.data = place.view(param.shape)  # the storage moves; the Parameter stays
            self.whole.append((place, offset, numel, param))


class _UnitBucket:
    """A zero=3 unit's trainable group seen as a bucket (the attributes _FlatBucket has): its shard is
    the parameters' storage, so nothing is gathered after a step (`flat` None)."""

    def __init__(self, group: Any, index: dict[int, int]) -> None:
        self.shard = _UnitShard(group, index)
        self.flat = None
        self.mine = group.shard  # (S,)
        self.grad = group.grad  # (S,)
        self.dtype, self.device = group.dtype, group.device
        self.whole = [(None, o, n, p) for p, o, n in zip(group.params, group.offsets, group.numels, strict=True)]


class _UnitShard:
    """The reducer's ShardPlan fields ShardedOptimizer and its state read, for one zero=3 group."""

    def __init__(self, group: Any, index: dict[int, int]) -> None:
        self.shard_numel, self.padded_numel, self.begin = group.shard_numel, group.padded, group.begin
        self.pieces = [
            flat.Cut(index[id(group.params[c.param])], c.param_offset, c.shard_offset, c.numel) for c in group.cuts
        ]
