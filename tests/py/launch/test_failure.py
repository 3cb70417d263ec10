"""The diagnosis of known failures, from the messages users actually see (torch's and dtcore's own), and the
order that makes the root cause the first failure rather than a rank the launcher stopped afterwards."""

from __future__ import annotations

import signal

import pytest

from dtcore.launch.failure import RankFailure, diagnose, first_first, report


def failure(summary: str, traceback: str = "", exitcode: int = 1, time: float = 100.0, rank: int = 0) -> RankFailure:
    return RankFailure(rank, rank, "gpu07", 4242, exitcode, time, summary, traceback, "")


@pytest.mark.parametrize(
    "message, name",
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity", "GPU"),
        (
            "torch.distributed.DistStoreError: use_libuv was requested but PyTorch was built without libuv support",
            "libuv",
        ),
        (
            "RuntimeError: The server socket has failed to listen on any local network address. port: 29500, "
            "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
            "port in use",
        ),
        ("RendezvousError: MASTER_PORT=29500 is taken on this host by pid 77 (python)", "port in use"),
        ("torch.AcceleratorError: CUDA error: invalid device ordinal", "invalid device ordinal"),
        ("CommError: allreduce #12 timed out on rank 3 after 300 s: rank 5 has not taken part", "collective timeout"),
        (
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)",
            "collective timeout",
        ),
        (
            "CommError: collective mismatch: rank 0 called allreduce(float32[1024]), rank 1 broadcast",
            "collective mismatch",
        ),
        ("RendezvousError: rendezvous timed out after 300 s: 2 of 16 ranks are missing: 8,9", "missing rank"),
        ("killed by SIGKILL", "killed"),
    ],
)
def test_each_known_failure_is_recognised(message, name):
    found = diagnose(failure(message.split(": ", 1)[-1], traceback=message))
    assert found is not None and found.name.startswith(name), (message, found)
    assert found.fix


def test_an_unknown_failure_gets_no_made_up_diagnosis():
    assert diagnose(failure("KeyError: 'labels'", "Traceback ...\nKeyError: 'labels'")) is None
    assert "Diagnosis" not in report(failure("KeyError: 'labels'"), [], "node0.log", 2)


def test_ranks_stopped_by_the_launcher_come_after_the_one_that_failed():
    stopped = failure("killed by SIGTERM", exitcode=-signal.SIGTERM, time=100.0, rank=0)  # whole seconds
    raised = failure("ValueError: x", "Traceback\nValueError: x", time=100.4, rank=1)
    assert first_first([stopped, raised])[0] is raised
    # The whole job stopped from outside: every rank got SIGTERM, and the earliest is named.
    others = [failure("killed by SIGTERM", exitcode=-15, time=t, rank=r) for r, t in ((0, 101.0), (1, 100.0))]
    assert first_first(others)[0].rank == 1
