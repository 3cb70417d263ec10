"""torch DDP's logging data on a dtcore model: `_get_ddp_logging_data()`, its runtime sample rate and
the error it records.

torch DDP keeps a dictionary of facts about itself (its constructor's inputs, the parameters and
buckets, the backend's environment variables, sampled timings of forward and backward, the last
error it raised) that tools and torch's own tests read. DistributedModel keeps the same keys where
dtcore has the fact, from the values it really uses; the timings come from the reducer (See Note
[Backward timeline] in csrc/dtcore/reducer/reducer.h) and the forward, sampled as torch samples them.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _C

# torch's runtime sample rate (kDDPRuntimeLoggingSampleRate): timings of the first 10 iterations, then of
# one in this many.
_DEFAULT_SAMPLE_RATE = 100
_SAMPLED_FIRST = 10

# c10's names of parameter dtypes (torch's "dtypes" key); any other dtype by torch's Python name.
_DTYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
}

# Environment variables torch logs, by backend (the value, or "N/A" when unset).
_ENV = ("MASTER_PORT", "MASTER_ADDR", "TORCH_DISTRIBUTED_DEBUG", "CUDA_VISIBLE_DEVICES")
_BACKEND_ENV = {
    "gloo": ("GLOO_SOCKET_IFNAME", "GLOO_DEVICE_TRANSPORT"),
    "nccl": (
        "NCCL_SOCKET_IFNAME",
        "NCCL_BLOCKING_WAIT",
        "NCCL_ASYNC_ERROR_HANDLING",
        "NCCL_DEBUG",
        "NCCL_NTHREADS",
        "NCCL_IB_TIMEOUT",
    ),
}

# The timings torch derives from its events: name -> (start event, end event), events as in _Log.
_DURATIONS = {
    "forward_compute_time": ("forward_start", "backward_compute_start"),
    "backward_compute_time": ("backward_compute_start", "backward_compute_end"),
    "backward_comm_time": ("backward_comm_start", "backward_comm_end"),
    "backward_compute_comm_overlap_time": ("backward_comm_start", "backward_compute_end"),
}
_EVENT_KEYS = {
    "forward_start": "forward_compute_time_start",
    "backward_compute_start": "backward_compute_time_start",
    "backward_compute_end": "backward_compute_time_end",
    "backward_comm_start": "backward_comm_time_start",
    "backward_comm_end": "backward_comm_time_end",
}


@dataclass
class _Log:
    data: dict[str, int | str] = field(default_factory=dict)
    sample_rate: int = _DEFAULT_SAMPLE_RATE
    iterations: int = 0  # synced forwards with grad enabled so far (torch's num_iterations_)
    recorded: int = 0  # sampled iterations whose timings were recorded (for the averages)
    forward_start: int = 0  # ns since the epoch, of the last synced forward
    backward_compute_start: int = 0  # its end: the backward can start
    reductions: int = 0  # the reducer's count at that forward: a later one is that forward's backward
    # (id of the reducer, its count of errors raised inside backward) as last recorded: a copy's reducer counts anew
    backward_errors: tuple[int, int] = (0, 0)


def _env(name: str) -> str:
    return os.environ.get(name, "N/A")


def records_errors(method: Callable) -> Callable:
    """A DistributedModel method whose dtcore errors are recorded in the logging data ("has_error",
    "error"), as torch DDP records the errors it raises; the error is raised on unchanged."""

    @functools.wraps(method)
    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._note_backward_error()  # first: an error raised since is the newer one
        try:
            return method(self, *args, **kwargs)
        except _C.DtcoreError as e:
            self._record_error(type(e).__name__, str(e))
            raise

    return recording


class DdpLogging:
    """torch DDP's logging data, on DistributedModel (which supplies `module`, `_comm`, `_reducer`,
    `_trainable` and torch DDP's constructor attributes)."""

    _ddp_log: _Log | None = None

    def _get_ddp_logging_data(self) -> dict[str, int | str]:
        """As torch DDP's: a dictionary of facts for debugging and analysis, with torch's keys.

        Constructor inputs (device_ids, output_device, broadcast_buffers, bucket_cap_bytes,
        find_unused_parameters, gradient_as_bucket_view as given: dtcore's gradients are bucket views
        either way, static_graph), module_name, rank and world_size in the model's group, backend_name,
        is_multi_device_module, has_sync_bn, num_parameter_tensors, total_parameter_size_bytes and
        dtypes of the parameters reduced, bucket_sizes (bytes, at construction), the environment
        variables torch logs for the backend, comm_hook (once registered), join_uneven_inputs (once
        join() ran), has_error and error (the last dtcore error raised by the model's forward, hook
        registration or reducer inside a backward). Sampled as torch samples (the first 10 iterations, then one in
        `_set_ddp_runtime_logging_sample_rate`'s rate, 100 by default), at the next synced forward:
        iteration, has_rebuilt_buckets, rebuilt_bucket_sizes, rebuilt_per_bucket_param_indices,
        prev_iteration_grad_ready_order_indices, num_buckets_reduced (fewer than the buckets when
        skip_all_reduce_unused_params skipped some), and the previous iteration's timings in ns
        (forward_compute_time, backward_compute_time, backward_comm_time,
        backward_compute_comm_overlap_time, their avg_* over the sampled iterations, and the events'
        host times *_start / *_end); a timing whose events that iteration did not reach is 0.

        With Gloo, gloo_num_threads is the thread count of the process group dtcore's communicator drives.
        Left out, as dtcore does not have the fact: unused_parameter_size,
        initial_bucket_size_limits and rebuilt_bucket_size_limits, and can_set_static_graph."""
        self._note_backward_error()
        return dict(self._ddp_log.data)

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        """As torch DDP's: after the first 10 iterations, timings are recorded once every `sample_rate`."""
        if not isinstance(sample_rate, int) or sample_rate < 1:
            self._log_and_throw(
                _C.ConfigError,
                f"DDP runtime logging sample rate should be equal or greater than 1, got {sample_rate!r}. Fix: "
                "pass an integer >= 1 (1 records every iteration).",
            )
        self._ddp_log.sample_rate = sample_rate

    def _log_and_throw(self, err_type: type, err_msg: str) -> None:
        """As torch DDP's: records the error in the logging data, then raises it."""
        self._record_error(err_type.__name__, err_msg)
        raise err_type(err_msg)

    def _record_error(self, kind: str, err_msg: str) -> None:
        if self._ddp_log is not None:  # None while the model is being built
            self._ddp_log.data.update(has_error=1, error=f"{kind}: {err_msg}")

    def _note_backward_error(self) -> None:
        """An error the reducer raised inside a backward reached only backward()'s caller: recorded
        when the model is next used or asked, before anything newer."""
        reducer = getattr(self, "_live_reducer", None)
        if reducer is None or self._ddp_log is None:
            return
        seen = (id(reducer), reducer.backward_errors)  # a count: cheap, before every forward
        if seen[1] and seen != self._ddp_log.backward_errors:
            self._ddp_log.backward_errors = seen
            _, kind, message = reducer.last_backward_error()
            self._record_error(kind, message)

    def _start_logging(self) -> None:
        """The construction data, once the reducer exists."""
        comm, params = self._comm, self._trainable
        data: dict[str, int | str] = {
            "module_name": type(self.module).__name__,
            "world_size": comm.size,
            "rank": comm.rank,
            "iteration": 0,
            "is_multi_device_module": int(self.is_multi_device_module),
            "num_parameter_tensors": len(params),
            "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
            "dtypes": ", ".join(
                sorted({_DTYPE_NAMES.get(p.dtype, str(p.dtype).removeprefix("torch.")) for p in params})
            ),
            "bucket_sizes": self._bucket_sizes(),
            "device_ids": ", ".join(str(d) for d in self.device_ids or []),
            "output_device": -1 if self.output_device is None else self.output_device,
            "broadcast_buffers": int(self.forward_sync_buffers),
            "has_sync_bn": int(any(isinstance(m, torch.nn.SyncBatchNorm) for m in self.module.modules())),
            "bucket_cap_bytes": self.bucket_bytes_cap,
            "find_unused_parameters": int(self.find_unused_parameters),
            "gradient_as_bucket_view": 1,  # DistributedDataParallel logs its argument instead
            "backend_name": comm.backend,
        }
        for name in _ENV + _BACKEND_ENV.get(comm.backend, ()):
            data[name.lower()] = _env(name)
        threads = getattr(getattr(comm.engine, "options", None), "_threads", None)  # Gloo's process group's
        if threads is not None:
            data["gloo_num_threads"] = threads
        self._ddp_log = _Log(data=data)

    def _bucket_sizes(self) -> str:
        """The buckets' sizes in bytes (their parameters', without dtcore's ZeRO padding), as torch's."""
        params = self._trainable
        sizes = (sum(params[i].numel() * params[i].element_size() for i in b) for b in self._reducer.bucket_params())
        return ", ".join(str(s) for s in sizes)

    def _log_forward_start(self) -> None:
        """A synced forward with grad enabled begins (torch DDP's iteration): the previous one's
        statistics are recorded if it is sampled, and this one's start is noted."""
        log = self._ddp_log
        n = log.iterations
        if n > 0 and (n <= _SAMPLED_FIRST or n % log.sample_rate == 0):
            self._record_runtime_stats(n)
        log.iterations += 1
        log.forward_start, log.backward_compute_start = time.time_ns(), 0
        log.reductions = self._reducer.reductions

    def _log_forward_end(self) -> None:
        self._ddp_log.backward_compute_start = time.time_ns()

    def _record_runtime_stats(self, iteration: int) -> None:
        log, reducer = self._ddp_log, self._reducer
        data = log.data
        log.recorded += 1
        data["iteration"] = iteration
        rebuilt = int(reducer.order_rebuilt)
        if data.get("has_rebuilt_buckets", 0) != rebuilt:  # once, when the plan becomes final
            data["rebuilt_bucket_sizes"] = self._bucket_sizes()
            data["rebuilt_per_bucket_param_indices"] = ", ".join(
                " ".join(str(i) for i in b) for b in reducer.bucket_params()
            )
        data["has_rebuilt_buckets"] = rebuilt
        data["num_buckets_reduced"] = reducer.last_buckets_reduced
        order = reducer.last_ready_order()
        if order:
            data["prev_iteration_grad_ready_order_indices"] = ", ".join(str(i) for i in order)
        events = {"forward_start": log.forward_start, "backward_compute_start": log.backward_compute_start}
        comm_start, compute_end, comm_end = reducer.last_backward_times()
        if reducer.reductions > log.reductions:  # the backward of that forward was reduced
            events.update(backward_comm_start=comm_start, backward_compute_end=compute_end, backward_comm_end=comm_end)
        for name, (start, end) in _DURATIONS.items():
            began, ended = events.get(start, 0), events.get(end, 0)
            data[name] = ended - began if began and ended else 0
            if data[name]:
                average = int(data.get(f"avg_{name}", 0))
                data[f"avg_{name}"] = (data[name] + average * (log.recorded - 1)) // log.recorded
        for event, key in _EVENT_KEYS.items():
            data[key] = events.get(event, 0)

    def _set_comm_hook_name(self, name: str) -> None:
        self._ddp_log.data["comm_hook"] = name

    def _log_uneven_input_join(self) -> None:
        self._ddp_log.data["join_uneven_inputs"] = 1
