"""Starting a benchmark's ranks: real processes on loopback, with the variables torchrun sets.

Imported by the benchmark scripts (`python benchmarks/bench_*.py` puts this folder on sys.path).
The launcher variables to clean and the torchrun variables come from the tests' own helpers
(tests/py/launch_helpers.py, standard library only), so that both clean the same list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests" / "py"))
from launch_helpers import free_port, routable_address, torchrun_style, without_launcher_vars

__all__ = ["bytes_written", "clean_env", "free_port", "rank_env", "rank0_report", "routable_address"]


def bytes_written() -> int:
    """Bytes this process has written through write()-family calls (Gloo's sockets, plus the store's
    small heartbeats): /proc/self/io's wchar."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without launcher variables, one thread per process, dtcore's warnings only."""
    env = without_launcher_vars(os.environ)
    env.update(OMP_NUM_THREADS="1", DTCORE_LOG_LEVEL="warn")
    env.update(extra)
    return env


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """The environment of one rank of a single-node job on loopback, as torchrun would set it."""
    return clean_env(**torchrun_style(rank, world, port), **extra)


def rank0_report(script: str, world: int, args: list[str], timeout: float = 3600.0, **extra: str) -> dict:
    """Runs `python script *args` as `world` ranks on loopback (with the variables `extra` beside
    the launcher's); rank 0's last JSON line.

    SystemExit naming the exit codes when a rank fails; every rank is killed after `timeout` s.
    """
    port = free_port()
    cmd = [sys.executable, script, *args]
    procs = [
        subprocess.Popen(cmd, env=rank_env(r, world, port, **extra), stdout=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    return json.loads([line for line in outs[0].splitlines() if line.startswith("{")][-1])
