"""Real processes on loopback: every launcher style, 1, 2 and 4 ranks, and what goes wrong at start-up."""

import socket
import sys

import pytest

from launch_helpers import (
    WORKERS,
    accelerate_style,
    clean_env,
    describe,
    free_port,
    leftover_processes,
    mpich_style,
    openmpi_style,
    run_processes,
    run_ranks,
    slurm_style,
    torchrun_style,
)

pytestmark = pytest.mark.multirank


def _check_allreduce(results, world, launcher):
    assert all(r.returncode == 0 for r in results), describe(results)
    reports = sorted((r.json() for r in results), key=lambda j: j["rank"])
    assert [j["rank"] for j in reports] == list(range(world))
    for j in reports:
        assert j["bad"] == [], describe(results)
        assert (j["world_size"], j["launcher"]) == (world, launcher)
        assert j["local_rank"] == j["rank"]
    # seed + rank: every rank draws differently, reproducibly
    assert len({j["seed_draw"] for j in reports}) == world


@pytest.mark.parametrize("world", [1, 2, 4])
def test_torchrun(world):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world}",
        str(WORKERS / "allreduce_worker.py"),
    ]
    results, sessions = run_processes([cmd], [clean_env()], timeout=180)
    assert results[0].returncode == 0, describe(results)
    reports = sorted(results[0].json_lines(), key=lambda j: j["rank"])
    assert [j["rank"] for j in reports] == list(range(world)), describe(results)
    assert all(j["bad"] == [] and j["launcher"] == "torchrun" for j in reports), describe(results)
    assert not leftover_processes(sessions)


@pytest.mark.parametrize(
    "style,launcher,world",
    [(s, name, w) for s, name in [(slurm_style, "slurm"), (openmpi_style, "openmpi")] for w in (1, 2, 4)]
    + [(mpich_style, "mpich", 2), (accelerate_style, "accelerate", 2)],
)
def test_simulated_launchers(style, launcher, world):
    port = free_port()
    envs = [clean_env(**style(rank, world, port)) for rank in range(world)]
    results, sessions = run_ranks("allreduce_worker.py", envs, timeout=120)
    _check_allreduce(results, world, launcher)
    assert not leftover_processes(sessions)


def test_missing_rank_is_named_within_timeout_plus_two_seconds():
    """A world of 3 with only ranks 0 and 1 started."""
    port, timeout = free_port(), 4.0
    envs = [clean_env(**torchrun_style(rank, 3, port)) for rank in (0, 1)]
    results, sessions = run_ranks("init_worker.py", envs, args=(str(timeout),), timeout=timeout + 30)
    for r in results:
        assert r.returncode == 3, describe(results)
        j = r.json()
        assert j["type"] == "RendezvousError", describe(results)
        assert "missing rank 2" in j["message"] and "2 of 3 ranks joined" in j["message"], j["message"]
        assert j["seconds"] <= timeout + 2.0, j
        # ... and the process is gone, too, within timeout + 2 s of init() starting
        assert r.ended - j["started_wall"] <= timeout + 2.0, (r.ended - j["started_wall"], j)
    assert not leftover_processes(sessions)


def test_rank0_killed_during_rendezvous_is_reported_by_the_others():
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 3, port)) for rank in (0, 1)]  # rank 2 never comes
    results, sessions = run_ranks("init_worker.py", envs, args=("30",), timeout=60, kill_after={0: 4.0})
    assert results[0].returncode is not None and results[0].returncode < 0  # SIGKILLed
    j = results[1].json()
    assert j["type"] == "RendezvousError", describe(results)
    assert "lost the rendezvous store" in j["message"] and "rank 0" in j["message"], j["message"]
    assert j["seconds"] < 15, j  # noticed at once, not at the 30 s timeout
    assert not leftover_processes(sessions)


def test_taken_master_port_names_host_port_and_fix():
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        envs = [clean_env(**slurm_style(0, 2, port))]
        results, sessions = run_ranks("init_worker.py", envs, args=("5",), timeout=60)
    finally:
        holder.close()
    j = results[0].json()
    assert j["type"] == "RendezvousError", describe(results)
    assert f"localhost:{port} is already in use" in j["message"]
    assert "MASTER_PORT" in j["message"] and "ss -ltnp" in j["message"]
    assert not leftover_processes(sessions)


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"RANK": "zero", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "RANK='zero' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "RANK=2 is outside 0..1"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a usable TCP port"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29500"},
            "MASTER_ADDR=no-such-host.invalid does not resolve",
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            "mpirun -x MASTER_ADDR",
        ),
        ({"DTCORE_LOG_LEVEL": "loud"}, "DTCORE_LOG_LEVEL"),
        ({"DTCORE_BACKEND": "mpi"}, "DTCORE_BACKEND='mpi' is not a backend"),
    ],
)
def test_bad_values_fail_fast_with_config_error(env, expected):
    results, sessions = run_ranks("init_worker.py", [clean_env(**env)], args=("5",), timeout=60)
    j = results[0].json()
    assert j["type"] == "ConfigError", describe(results)
    assert expected in j["message"], j["message"]
    assert "Fix:" in j["message"]
    assert j["seconds"] < 2.0  # validation happens before any waiting
    assert not leftover_processes(sessions)


def test_console_shows_rank0_and_every_rank_writes_its_file(tmp_path):
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in range(2)]
    results, _ = run_ranks("allreduce_worker.py", envs, args=(str(tmp_path),), timeout=120)
    _check_allreduce(results, 2, "env")
    assert "[I] [rank 0/2 " in results[0].stderr and "ready in" in results[0].stderr
    assert "[I]" not in results[1].stderr  # rank 1 prints warnings and errors only
    files = {f.name.rsplit("-", 1)[1]: f for f in tmp_path.glob("dtcore-*-rank*.log")}  # names carry start times
    assert sorted(files) == ["rank0.log", "rank1.log"]
    assert "[rank 1/2 " in files["rank1.log"].read_text()
