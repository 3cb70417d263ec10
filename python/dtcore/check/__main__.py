"""python -m dtcore.check: the resource checker's command line. Exit 0: nothing failed; 1: something
failed; 2: bad usage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._report import SCHEMA, Item, Report


def _parser() -> argparse.ArgumentParser:
    from . import DEFAULT_SIZES  # noqa: F401  (documents the default below)

    p = argparse.ArgumentParser(
        prog="python -m dtcore.check",
        description="Checks this node (or, under torchrun/srun/mpirun, every rank) for what breaks distributed "
        "training: GPUs, versions, launcher variables, network, host limits and known environment traps. "
        "Each item is PASS, WARN or FAIL, with the fix for anything that is not PASS.",
        epilog="Exit status: 0 when nothing failed (warnings allowed), 1 when an item failed, 2 for bad usage. "
        "Items and the JSON schema: docs/check.md.",
    )
    p.add_argument(
        "--analyze",
        metavar="DIR",
        help="instead of checking, read the ranks' flight records (flight-rank<r>.jsonl) in DIR and name where "
        "they diverged, which rank fell behind, or the first failure; exit 1 when a problem was found",
    )
    p.add_argument("--json", action="store_true", help=f"print the report as one JSON document (schema {SCHEMA})")
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="where checkpoints go: free disk is checked there (default: the working directory)",
    )
    p.add_argument("--log-dir", metavar="DIR", help="where logs go (default: DTCORE_LOG_DIR, when set)")
    p.add_argument(
        "--min-free-gb",
        dest="min_free_disk_gb",
        type=float,
        default=10.0,
        metavar="GB",
        help="warn when a checkpoint or log directory has less free disk, in GB of 10^9 bytes (default: 10)",
    )
    p.add_argument("--shm-path", default="/dev/shm", metavar="PATH", help="the shared-memory mount (default: /dev/shm)")
    p.add_argument(
        "--accelerate-config",
        metavar="FILE",
        help="an accelerate config to judge (default: accelerate's default_config.yaml, when present)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--distributed",
        dest="distributed",
        action="store_true",
        default=None,
        help="join the other ranks, compare and measure (default: when launched with several ranks)",
    )
    mode.add_argument(
        "--local", dest="distributed", action="store_false", help="check this process only, even under a launcher"
    )
    p.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="collective backend of the distributed mode (default: auto, as dtcore.init)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds to wait for the other ranks and for each collective (default: 60; "
        "DTCORE_TIMEOUT is judged as dtcore.init() reads it, not used for this wait)",
    )
    p.add_argument(
        "--no-bandwidth",
        dest="bandwidth",
        action="store_false",
        help="skip the allreduce sweep and the link test of the distributed mode",
    )
    p.add_argument(
        "--sizes",
        default="8B:64MiB",
        metavar="MIN:MAX",
        help="allreduce sizes of the sweep, doubling from MIN to MAX, with units B, KB/MB/GB (powers of "
        "1000) or KiB/MiB/GiB (powers of 1024) (default: 8B:64MiB)",
    )
    p.add_argument("--factor", type=int, default=2, metavar="F", help="size multiplier between steps (default: 2)")
    p.add_argument(
        "--iters",
        type=int,
        metavar="N",
        help="timed allreduces per size (default: 20 up to 64 KiB, 10 up to 4 MiB, 5 above)",
    )
    return p


def _torch_mismatch_report(error: str) -> Report:
    """When dtcore cannot load against this torch, the one thing to report is that, and the fix."""
    import socket

    message, _, fix = error.partition(" Fix: ")
    return Report(
        items=[Item.make("version.dtcore", "dtcore build", "FAIL", "cannot load", message, fix)],
        host=socket.gethostname(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits 2 on bad usage
    if args.analyze is not None:
        from ._analyze import analyze

        try:
            found, text = analyze(args.analyze)
        except ValueError as e:
            _parser().error(str(e))
        print(text, flush=True)
        return 1 if found else 0
    from .. import _guard

    if _guard.load_error is not None:
        report = _torch_mismatch_report(_guard.load_error)
    else:
        import dataclasses

        from .. import _C
        from . import Options, parse_size, run, size_range

        try:
            low, _, high = args.sizes.partition(":")
            sizes = size_range(parse_size(low, "--sizes"), parse_size(high or low, "--sizes"), args.factor)
            if args.iters is not None and args.iters < 1:
                raise ValueError(f"--iters {args.iters}: need at least 1")
            if not args.timeout > 0:
                raise ValueError(f"--timeout {args.timeout}: need a positive number of seconds")
        except (ValueError, _C.ConfigError) as e:
            _parser().error(str(e))
        # The flags' destinations are Options' field names.
        options = {f.name: getattr(args, f.name) for f in dataclasses.fields(Options) if hasattr(args, f.name)}
        try:
            report = run(**dict(options, sizes=sizes))
        except _C.ConfigError as e:  # an argument the checker cannot use, e.g. a missing --accelerate-config
            _parser().error(str(e))
    rank = (report.world or {}).get("rank", 0)
    if report.mode != "distributed" or rank == 0:
        print(report.to_json() if args.json else report.format(), flush=True)
    elif any(i.group == "distributed" and i.status == "FAIL" for i in report.items):
        # Rank 0 may be the one missing: every rank that could not finish says why, on stderr.
        print(f"rank {rank} ({report.host}):\n{report.format()}", file=sys.stderr, flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
