"""What a run records and shows: run.json, each rank's metrics file, rank 0's progress bar,
MFU, stragglers, and TensorBoard / MLflow when they are installed.

Note [Run directory]: the files written here are read by dtcore.monitor and dtcore.plot:
  RUN_DIR/run.json               rank 0, atomically at start (config, world_size, num_iterations,
                                 started, hosts, model_flops_per_token, peak_flops_per_device)
  RUN_DIR/metrics/rank<r>.jsonl  every rank; one JSON object per line, each written by a single
                                 write() with O_APPEND, so a crash never leaves half a line.
Keys of the lines are in `train_line` and `eval_line`; change them only together with the readers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import time
from typing import Any

import torch

from .. import _C
from .rundir import slow_ranks

log = logging.getLogger("dtcore.train")

# Peak dense bf16 FLOP/s per device (vendor data sheets, SXM parts), by a name's substring.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
)


def peak_flops(device: torch.device, override_tflops: float) -> float | None:
    """The device's peak for MFU: the override, the table's figure for a known GPU, else None."""
    if override_tflops > 0:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None  # CPU: no honest peak, so MFU is shown as n/a
    name = torch.cuda.get_device_name(device)
    for part, flops in PEAK_BF16_FLOPS:
        if part in name:
            return flops
    log.warning(
        "MFU: %s is not in dtcore's table of peaks (A100, H100, H200, B200); set --logging.peak_tflops=<dense bf16 "
        "TFLOP/s of one device> to see MFU",
        name,
    )
    return None


def write_json_atomically(path: str, value: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class MetricsFile:
    """RUN_DIR/metrics/rank<r>.jsonl, appended one whole line per write(). See Note [Run directory]."""

    def __init__(self, run_dir: str, rank: int) -> None:
        os.makedirs(os.path.join(run_dir, "metrics"), exist_ok=True)
        self.path = os.path.join(run_dir, "metrics", f"rank{rank}.jsonl")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, line: dict[str, Any]) -> None:
        data = (json.dumps(line, allow_nan=True) + "\n").encode()
        written = os.write(self._fd, data)  # one write of the whole line (O_APPEND: atomic for a line)
        if written != len(data):
            raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes of a metrics line (disk full?)")

    def close(self) -> None:
        os.close(self._fd)


def train_line(step: int, rank: int, host: str, **values: Any) -> dict[str, Any]:
    """The train line of Note [Run directory]; `values`: loss, lr, step_time_s, wait_s, tokens, tokens_per_s,
    mfu, mem_allocated_bytes, mem_reserved_bytes."""
    return {"kind": "train", "step": step, "time": time.time(), "rank": rank, "host": host, **values}


def eval_line(step: int, rank: int, eval_loss: float) -> dict[str, Any]:
    return {"kind": "eval", "step": step, "time": time.time(), "rank": rank, "eval_loss": eval_loss}


def stragglers(medians: list[float], hosts: list[str], ratio: float) -> list[str]:
    """'rank r (host): median x s, y x the job median' for each rank that rundir.slow_ranks() names
    (median own time, rundir.own_time(), above ratio x the job's median)."""
    slow = slow_ranks(dict(enumerate(medians)), dict(enumerate(hosts)), ratio)
    job = statistics.median(medians)
    return [
        f"rank {x.rank} ({x.host}): median own time {x.median_s:.3f} s a step (its step time less its wait for the "
        f"other ranks), {x.factor:.2f}x the job's median {job:.3f} s"
        for x in slow
    ]


def memory(device: torch.device) -> tuple[int | None, int | None]:
    if device.type != "cuda":
        return None, None
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)


def fmt_rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s / 1e3:.1f}k" if tokens_per_s >= 1e3 else f"{tokens_per_s:.0f}"


def summary(line: dict[str, Any], eta_s: float) -> dict[str, str]:
    """The progress bar's fields (also the periodic log line)."""
    mfu = line["mfu"]
    mem = line["mem_allocated_bytes"]
    return {
        "loss": f"{line['loss']:.4f}",
        "tok/s": fmt_rate(line["tokens_per_s"]),
        "mfu": "n/a" if mfu is None else f"{100 * mfu:.1f}%",
        "step": f"{1000 * line['step_time_s']:.0f}ms",
        "mem": "n/a" if mem is None else f"{mem / 2**30:.1f}GiB",
        "eta": time.strftime("%H:%M:%S", time.gmtime(max(0.0, eta_s))) if math.isfinite(eta_s) else "?",
    }


