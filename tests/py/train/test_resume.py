"""Interrupted runs of `python -m dtcore.train` on 2 CPU ranks. Exact resume: a run stopped by
SIGTERM mid-epoch, or killed by SIGKILL, then resumed with --checkpoint.resume=auto, logs the same
losses bit for bit as the uninterrupted run. A rank that dies ends the other with the health
monitor's verdict, not a stack."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dtcore.train.resume import EXIT_PREEMPTED

from launch_helpers import clean_env, free_port, leftover_processes, torchrun_style

# Dropout on, so that the random generators are part of what must be restored.
BASE = [
    "--preset",
    "tiny",
    "--model.dropout=0.1",
    "--logging.progress=false",
    "--logging.plot=false",
    "--eval_every=10",
]


def _start(run_dir, *args):
    port = free_port()
    cmd = [sys.executable, "-m", "dtcore.train", *BASE, f"--logging.run_dir={run_dir}", *args]
    return [
        subprocess.Popen(
            cmd,
            env=clean_env(**torchrun_style(rank, 2, port)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in range(2)
    ]


def _finish(procs, timeout=120):
    """Each rank's (exit status, output); kills what is left at the timeout."""
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert leftover_processes([p.pid for p in procs]) == []
    return out


def _when_step(run_dir, rank, step, timeout=60):
    path = run_dir / "metrics" / f"rank{rank}.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and sum(1 for line in path.read_text().splitlines() if '"train"' in line) >= step:
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} did not reach step {step} in {timeout} s")


def _losses(run_dir, rank):
    """{(kind, step): loss} of a rank; after a resume the later line of a step wins."""
    out = {}
    for line in (run_dir / "metrics" / f"rank{rank}.jsonl").read_text().splitlines():
        j = json.loads(line)
        out[(j["kind"], j["step"])] = j.get("loss", j.get("eval_loss"))
    return out


# 2 micro-batches of 3 sequences per rank and step: 22 batches per rank and epoch of the shipped
# corpus make 11 steps, so a stop before step 11 is mid-epoch and a resume after it crosses epoch
# boundaries. ZeRO-2: the optimizer state and the gradients are sharded, and resharded at load.
ARGS = ("--device_batch_size=3", "--total_batch_size=12", "--zero=2", "--num_iterations=30", "--checkpoint.every=4")
# Deterministic: the reference and the interrupted run are two runs, whose bucket_mb="auto" plans may
# differ, and zero=2's clip norm, summed shard by shard, rounds by the layout.
ARGS += ("--training.deterministic=true",)
ARGS += ("--checkpoint.at_end=false",)
EPOCH = 11


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Both ranks' losses of the uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("reference")
    results = _finish(_start(run_dir, *ARGS))
    assert [code for code, _ in results] == [0, 0], results
    return [_losses(run_dir, rank) for rank in (0, 1)]


def _same_after(reference, run_dir, step):
    for rank, ref in enumerate(reference):
        got = _losses(run_dir, rank)
        later = {k: v for k, v in ref.items() if k[1] > step}
        assert later and {k: got[k] for k in later} == later


@pytest.mark.multirank
def test_sigterm_mid_epoch_saves_exits_75_and_resumes_bit_identical(tmp_path, reference):
    run_dir = tmp_path / "run"
    procs = _start(run_dir, *ARGS)
    _when_step(run_dir, 1, 5)
    procs[1].send_signal(signal.SIGTERM)  # one rank only: the other learns of it within the step
    results = _finish(procs)
    assert [code for code, _ in results] == [EXIT_PREEMPTED] * 2, results
    stop = int(sorted(os.listdir(run_dir / "checkpoints"))[-1].removeprefix("step_"))
    assert 5 <= stop < EPOCH, stop  # mid-epoch
    assert f"checkpoint of step {stop} complete" in results[1][1] and "after the signal" in results[1][1]
    resumed = _finish(_start(run_dir, *ARGS, "--checkpoint.resume=auto"))
    assert [code for code, _ in resumed] == [0, 0], resumed
    assert f"at step {stop}" in resumed[0][1]
    _same_after(reference, run_dir, stop)


