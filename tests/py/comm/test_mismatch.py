"""Ranks that call different collectives: a CommError on every rank naming each rank's call, never
an abort inside Gloo and never a wrong result (Note [Collective signature])."""

import subprocess
import sys

import pytest

from dtcore.check._analyze import analyze

from launch_helpers import clean_env, describe, free_port, leftover_processes, run_ranks, torchrun_style

pytestmark = pytest.mark.multirank

RANK1 = {
    "size": "all_reduce (torch.float32[500], sum)",
    "dtype": "all_reduce (torch.int32[1000], sum)",
    "op": "all_reduce (torch.float32[1000], max)",
    "collective": "broadcast (torch.float32[1000], from rank 0)",
}


@pytest.mark.parametrize("case", sorted(RANK1))
def test_a_mismatch_is_a_comm_error_on_every_rank_naming_both_calls(case, tmp_path):
    port = free_port()
    envs = [clean_env(DTCORE_LOG_DIR=str(tmp_path), **torchrun_style(rank, 2, port)) for rank in range(2)]
    results, sessions = run_ranks("mismatch_worker.py", envs, args=(case,), timeout=90)
    assert [r.returncode for r in results] == [0, 0], describe(results)  # no abort, no signal
    for r in results:
        j = r.json()
        assert "result" not in j, f"rank {j['rank']} got a result: {j}"  # never silently wrong
        message = j["error"]
        assert "the ranks called different collectives at #2" in message, message
        assert "rank 0: all_reduce (torch.float32[1000], sum)" in message, message
        assert f"rank 1: {RANK1[case]}" in message, message
        assert "Fix:" in message
        assert j["seconds"] < 5, j  # found before any data moved, not at a timeout
        assert "an earlier collective failed" in j["later"], j  # the job is broken from here on
    assert leftover_processes(sessions) == []
    # Each rank dumped its flight record on the failure; read together, they name the divergence.
    assert sorted(p.name for p in tmp_path.glob("flight-rank*.jsonl")) == ["flight-rank0.jsonl", "flight-rank1.jsonl"]
    found, report = analyze(tmp_path)
    assert found, report
    assert "DIVERGED at collective #2" in report, report
    assert "rank 1 (host " in report and RANK1[case] in report, report
    assert "rank 0 (host " in report and "all_reduce (torch.float32[1000], sum)" in report, report


@pytest.mark.parametrize("case", ["op", "dtype"])
def test_without_the_check_before_each_call_the_heartbeat_finds_a_mismatch(case, tmp_path):
    """The two silent-wrong cases (sum against max; float32 against int32 of the same size) with no
    check before each call, as on NCCL: the call runs, and the ranks' signatures compared through the
    heartbeat end the job with a CommError on both ranks naming both calls (Note [Collective signature])."""
    port = free_port()
    envs = [
        # Through Gloo: through shared memory the signatures are compared before each call whatever
        # DTCORE_CHECK_COLLECTIVES says, since that costs nothing there.
        clean_env(
            DTCORE_LOG_DIR=str(tmp_path), DTCORE_CHECK_COLLECTIVES="0", DTCORE_SHM="0", **torchrun_style(rank, 2, port)
        )
        for rank in range(2)
    ]
    results, sessions = run_ranks("mismatch_worker.py", envs, args=(case, "heartbeat"), timeout=90)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    for r in results:
        j = r.json()
        assert "error" not in j, j  # no check before the call: it ran
        message = j["later"]
        assert "the ranks called different collectives at #2:" in message, message
        assert "rank 0: all_reduce (torch.float32[1000], sum)" in message, message
        assert f"rank 1: {RANK1[case]}" in message, message
        assert "Found by comparing the ranks' heartbeats" in message and "Fix:" in message, message
        assert j["after"] < 10, j  # about one heartbeat interval, never the timeout
    assert leftover_processes(sessions) == []


def test_analyze_names_a_rank_that_fell_behind_and_refuses_an_empty_folder(tmp_path):
    def record(rank, seq, state, signature):
        return (
            f'{{"rank": {rank}, "world": 3, "host": "h{rank}", "seq": {seq}, "op": "all_reduce", "detail": '
            f'"torch.float32[8], sum", "label": "bucket 1/1", "signature": "{signature}", "started": {seq}.0, '
            f'"finished": 0, "state": "{state}"}}\n'
        )

    for rank, last in [(0, 3), (1, 3), (2, 2)]:  # rank 2 never issued #3
        lines = [record(rank, s, "succeeded", f"{s:016x}") for s in range(1, last)]
        lines.append(record(rank, last, "failed" if rank < 2 else "succeeded", f"{last:016x}"))
        (tmp_path / f"flight-rank{rank}.jsonl").write_text("".join(lines))
    found, report = analyze(tmp_path)
    assert found, report
    assert "BEHIND: rank 2 never issued collective #3, which ranks 0-1 waited in" in report, report
    assert "rank 2 (host h2): its last collective is #2" in report, report
    # The command line: exit 1 on a finding, 2 (usage) for a folder with no record.
    cli = [sys.executable, "-m", "dtcore.check", "--analyze"]
    assert subprocess.run([*cli, str(tmp_path)], capture_output=True, timeout=60).returncode == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([*cli, str(empty)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "holds no flight record" in done.stderr, done
