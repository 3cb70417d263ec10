"""Reading a run directory of `python -m dtcore.train` (RUN_DIR/run.json, RUN_DIR/metrics/rank<r>.jsonl),
for dtcore.monitor and dtcore.plot. The layout is the trainer's (Note [Run directory] in
dtcore/train/metrics.py); this module only reads it, and tolerates what a live or crashed run
leaves: a rank with no line yet, a metric that is null, a line still being written (no newline
yet: skipped until it is complete).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import statistics

from ... import _C
from ..metrics import WINDOW, Straggler, own_time, slow_ranks


@dataclasses.dataclass
class Run:
    """What the run directory holds: run.json (or {} before it is written) and every rank's lines."""

    path: str
    info: dict
    train: dict[int, list[dict]]  # rank -> its "train" lines, in step order
    evals: list[dict]  # every rank's "eval" lines
    restarts: list[dict] = dataclasses.field(default_factory=list)  # rank 0's "restart" lines, in order

    @property
    def ranks(self) -> list[int]:
        return sorted(self.train)

    def host(self, rank: int) -> str:
        lines = self.train.get(rank) or []
        if lines and lines[-1].get("host"):
            return str(lines[-1]["host"])
        hosts = self.info.get("hosts") or []
        return str(hosts[rank]) if rank < len(hosts) else "?"


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The command line of dtcore.monitor and dtcore.plot: RUN_DIR, then each tool's own options."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds run.json and metrics/)")
    return p


def _lines(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for line in text.split("\n")[:-1]:  # the piece after the last newline is not a whole line yet
        if line.strip():
            out.append(json.loads(line))
    return out


def load(path: str) -> Run:
    """Reads RUN_DIR; ConfigError when it is absent or holds no run (neither run.json nor metrics)."""
    if not os.path.isdir(path):
        raise _C.ConfigError(
            f"'{path}' is not a directory. Fix: pass the run directory that python -m dtcore.train writes "
            "(it holds run.json and metrics/rank<r>.jsonl)."
        )
    info_path = os.path.join(path, "run.json")
    files = glob.glob(os.path.join(glob.escape(path), "metrics", "rank*.jsonl"))
    if not files and not os.path.isfile(info_path):
        raise _C.ConfigError(
            f"'{path}' holds no run: neither run.json nor metrics/rank<r>.jsonl is there. Fix: pass the run "
            "directory of python -m dtcore.train (its --run_dir), or wait until the run has started."
        )
    info = {}
    if os.path.isfile(info_path):
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
    train: dict[int, list[dict]] = {}
    evals: list[dict] = []
    restarts: list[dict] = []
    world = info.get("world_size")
    for file in files:
        match = re.search(r"rank(\d+)\.jsonl$", file)
        if not match:
            continue
        rank = int(match.group(1))
        if isinstance(world, int) and rank >= world:
            continue  # a rank of an earlier world size, before a resume on fewer ranks
        lines = _lines(file)
        # After a resume, the steps between the checkpoint and the interruption were run twice: the
        # later line of a step is the run's.
        latest = {x["step"]: x for x in lines if x.get("kind") == "train"}
        train[rank] = [latest[step] for step in sorted(latest)]
        latest_eval = {x["step"]: x for x in lines if x.get("kind") == "eval"}
        evals += latest_eval.values()
        restarts += [x for x in lines if x.get("kind") == "restart"]
    restarts.sort(key=lambda x: x["restart"])
    return Run(path, info, train, sorted(evals, key=lambda x: (x["step"], x.get("rank", 0))), restarts)


def values(lines: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over `lines`, leaving out the lines where it is null or absent."""
    pairs = [(x["step"], x[key]) for x in lines if x.get(key) is not None]
    return [s for s, _ in pairs], [float(v) for _, v in pairs]


@dataclasses.dataclass
class Spread:
    """Over the last WINDOW steps: the job's median step time, each rank's median own time
    (own_time()), and the stragglers among them (slow_ranks())."""

    job_median_s: float
    rank_median_s: dict[int, float]
    stragglers: list[Straggler]


def spread(run: Run, window: int = WINDOW) -> Spread | None:
    """None until some rank has a step time."""
    steps, own = [], {}
    for rank, lines in run.train.items():
        timed = [x for x in lines[-window:] if x.get("step_time_s") is not None]
        if timed:
            steps += [float(x["step_time_s"]) for x in timed]
            own[rank] = [own_time(float(x["step_time_s"]), x.get("wait_s")) for x in timed]
    if not own:
        return None
    medians = {rank: statistics.median(times) for rank, times in own.items()}
    slow = slow_ranks(medians, {rank: run.host(rank) for rank in medians})
    return Spread(statistics.median(steps), medians, slow)
