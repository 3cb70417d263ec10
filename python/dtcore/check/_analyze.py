"""python -m dtcore.check --analyze DIR: lines up the ranks' flight records and names the culprit.

Each rank dumps its last collectives to `flight-rank<r>.jsonl` on a failure, a timeout or SIGUSR2
(beside its log with log_dir, else in a folder of the job's under the temporary directory; the
warning that announces the dump names it). Read together, the records answer in order:

1. Did the ranks call different collectives? The first sequence number at which their signatures
   differ is where their code parted (See Note [Collective signature] in communicator.h): each
   rank's call there is named.
2. Otherwise, did a rank stop issuing collectives? The ranks behind the others are the ones to
   look at (dead, stopped, or busy elsewhere), with what the others were waiting in.
3. Otherwise, the first collective that failed, and where.

No torch here: it reads JSON only, so it runs wherever the logs were copied.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ._report import rank_ranges


@dataclasses.dataclass
class Records:
    rank: int
    world: int
    host: str
    path: Path
    by_seq: dict[int, dict]

    @property
    def last(self) -> int:
        return max(self.by_seq, default=0)


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2,5'; [3] -> 'rank 3'."""
    return ("ranks " if len(ranks) > 1 else "rank ") + rank_ranges(ranks)


def _call(record: dict) -> str:
    detail = f" ({record['detail']})" if record.get("detail") else ""
    label = f" [{record['label']}]" if record.get("label") else ""
    return f"{record['op']}{detail}{label}"


def load(folder: str | Path) -> dict[int, Records]:
    """Every flight-rank*.jsonl in `folder`, by rank. ValueError naming the file for a bad one."""
    out: dict[int, Records] = {}
    for path in sorted(Path(folder).glob("flight-rank*.jsonl")):
        records: dict[int, dict] = {}
        rank = world = -1
        host = "?"
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                rank, world, host = int(r["rank"]), int(r["world"]), str(r["host"])
                records[int(r["seq"])] = r
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n} is not a flight record line ({e}): {line[:80]!r}") from None
        if rank >= 0:
            out[rank] = Records(rank, world, host, path, records)
    return out


def analyze(folder: str | Path) -> tuple[bool, str]:
    """(found a problem, the report). ValueError when `folder` holds no flight record."""
    ranks = load(folder)
    if not ranks:
        raise ValueError(
            f"{folder} holds no flight record (flight-rank<r>.jsonl). Fix: pass the folder the dtcore warning "
            "'flight record of rank ... written to' named (the log_dir, or dtcore-flight-* under the temporary "
            "directory), after copying every rank's file there; `kill -USR2 <pid>` makes a live rank dump its own."
        )
    world = max(r.world for r in ranks.values())
    lines = [f"flight records of {_ranks(list(ranks))} (world {world}) in {folder}"]
    missing = [r for r in range(world) if r not in ranks]
    if missing:
        lines.append(
            f"  no record from {_ranks(missing)}: died before dumping, or never failed; copy their files here, "
            "or `kill -USR2` them while they run"
        )

    # 1. The first collective the ranks disagree on; only where every rank still holds a record.
    common = set.intersection(*(set(r.by_seq) for r in ranks.values()))
    for seq in sorted(common):
        signatures = {r.by_seq[seq]["signature"] for r in ranks.values()}
        if len(signatures) > 1:
            calls: dict[str, list[int]] = {}
            for r in ranks.values():
                calls.setdefault(_call(r.by_seq[seq]), []).append(r.rank)
            lines.append(f"DIVERGED at collective #{seq}: the ranks called different collectives")
            for call, who in sorted(calls.items(), key=lambda kv: (-len(kv[1]), kv[1])):
                hosts = sorted({ranks[r].host for r in who})
                lines.append(f"  - {_ranks(who)} (host {', '.join(hosts)}): {call}")
            lines.append(
                "Fix: every rank must issue the same collectives in the same order, with the same sizes, dtypes, "
                "reductions and roots; find where the ranks' code paths part before this call."
            )
            return True, "\n".join(lines)

    # 2. A rank that stopped issuing while the others went on.
    last = {r.rank: r.last for r in ranks.values()}
    ahead = max(last.values())
    behind = [r for r, seq in last.items() if seq < ahead]
    if behind or missing:
        for r in sorted(behind):
            rec = ranks[r]
            last_call = rec.by_seq.get(rec.last)
            what = f"#{rec.last} {_call(last_call)} ({last_call['state']})" if last_call else "none"
            lines.append(f"  - rank {r} (host {rec.host}): its last collective is {what}")
        waiting = [r for r, seq in last.items() if seq == ahead]
        sample = ranks[waiting[0]].by_seq[ahead]
        lines.append(
            f"BEHIND: {_ranks(behind + missing)} never issued collective #{ahead}, which {_ranks(waiting)} "
            f"waited in: {_call(sample)} ({sample['state']}). Look at {_ranks(behind + missing)} first: dead, "
            "stopped, or busy in their own code (their own logs say which)."
        )
        return True, "\n".join(lines)

    # 3. Every rank issued the same collectives: the first failure, if any.
    failures = sorted(
        (rec["finished"] or rec["started"], seq, r.rank)
        for r in ranks.values()
        for seq, rec in r.by_seq.items()
        if rec["state"] != "succeeded"
    )
    if not failures:
        lines.append(f"OK: every rank issued the same {len(common)} collectives, and each succeeded")
        return False, "\n".join(lines)
    _, seq, rank = failures[0]
    states: dict[str, list[int]] = {}
    for r in ranks.values():
        states.setdefault(r.by_seq[seq]["state"], []).append(r.rank)
    lines.append(
        f"FAILED: the ranks issued the same collectives; the first that did not succeed is #{seq} "
        f"{_call(ranks[rank].by_seq[seq])}: "
        + "; ".join(f"{state} on {_ranks(who)}" for state, who in sorted(states.items()))
        + ". The lowest rank's error in its log says why."
    )
    return True, "\n".join(lines)