class Progress:
    """Rank 0's tqdm bar (when enabled) and a log line every `log_every` steps; nothing elsewhere."""

    def __init__(self, enabled: bool, bar: bool, total: int, initial: int, log_every: int) -> None:
        self.enabled, self.log_every = enabled, log_every
        self.bar = None
        if enabled and bar:
            try:
                from tqdm import tqdm
            except ImportError:  # not a hard dependency: the log lines carry the same figures
                log.warning(
                    "tqdm is not installed: no progress bar (pip install tqdm), a log line every %d steps", log_every
                )
            else:
                self.bar = tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True, leave=True)

    def update(self, line: dict[str, Any], eta_s: float) -> None:
        if not self.enabled:
            return
        fields = summary(line, eta_s)
        if self.bar is not None:
            self.bar.set_postfix(fields, refresh=False)
            self.bar.update(1)
        if self.log_every and line["step"] % self.log_every == 0:
            log.info("step %d | %s", line["step"], " | ".join(f"{k} {v}" for k, v in fields.items()))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Trackers:
    """TensorBoard scalars and an MLflow run, each only when its package is installed (optional).

    One that is installed and asked for but cannot start (an unwritable directory, a tracking URI
    MLflow refuses or cannot reach) is a ConfigError naming it and the fix, before the first step;
    one that fails later is dropped with a WARNING: the metrics files keep every value, and a
    monitoring service that went away never ends a training run."""

    def __init__(self, enabled: bool, run_dir: str, tensorboard: bool, mlflow: bool, params: dict) -> None:
        self.tb = self.mlflow = None
        if not enabled:
            return
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.debug("tensorboard is not installed: no TensorBoard scalars")
            else:
                where = os.path.join(run_dir, "tensorboard")
                try:
                    self.tb = SummaryWriter(where)
                except Exception as e:
                    raise _C.ConfigError(
                        f"TensorBoard: cannot write scalars to {where}: {_first_line(e)}. Fix: make {run_dir} "
                        "writable, or --logging.tensorboard=false."
                    ) from None
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if mlflow and uri:
            try:
                import mlflow as mlflow_module
            except ImportError:
                log.debug("mlflow is not installed: no MLflow run")
            else:
                try:
                    mlflow_module.start_run(run_name=os.path.basename(os.path.abspath(run_dir)))
                    self.mlflow = mlflow_module
                    flat = {f"{s}.{k}": v for s, fields in params.items() for k, v in fields.items()}
                    mlflow_module.log_params(flat)
                except Exception as e:
                    self.close("FAILED")
                    raise _C.ConfigError(
                        f"MLflow: cannot log a run at MLFLOW_TRACKING_URI={uri}: {_first_line(e)}. Fix: a tracking "
                        "URI MLflow accepts and reaches (e.g. http://HOST:5000 of a running `mlflow server`), or "
                        "--logging.mlflow=false (or MLFLOW_TRACKING_URI unset)."
                    ) from None

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        values = {k: v for k, v in values.items() if v is not None}
        if self.tb is not None:
            try:
                for key, value in values.items():
                    self.tb.add_scalar(key, value, step)
            except Exception as e:
                self.tb = self._drop("TensorBoard", e, self.tb.close)
        if self.mlflow is not None:
            try:
                self.mlflow.log_metrics(values, step=step)
            except Exception as e:
                self.mlflow = self._drop("MLflow", e, lambda: None)

    @staticmethod
    def _drop(name: str, error: BaseException, close: Any) -> None:
        log.warning(
            "%s failed (%s): no more scalars go there in this run; RUN_DIR/metrics has every value",
            name,
            _first_line(error),
        )
        with contextlib.suppress(Exception):
            close()

    def close(self, status: str = "FINISHED") -> None:
        """`status`: how the MLflow run ends, FINISHED, FAILED or KILLED (preempted)."""
        if self.tb is not None:
            self.tb.close()
        if self.mlflow is not None:
            with contextlib.suppress(Exception):  # the run's metrics are in; its end mark is best effort
                self.mlflow.end_run(status=status)
        self.tb = self.mlflow = None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].rstrip(".") if text else type(error).__name__
