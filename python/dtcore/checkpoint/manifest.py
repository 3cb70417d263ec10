"""The checkpoint's manifest: what a checkpoint holds, where, and whether it is complete.

Note [Checkpoint layout]
~~~~~~~~~~~~~~~~~~~~~~~~
A checkpoint is one directory:

    rank00000.safetensors ... rank<N-1>.safetensors   one file per rank that saved, in safetensors
    manifest.json                                       written last, by rank 0

A checkpoint is complete exactly when manifest.json exists: every file is written to a temporary
name, fsynced and renamed (csrc/dtcore/checkpoint/atomic_file.h), and rank 0 writes the manifest
only after every rank has reported its file written, with its size and SHA-256. A save into a
directory that holds a checkpoint removes its manifest first, so that directory is never a
mixture that looks complete.

Every saved tensor is a *logical* tensor with a full shape and dtype ("model/<state_dict key>",
"optim/<parameter index>/<state key>"), stored as one or more flat chunks: elements [lo, hi) of
the flattened tensor, each in some rank's file under the key "<name>@<lo>". Chunks of one tensor
tile it exactly. Who wrote which chunk depends on how the state was held when saving (a
replicated model is split evenly across the ranks; ZeRO's optimizer state is written by the rank
that owns each piece), and does not matter when loading: a reader assembles any range of any
tensor from the chunks, which is how a checkpoint saved at N ranks loads at M.

The optimizer is kept in torch's own state_dict format (parameter indices numbered group after
group, as a torch optimizer over the whole model numbers them), so that ShardedOptimizer and plain
torch optimizers load each other's checkpoints. Hyperparameters, scalar state, `extra` and each
rank's `rank_extra` are JSON (checkpoint/values.py), their tensors in the files.

manifest.json:
    {"format": "dtcore-checkpoint", "version": 1, "step": int, "world_size": N,
     "dtcore_version", "torch_version", "created": unix time,
     "files": [{"name", "rank", "bytes", "sha256"}, ...],
     "tensors": {name: {"shape": [...], "dtype": "float32", "chunks": [[file index, lo, hi], ...]}},
     "aliases": {name: name of the tensor it shares memory with (tied weights)},
     "optimizer": null | {"class", "param_groups", "scalars": {index: {key: value}}, "zero": 0|1|2|3},
     "extra": value, "rank_extra": [value of rank 0, ..., rank N-1],
     "bucket_plan": null | {"world_size": N, "buckets": [[parameter name, ...], ...]}}
(bucket_plan: a bucket_mb="auto" model's chosen buckets, adopted on load at the same world size;
absent from checkpoints of dtcore versions before it, which read as null.)
"""

from __future__ import annotations

import json
import os
from typing import Any

from .. import _C

MANIFEST = "manifest.json"
FORMAT = "dtcore-checkpoint"
VERSION = 1


def file_name(rank: int) -> str:
    return f"rank{rank:05d}.safetensors"


def chunk_key(name: str, lo: int) -> str:
    return f"{name}@{lo}"


def write_json(path: str, value: Any) -> None:
    """`value` as JSON into the file `path`, which appears whole or not at all (_C.write_file_atomic: a
    temporary name, fsynced, renamed): the manifest, and the trainer's run.json."""
    _C.write_file_atomic(path, json.dumps(value, indent=1))


def is_complete(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, MANIFEST))


def read(directory: str) -> dict[str, Any]:
    """The manifest of the checkpoint in `directory`; CheckpointError naming what is wrong."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise _C.CheckpointError(
            f"{directory} is not a complete checkpoint: it has no {MANIFEST} (a save that did not finish, or not a "
            "dtcore checkpoint). Fix: load a complete one, or the directory that holds the step directories to "
            "get the newest complete one."
        )
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _C.CheckpointError(f"{path} is corrupt: {e}. Fix: load another checkpoint.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _C.CheckpointError(f"{path} is not a dtcore checkpoint manifest. Fix: load a dtcore checkpoint.")
    if manifest.get("version") != VERSION:
        raise _C.CheckpointError(
            f"{path} has format version {manifest.get('version')}; this dtcore ({_C.__version__}) reads version "
            f"{VERSION}. Fix: load it with the dtcore version that wrote it ({manifest.get('dtcore_version')})."
        )
    return manifest


def latest(path: str) -> str | None:
    """The newest complete checkpoint: `path` itself if it is one, else the complete checkpoint
    directly under `path` with the highest step (ties: the newest manifest). None when none is."""
    path = os.fspath(path)
    if is_complete(path):
        return path
    if not os.path.isdir(path):
        return None
    best: tuple[int, float, str] | None = None
    for entry in os.scandir(path):
        if not entry.is_dir() or not is_complete(entry.path):
            continue
        try:
            manifest = read(entry.path)
        except _C.CheckpointError:
            continue  # an unreadable manifest is not a complete checkpoint to resume from
        key = (int(manifest.get("step", -1)), os.path.getmtime(os.path.join(entry.path, MANIFEST)), entry.path)
        if best is None or key > best:
            best = key
    return None if best is None else best[2]


def resolve(path: str) -> str:
    """latest(path), or a CheckpointError saying what was found instead."""
    found = latest(path)
    if found is not None:
        return found
    if not os.path.exists(path):
        raise _C.CheckpointError(f"no checkpoint at {path}: it does not exist. Fix: check the path.")
    incomplete = sorted(e.name for e in os.scandir(path) if e.is_dir()) if os.path.isdir(path) else []
    seen = f" Incomplete ones (no {MANIFEST}): {', '.join(incomplete[:5])}." if incomplete else ""
    raise _C.CheckpointError(
        f"no complete checkpoint in {path}.{seen} Fix: load a directory that dtcore.save_checkpoint completed."
    )
