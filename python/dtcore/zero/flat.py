"""zero=3's storage: a unit's parameters in one flat padded buffer, of which a rank keeps its shard.

Note [Fully sharded storage]
A unit's parameters of one dtype and one requires_grad form a FlatGroup (frozen ones apart, so
that no gradient is reduced for them; see Note [Fully sharded units] in stage3.py). They lie end
to end in registration order in one flat buffer of `padded` elements, padded at the end to a
multiple of the world size N; rank r keeps elements [r * S, (r + 1) * S) of it, S = padded / N, in
`shard`, in the parameters' own dtype: the values the optimizer steps (the masters, under mixed
precision). Between uses the flat buffer `full` has no storage: its untyped storage is resized to
0 bytes, as FSDP2 frees its unsharded parameters, and each Parameter's data is an empty tensor
(shape (0,), as DeepSpeed's ZeRO-3 leaves them): a read of a parameter between uses finds no
values, where a view of freed storage would read past its end unchecked on a CPU. Gathered, each
Parameter object's data is a view of its place in `full`, in its own shape. The storage of `full`
is the same object across frees, so autograd's saved tensors (the parameter itself, or views of it
such as w.t()) see the gathered values again once the unit is gathered for its backward.

Gathered, `full` holds every rank's shard, in `compute_dtype` (param_dtype under mixed precision,
else the parameters' dtype). A gradient of the whole unit, `(padded,)`, is reduce-scattered into
`(S,)` and added to `grad`, this rank's gradient shard, in the parameters' dtype.
"""

from __future__ import annotations

from typing import Any

import torch

_FREE = 0  # bytes of a freed storage


class Cut:
    """One parameter's part in this rank's shard: elements [param_offset, param_offset + numel) of the
    flattened parameter are elements [shard_offset, shard_offset + numel) of the shard."""

    __slots__ = ("param", "param_offset", "shard_offset", "numel")

    def __init__(self, param: int, param_offset: int, shard_offset: int, numel: int) -> None:
        self.param, self.param_offset, self.shard_offset, self.numel = param, param_offset, shard_offset, numel


