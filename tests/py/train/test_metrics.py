"""The trainer's metrics: a step's line from its measurements, and the straggler rule."""

import json

import pytest
import torch

from dtcore.train.metrics import MetricsProcessor, Progress, Trackers, stragglers


def _processor(tmp_path, trackers: Trackers, *, rank: int, world: int, peak_flops: float | None) -> MetricsProcessor:
    """A rank's metrics on the CPU, without a progress bar: lines in tmp_path/metrics."""
    progress = Progress(enabled=False, bar=False, total=10, initial=0, log_every=0)
    return MetricsProcessor(
        str(tmp_path),
        rank=rank,
        host=f"h{rank}",
        world=world,
        device=torch.device("cpu"),
        flops_per_token=6e6,
        peak_flops=peak_flops,
        window=2,
        progress=progress,
        trackers=trackers,
    )


def test_a_steps_measurements_become_its_train_line_and_an_evaluation_its_eval_line(tmp_path):
    trackers = Trackers(False, str(tmp_path), tensorboard=False, mlflow=False, params={})
    record = _processor(tmp_path, trackers, rank=1, world=2, peak_flops=1e12)
    for step in (1, 2, 3):
        record.train(step, loss=2.0, job_loss=2.5, lr=1e-3, step_time_s=0.5, wait_s=0.1, tokens=100, job_tokens=200.0)
    record.eval(3, 2.25)
    record.close("FINISHED")
    train, *_, evaluation = [
        json.loads(line) for line in (tmp_path / "metrics" / "rank1.jsonl").read_text().splitlines()
    ]
    assert train.pop("time") > 0 and evaluation.pop("time") > 0
    assert train == {
        "kind": "train",
        "step": 1,
        "rank": 1,
        "host": "h1",
        "loss": 2.0,  # this rank's
        "lr": 1e-3,
        "step_time_s": 0.5,
        "wait_s": 0.1,
        "tokens": 100,
        "tokens_per_s": 400.0,  # the job's
        "mfu": pytest.approx(6e6 * 400 / (1e12 * 2)),
        "mem_allocated_bytes": None,  # CPU
        "mem_reserved_bytes": None,
    }
    assert evaluation == {"kind": "eval", "step": 3, "rank": 1, "eval_loss": 2.25}
    assert list(record.own_times) == pytest.approx([0.4, 0.4])  # the last `window` steps, less their wait


def test_the_trackers_get_a_steps_scalars_when_published_in_order_and_the_rest_at_close(tmp_path):
    class Recording(Trackers):  # the trackers' side, recorded: what reaches TensorBoard and MLflow, and when
        def __init__(self):
            super().__init__(False, str(tmp_path), tensorboard=False, mlflow=False, params={})
            self.got = []

        def scalars(self, step, values):
            self.got.append((step, sorted(values)))

    trackers = Recording()
    record = _processor(tmp_path, trackers, rank=0, world=1, peak_flops=None)
    record.train(1, loss=2.0, job_loss=2.0, lr=1e-3, step_time_s=0.5, wait_s=0.1, tokens=100, job_tokens=100.0)
    record.eval(1, 1.5)
    assert trackers.got == []  # not while the step's checkpoints may still be taken
    record.publish()
    train = (1, ["train/loss", "train/mfu", "train/tokens_per_s"])
    assert trackers.got == [train, (1, ["eval/loss"])]
    record.train(2, loss=2.0, job_loss=2.0, lr=1e-3, step_time_s=0.5, wait_s=0.1, tokens=100, job_tokens=100.0)
    record.close("FINISHED")  # a run that ends (or fails) before publishing loses no scalar
    assert trackers.got[2:] == [(2, train[1])]


def test_stragglers_are_ranks_above_the_ratio_of_the_job_median():
    slow = stragglers([0.10, 0.10, 0.12, 0.10], ["a", "b", "c", "d"], 1.1)
    assert slow == [
        "rank 2 (c): median own time 0.120 s a step (its step time less its wait for the other ranks), 1.20x the "
        "job's median 0.100 s"
    ]
    assert stragglers([0.10, 0.105, 0.10, 0.10], ["a", "b", "c", "d"], 1.1) == []


def test_the_same_preemption_signal_twice_at_once_is_one_request():
    import signal

    from dtcore.train.resume import Preemption

    p = Preemption()
    p._handle(signal.SIGTERM, None)
    p._handle(signal.SIGTERM, None)  # SLURM's copy and the agent's forwarded one: no exit
    assert p.requested and p.signum == signal.SIGTERM
