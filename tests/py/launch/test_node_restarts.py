"""--max-restarts on several nodes: the nodes restart together, on the job's one budget (Note [Rounds] in
dtcore/launch/rendezvous.py). Two real launchers on this host (node 0 and node 1, one rank each, over
loopback), running a small worker that all-reduces a few times and prints its restart count, or dtcore.Trainer
(workers/restart_worker.py), whose rank 0 on node 0 records a failure on node 1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_helpers import WORKERS, clean_env, free_port, leftover_processes

pytestmark = pytest.mark.multirank

# `worker.py MODE STEPS`: an all-reduce of (rank + 1) * (step + 1) per step, 0.2 s apart; rank 1 exits with status 3
# after step 1 at restart count 0 (MODE "once") or at every attempt ("always"); "run" never fails; "apart" never
# fails and all-reduces at its last step only (a rank whose peer is lost meanwhile does not notice).
WORKER = """
import json, os, sys, time
import torch
import dtcore

mode, steps = sys.argv[1], int(sys.argv[2])
count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ctx = dtcore.init(timeout=10)
total = 0.0
for step in range(steps):
    t = torch.tensor([float(ctx.rank + 1) * (step + 1)])
    if mode != "apart" or step == steps - 1:
        dtcore.all_reduce(t)
        total += t.item()
    print(f"rank {ctx.rank} step {step} restart {count}", flush=True)
    if ctx.rank == 1 and step == 1 and (mode == "always" or (mode == "once" and count == 0)):
        print("rank 1 gives up", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(0.2)
print(json.dumps({"rank": ctx.rank, "restart_count": count, "total": total}), flush=True)
dtcore.shutdown()
"""


class Node:
    """One node's launcher, in a session of its own, its output in files (read while it runs)."""

    def __init__(self, tmp_path: Path, node: int, port: int, program: list[str], tag: str, restarts: int):
        self.out = tmp_path / f"node{node}{tag}.out"
        self.err = tmp_path / f"node{node}{tag}.err"
        cmd = [sys.executable, "-m", "dtcore.launch", "--nnodes", "2", "--node-rank", str(node)]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "1"]
        cmd += [
            "--max-restarts",
            str(restarts),
            "--timeout",
            "20",
            "--log-dir",
            str(tmp_path / "logs"),
            "--no-preflight",
        ]
        self.ranks: list[int] = []  # its ranks' pids, once kill() has found them
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.p = subprocess.Popen(
                [*cmd, *program],
                cwd=tmp_path,
                env=clean_env(DTCORE_RDZV_LOG_INTERVAL="1"),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stdout() + self.stderr():
            assert time.monotonic() < deadline and self.p.poll() is None, (text, self.stderr())
            time.sleep(0.1)

    def wait(self, timeout: float) -> int:
        return self.p.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL to the launcher and its ranks (torch's agent starts each rank in a session of its own)."""
        if self.p.poll() is None:
            self.ranks = _children(self.p.pid)
            os.killpg(self.p.pid, signal.SIGKILL)
            for pid in self.ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        self.p.wait()

    def results(self) -> list[dict]:
        return [json.loads(line.split(":", 1)[1]) for line in self.stdout().splitlines() if ":{" in line]


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            text = stat.read_text()
            if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@pytest.fixture
def job(tmp_path):
    """Starts nodes (`start(node, *worker args)`) on one port; kills whatever is left, and checks nothing is."""
    (tmp_path / "worker.py").write_text(WORKER)
    port = free_port()
    nodes: list[Node] = []

    def start(node: int, *args: str, restarts: int = 2, script: Path = tmp_path / "worker.py") -> Node:
        nodes.append(Node(tmp_path, node, port, [str(script), *args], f"_{len(nodes)}", restarts))
        return nodes[-1]

    try:
        yield start
    finally:
        for n in nodes:
            n.kill()
    assert leftover_processes([pid for n in nodes for pid in (n.p.pid, *n.ranks)]) == []


def test_a_rank_that_fails_once_restarts_both_nodes_together_on_the_job_s_budget(job):
    nodes = [job(k, "once", "4") for k in (0, 1)]
    assert [n.wait(30) for n in nodes] == [0, 0], [n.stderr() for n in nodes]
    for n in nodes:
        assert "restart 1 of 2" in n.stderr() and "restart 2 of 2" not in n.stderr(), n.stderr()
        assert "all 2 nodes joined for restart 1 of 2" in n.stderr()
        # Both ranks saw the same restart count, and the sum of (1 + 2) * (step + 1) over 4 steps.
        assert [(r["restart_count"], r["total"]) for r in n.results()] == [(1, 30.0)], n.stdout()
    # Node 1's own failure; on node 0, node 1's (its rank may have failed too, losing its peer: then after it).
    assert "rank 1 failed (failure 1)" in nodes[1].stderr() and "exited with status 3" in nodes[1].stderr()
    assert "node 1 (" in nodes[0].stderr() and "failed: rank 1: exited with status 3" in nodes[0].stderr()
    assert "another node's job failed" not in nodes[0].stderr()  # a restart is not the final failure's relay


def test_the_trainer_on_node_0_records_the_restart_with_the_cause_on_node_1(job, tmp_path):
    run = tmp_path / "run"
    nodes = [job(k, str(run), "kill", "1", "5", script=WORKERS / "restart_worker.py") for k in (0, 1)]
    assert [n.wait(60) for n in nodes] == [0, 0], [n.stderr() for n in nodes]
    assert "restart 1 of 2: node 1 (" in nodes[0].stderr() and "failed: rank 1: killed by SIGKILL" in nodes[0].stderr()
    (restart,) = json.loads((run / "run.json").read_text())["restarts"]  # rank 0's record, on node 0
    assert (restart["restart"], restart["failed_rank"], restart["cause"]) == (1, 1, "killed by SIGKILL"), restart
    assert restart["resumed_from_step"] == 4 and restart["steps_lost"] == 0, restart


def test_a_node_lost_with_its_rank_is_started_again_and_the_job_finishes(job):
    node0, node1 = job(0, "run", "30"), job(1, "run", "30")
    node1.wait_for("rank 1 step 3 restart 0", 30)
    node1.kill()  # the launcher and its rank, as a lost machine
    node0.wait_for("missing: node 1", 20)  # its rank lost its peer; node 0 waits for node 1, naming it
    again = job(1, "run", "30")
    assert [node0.wait(40), again.wait(40)] == [0, 0], (node0.stderr(), again.stderr())
    assert "node 1 was started again: it rejoins the job at restart 1 of 2" in again.stderr(), again.stderr()
    for n in (node0, again):
        assert [(r["restart_count"], r["total"]) for r in n.results()] == [(1, 3.0 * 30 * 31 / 2)], n.stdout()
    waited = [line for line in node0.stderr().splitlines() if "missing: node 1" in line]
    assert "rendezvous for restart 1 of 2: 1/2 nodes joined (node 0 " in waited[0], node0.stderr()


def test_a_node_started_again_while_the_others_run_on_moves_them_to_the_next_restart(job):
    node0, node1 = job(0, "apart", "40"), job(1, "apart", "40")
    node1.wait_for("rank 1 step 3 restart 0", 30)
    node1.kill()
    again = job(1, "apart", "40")  # node 0's rank has not noticed: node 1 moves the job on, and node 0 follows
    assert [node0.wait(40), again.wait(40)] == [0, 0], (node0.stderr(), again.stderr())
    assert "restart 1 of 2: node 1 (" in node0.stderr() and "left (its launcher was lost" in node0.stderr()
    assert "rank 0 failed" not in node0.stderr()  # its rank was restarted healthy, not failed
    assert "rejoins the job at restart 1 of 2" in again.stderr() and "left (" not in again.stderr()
    for n in (node0, again):
        assert [(r["restart_count"], r["total"]) for r in n.results()] == [(1, 3.0 * 40)], n.stdout()


def test_with_no_restart_left_both_nodes_end_with_the_root_cause(job):
    started = time.monotonic()
    nodes = [job(k, "always", "4") for k in (0, 1)]
    assert [n.wait(40) for n in nodes] == [1, 1], [n.stderr() for n in nodes]
    assert time.monotonic() - started < 40
    for n in nodes:
        err = n.stderr()
        assert "Root cause: rank 1 (local rank 0)" in err and "exited with status 3" in err, err
        assert "restart 2 of 2" in err
    assert "no restart left: the job failed 3 time(s), --max-restarts 2" in nodes[1].stderr()
    assert "another node's job failed: stopping the ranks of this node" in nodes[0].stderr()


def test_a_node_started_again_with_no_restart_left_is_refused_with_the_fix(job):
    node0, node1 = job(0, "apart", "20", restarts=0), job(1, "apart", "20", restarts=0)
    node1.wait_for("rank 1 step 3 restart 0", 30)
    node1.kill()
    again = job(1, "apart", "20", restarts=0)
    assert again.wait(20) == 1
    err = again.stderr()
    assert "node 1 (" in err and "was started again while the job runs, but the job has no restart left" in err, err
    assert "(--max-restarts 0, 0 used). Fix: stop every node, then start every node again, node 0 first" in err
    assert node0.wait(40) == 1  # its rank's last all-reduce finds its peer gone: the job's final failure


def test_when_node_0_is_lost_the_other_nodes_say_the_job_cannot_go_on_and_how_to_start_it_again(job):
    node0, node1 = job(0, "apart", "40"), job(1, "apart", "40")
    node1.wait_for("rank 1 step 3 restart 0", 30)
    node0.kill()  # the node that serves the rendezvous store
    assert node1.wait(30) == 1
    err = node1.stderr()
    assert "lost node 0's rendezvous store at 127.0.0.1:" in err, err
    assert "node 0 serves the store, and the job cannot go on without it" in err
    assert "start every node again, node 0 first (" in err and "--node-rank 0" in err