class FlatGroup:
    """One unit's parameters of one dtype and requires_grad: Note [Fully sharded storage]."""

    def __init__(
        self,
        label: str,
        named: list[tuple[str, torch.nn.Parameter]],
        rank: int,
        world: int,
        device: torch.device,
        compute_dtype: torch.dtype | None,
    ) -> None:
        self.label = label  # the unit's name and the group's kind, for collectives and messages
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [tuple(p.shape) for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.offsets = []
        offset = 0
        for n in self.numels:
            self.offsets.append(offset)
            offset += n
        self.numel = offset
        self.dtype = self.params[0].dtype
        self.requires_grad = self.params[0].requires_grad
        self.compute_dtype = compute_dtype if compute_dtype is not None and self.dtype.is_floating_point else self.dtype
        self.device = device
        self.rank, self.world = rank, world
        self.shard_numel = -(-max(self.numel, 1) // world)  # S
        self.padded = self.shard_numel * world
        self.begin = rank * self.shard_numel
        self.cuts = self._cut()
        self.shard = torch.zeros(self.shard_numel, dtype=self.dtype, device=device)  # (S,)
        self.full = torch.empty(self.padded, dtype=self.compute_dtype, device=device)  # (N * S,)
        self._nbytes = self.full.untyped_storage().nbytes()
        self.full.untyped_storage().resize_(_FREE)  # no values until the first gather
        self._empty = torch.empty(0, dtype=self.dtype, device=device)  # a parameter's data between uses: its own dtype
        # (S,): this rank's reduced gradient, kept across steps (the optimizer's pieces are views of it);
        # `has_grad` False until a reduction since zero_grad(set_to_none=True) writes it.
        self.grad = torch.zeros(self.shard_numel, dtype=self.dtype, device=device) if self.requires_grad else None
        self.has_grad = False
        self.accumulated: torch.Tensor | None = None  # (N * S,): gradients kept under no_sync()
        self.lent: torch.Tensor | None = None  # (N * S,): the parameters' .grad during the unit's backward
        self.gathered = False  # whether `full` has storage and the parameters point into it
        self._work: Any = None  # the gather in flight
        self._sent: torch.Tensor | None = None  # its input, kept alive until it ends

    def _cut(self) -> list[Cut]:
        cuts = []
        lo, hi = self.begin, self.begin + self.shard_numel
        for i, (offset, numel) in enumerate(zip(self.offsets, self.numels, strict=True)):
            a, b = max(lo, offset), min(hi, offset + numel)
            if a < b:
                cuts.append(Cut(i, a - offset, a - lo, b - a))
        return cuts

    # --- building -------------------------------------------------------------------------

    def adopt(self) -> None:
        """This rank's shard from the parameters' current values (the same on every rank: broadcast at
        wrap, or loaded), in their own dtype; then the parameters' data is freed (their storages go with
        their last reference)."""
        for cut in self.cuts:
            source = self.params[cut.param].detach().reshape(-1).narrow(0, cut.param_offset, cut.numel)
            self.shard.narrow(0, cut.shard_offset, cut.numel).copy_(source)
        self.gathered = True  # so that free() empties the parameters
        self.free()

    def _point(self) -> None:
        """Each Parameter's data at its place in `full` (whose storage is there)."""
        for p, offset, numel, shape in zip(self.params, self.offsets, self.numels, self.shapes, strict=True):
            p.data = self.full.narrow(0, offset, numel).view(shape)

    # --- gather and free ------------------------------------------------------------------

    def gather(self, communicator: Any) -> None:
        """Issues the all-gather of every rank's shard into `full` (no wait: `wait()` before use)."""
        if self.gathered or self._work is not None:
            return
        self.full.untyped_storage().resize_(self._nbytes)
        sent = self.shard if self.compute_dtype == self.dtype else self.shard.to(self.compute_dtype)
        self._sent = sent
        self._work = communicator.all_gather(self.full, sent, f"zero=3 gather {self.label}")
        self._point()  # read only after wait()

    @property
    def in_flight(self) -> bool:
        """A gather into `full` was issued and not yet waited for."""
        return self._work is not None

    def wait(self) -> None:
        """Until `full` holds the gathered values (on a GPU: the current stream waits for them)."""
        if self._work is not None:
            work, self._work = self._work, None
            if self.device.type == "cuda":
                work.wait_on_stream()
            else:
                work.wait()
            self._sent = None
            self.gathered = True

    def free(self) -> None:
        """Drops the gathered values (a gather in flight is waited for first: its output is this storage)."""
        self.wait()
        if self.gathered:
            for p in self.params:
                p.data = self._empty
            self.full.untyped_storage().resize_(_FREE)
            self.gathered = False

    # --- gradients ------------------------------------------------------------------------

    def lend_grads(self) -> None:
        """Before the unit's backward: each parameter without a gradient gets a view of one zeroed flat
        buffer as its .grad, so that autograd adds into it in place (See Note [Lent bucket views] in
        csrc/dtcore/reducer/reducer.h for zero=0's): the unit's gradient exists once, already flat."""
        if self.lent is not None or not self.requires_grad:
            return
        self.lent = torch.zeros(self.padded, dtype=self.compute_dtype, device=self.device)  # (N * S,)
        for p, offset, numel, shape in zip(self.params, self.offsets, self.numels, self.shapes, strict=True):
            if p.grad is None:
                p.grad = self.lent.narrow(0, offset, numel).view(shape)

    def take_grads(self, dtype: torch.dtype) -> torch.Tensor:
        """The unit's gradients, `(padded,)` in `dtype` (zeros where a parameter got none, and in the
        padding), plus what no_sync() kept; each parameter's .grad is released."""
        lent, self.lent = self.lent, None
        flat = lent if lent is not None else torch.zeros(self.padded, dtype=self.compute_dtype, device=self.device)
        for p, offset, numel in zip(self.params, self.offsets, self.numels, strict=True):
            if p.grad is not None:
                if lent is None or p.grad.untyped_storage().data_ptr() != lent.untyped_storage().data_ptr():
                    flat.narrow(0, offset, numel).add_(p.grad.reshape(-1))  # not the lent view: autograd's own
                p.grad = None
        if flat.dtype != dtype:
            flat = flat.to(dtype)
        kept, self.accumulated = self.accumulated, None
        if kept is not None:
            flat.add_(kept.to(dtype))
        return flat

    def keep_grads(self) -> None:
        """Inside no_sync(): the parameters' gradients are added to `accumulated` and released."""
        self.accumulated = self.take_grads(self.dtype)  # the masters' precision: many micro-batches add up

    def add_reduced(self, reduced: torch.Tensor) -> None:
        """Adds a reduce-scattered `(S,)` gradient into `grad`."""
        assert self.grad is not None
        if self.has_grad:
            self.grad.add_(reduced)
        else:
            self.grad.copy_(reduced)
            self.has_grad = True

    # --- whole values (state dicts, checkpoints) -------------------------------------------

    def gather_masters(self, communicator: Any) -> torch.Tensor:
        """Every rank's shard in the parameters' own dtype, `(padded,)`: a collective, waited for."""
        whole = torch.empty(self.padded, dtype=self.dtype, device=self.device)
        communicator.all_gather(whole, self.shard, f"zero=3 state {self.label}").wait()
        return whole
