"""Offloading the inputs that checkpointed blocks keep for their recompute (offload=True).

A checkpointed block keeps only its inputs for backward. torch's non-reentrant checkpoint saves
them through the saved-tensor hooks in effect around the checkpoint call (inside the block its own
hooks take over), so a pair of hooks around each checkpointed block sees exactly those inputs:
  - pack (forward): copy the input to pinned host memory on a side stream, after the stream that
    produced it; record_stream keeps the allocator from reusing the device memory before the copy
    is done. The device copy is then released with the last other reference to it.
  - unpack (backward, when the block's recompute starts): wait for that input's copy back to the
    device, then start bringing back the previous block's input on the side stream, so that it
    travels while this block recomputes and runs its backward (blocks run backward in reverse).
Handles are linked to the one packed before them by weak references, so a chain never outlives
its step. On CPU there is nothing to move: checkpoint_activations() does not install the hooks
and says so in its summary. `copy_on_cpu=True` runs the same pack/prefetch/unpack path on CPU with
plain host copies and no streams; the tests use it to check the path on machines without a GPU.
"""

from __future__ import annotations

import weakref

import torch


class _Offloaded:
    """One block input in host memory, and its way back."""

    __slots__ = ("host", "device", "copied", "back", "ready", "previous", "__weakref__")

    def __init__(self, host: torch.Tensor, device: torch.device, copied, previous) -> None:
        self.host = host
        self.device = device
        self.copied = copied  # CUDA event: the host copy is complete (None on CPU)
        self.back: torch.Tensor | None = None  # the device copy once prefetched, until unpacked
        self.ready = None  # CUDA event: `back` is complete
        self.previous = previous  # weakref to the handle packed just before (the block before)


class Offloader:
    """saved_tensors_hooks pack/unpack pair for the inputs of checkpointed blocks on one device."""

    def __init__(self, device: torch.device, copy_on_cpu: bool = False) -> None:
        self.device = device
        self.copy_on_cpu = copy_on_cpu
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # the side stream
        self._last: weakref.ref | None = None
        self.packed = 0  # counters, for the summary and the tests
        self.prefetched = 0

    def _moves(self, t: torch.Tensor) -> bool:
        if t.device.type == "cuda":
            return self.stream is not None and t.device == self.device
        return self.copy_on_cpu and t.device.type == "cpu"

    def pack(self, t: torch.Tensor):
        if not self._moves(t):
            return t
        if self.stream is None:  # copy_on_cpu: the same path, without streams
            host, copied = t.detach().clone(memory_format=torch.preserve_format), None
        else:
            host = torch.empty_like(t, device="cpu", pin_memory=True)
            self.stream.wait_stream(torch.cuda.current_stream(t.device))  # t is computed
            with torch.cuda.stream(self.stream):
                host.copy_(t.detach(), non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(self.stream)
            t.record_stream(self.stream)
        handle = _Offloaded(host, t.device, copied, self._last)
        self._last = weakref.ref(handle)
        self.packed += 1
        return handle

    def _prefetch(self, h: _Offloaded) -> None:
        self.prefetched += 1
        if self.stream is None:
            h.back = h.host.clone(memory_format=torch.preserve_format)
            return
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(h.copied)
            h.back = h.host.to(h.device, non_blocking=True)
            h.ready = torch.cuda.Event()
            h.ready.record(self.stream)

    def unpack(self, h) -> torch.Tensor:
        if not isinstance(h, _Offloaded):
            return h
        if h.back is None:  # not prefetched (the last block in backward, or a second backward)
            self._prefetch(h)
        t, h.back = h.back, None
        if h.ready is not None:
            current = torch.cuda.current_stream(h.device)
            current.wait_event(h.ready)
            t.record_stream(current)  # allocated on the side stream, used on this one
        previous = h.previous() if h.previous is not None else None
        if previous is not None and previous.back is None:
            self._prefetch(previous)  # the block before runs backward next: bring its input now
        return t

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
