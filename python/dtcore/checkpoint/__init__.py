"""Checkpoints: safetensors files per rank and a JSON manifest written last; no pickle anywhere.

    dtcore.save_checkpoint(path, model=, optimizer=, step=, extra=, rank_extra=, async_save=)
    dtcore.load_checkpoint(path, model=, optimizer=) -> {"step", "extra", "rank_extra", "path"}
    dtcore.checkpoint.latest(path)   the newest complete checkpoint under path, or None
    dtcore.checkpoint.wait()         the asynchronous save in flight, done (or its error raised)
    dtcore.checkpoint.abandon(why)   the same, given up after a short grace: the run failed
    dtcore.checkpoint.export(path, out.safetensors)   the model's weights for use without dtcore
    dtcore.checkpoint.write_json(path, value)          a JSON file that appears whole or not at all
    dtcore.checkpoint.check_extra(value, where)        a CheckpointError now if extra=value could not be saved

A checkpoint saved by N ranks loads at any number of ranks, with or without ZeRO, and into a
plain torch optimizer. See Note [Checkpoint layout] in manifest.py and docs/checkpoint.md.
"""

from .load import export, load_checkpoint
from .manifest import latest, write_json
from .save import abandon, save_checkpoint, wait
from .values import check_extra

__all__ = ["save_checkpoint", "load_checkpoint", "latest", "wait", "abandon", "export", "write_json", "check_extra"]
