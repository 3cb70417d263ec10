"""`dtcore.ShardedOptimizer`: any elementwise torch optimizer, its state kept for this rank's shard only.

Wrap the model with `dtcore.wrap(model, zero=1)` (optimizer state sharded) or `zero=2` (gradients
sharded too), then `opt = dtcore.ShardedOptimizer(model, torch.optim.AdamW, lr=..., weight_decay=...)`.
Each rank owns an equal shard of every gradient bucket (Note [Shard layout], in
csrc/dtcore/reducer/shard_plan.h). The inner torch optimizer is built over this rank's *pieces*
(the parts of parameters in its shards), so its state (AdamW's two moments: 8 of the 16 bytes per
parameter in fp32) exists for 1/N of the model; after its step the updated shards are all-gathered
into every rank's parameters.

A piece of an fp32 parameter is a view of the parameter itself: the optimizer updates it in
place, no copy. A piece of a parameter in another dtype (bf16, fp16) gets an fp32 master copy
(`master_dtype`), stepped in fp32 and cast into the parameter before the all-gather.

Sharding elementwise is exact only for optimizers whose update of an element depends on that
element alone (SGD, Adam, AdamW, ...). Others (Adafactor's factored moments, Muon's
orthogonalisation, LBFGS) would be silently wrong, so they are refused unless `elementwise=True`
says the class is elementwise.

`param_groups` are the model's parameters with their hyperparameters, as with any torch
optimizer: LR schedulers and hand edits work; they reach the inner optimizer at each step.
`state_dict()` gathers the whole state in torch's own format (as a torch optimizer over the whole
model would hold it), and `load_state_dict()` takes that format from any world size or from a
plain torch optimizer: the shards are cut anew.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import _C
from ..bootstrap.context import get_context
from ..reducer.model import DistributedModel
from .state import apply_pending, gather_state, scatter_state

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

    __slots__ = (
        "param",
        "group",
        "bucket",
        "param_view",
        "local",
        "grad_view",
        "param_offset",
        "shard_offset",
        "numel",
    )

    def __init__(
        self, param: torch.Tensor, group: int, bucket: int, param_offset: int, shard_offset: int, numel: int
    ) -> None:
        self.param = param
        self.group = group
        self.bucket = bucket
        self.param_offset = param_offset
        self.param_view = param.detach().view(-1).narrow(0, param_offset, numel)  # (numel,)
        self.shard_offset = shard_offset
        self.numel = numel
        self.local = self.param_view  # what the inner optimizer steps; a master copy when set
        self.grad_view: torch.Tensor | None = None

    @property
    def has_master(self) -> bool:
        return self.local is not self.param_view


class ShardedOptimizer(torch.optim.Optimizer):
    _dtcore_sharded = True  # steps a zero=2 model rightly: see reducer/zero_guard.py

    """`optimizer_class` stepping this rank's shard of `model` (dtcore.wrap(model, zero=1|2)).

    params: the model's parameters (default) or torch-style param groups over them.
    master_dtype: pieces of parameters in another dtype are stepped in an fp32 copy (None: never).
    elementwise: True asserts that `optimizer_class` updates each element on its own; needed for
    classes dtcore does not know. Remaining keyword arguments go to `optimizer_class`.
    """

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
                "dtcore.wrap(model, zero=1) (optimizer state sharded) or zero=2 (gradients sharded too)."
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
        self._buckets: list[_BucketCopies] = []
        self._inner: torch.optim.Optimizer | None = None
        self._pending_state: dict[Any, Any] | None = None  # loaded before the pieces existed
        groups = list(model.parameters() if params is None else params)
        super().__init__(groups, optimizer_class([torch.zeros(0)], **defaults).defaults)
        self._check_groups()

    # --- torch.optim.Optimizer -------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self._inner is not None:
            raise _C.ConfigError(
                "ShardedOptimizer.add_param_group after the first step is not supported: the shards are cut. "
                "Fix: pass every group when building the ShardedOptimizer."
            )
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Steps this rank's shard, then all-gathers the updated parameters into every rank."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._ensure_built():
            return loss  # no backward has reduced gradients yet: nothing to step, as torch's would
        assert self._inner is not None
        for inner, group in zip(self._inner.param_groups, self.param_groups, strict=True):
            inner.update({k: v for k, v in group.items() if k != "params"})  # schedulers edit these
        for piece in self._pieces:
            if piece.grad_view is not None and piece.local.grad is not piece.grad_view:
                piece.local.grad.copy_(piece.grad_view)  # another dtype than the master's
        self._inner.step()
        for piece in self._pieces:
            if piece.has_master:
                piece.param_view.copy_(piece.local)
        self._all_gather_parameters()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the reduced gradients in place (their buffers and shards are kept, whatever set_to_none)."""
        self._model._reducer.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        """The whole state in torch's format, gathered from every rank (a collective: call it on all)."""
        return gather_state(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads torch's format (from a ShardedOptimizer at any world size, or a plain torch optimizer)."""
        scatter_state(self, state_dict)

    # --- the shards ------------------------------------------------------------------------

    def _check_groups(self) -> None:
        trainable = {id(p) for p in self._model.module.parameters() if p.requires_grad}
        seen: set[int] = set()
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in trainable:
                    raise _C.ConfigError(
                        f"ShardedOptimizer got a parameter of shape {tuple(p.shape)} that is not a trainable parameter "
                        "of the wrapped model. Fix: pass model.parameters() (or groups over them) of the model given."
                    )
                if id(p) in seen:
                    raise _C.ConfigError(
                        f"ShardedOptimizer got a parameter of shape {tuple(p.shape)} in two param groups. Fix: list "
                        "each parameter once."
                    )
                seen.add(id(p))

    def _ensure_built(self) -> bool:
        """Cuts the pieces on the reducer's final plan (Note [Shard layout]); False before it is final."""
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
        group_of = {id(p): g for g, group in enumerate(self.param_groups) for p in group["params"]}
        self._pieces, self._buckets = [], []
        for b, (shard, (layout, _dtype)) in enumerate(zip(reducer.shards(), reducer.bucket_layout(), strict=True)):
            grad_shard = reducer.grad_shard(b)  # (shard_numel,)
            for cut in shard.pieces:
                param = params[cut.param]
                group = group_of.get(id(param))
                if group is None:
                    continue  # reduced but not optimized: gathered as it is
                piece = _Piece(param, group, b, cut.param_offset, cut.shard_offset, cut.numel)
                grad = grad_shard.narrow(0, cut.shard_offset, cut.numel)
                if self._master_dtype is not None and param.dtype != self._master_dtype:
                    piece.local = piece.param_view.to(self._master_dtype, copy=True)
                    piece.local.grad = grad.to(self._master_dtype, copy=True)
                else:
                    piece.local.grad = grad  # a view: the reducer's shard, read in place
                piece.grad_view = grad
                self._pieces.append(piece)
            self._buckets.append(_BucketCopies(shard, layout, params))
        # Every group on every rank holds a piece, empty if need be, so that each rank's optimizer
        # has the same state keys (state_dict gathers them) even when its shards miss a group.
        inner_groups = []
        for g, group in enumerate(self.param_groups):
            local = [p.local for p in self._pieces if p.group == g]
            if not local:
                like = group["params"][0] if group["params"] else params[0]
                placeholder = torch.zeros(0, dtype=self._master_dtype or like.dtype, device=like.device)
                placeholder.grad = torch.zeros_like(placeholder)
                local = [placeholder]
            inner_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": local})
        self._inner = self._optimizer_class(inner_groups)

    def _all_gather_parameters(self) -> None:
        """Every rank's updated shards into every rank's parameters, in chunks, two in flight.

        A chunk is the same stretch of every rank's shard; chunks keep the transient buffers to a
        few MiB however large the buckets are (Note [Shard layout]: shards are equal, so every
        rank cuts the same chunks).
        """
        communicator = get_context().communicator
        world = communicator.size
        in_flight: list[tuple[Any, torch.Tensor, _BucketCopies, int, int]] = []
        for b, bucket in enumerate(self._buckets):
            size = bucket.shard.shard_numel
            step = max(1, _GATHER_CHUNK_BYTES // (world * bucket.element_size))
            for lo in range(0, size, step):
                n = min(step, size - lo)
                mine = torch.zeros(n, dtype=bucket.dtype, device=bucket.device)  # (n,), padding stays zero
                bucket.copy(bucket.shard.begin + lo, n, mine, into_params=False)
                gathered = torch.empty(world * n, dtype=bucket.dtype, device=bucket.device)  # (N * n,): rank-major
                work = communicator.all_gather(gathered, mine, f"parameters {b + 1}/{len(self._buckets)}")
                in_flight.append((work, gathered, bucket, lo, n))
                if len(in_flight) == 2:
                    _gathered_into_params(*in_flight.pop(0), world)
        for args in in_flight:
            _gathered_into_params(*args, world)


_GATHER_CHUNK_BYTES = 2 << 20  # each all-gather's output; two in flight


def _gathered_into_params(
    work: Any, gathered: torch.Tensor, bucket: _BucketCopies, lo: int, n: int, world: int
) -> None:
    work.wait()
    for r in range(world):  # rank r's chunk: elements [r * S + lo, r * S + lo + n) of the bucket
        bucket.copy(r * bucket.shard.shard_numel + lo, n, gathered.narrow(0, r * n, n), into_params=True)


class _BucketCopies:
    """Copies between a stretch of one bucket's (padded) layout and the parameters that lie in it."""

    def __init__(self, shard: Any, layout: list[tuple[int, int, int]], params: list[torch.Tensor]) -> None:
        self.shard = shard
        # (flattened parameter, its offset in the bucket, numel, parameter), in layout order
        self.whole = [(params[i].detach().view(-1), offset, numel, params[i]) for i, offset, numel in layout]
        self.starts = [offset for _, offset, _, _ in self.whole]
        self.dtype, self.device = params[layout[0][0]].dtype, params[layout[0][0]].device
        self.element_size = params[layout[0][0]].element_size()

    def whole_params(self) -> list[tuple[torch.Tensor, int, int, torch.Tensor]]:
        return self.whole

    def copy(self, lo: int, n: int, buffer: torch.Tensor, *, into_params: bool) -> None:
        """Bucket elements [lo, lo + n) <-> buffer[0:n]; the padding has no parameter and is skipped."""
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        while i < len(self.whole) and self.whole[i][1] < lo + n:
            flat, offset, numel, _ = self.whole[i]
            a, b = max(lo, offset), min(lo + n, offset + numel)
            if a < b:
                values, place = flat.narrow(0, a - offset, b - a), buffer.narrow(0, a - lo, b - a)
                (values if into_params else place).copy_(place if into_params else values)
            i += 1
