"""The straggler rule of the trainer's metrics."""

from dtcore.train.metrics import stragglers


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
