"""The rendezvous store against strangers, with real processes on loopback (issue 11, items 1 and 6).

A foreign listener on the master port, foreign clients without the job secret (raw sockets and
c10d's TCPStore client), a flood of idle connections, a 64 MiB value, and the addresses the store
listens on. Each test fails on a store that trusts anyone (c10d's TCPStore, as before).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from launch_helpers import (
    WORKERS,
    clean_env,
    describe,
    free_port,
    leftover_processes,
    routable_address,
    run_processes,
    run_ranks,
    torchrun_style,
)

pytestmark = pytest.mark.multirank

GREETING = struct.pack(">I", 42)  # the frame header of a dtcore store's greeting (Note [Store protocol])


@contextlib.contextmanager
def silent_listener():
    """Something foreign on a port: accepts every connection and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held, stop = [], threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for s in [*held, listener]:
            s.close()


def test_a_silent_foreign_listener_on_the_master_port_ends_rank1_naming_host_port():
    """Rank 0 finds the port taken; rank 1 must not wait forever on what holds it (it used to)."""
    timeout = 20.0
    with silent_listener() as port:
        envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in (0, 1)]
        results, sessions = run_ranks("init_worker.py", envs, args=(str(timeout),), timeout=timeout + 30)
    assert all(r.returncode == 3 for r in results), describe(results)
    rank0, rank1 = (r.json() for r in results)
    assert f"127.0.0.1:{port} is already in use" in rank0["message"], rank0
    assert rank1["type"] == "RendezvousError", rank1
    for part in (f"127.0.0.1:{port}", "not a dtcore store", "sent nothing", "MASTER_PORT=<port>", "stop the other"):
        assert part in rank1["message"], rank1["message"]
    # A dtcore store greets at once: ten seconds of silence are enough, the full timeout is not waited.
    assert rank1["seconds"] < 12.0, rank1
    assert not leftover_processes(sessions)


@contextlib.contextmanager
def live_job(folder: Path, world: int = 2, drop: tuple[str, ...] = (), **extra: str):
    """A job of `world` ranks between init() and its end; yields (port, rank 0's pid).

    torchrun's variables, with `extra` set over them and `drop` left out."""
    port = free_port()
    styles = [{k: v for k, v in torchrun_style(rank, world, port).items() if k not in drop} for rank in range(world)]
    envs = [clean_env(**{**style, **extra}) for style in styles]
    out: dict = {}

    def run() -> None:
        out["results"] = run_ranks("store_hold_worker.py", envs, args=(str(folder),), timeout=150)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while not all((folder / f"ready{r}").exists() for r in range(world)):
            assert thread.is_alive() and time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)
        ready = json.loads((folder / "ready0").read_text())
        assert ready["port"] == port
        yield port, ready["pid"]
    finally:
        (folder / "go").write_text("")
        thread.join(180)
    results, sessions = out["results"]
    assert all(r.returncode == 0 for r in results), describe(results)
    assert all(r.json()["sum"] == [float(world)] * 3 for r in results), describe(results)
    assert not leftover_processes(sessions)


