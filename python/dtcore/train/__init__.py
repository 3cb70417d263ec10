"""The bound trainer: `dtcore.Trainer` and `python -m dtcore.train`.

The loop: config (TrainConfig and its sections, model sizes, presets, TOML, --key=value), trainer
(Trainer.fit), metrics (run directory, progress, MFU, stragglers), memory (expected memory and the
out-of-memory diagnosis), resume (random generators and preemption signals), reference (--help and
docs/train.md's tables, from the dataclasses). Apart from the loop: demo/, the built-in GPT and its
text (what python -m dtcore.train trains), and rundir/, which reads a run directory back (python -m
dtcore.monitor, python -m dtcore.plot, and the plots a run writes at its end). docs/train.md is the
reference.
"""

from .config import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    TrainingConfig,
)
from .resume import EXIT_PREEMPTED
from .trainer import Preempted, Trainer

__all__ = [
    "Trainer",
    "TrainConfig",
    "ModelConfig",
    "DataConfig",
    "OptimConfig",
    "TrainingConfig",
    "CheckpointConfig",
    "LoggingConfig",
    "ParallelConfig",
    "Preempted",
    "EXIT_PREEMPTED",
]
