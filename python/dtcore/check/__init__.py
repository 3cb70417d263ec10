"""The resource checker: finds what will break a distributed job before it wastes GPU hours.

    python -m dtcore.check [--json]                     # this node
    torchrun --nproc_per_node=8 -m dtcore.check         # every rank, compared and measured
    report = dtcore.check.run(); report.ok; report.failures; print(report.format())

Each item is PASS, WARN or FAIL with the value seen and, when not PASS, the fix. docs/check.md
lists the items and the JSON schema. The checker uses bootstrap and comm, never the reverse:
it registers itself as init(preflight=True)'s probes when imported.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

from .. import _C, _guard
from ..bootstrap import preflight
from ..units import parse_bytes
from ._options import DEFAULT_SIZES, Options, default_iters, size_range
from ._report import SCHEMA, Item, Report

__all__ = [
    "run",
    "Options",
    "Report",
    "Item",
    "SCHEMA",
    "parse_size",
    "size_range",
    "DEFAULT_SIZES",
    "allreduce_sweep",
    "default_iters",
]

parse_size = parse_bytes  # sizes are read one way everywhere (dtcore.units)


def run(**options: Any) -> Report:
    """Runs the checker and returns its Report (the same as `python -m dtcore.check --json`).

    The keywords are the fields of dtcore.check.Options (each documented there). In the
    distributed mode every rank of the job must call it; under a running dtcore.init() it uses
    that context and leaves it running.
    """
    known = [f.name for f in dataclasses.fields(Options)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        import difflib

        close = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
        hints = "; ".join(f"'{n}'" + (f" (did you mean '{m[0]}'?)" if m else "") for n, m in close.items())
        raise _C.ConfigError(
            f"dtcore.check.run() got unknown option(s) {hints}. Fix: use the fields of "
            f"dtcore.check.Options: {', '.join(known)}."
        )
    o = Options(**options)
    if o.timeout is not None and (
        isinstance(o.timeout, bool) or not isinstance(o.timeout, (int, float)) or not 0 < o.timeout <= 1e9
    ):
        raise _C.ConfigError(
            f"dtcore.check.run(timeout={o.timeout!r}) is not a number of seconds the checker can "
            "wait. Fix: pass a positive number, e.g. timeout=60, or None for the job's own."
        )
    env = dict(os.environ if o.env is None else o.env)
    distributed = o.distributed
    if distributed is None:
        distributed = _launched_world(env, o) > 1
    if _guard.torch_mismatch() is not None:
        distributed = False  # an extension built for another torch must not run collectives; report it
    o = dataclasses.replace(o, env=env, distributed=distributed)

    from ._local import run_local

    local = run_local(o)
    if not distributed:
        return local
    from ._distributed import run_distributed

    return run_distributed(local, o)


# help(dtcore.check.run) and editors show the options, declared once in Options.
run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(Options).parameters.values()],
    return_annotation=Report,
)


def _launched_world(env: dict[str, str], o: Options) -> int:
    try:
        return _C.read_world(env, dict(o.overrides)).world_size
    except _C.DtcoreError:
        return 1  # the local probes report why the environment cannot be read


def _preflight(overrides: dict[str, Any], settings_args: dict[str, Any]) -> None:
    """init(preflight=True): this process's probes, judged with init()'s own arguments; FAILs raise."""
    import logging

    log = logging.getLogger("dtcore")
    report = run(
        distributed=False,
        preflight=True,
        overrides=overrides,
        backend=settings_args["backend"],
        timeout=settings_args["timeout"],
        log_dir=settings_args["log_dir"],
    )
    for item in report.warnings:
        log.warning("preflight: %s: %s %s Fix: %s", item.title, item.value, item.message, item.fix)
    if report.failures:
        lines = "\n".join(f"  - {i.title} ({i.value}): {i.message} Fix: {i.fix}" for i in report.failures)
        raise _C.ConfigError(
            f"init(preflight=True): {len(report.failures)} check(s) failed on host {report.host}:\n{lines}\n"
            "Run `python -m dtcore.check` for the whole report."
        )


preflight.register(_preflight)


def allreduce_sweep(sizes: Any = DEFAULT_SIZES, iters: Any = None) -> tuple[list[dict], list[int]]:
    """The distributed mode's allreduce sweep on the current context (every rank calls it).

    Returns one dict per size (bytes, count, iters, time_us of the slowest rank, algbw_gbps,
    busbw_gbps) and the sizes whose result was wrong on any rank.
    """
    from ._distributed import sweep

    return sweep(list(sizes), iters)
