"""Starts real rank processes on loopback, with a timeout, and proves none is left behind.

Each rank runs in its own session (start_new_session), so a timeout kills its whole process
group; `leftover_processes` scans /proc for anything still in those sessions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"
ROOT = Path(__file__).resolve().parents[2]  # the repository
EXAMPLES = ROOT / "examples"

# Variables of any launcher (and dtcore's own) that must not leak from the test runner's
# environment into a simulated one. benchmarks/ranks.py cleans with the same list.
LAUNCHER_PREFIXES = (
    "SLURM_",
    "OMPI_",
    "PMI_",
    "MPI_LOCAL",
    "TORCHELASTIC_",
    "DTCORE_",
    "ACCELERATE_",
    "GROUP_",
    "ROLE_",
)
LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"}


def without_launcher_vars(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less every launcher variable (LAUNCHER_VARS, LAUNCHER_PREFIXES)."""
    return {k: v for k, v in env.items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}


def clean_env(**extra: str) -> dict[str, str]:
    env = without_launcher_vars(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # 2-core machines: no oversubscription
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def routable_address() -> str | None:
    """An address of this host that is not loopback (a job of several nodes refuses loopback), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # UDP: picks the outgoing address, sends nothing
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def torchrun_style(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def slurm_style(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(world),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": str(world),
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "MASTER_PORT": str(port),
    }


def openmpi_style(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(world),
        "MASTER_PORT": str(port),
    }


def mpich_style(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "PMI_RANK": str(rank),
        "PMI_SIZE": str(world),
        "MPI_LOCALRANKID": str(rank),
        "MPI_LOCALNRANKS": str(world),
        "MASTER_PORT": str(port),
    }


def accelerate_style(rank: int, world: int, port: int) -> dict[str, str]:
    return dict(torchrun_style(rank, world, port), ACCELERATE_MIXED_PRECISION="no")


def accelerate_launch(folder: Path, processes: int = 2) -> list[str]:
    """The real `accelerate launch` with a config file it writes into `folder`: the ordinary multi-process config
    the docs give for dtcore (distributed_type MULTI_GPU: torchrun underneath, also without GPUs), `processes` on
    this host at a free port. The script and its arguments follow."""
    config = Path(folder) / "accelerate_config.yaml"
    config.write_text(
        f"compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: {processes}\n"
        "num_machines: 1\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\nmain_process_ip: 127.0.0.1\n"
        f"main_process_port: {free_port()}\nrdzv_backend: static\nsame_network: true\n"
    )
    return [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", str(config)]


@dataclasses.dataclass
class RankResult:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float  # from start to exit
    ended: float  # time.time() at exit, to compare with times a worker reports

    def json_lines(self) -> list[dict]:
        """Every JSON line printed (several ranks may share one stdout under torchrun)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    def json(self) -> dict:
        """The last JSON line the worker printed."""
        lines = self.json_lines()
        if not lines:
            raise AssertionError(f"no JSON result; stdout:\n{self.stdout}\nstderr:\n{self.stderr}")
        return lines[-1]


def run_processes(
    cmds: list[list[str]],
    envs: list[dict[str, str]],
    timeout: float,
    kill_after: dict[int, float | Callable[[], bool]] | None = None,
    until_done: list[int] | None = None,
) -> tuple[list[RankResult], list[int]]:
    """Starts every command at once; kills any still running after `timeout` seconds.

    `kill_after` maps a process index to seconds after start at which it is SIGKILLed, to
    simulate a crash, or to a condition polled every 50 ms (e.g. that a line is in its log): it is
    killed once the condition holds (conditions after the timed kills, in index order). `until_done`
    lists the processes whose results the caller needs: once
    they have all exited, the sessions of the others are killed (returncode -9) rather than
    waited for, e.g. a rank that stopped itself. Each process is reaped by its own thread, so
    exit times are exact.
    """
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        for cmd, env in zip(cmds, envs)
    ]
    sessions = [p.pid for p in procs]
    results: list[RankResult | None] = [None] * len(procs)

    def reap(i: int, p: subprocess.Popen) -> None:
        try:
            out, err = p.communicate(timeout=timeout)
            code: int | None = p.returncode
        except subprocess.TimeoutExpired:
            _kill_session(p.pid)
            out, err = p.communicate()
            code = None
        results[i] = RankResult(code, out, err, time.monotonic() - start, time.time())

    threads = [threading.Thread(target=reap, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    try:
        timed = {i: d for i, d in (kill_after or {}).items() if not callable(d)}
        for i, delay in sorted(timed.items(), key=lambda kv: kv[1]):
            time.sleep(max(0.0, delay - (time.monotonic() - start)))
            _kill_session(procs[i].pid)
        for i, condition in sorted((kill_after or {}).items()):
            if i in timed:
                continue
            while not condition() and procs[i].poll() is None and time.monotonic() - start < timeout:
                time.sleep(0.05)
            _kill_session(procs[i].pid)
        for i in until_done or []:
            threads[i].join(timeout + 30)
        if until_done is not None:
            for p in procs:
                if p.poll() is None:
                    _kill_session(p.pid)
        for t in threads:
            t.join(timeout + 30)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_session(p.pid)
                p.wait()
    return [r for r in results if r is not None], sessions


def run_ranks(
    worker: str,
    envs: list[dict[str, str]],
    args: tuple[str, ...] = (),
    timeout: float = 120.0,
    kill_after: dict[int, float] | None = None,
    until_done: list[int] | None = None,
):
    cmd = [sys.executable, str(WORKERS / worker), *args]
    return run_processes([cmd] * len(envs), envs, timeout, kill_after, until_done)


def _kill_session(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_in_session(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Runs `cmd` in a session of its own (killed whole at the timeout), and checks that no process of it (a
    rank included) outlives it."""
    p = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert leftover_processes([p.pid]) == []
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def leftover_processes(sessions: list[int]) -> list[str]:
    """Processes still alive in any of the given sessions (zombies excluded)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        state, sid = fields[0], int(fields[3])
        if sid in sessions and state != "Z":
            alive.append(text[: text.rindex(")") + 1])
    return alive


def describe(results: list[RankResult]) -> str:
    return "\n".join(
        f"--- rank {i}: rc={r.returncode} after {r.seconds:.1f}s\n"
        f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
        for i, r in enumerate(results)
    )


def max_relative(ours: list[float], theirs: list[float]) -> float:
    """The largest relative difference between two runs' per-step values (losses, norms) of the same length."""
    assert len(ours) == len(theirs) > 0, (ours, theirs)
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs))


def run_job(worker: str, world: int, *args: object, timeout: float = 120.0) -> list[dict]:
    """A torchrun-style job of `world` ranks that must succeed and leave no process behind: each
    rank's JSON report (its last stdout line), in rank order."""
    port = free_port()
    envs = [clean_env(**torchrun_style(rank, world, port)) for rank in range(world)]
    results, sessions = run_ranks(worker, envs, args=tuple(str(a) for a in args), timeout=timeout)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert leftover_processes(sessions) == []
    return [r.json() for r in results]
