"""A rank that waits says so on its console, at warning level, naming whom it waits for; Ctrl-C
during the rendezvous ends it at once."""

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

from launch_helpers import WORKERS, clean_env, free_port, torchrun_style

pytestmark = pytest.mark.multirank

INIT = "import dtcore; dtcore.init(timeout=60)"


def _start(rank: int, world: int, port: int) -> subprocess.Popen:
    env = clean_env(DTCORE_RDZV_LOG_INTERVAL="1", DTCORE_LOG_RANKS="0", **torchrun_style(rank, world, port))
    return subprocess.Popen(
        [sys.executable, "-c", INIT], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _read_until(proc: subprocess.Popen, needle: str, seconds: float) -> str:
    """stderr until it holds `needle`, ends, or `seconds` have passed (a silent process cannot
    hold it longer); what was read. Reads the pipe's descriptor, so nothing waits in a buffer."""
    fd, seen, end = proc.stderr.fileno(), b"", time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while needle.encode() not in seen and (left := end - time.monotonic()) > 0:
            if not selector.select(left):
                break  # the time is up
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # stderr closed
            seen += chunk
    return seen.decode(errors="replace")


@pytest.mark.parametrize("rank, waits_for", [(1, "rank 0 to serve the store"), (0, "waiting for rank 1")])
def test_a_waiting_rank_warns_and_ctrl_c_ends_the_rendezvous(rank, waits_for):
    proc = _start(rank, 2, free_port())  # the other rank never starts
    try:
        seen = _read_until(proc, waits_for, 20)
        assert waits_for in seen and "[W]" in seen, seen  # a warning: on every rank's console
        assert "not started yet" in seen, seen
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=10)[1]
        assert time.monotonic() - sent < 3, "Ctrl-C took too long"
        assert proc.returncode != 0 and "KeyboardInterrupt" in rest, rest
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already when the test passed
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


def test_a_rank_waiting_on_a_stopped_peer_warns_long_before_the_timeout():
    """The health monitor's verdict reaches the console while the collective still waits."""
    port, worker = free_port(), str(WORKERS / "failure_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, worker, "stop", "60"],
            env=clean_env(**torchrun_style(rank, 3, port)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in range(3)
    ]
    try:
        start = time.monotonic()
        seen = _read_until(procs[1], "root cause: rank 2 (stopped)", 30)  # rank 1: not a rank that logs info
        assert "has waited" in seen and "root cause: rank 2 (stopped)" in seen, seen
        assert time.monotonic() - start < 20, seen  # seconds, not the 60 s timeout
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            p.stderr.close()
