"""The checker's report: items, their JSON document and the terminal table.

JSON schema "dtcore.check/1" (docs/check.md): {"schema", "mode", "status", "counts", "host",
"elapsed_s", "world", "backend", "facts", "gpus", "items": [{"id", "group", "title", "status",
"value", "message", "fix"}], and in the distributed mode "ranks", "nodes", "bandwidth"}.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
from collections.abc import Sequence
from typing import Any

from ..units import format_bytes


def rank_ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5', as dtcore's C++ messages write rank sets (format_ranks in roster.h)."""
    out, ranks = [], sorted(ranks)
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)


SCHEMA = "dtcore.check/1"
STATUSES = ("PASS", "WARN", "FAIL")

# Report order and headings of the groups; unknown groups follow in order of appearance.
GROUPS = {
    "version": "versions",
    "gpu": "GPUs",
    "launch": "launcher",
    "network": "network",
    "host": "host",
    "env": "environment",
    "distributed": "distributed",
    "consistency": "consistency across ranks",
    "ranks": "other ranks",
    "nodes": "nodes",
    "bandwidth": "bandwidth",
}


@dataclasses.dataclass(frozen=True)
class Item:
    """One judged line: PASS, WARN or FAIL, the value seen, what it means, and the fix."""

    id: str
    group: str
    title: str
    status: str
    value: str
    message: str = ""
    fix: str = ""

    @classmethod
    def make(cls, id: str, title: str, status: str, value: str, message: str = "", fix: str = "") -> Item:
        return cls(id, id.split(".", 1)[0], title, status, value, message, fix)

    @classmethod
    def of(cls, item: Any) -> Item:
        """From a judged C++ item (_C.CheckItem) or a JSON item (dict)."""
        if isinstance(item, dict):
            return cls(**item)
        return cls(item.id, item.group, item.title, item.status, item.value, item.message, item.fix)


def worst(statuses: Any) -> str:
    level = max((STATUSES.index(s) for s in statuses), default=0)
    return STATUSES[level]


@dataclasses.dataclass
class Report:
    """What `dtcore.check.run()` returns and `python -m dtcore.check` prints."""

    items: list[Item]
    host: str
    mode: str = "local"  # "local" | "distributed"
    elapsed_s: float = 0.0
    world: dict | None = None  # the job as dtcore.init() would read it
    backend: str = "gloo"
    facts: dict = dataclasses.field(default_factory=dict)  # versions that must agree across ranks
    gpus: dict = dataclasses.field(default_factory=dict)
    ranks: list = dataclasses.field(default_factory=list)  # distributed: one summary per rank
    nodes: list = dataclasses.field(default_factory=list)  # distributed: one summary per host
    bandwidth: dict | None = None  # distributed: the allreduce sweep and the link test

    @property
    def status(self) -> str:
        return worst(i.status for i in self.items)

    @property
    def ok(self) -> bool:
        """True when nothing failed (warnings allowed)."""
        return self.status != "FAIL"

    @property
    def failures(self) -> list[Item]:
        return [i for i in self.items if i.status == "FAIL"]

    @property
    def warnings(self) -> list[Item]:
        return [i for i in self.items if i.status == "WARN"]

    def item(self, id: str) -> Item:
        for i in self.items:
            if i.id == id:
                return i
        raise KeyError(f"no item '{id}' in this report; it has: {', '.join(i.id for i in self.items)}")

    def counts(self) -> dict[str, int]:
        return {s: sum(i.status == s for i in self.items) for s in STATUSES}

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "mode": self.mode,
            "status": self.status,
            "counts": self.counts(),
            "host": self.host,
            "elapsed_s": round(self.elapsed_s, 3),
            "world": self.world,
            "backend": self.backend,
            "facts": self.facts,
            "gpus": self.gpus,
            "items": [dataclasses.asdict(i) for i in self.items],
            "ranks": self.ranks,
            "nodes": self.nodes,
            "bandwidth": self.bandwidth,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        return cls(
            items=[Item.of(i) for i in d["items"]],
            host=d["host"],
            mode=d.get("mode", "local"),
            elapsed_s=d.get("elapsed_s", 0.0),
            world=d.get("world"),
            backend=d.get("backend", "gloo"),
            facts=d.get("facts", {}),
            gpus=d.get("gpus", {}),
            ranks=d.get("ranks", []),
            nodes=d.get("nodes", []),
            bandwidth=d.get("bandwidth"),
        )

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format(self, width: int | None = None) -> str:
        """The terminal table: grouped, one line per item, message and fix under WARN/FAIL."""
        width = width or max(80, min(shutil.get_terminal_size((120, 24)).columns, 160))
        order = list(GROUPS)
        groups: dict[str, list[Item]] = {}
        for i in self.items:
            groups.setdefault(i.group, []).append(i)
            if i.group not in order:
                order.append(i.group)
        title_w = min(28, max((len(i.title) for i in self.items), default=10))
        lines = []
        for g in order:
            if g not in groups:
                continue
            lines.append(GROUPS.get(g, g))
            for i in groups[g]:
                note = f"  ({i.message})" if i.status == "PASS" and i.message else ""
                lines.append(f"  {i.status}  {i.title:<{title_w}}  {i.value}{note}")
                if i.status != "PASS":
                    indent = " " * 8
                    for text in (i.message, "fix: " + i.fix):
                        lines.extend(textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  "))
            if g == "bandwidth" and self.bandwidth:
                lines.extend(format_bandwidth(self.bandwidth))
        c = self.counts()
        where = f"{len(self.ranks)} ranks on {len(self.nodes)} node(s)" if self.ranks else self.host
        lines.append(
            f"dtcore.check: {self.status} - {c['PASS']} passed, {c['WARN']} warning(s), {c['FAIL']} failure(s) "
            f"({where}, {self.elapsed_s:.2f} s)"
        )
        return "\n".join(lines)


def format_bandwidth(bw: dict) -> list[str]:
    lines = [
        f"        allreduce ({bw['dtype']}, sum) on {bw['backend']}, {bw['world_size']} ranks: "
        "busbw = algbw x 2(n-1)/n",
        f"        {'size':>10}  {'iters':>5}  {'time (us)':>10}  {'algbw (GB/s)':>12}  {'busbw (GB/s)':>12}",
    ]
    for r in bw["results"]:
        lines.append(
            f"        {format_bytes(r['bytes']):>10}  {r['iters']:>5}  {r['time_us']:>10.1f}  "
            f"{r['algbw_gbps']:>12.3f}  {r['busbw_gbps']:>12.3f}"
        )
    return lines
