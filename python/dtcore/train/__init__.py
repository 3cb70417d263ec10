"""The bound trainer: `dtcore.Trainer` and `python -m dtcore.train`.

config (TrainConfig and its sections, presets, TOML, --key=value), trainer (the loop), data (the
shipped corpus and token batches), gpt (the built-in model), metrics (run directory, progress,
MFU, stragglers), memory (expected memory and the out-of-memory diagnosis), resume (random
generators and preemption signals); rundir, monitor and plot read a run directory back
(python -m dtcore.monitor, python -m dtcore.plot, and the plots a run writes at its end).
docs/train.md is the reference.
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
