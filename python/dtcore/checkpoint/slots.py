"""The files of in-memory checkpoints: one safetensors file per rank and slot, `slot<j>/rank<r>.safetensors` in a
node directory, mapped into memory, with a record at its end naming the step it holds.

A rank's own copies (memory.py) write such a file once per layout and copy into its mapping; the replicas a
rank keeps of a rank on another node (replica.py) are byte copies of the other rank's file. Either way the
file says everything about itself: its header's metadata holds the static part of the rank's manifest report
(`dtcore_static`: its tensors and chunks, rank 0's aliases and bucket plan), its record the rest (step, RNG
states, data position, rank 0's schedule and optimizer hyperparameters).

The record is an area at the end of the file (the entry RECORD): a marker (the step + 1, or 0: no step), the
record's length, then its JSON, written through a Python mmap of the same pages (no system call). The marker
is cleared before the file's bytes change and set after they and the record are complete, so that a process
killed in between leaves a file without a step.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any

import torch

from .. import _C
from . import manifest
from .save import remove_file

SLOTS = 2
RECORD = "__record__"  # the entry of each file that holds its record
MIN_RECORD_ROOM = 1 << 16
_HEAD = struct.Struct("<QQ")  # the step + 1 (0: none), the record's length; then the record's JSON
HEAD_BYTES = _HEAD.size


def slot_directory(directory: str, slot: int) -> str:
    return os.path.join(directory, f"slot{slot}")


def slot_file(directory: str, slot: int, rank: int) -> str:
    """Rank `rank`'s file of slot `slot` in node directory `directory` (its own copy, or a replica of it)."""
    return os.path.join(slot_directory(directory, slot), manifest.file_name(rank))


class SlotFile:
    """A slot's file, mapped twice: `mapped` (a uint8 tensor of the whole file, which copies go into and
    replicas are sent from) and a Python mmap for the record. `record_at`: where the record area starts."""

    def __init__(self, path: str, size: int, record_at: int) -> None:
        self.path, self.size, self.record_at = path, size, record_at
        self.record_room = size - record_at - HEAD_BYTES  # bytes a record may take (less where entries follow it)
        self.views: list[torch.Tensor] = []  # write(): its entries' bytes in the mapping, in their order
        self.mapped = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        with open(path, "r+b") as f:
            self.mm = mmap.mmap(f.fileno(), size)

    @classmethod
    def write(cls, path: str, static: dict[str, Any], entries: list[tuple[str, torch.Tensor]]) -> SlotFile:
        """Writes `entries` (RECORD among them) as the file at `path`, whole, and maps it."""
        _C.write_safetensors(path, entries, {"format": "pt", "dtcore_static": json.dumps(static)})
        header, start = read_header(path)
        lo, hi = header[RECORD]["data_offsets"]
        file = cls(path, os.path.getsize(path), start + lo)
        file.record_room = hi - lo - HEAD_BYTES
        file.views = [file.mapped[start + a : start + b] for a, b in (header[k]["data_offsets"] for k, _ in entries)]
        return file

    @classmethod
    def allocate(cls, path: str, size: int, record_at: int) -> SlotFile:
        """A new file of `size` zero bytes at `path` (the old one removed), its pages reserved: a tmpfs without
        room fails here (OSError ENOSPC), never later as a SIGBUS in the middle of a copy into the mapping."""
        remove_file(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            os.close(fd)
            remove_file(path)
            raise
        os.close(fd)
        return cls(path, size, record_at)

    def clear(self) -> None:
        """From here until commit(), this file holds no step."""
        self.mm[self.record_at : self.record_at + 8] = bytes(8)

    def commit(self, step: int, payload: bytes) -> None:
        """The record, then the marker that makes it one."""
        body = self.record_at + HEAD_BYTES
        self.mm[body : body + len(payload)] = payload
        self.mm[self.record_at + 8 : self.record_at + 16] = len(payload).to_bytes(8, "little")
        self.mm[self.record_at : self.record_at + 8] = (step + 1).to_bytes(8, "little")

    def commit_bytes(self, tail: bytes) -> None:
        """The record area as another file's (`tail`: its bytes from its record_at on), the marker last."""
        self.mm[self.record_at + 8 : self.record_at + len(tail)] = tail[8:]
        self.mm[self.record_at : self.record_at + 8] = tail[:8]

    def close(self) -> None:
        self.mm.close()


def read_header(path: str) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and where its data starts."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(length)), 8 + length


def marker_of(tail: bytes) -> int:
    """The step a record area's bytes name (-1: none)."""
    return int.from_bytes(tail[:8], "little") - 1


def read_record(path: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(static report, record) of a file whose marker names a step, else None."""
    try:
        header, start = read_header(path)
        lo, _ = header[RECORD]["data_offsets"]
        with open(path, "rb") as f:
            f.seek(start + lo)
            marker, length = _HEAD.unpack(f.read(HEAD_BYTES))
            if marker == 0:
                return None
            record = json.loads(f.read(length))
        if record.get("step") != marker - 1:
            return None
        return json.loads(header["__metadata__"]["dtcore_static"]), record
    except (OSError, ValueError, KeyError, struct.error):
        return None


def recorded(directory: str, rank: int, world: int) -> dict[int, int]:
    """{step: slot} of the files of rank `rank` in `directory` that hold a step, for a job of `world` ranks (a
    copy made at another world size is left out: its shares were cut for that size)."""
    found = {}
    for slot in range(SLOTS):
        read = read_record(slot_file(directory, slot, rank))
        if read is not None and read[0].get("world_size") == world and read[0].get("rank") == rank:
            found[int(read[1]["step"])] = slot
    return found


def clear_record(path: str) -> None:
    """A file no longer holds a step (its marker cleared, through the file)."""
    try:
        header, start = read_header(path)
        with open(path, "r+b") as f:
            f.seek(start + header[RECORD]["data_offsets"][0])
            f.write(bytes(8))
    except (OSError, ValueError, KeyError):
        pass
