"""Real processes on loopback: every launcher style, 1, 2 and 4 ranks, and what goes wrong at start-up."""

import json
import socket
import sys

import pytest
import torch

from dtcore import _C

from launch_helpers import (
    WORKERS,
    accelerate_style,
    clean_env,
    describe,
    free_port,
    leftover_processes,
    mpich_style,
    openmpi_style,
    routable_address,
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
        assert j["shared_memory"] == (world > 1)  # one host: the ranks exchange through /dev/shm
        assert j["shared_buffer"] == (world > 1)  # and map buffers in it
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


def test_rank0_killed_during_rendezvous_is_reported_by_the_others(tmp_path):
    port = free_port()
    knobs = {"DTCORE_LOG_DIR": str(tmp_path), "DTCORE_RDZV_LOG_INTERVAL": "1"}
    envs = [clean_env(**torchrun_style(rank, 3, port), **knobs) for rank in (0, 1)]  # rank 2 never comes

    def rank1_joined() -> bool:  # rank 0 logs it (a fixed delay was too early on a loaded machine)
        return any("2/3 ranks joined" in f.read_text(errors="replace") for f in tmp_path.glob("*rank0*.log"))

    results, sessions = run_ranks("init_worker.py", envs, args=("30",), timeout=60, kill_after={0: rank1_joined})
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
    assert f"127.0.0.1:{port} is already in use" in j["message"]  # one node: the store is on loopback
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


# Note [Launcher variables are read by presence] (csrc/dtcore/bootstrap/launcher.cpp): a launcher
# variable that is set, even to "", must be valid. Each case is one rank of a world of 2 (or a world
# of 1 for the knobs) with one variable broken; before, each trained alone as "rank 0 of 1" or waited
# for a rendezvous that could not happen. Case id -> (environment, what the ConfigError says).
def _broken(style, variable: str, value: str = "", says: str = "", **also: str) -> tuple[dict[str, str], str]:
    """Rank 0 of 2 in `style` (None: no launcher) with `variable` set to `value`; what the error says."""
    env = dict(style(0, 2, 0)) if style else {}
    env.update(also, **{variable: value})
    return env, says or f"{variable}='{value}' is set but empty"


_PRESENT_MUST_BE_VALID = {
    "slurm_procid_empty": _broken(
        slurm_style, "SLURM_PROCID", says="SLURM_PROCID='' is set but empty (launcher: slurm)"
    ),
    "ompi_rank_empty": _broken(
        openmpi_style, "OMPI_COMM_WORLD_RANK", says="OMPI_COMM_WORLD_RANK='' is set but empty (launcher: openmpi)"
    ),
    "pmi_rank_empty": _broken(mpich_style, "PMI_RANK", says="PMI_RANK='' is set but empty (launcher: mpich)"),
    "rank_empty": _broken(torchrun_style, "RANK", says="RANK='' is set but empty (launcher: env)"),
    "world_size_empty": _broken(torchrun_style, "WORLD_SIZE"),
    "local_rank_empty": _broken(torchrun_style, "LOCAL_RANK"),
    "local_world_size_empty": _broken(torchrun_style, "LOCAL_WORLD_SIZE"),
    "master_addr_empty": _broken(torchrun_style, "MASTER_ADDR"),
    "master_port_empty": _broken(
        torchrun_style, "MASTER_PORT", says="MASTER_PORT='' is set but empty (launcher: env). Fix: set MASTER_PORT to a"
    ),
    "slurm_master_port_empty": _broken(
        slurm_style, "MASTER_PORT", says="MASTER_PORT='' is set but empty (launcher: slurm)"
    ),
    "slurm_ntasks_empty": _broken(slurm_style, "SLURM_NTASKS", SLURM_NPROCS="2"),  # named, not the older name
    "slurm_tasks_per_node_empty": _broken(slurm_style, "SLURM_TASKS_PER_NODE"),
    "slurm_job_nodelist_empty": _broken(slurm_style, "SLURM_JOB_NODELIST"),
    "slurm_job_id_negative": _broken(slurm_style, "SLURM_JOB_ID", "-1", "SLURM_JOB_ID='-1' is not a SLURM job id"),
    "slurm_nnodes_beyond_the_node_list": _broken(
        slurm_style,
        "SLURM_NNODES",
        "3",
        "SLURM_NNODES=3 exceeds the 1 host(s) that SLURM_JOB_NODELIST='localhost' names",
    ),
    "log_ranks_negative": _broken(None, "DTCORE_LOG_RANKS", "-1", "DTCORE_LOG_RANKS='-1' is not a list of ranks"),
    "backend_nccl_without_a_gpu": _broken(
        None, "DTCORE_BACKEND", "nccl", "DTCORE_BACKEND='nccl', but torch sees no usable"
    ),
}


@pytest.fixture(scope="module")
def present_must_be_valid_results():
    """Every case of _PRESENT_MUST_BE_VALID in one process (one start of torch), each fresh."""
    port = str(free_port())  # where a case does wait, it waits alone on a port of its own
    cases = {
        case: {k: port if k == "MASTER_PORT" and v == "0" else v for k, v in env.items()}
        for case, (env, _) in _PRESENT_MUST_BE_VALID.items()
    }
    timeout = 3.0
    results, sessions = run_ranks(
        "env_cases_worker.py", [clean_env()], args=(str(timeout), json.dumps(cases)), timeout=60 + 5 * len(cases)
    )
    assert not leftover_processes(sessions)
    by_case = {j["case"]: j for j in results[0].json_lines()}
    assert set(by_case) == set(cases), describe(results)
    return by_case


@pytest.mark.parametrize("case", list(_PRESENT_MUST_BE_VALID))
def test_a_present_launcher_variable_must_be_valid(case, present_must_be_valid_results):
    """A ConfigError at once that names the variable, its value and the fix; never a lone rank or a wait."""
    if case == "backend_nccl_without_a_gpu" and _C.has_nccl and torch.cuda.is_available():
        pytest.skip("this machine can run NCCL")
    j = present_must_be_valid_results[case]
    assert not j["ok"], j  # never "rank 0 of 1" on its own
    assert j["type"] == "ConfigError", j
    assert _PRESENT_MUST_BE_VALID[case][1] in j["message"], j["message"]
    assert "Fix:" in j["message"], j["message"]
    assert j["seconds"] < 2.0, j  # before any waiting


@pytest.mark.parametrize("style", [slurm_style, openmpi_style, mpich_style], ids=["slurm", "openmpi", "mpich"])
def test_an_empty_rank_on_every_process_fails_each_instead_of_training_alone(style):
    """SLURM_PROCID='' (or OMPI_COMM_WORLD_RANK, PMI_RANK) on every rank of a job of 2: each process
    raises a ConfigError at once, where before each trained alone as "rank 0 of 1"."""
    rank_variable = next(iter(style(0, 2, 0)))
    port, timeout = free_port(), 4.0
    envs = [clean_env(**dict(style(rank, 2, port), **{rank_variable: ""})) for rank in range(2)]
    results, sessions = run_ranks("init_worker.py", envs, args=(str(timeout),), timeout=timeout + 30)
    for r in results:
        j = r.json()
        assert not j["ok"] and j["type"] == "ConfigError", describe(results)
        assert f"{rank_variable}='' is set but empty" in j["message"] and "Fix:" in j["message"], j["message"]
        assert j["seconds"] < 2.0, j
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


def test_two_nodes_of_one_process_on_one_machine_train():
    """NODE_RANK 0 and 1, LOCAL_RANK 0 on both, one host: on CPU they share no device, so they train."""
    address = routable_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback")
    port = free_port()
    envs = [
        clean_env(
            **dict(torchrun_style(rank, 2, port), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR=address),
            NODE_RANK=str(rank),
        )
        for rank in range(2)
    ]
    results, sessions = run_ranks("wrap_worker.py", envs, args=("parity", "25"), timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert [r.json()["bad"] for r in results] == [[], []]
    assert not leftover_processes(sessions)


@pytest.mark.parametrize(
    "per_node,worker",
    [(1, ("wrap_worker.py", "parity", "25")), (2, ("allreduce_worker.py",))],
    ids=["1-per-node-trains", "2-per-node-collectives"],
)
def test_two_torchrun_nodes_on_one_machine(per_node, worker):
    """torchrun --nnodes=2 started twice on one machine, as users try multi-node set-ups. With two
    processes per node, local_main_process_first runs local rank 0 of both nodes first."""
    port = free_port()
    cmds = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node_rank={node}",
            f"--nproc_per_node={per_node}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            str(WORKERS / worker[0]),
            *worker[1:],
        ]
        for node in range(2)
    ]
    results, sessions = run_processes(cmds, [clean_env(), clean_env()], timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    reports = [j for r in results for j in r.json_lines()]
    assert sorted(j["rank"] for j in reports) == list(range(2 * per_node))
    assert all(j["bad"] == [] for j in reports), describe(results)
    assert not leftover_processes(sessions)
