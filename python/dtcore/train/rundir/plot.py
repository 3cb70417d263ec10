"""python -m dtcore.plot RUN_DIR: PNG plots of a run of `python -m dtcore.train` into RUN_DIR/plots.

loss.png (mean train loss over ranks per step, and the eval loss), throughput.png (job-wide
tokens/s, and MFU where it was measured), memory.png (allocated and reserved per rank) and
step_time.png (each rank's step time, with the job's median: a straggler stands out). A metric
that is null in every line (memory and MFU on CPU) is said and its plot left out, never drawn as
zeros. An absent or empty run directory is refused with the fix.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Sequence

from ... import _C
from .run import Run, load, parser, values

_GIB = float(1 << 30)


def _figure(title: str, ylabel: str):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig, out_dir: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _discard(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _mean_by_step(run: Run, key: str) -> tuple[list[int], list[float]]:
    by_step: dict[int, list[float]] = {}
    for lines in run.train.values():
        for step, v in zip(*values(lines, key)):
            by_step.setdefault(step, []).append(v)
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def plot(run: Run) -> tuple[list[str], list[str]]:
    """Writes the plots; returns (paths written, notes on what was left out and why)."""
    out_dir = os.path.join(run.path, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written, notes = [], []
    name = os.path.basename(os.path.normpath(run.path))

    steps, loss = _mean_by_step(run, "loss")
    eval_steps, eval_loss = values(run.evals, "eval_loss")
    if loss or eval_loss:
        fig, ax = _figure(f"{name}: loss", "loss")
        if loss:
            ax.plot(steps, loss, label=f"train (mean of {len(run.ranks)} rank(s))")
        if eval_loss:
            ax.plot(eval_steps, eval_loss, "o-", label="eval")
        for i, r in enumerate(run.restarts):  # where each restarted job resumed
            ax.axvline(r["resumed_from_step"], color="tab:red", linestyle=":", label="restart" if i == 0 else None)
        ax.legend()
        written.append(_save(fig, out_dir, "loss.png"))
    else:
        notes.append("loss: no value logged yet")

    head = run.train.get(0) or next(iter(run.train.values()), [])
    steps, tps = values(head, "tokens_per_s")
    if tps:
        fig, ax = _figure(f"{name}: throughput (whole job)", "tokens/s")
        drawn = ax.plot(steps, tps, color="tab:blue", label="tokens/s (left)")
        ax.set_ylabel("tokens/s", color="tab:blue")
        mfu_steps, mfu = values(head, "mfu")
        if mfu:
            right = ax.twinx()
            drawn += right.plot(mfu_steps, [100 * m for m in mfu], "--", color="tab:orange", label="MFU (right)")
            right.set_ylabel("MFU (%)", color="tab:orange")
            ax.legend(drawn, [line.get_label() for line in drawn], loc="lower right")
        else:
            notes.append("MFU: null in every line (no peak FLOPs known, e.g. on CPU): not drawn")
        written.append(_save(fig, out_dir, "throughput.png"))
    else:
        notes.append("throughput: tokens_per_s null or absent in every line: no plot")

    fig, ax = _figure(f"{name}: memory per rank", "GiB")
    drew = False
    for rank in run.ranks:
        for key, style in (("mem_allocated_bytes", "-"), ("mem_reserved_bytes", "--")):
            steps, mem = values(run.train[rank], key)
            if mem:
                ax.plot(steps, [m / _GIB for m in mem], style, label=f"rank {rank} {key.split('_')[1]}")
                drew = True
    if drew:
        ax.legend(fontsize="small", ncol=2)
        written.append(_save(fig, out_dir, "memory.png"))
    else:
        _discard(fig)
        notes.append("memory: null in every line (a CPU run): no plot")

    fig, ax = _figure(f"{name}: step time per rank", "seconds")
    every: list[float] = []
    for rank in run.ranks:
        steps, times = values(run.train[rank], "step_time_s")
        every += times
        if times:
            ax.plot(steps, times, label=f"rank {rank} ({run.host(rank)})", linewidth=1)
    if every:
        ax.axhline(statistics.median(every), color="black", linestyle=":", label="job median")
        ax.legend(fontsize="small", ncol=2)
        written.append(_save(fig, out_dir, "step_time.png"))
    else:
        _discard(fig)
        notes.append("step time: no value logged yet")
    return written, notes


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(
        "python -m dtcore.plot",
        "Writes PNG plots of a python -m dtcore.train run (loss, throughput, memory, per-rank step time) into "
        "RUN_DIR/plots.",
    )
    a = p.parse_args(argv)
    try:
        run = load(a.run_dir)
    except _C.ConfigError as e:
        print(f"dtcore.plot: {e}", file=sys.stderr)
        return 1
    if not any(run.train.values()) and not run.evals:
        print(f"dtcore.plot: '{a.run_dir}' has no metric line yet: nothing to plot.", file=sys.stderr)
        return 1
    written, notes = plot(run)
    for path in written:
        print(f"dtcore.plot: wrote {path}")
    for note in notes:
        print(f"dtcore.plot: {note}")
    return 0