@pytest.mark.multirank
def test_sigkill_then_resume_auto_continues_from_the_newest_complete_checkpoint(tmp_path, reference):
    run_dir = tmp_path / "run"
    procs = _start(run_dir, *ARGS)
    _when_step(run_dir, 0, 14)
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
    _finish(procs)
    saved = run_dir / "checkpoints"
    complete = [d for d in sorted(os.listdir(saved)) if (saved / d / "manifest.json").exists()]
    stop = int(complete[-1].removeprefix("step_"))
    assert 8 <= stop < 30 and stop % 4 == 0, complete  # the save at 12 waited for the one at 8
    resumed = _finish(_start(run_dir, *ARGS, "--checkpoint.resume=auto"))
    assert [code for code, _ in resumed] == [0, 0], resumed
    _same_after(reference, run_dir, stop)  # across epoch boundaries too


def test_a_first_signal_asks_for_a_stop_and_a_second_exits_at_once():
    code = (
        "import os, signal, time\n"
        "from dtcore.train.resume import Preemption\n"
        "p = Preemption(); p.install()\n"
        "os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.1)\n"
        "assert p.requested and p.signum == signal.SIGUSR1\n"
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(10)\n"
    )
    env = clean_env()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + 15, done.stderr
    assert "SIGUSR1: every rank saves a checkpoint after this step" in done.stderr
    assert "second signal SIGTERM: exiting now" in done.stderr


@pytest.mark.multirank
def test_a_dead_rank_ends_the_other_with_the_health_verdict_not_a_stack(tmp_path):
    procs = _start(tmp_path, "--num_iterations=100000", "--checkpoint.at_end=false")
    _when_step(tmp_path, 1, 3)
    os.killpg(procs[1].pid, signal.SIGKILL)
    (code, text), _ = _finish(procs)
    assert code == 1, text
    assert "the run ended: " in text and "root cause: rank 1" in text, text
    assert "Traceback" not in text


@pytest.mark.multirank
def test_zero3_training_stops_and_resumes_bit_identical(tmp_path):
    """--parallel.zero=3: each rank saves its shards of the parameters and optimizer state, and a
    resumed run continues exactly as the uninterrupted one."""
    args = ("--device_batch_size=3", "--total_batch_size=12", "--zero=3", "--num_iterations=9", "--checkpoint.every=3")
    args += ("--checkpoint.at_end=false",)
    whole = tmp_path / "whole"
    assert [code for code, _ in _finish(_start(whole, *args))] == [0, 0]
    run_dir = tmp_path / "run"
    procs = _start(run_dir, *args)
    _when_step(run_dir, 0, 4)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    assert [code for code, _ in _finish(procs)] == [EXIT_PREEMPTED] * 2
    stop = int(sorted(os.listdir(run_dir / "checkpoints"))[-1].removeprefix("step_"))
    resumed = _finish(_start(run_dir, *args, "--checkpoint.resume=auto"))
    assert [code for code, _ in resumed] == [0, 0], resumed
    _same_after([_losses(whole, rank) for rank in (0, 1)], run_dir, stop)


def test_rng_state_gives_each_generators_state_as_it_is_after_every_kind_of_draw():
    # rng_state() skips random.getstate() and numpy.random.get_state() while their state's bytes are those of the
    # last full read; a Gaussian cached (and then used up, which leaves NumPy's words as they were) and a state set
    # must still be seen.
    import random

    import numpy

    from dtcore.train.rng import rng_state, set_rng_state

    def expected():
        version, internal, gauss = random.getstate()
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        return [version, list(internal), gauss], [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]

    def ours():
        state = rng_state()
        python, np = state["python"], state["numpy"]
        return [python[0], python[1].tolist(), python[2]], [np[0], np[1].tolist(), *np[2:]]

    draws = [
        lambda: None,
        lambda: numpy.random.rand(3),
        lambda: numpy.random.standard_normal(),  # one Gaussian drawn, its pair's other cached
        lambda: numpy.random.standard_normal(),  # the cached one used: the words do not move
        lambda: numpy.random.seed(3),
        lambda: numpy.random.randint(0, 5, 700),  # past the end of the 624 words: all of them anew
        lambda: random.random(),
        lambda: random.gauss(0, 1),  # Python's cached Gaussian: an attribute, the words as they were
        lambda: random.gauss(0, 1),
        lambda: random.seed(5),
        lambda: random.getrandbits(64 * 700),
    ]
    for draw in draws * 3:
        draw()
        assert ours() == expected()
    taken = rng_state()
    numpy.random.standard_normal()
    random.gauss(0, 1)
    set_rng_state(taken)
    assert ours() == expected()
