"""python -m dtcore.monitor RUN_DIR: the live state of a run of `python -m dtcore.train`, from its metrics.

Last step of total, loss (mean over ranks at the last step every rank has reached), last eval loss,
tokens/s and MFU (job-wide, as rank 0 logged them), ETA from the median step time, when the last
line was written, and the per-rank step-time spread over the last 20 steps with the stragglers
named (a rank whose median own time, its step time less its wait for the others, is > 1.1x the
job's). Refreshes every --interval seconds until
the run reaches its last step or Ctrl-C; --once prints once and exits.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
from collections.abc import Sequence

from ... import _C
from ..metrics import STRAGGLER_FACTOR, WINDOW
from .run import Run, load, parser, spread


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


def _progress(run: Run) -> tuple[int | None, int | None]:
    """(steps done, total steps): a run whose steps start at 0 has done last + 1, one counted from 1 has done last."""
    steps = [x["step"] for lines in run.train.values() for x in lines]
    total = run.info.get("num_iterations")
    if not steps:
        return None, total
    return max(steps) + (1 if min(steps) == 0 else 0), total


def summary(run: Run) -> str:
    """The monitor's text for one look at the run."""
    world = run.info.get("world_size") or len(run.ranks)
    hosts = sorted(set(run.info.get("hosts") or [run.host(r) for r in run.ranks]))
    lines = [f"run {run.path}: {world} rank(s) on {', '.join(hosts) or '?'}"]
    if not any(run.train.values()):
        return "\n".join(lines + ["no training step logged yet"])
    done, total = _progress(run)
    common = min(lines_[-1]["step"] for lines_ in run.train.values() if lines_)
    at_common = [x for lines_ in run.train.values() for x in lines_ if x["step"] == common]
    losses = [float(x["loss"]) for x in at_common if x.get("loss") is not None]
    last = max((x for lines_ in run.train.values() for x in lines_), key=lambda x: (x["step"], -x.get("rank", 0)))
    rank0 = run.train.get(0) or []
    head = rank0[-1] if rank0 else last
    parts = [f"step {last['step']}" + (f" ({done}/{total}, {100 * done / total:.0f}%)" if total else "")]
    if losses:
        parts.append(f"loss {statistics.fmean(losses):.4f} (step {common}, mean of {len(losses)} rank(s))")
    if run.evals:
        parts.append(f"eval loss {float(run.evals[-1]['eval_loss']):.4f} (step {run.evals[-1]['step']})")
    if head.get("tokens_per_s") is not None:
        parts.append(f"{float(head['tokens_per_s']):,.0f} tokens/s")
    parts.append(f"MFU {100 * float(head['mfu']):.1f}%" if head.get("mfu") is not None else "MFU n/a")
    s = spread(run)
    if s and total and done is not None:
        parts.append("finished" if done >= total else f"ETA {_duration((total - done) * s.job_median_s)}")
    age = time.time() - max(float(x.get("time", 0)) for lines_ in run.train.values() for x in lines_[-1:])
    parts.append(f"last line {_duration(max(0.0, age))} ago")
    lines.append(", ".join(parts))
    if run.restarts:
        lines.append(f"restarts: {len(run.restarts)}")
        lines += [f"  {restart_text(r)}" for r in run.restarts]
    if s:
        fastest = min(s.rank_median_s, key=s.rank_median_s.get)
        slowest = max(s.rank_median_s, key=s.rank_median_s.get)
        lines.append(
            f"median of the last {WINDOW} steps: step time {s.job_median_s:.3f} s; each rank's own time (less its "
            f"wait for the others) from {s.rank_median_s[fastest]:.3f} s (rank {fastest}) to "
            f"{s.rank_median_s[slowest]:.3f} s (rank {slowest})"
        )
        if s.stragglers:
            named = "; ".join(f"rank {x.rank} on {x.host}: {x.median_s:.3f} s ({x.factor:.2f}x)" for x in s.stragglers)
            lines.append(f"stragglers (> {STRAGGLER_FACTOR}x the job's median): {named}")
        else:
            lines.append(f"no straggler (every rank within {STRAGGLER_FACTOR}x the job's median)")
    return "\n".join(lines)


def restart_text(r: dict) -> str:
    """One restart as the monitor shows it: when, what failed, what it cost."""
    cause = f"rank {r['failed_rank']} on {r['failed_host']}: {r['cause']}" if r.get("cause") else "cause not recorded"
    lost = "?" if r.get("steps_lost") is None else r["steps_lost"]
    back = "" if r.get("recover_s") is None else f", training again {r['recover_s']:.1f} s after the failure"
    return f"#{r['restart']} at step {r['resumed_from_step']} ({cause}): {lost} step(s) lost{back}"


def finished(run: Run) -> bool:
    done, total = _progress(run)
    return bool(total) and done is not None and done >= total


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(
        "python -m dtcore.monitor",
        "Shows the live state of a run of python -m dtcore.train from its metrics: step, loss, tokens/s, ETA, "
        "and the per-rank step-time spread with stragglers named.",
    )
    p.add_argument("--once", action="store_true", help="print once and exit")
    p.add_argument("--interval", type=float, default=5.0, metavar="S", help="seconds between looks (default: 5)")
    a = p.parse_args(argv)
    if not a.interval > 0:
        p.error(f"--interval {a.interval}: need a positive number of seconds")
    try:
        while True:
            run = load(a.run_dir)
            print(summary(run), flush=True)
            if a.once or finished(run):
                return 0
            time.sleep(a.interval)
            print(flush=True)
    except _C.ConfigError as e:
        print(f"dtcore.monitor: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
