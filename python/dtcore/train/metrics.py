"""What a run records and shows: run.json, each rank's metrics file, rank 0's progress bar,
MFU, stragglers, and TensorBoard / MLflow when they are installed.

Note [Run directory]: the files written here are read by dtcore.monitor and dtcore.plot
(dtcore/train/rundir):
  RUN_DIR/run.json               rank 0, atomically at start (config, world_size, num_iterations,
                                 started, hosts, model_flops_per_token, peak_flops_per_device,
                                 restarts), and again after each restart's first step
  RUN_DIR/metrics/rank<r>.jsonl  every rank; one JSON object per line, each written by a single
                                 write() with O_APPEND, so a crash never leaves half a line.
Keys of the lines are in MetricsProcessor.train and .eval, and restarts.restart_line (rank 0's
"restart" lines, each also an entry of run.json's "restarts"); change them only together with the
readers. The straggler rule (own_time, slow_ranks) is here too: the trainer applies it live and
dtcore.monitor to the files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import statistics
import time
from collections import deque
from typing import Any

import torch

from .. import _C

log = logging.getLogger("dtcore.train")

STRAGGLER_FACTOR = 1.1  # a rank whose median own time (own_time()) exceeds the job's by this factor is named
WINDOW = 20  # steps over which own times are compared (logging.straggler_window's default, dtcore.monitor's)

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


class MetricsFile:
    """RUN_DIR/metrics/rank<r>.jsonl, appended one whole line per write(). See Note [Run directory]."""

    def __init__(self, run_dir: str, rank: int) -> None:
        os.makedirs(os.path.join(run_dir, "metrics"), exist_ok=True)
        self.path = self.path_of(run_dir, rank)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @staticmethod
    def path_of(run_dir: str, rank: int) -> str:
        return os.path.join(run_dir, "metrics", f"rank{rank}.jsonl")

    def write(self, line: dict[str, Any]) -> None:
        data = (json.dumps(line, allow_nan=True) + "\n").encode()
        written = os.write(self._fd, data)  # one write of the whole line (O_APPEND: atomic for a line)
        if written != len(data):
            raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes of a metrics line (disk full?)")

    def close(self) -> None:
        os.close(self._fd)


@dataclasses.dataclass
class Straggler:
    rank: int
    host: str
    median_s: float
    factor: float  # its median / the job's median


def own_time(step_time_s: float, wait_s: float | None) -> float:
    """A rank's own time in a step: its step time less the time it was blocked waiting for the
    other ranks' collectives (wait_s, from dtcore._C.wait_seconds()). Every rank's step time
    includes waiting for the slowest, so step times alone are equal and name nobody; own times
    differ by what each rank itself spent. Lines without wait_s (older runs) count it as 0."""
    return step_time_s - (wait_s or 0.0)


def slow_ranks(medians: dict[int, float], hosts: dict[int, str], factor: float = STRAGGLER_FACTOR) -> list[Straggler]:
    """The stragglers among `medians` (rank -> its median own time over a window): the ranks above
    `factor` x the job's median, the median of the ranks' medians. The trainer (live, from an
    all-reduce) and dtcore.monitor (from the run directory) both name ranks by this rule."""
    job = statistics.median(medians.values())
    return [
        Straggler(rank, hosts.get(rank, "?"), m, m / job)
        for rank, m in sorted(medians.items())
        if job > 0 and m > factor * job
    ]


def stragglers(medians: list[float], hosts: list[str], ratio: float) -> list[str]:
    """'rank r (host): median x s, y x the job median' for each rank that slow_ranks() names
    (median own time above ratio x the job's median)."""
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
    """Rank 0's tqdm bar (when enabled) and a log line every `log_every` steps; nothing elsewhere.
    Its ETA: the steps left of `total`, at the mean time of those taken since it was made (at `initial`)."""

    def __init__(self, enabled: bool, bar: bool, total: int, initial: int, log_every: int) -> None:
        self.enabled, self.log_every = enabled, log_every
        self.total, self.initial, self.started = total, initial, time.monotonic()
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

    def update(self, line: dict[str, Any]) -> None:
        if not self.enabled:
            return
        step = line["step"]
        eta_s = (time.monotonic() - self.started) / (step - self.initial) * (self.total - step)
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


class MetricsProcessor:
    """One rank's metrics, from its measurements to every place they go (as torchtitan's
    MetricsProcessor): a step becomes the train line of Note [Run directory] in this rank's metrics
    file, rank 0's progress bar and log line, and the job's scalars for the trackers; an evaluation
    becomes an eval line and a scalar. It keeps the own times (own_time()) of the last `window`
    steps for the trainer's straggler check. `peak_flops`: one device's, None for no MFU.

    The scalars go to the trackers when the trainer calls publish(), at the end of a step, after its
    checkpoints, rather than as the lines are written: TensorBoard's writer thread wakes for each one
    (and computes its CRCs in Python), and would hold the GIL during an in-memory checkpoint taken
    right after the metrics (rank 0's RNG capture there took 186 us, against 65 us without it)."""

    def __init__(
        self,
        run_dir: str,
        *,
        rank: int,
        host: str,
        world: int,
        device: torch.device,
        flops_per_token: float,
        peak_flops: float | None,
        window: int,
        progress: Progress,
        trackers: Trackers,
    ) -> None:
        self.rank, self.host, self.world, self.device = rank, host, world, device
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.own_times: deque[float] = deque(maxlen=window)
        self.progress, self.trackers = progress, trackers
        self.file = MetricsFile(run_dir, rank)
        self._scalars: list[tuple[int, dict[str, float | None]]] = []  # for the trackers, until publish()

    def train(
        self,
        step: int,
        *,
        loss: float,
        job_loss: float,
        lr: float,
        step_time_s: float,
        wait_s: float,
        tokens: int,
        job_tokens: float,
    ) -> None:
        """Step `step`: this rank's loss and tokens, the job's (summed over ranks; job_loss their mean),
        the learning rate it used, its time and the part of it spent waiting for the other ranks."""
        rate = job_tokens / step_time_s  # the job's tokens/s
        mfu = None if self.peak_flops is None else self.flops_per_token * rate / (self.peak_flops * self.world)
        allocated, reserved = memory(self.device)
        line = {"kind": "train", "step": step, "time": time.time(), "rank": self.rank, "host": self.host}
        line |= {"loss": loss, "lr": lr, "step_time_s": step_time_s, "wait_s": wait_s}
        line |= {"tokens": tokens, "tokens_per_s": rate, "mfu": mfu}
        line |= {"mem_allocated_bytes": allocated, "mem_reserved_bytes": reserved}
        self.file.write(line)
        self.own_times.append(own_time(step_time_s, wait_s))
        self.progress.update(line | {"loss": job_loss})
        self._scalars.append((step, {"train/loss": job_loss, "train/tokens_per_s": rate, "train/mfu": mfu}))

    def eval(self, step: int, eval_loss: float) -> None:
        """The evaluation at step `step`: its loss, the same on every rank."""
        self.file.write({"kind": "eval", "step": step, "time": time.time(), "rank": self.rank, "eval_loss": eval_loss})
        self._scalars.append((step, {"eval/loss": eval_loss}))

    def publish(self) -> None:
        """The scalars of the lines written since the last call, to the trackers."""
        for step, values in self._scalars:
            self.trackers.scalars(step, values)
        self._scalars.clear()

    def close(self, status: str) -> None:
        """`status`: how the run ended, for MLflow (Trackers.close)."""
        self.publish()
        self.progress.close()
        self.trackers.close(status)
        self.file.close()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].rstrip(".") if text else type(error).__name__