def closed_by_server(sock: socket.socket, within: float = 5.0) -> bool:
    """True when the server closes `sock` within `within` seconds (whatever it sent first is skipped)."""
    sock.settimeout(within)
    end = time.monotonic() + within
    try:
        while time.monotonic() < end:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def test_b_a_stranger_without_the_secret_cannot_read_list_set_or_delete(tmp_path):
    with live_job(tmp_path) as (port, _):
        # c10d's TCPStore client: closed during its own handshake, so nothing is read or written.
        start = time.monotonic()
        with pytest.raises(RuntimeError):  # dist.DistError is a RuntimeError
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))
            store.set("dtcore/attempt_0/generation_0/roster/abort", "FORGED: this job is cancelled")
            store.delete_key("dtcore/attempt_0/generation_0/health/0")
            store.num_keys()
        assert time.monotonic() - start < 10
        # A raw socket: the store greets, then closes on anything but a handshake with the secret.
        for attempt in (
            b"\x00\x00\x00\x11" + bytes([3]) + b"\x00" * 16,  # a get request, skipping the handshake
            struct.pack(">I", 74) + b"dtcstore\x00\x01" + b"\x00" * 64,  # a handshake with a made-up MAC
            b"GET / HTTP/1.0\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                assert s.recv(4, socket.MSG_WAITALL) == GREETING
                s.sendall(attempt)
                assert closed_by_server(s), attempt
    # live_job's exit: the job's all-reduce still ran on an intact store.


def test_b_a_secret_file_readable_by_others_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-value\n")
    secret.chmod(0o644)
    envs = [clean_env(**torchrun_style(rank, 2, free_port()), DTCORE_JOB_SECRET_FILE=str(secret)) for rank in range(1)]
    results, sessions = run_ranks("init_worker.py", envs, args=("10",), timeout=60)
    j = results[0].json()
    assert j["type"] == "RendezvousError", describe(results)
    assert f"{secret} has mode 0644" in j["message"] and f"chmod 600 {secret}" in j["message"], j["message"]
    assert "s3cret-value" not in j["message"] + results[0].stderr + results[0].stdout
    assert not leftover_processes(sessions)


def test_b_ranks_with_different_secrets_do_not_meet_and_the_secret_is_never_shown():
    port = free_port()
    envs = [
        clean_env(**torchrun_style(rank, 2, port), DTCORE_JOB_SECRET=f"secret-of-rank-{rank}", DTCORE_LOG_LEVEL="debug")
        for rank in (0, 1)
    ]
    results, sessions = run_ranks("init_worker.py", envs, args=("6",), timeout=40)
    j = results[1].json()
    assert j["type"] == "RendezvousError", describe(results)
    assert f"127.0.0.1:{port}" in j["message"] and "does not have this job's secret" in j["message"], j["message"]
    assert "has its job secret from DTCORE_JOB_SECRET" in j["message"], j["message"]
    for r in results:
        assert "secret-of-rank" not in r.stdout + r.stderr, describe(results)
    assert not leftover_processes(sessions)


def test_c_five_hundred_idle_connections_do_not_stop_a_two_rank_init(tmp_path):
    port, flag = free_port(), tmp_path / "flooded"
    envs = [clean_env(**torchrun_style(rank, 2, port)) for rank in (0, 1)]
    flood = [sys.executable, str(WORKERS / "flood_worker.py"), str(port), "500", "25", str(flag)]
    # Rank 1 starts once the stranger holds its 500 connections to rank 0's store.
    cmds = [
        [sys.executable, str(WORKERS / "init_worker.py"), "30"],
        [sys.executable, str(WORKERS / "late_init_worker.py"), str(flag), "30"],
        flood,
    ]
    results, sessions = run_processes(cmds, [*envs, clean_env()], timeout=90)
    assert results[2].json()["opened"] == 500, describe(results)
    assert results[0].returncode == 0 and results[1].returncode == 0, describe(results)
    assert results[1].json()["seconds"] < 10.0, describe(results)
    assert not leftover_processes(sessions)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_d_a_strangers_64_mib_value_is_not_stored(tmp_path):
    blob = b"x" * (64 << 20)
    with live_job(tmp_path) as (port, rank0_pid):
        before = rss_bytes(rank0_pid)
        # c10d's TCPStore client is refused at once: the store closes the connection in the
        # client's own handshake, so the constructor raises and none of these 64 values of
        # 1 MiB is ever sent.
        with pytest.raises(RuntimeError):  # dist.DistError is a RuntimeError
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))
            for i in range(64):
                store.set(f"blob/{i}", blob[: 1 << 20])
        # The 64 MiB as one frame on a raw socket: closed without being stored.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            assert s.recv(4, socket.MSG_WAITALL) == GREETING
            with contextlib.suppress(OSError):
                s.sendall(struct.pack(">I", len(blob) + 32) + blob)
            assert closed_by_server(s)
        time.sleep(0.5)
        grown = rss_bytes(rank0_pid) - before
        assert grown < (16 << 20), f"rank 0 grew by {grown / 2**20:.1f} MiB"


