"""Real processes on loopback: a script that sets up torch.distributed itself, before or after
dtcore.init(), and launch set-ups that put several "nodes" on one machine."""

import sys
from pathlib import Path

import pytest

from launch_helpers import (
    WORKERS,
    accelerate_style,
    clean_env,
    describe,
    free_port,
    leftover_processes,
    openmpi_style,
    run_processes,
    run_ranks,
    slurm_style,
    torchrun_style,
)

pytestmark = pytest.mark.multirank


def _plain(rank: int, world: int, port: int) -> dict[str, str]:
    """RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT only, as a hand-written script or a job file sets them."""
    return {k: v for k, v in torchrun_style(rank, world, port).items() if not k.startswith("LOCAL_")}


def _mpi_for_accelerate(rank: int, world: int, port: int) -> dict[str, str]:
    """mpirun -x MASTER_ADDR -x MASTER_PORT with accelerate's variables: Accelerator() sets the group up."""
    return dict(openmpi_style(rank, world, port), MASTER_ADDR="127.0.0.1", ACCELERATE_MIXED_PRECISION="no")


def _run(style, mode: str) -> list[dict]:
    port = free_port()
    envs = [clean_env(**style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("torch_first_worker.py", envs, args=(mode,), timeout=90)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert not leftover_processes(sessions)
    return [r.json() for r in results]


@pytest.mark.parametrize(
    "style,mode,launcher",
    [(_plain, "env", "env"), (slurm_style, "tcp", "slurm"), (_mpi_for_accelerate, "accelerate", "accelerate")],
    ids=["plain", "slurm", "accelerate-mpi"],
)
def test_init_joins_a_torch_group_set_up_first(style, mode, launcher):
    """init_process_group first (its rank 0 serves a store at the master port): dtcore.init() joins
    on that group's store, trains, and leaves the group to the script at shutdown."""
    for rank, j in enumerate(_run(style, mode)):
        assert (j["rank"], j["world_size"], j["launcher"]) == (rank, 2, launcher), j
        assert j["bad"] == [], j
        assert j["owns"] is False, j  # the script's group, not dtcore's
        assert j["group_after_shutdown"] is True and j["torch_sum_after_shutdown"] == 2.0, j
        assert j["sum_after_second_init"] == 2.0 and j["second_rank"] == rank, j
        assert j.get("accelerator", [rank, 2]) == [rank, 2], j


def test_accelerator_after_init_uses_its_group():
    """dtcore.init() first: it sets the default group up, Accelerator() finds it and keeps it."""
    for rank, j in enumerate(_run(accelerate_style, "accelerate-after")):
        assert (j["rank"], j["launcher"], j["accelerator"]) == (rank, "accelerate", [rank, 2]), j
        assert j["bad"] == [] and j["owns"] is True, j
        assert j["group_after_shutdown"] is False, j  # dtcore's group, ended with it


def test_a_dead_peer_that_served_the_store_leaves_no_cpp_stack_traces_on_the_console(tmp_path):
    """Rank 0 serves the script's TCPStore and is SIGKILLed mid-training. Every store request of
    rank 1's dtcore threads then fails inside c10d, which warns with the C++ stack trace of the
    failure (`[c10d] sendBytes failed ... Broken pipe` and 15-30 "frame #N" lines, each time).
    Rank 1's console keeps dtcore's error and the first line of each warning; the frames go to its
    log file (Note [C++ stack traces on the console])."""
    port = free_port()
    envs = [clean_env(**_plain(rank, 2, port)) for rank in range(2)]
    envs[1]["DTCORE_LOG_DIR"] = str(tmp_path)
    cmd = [sys.executable, str(WORKERS / "peer_kill_worker.py"), "torch-first"]
    results, sessions = run_processes([cmd, cmd], envs, timeout=90)
    survivor = results[1]
    assert results[0].returncode == -9 and survivor.returncode == 1, describe(results)
    assert survivor.json()["type"] == "CommError", describe(results)
    assert "CommError: all_reduce #" in survivor.stderr, survivor.stderr[-3000:]
    assert "frame #" not in survivor.stderr and "Exception raised from" not in survivor.stderr, survivor.stderr[-3000:]
    logs = "".join(p.read_text() for p in Path(tmp_path).glob("dtcore-*-rank1.log"))
    assert "C++ stack trace of the torch message" in logs and "frame #0: " in logs, logs[-3000:]
    assert not leftover_processes(sessions)