def _other_addresses() -> list[tuple[int, str]]:
    """This host's addresses other than 127.0.0.1 that a socket can bind here (::1 and the interfaces)."""
    found: list[tuple[int, str]] = []
    candidates = [(socket.AF_INET6, "::1")]
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP):
            candidates.append((info[0], info[4][0]))
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # no packet is sent: this asks which interface the route takes
        candidates.append((socket.AF_INET, s.getsockname()[0]))
    for family, address in candidates:
        if address.startswith("127.") or (family, address) in found:
            continue
        with contextlib.suppress(OSError), socket.socket(family) as s:
            s.bind((address, 0))
            found.append((family, address))
    return found


def _reachable(family: int, address: str, port: int) -> bool:
    with socket.socket(family) as s:
        s.settimeout(5)
        try:
            s.connect((address, port))
        except ConnectionRefusedError:
            return False
        return s.recv(4, socket.MSG_WAITALL) == GREETING


def test_e_a_job_on_127_0_0_1_is_not_reachable_at_other_addresses(tmp_path):
    others = _other_addresses()
    if not others:
        pytest.skip("this machine has no address besides 127.0.0.1 to test from")
    with live_job(tmp_path) as (port, _):
        for family, address in others:
            assert not _reachable(family, address, port)
        assert _reachable(socket.AF_INET, "127.0.0.1", port)


def test_e_a_one_node_job_serves_at_loopback_whatever_master_addr_says(tmp_path):
    others = [(f, a) for f, a in _other_addresses() if f == socket.AF_INET]
    if not others:
        pytest.skip("this machine has no IPv4 address besides 127.0.0.1 to test from")
    family, address = others[0]
    one, bare = tmp_path / "one", tmp_path / "bare"
    one.mkdir()
    bare.mkdir()
    # LOCAL_WORLD_SIZE == WORLD_SIZE: one node, so the store stays on loopback (Note [Store address]).
    with live_job(one, MASTER_ADDR=address) as (port, _):
        assert not _reachable(family, address, port)
        assert _reachable(socket.AF_INET, "127.0.0.1", port)
    # Bare RANK/WORLD_SIZE: the ranks may be on several hosts, so the store serves at MASTER_ADDR.
    with live_job(bare, drop=("LOCAL_RANK", "LOCAL_WORLD_SIZE"), MASTER_ADDR=address) as (port, _):
        assert _reachable(family, address, port)
        assert not _reachable(socket.AF_INET, "127.0.0.1", port)


@pytest.mark.parametrize("secret", [None, "a-secret-shared-by-the-nodes"])
def test_b_a_job_of_several_nodes_without_a_secret_is_warned_once_on_rank_0(secret):
    """Without DTCORE_JOB_SECRET a job of several nodes has no private channel for a secret, so its
    store's secret is one anyone running dtcore can derive (Note [Job secret]): rank 0 says so once,
    at warning level, naming DTCORE_JOB_SECRET as the fix; with the variable set, nothing is said."""
    address = routable_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback")
    port = free_port()
    extra = {"DTCORE_JOB_SECRET": secret} if secret else {}
    envs = [
        clean_env(
            **dict(torchrun_style(rank, 2, port), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR=address),
            NODE_RANK=str(rank),
            **extra,
        )
        for rank in range(2)
    ]
    results, sessions = run_ranks("allreduce_worker.py", envs, timeout=120)
    assert all(r.returncode == 0 for r in results), describe(results)
    warnings = [[line for line in r.stderr.splitlines() if "authenticates nobody" in line] for r in results]
    if secret:
        assert warnings == [[], []], describe(results)
    else:
        assert len(warnings[0]) == 1 and warnings[1] == [], describe(results)
        assert "[W] [rank 0/2 " in warnings[0][0] and "Fix: " in warnings[0][0], warnings[0][0]
        assert "export DTCORE_JOB_SECRET=$(openssl rand -hex 32)" in warnings[0][0], warnings[0][0]
    assert not leftover_processes(sessions)
