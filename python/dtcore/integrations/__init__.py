"""Thin adapters that put dtcore behind other libraries' training loops, on dtcore's public names only.

    accelerate.py    Accelerator, DtcorePlugin: accelerate's prepare() gives dtcore models
                     (from dtcore.integrations.accelerate import Accelerator, DtcorePlugin)
    transformers.py  Trainer: Hugging Face's Trainer, on that Accelerator, with dtcore checkpoints
                     (from dtcore.integrations.transformers import Trainer, DtcorePlugin)
    lightning.py     DtcoreStrategy: Lightning's Trainer(strategy=DtcoreStrategy(zero=2)), or strategy="dtcore"
                     (lightning_zero.py: its sharded optimizers, schedulers and clipping)
                     (lightning_checkpoint.py: the hyperparameters and state_dict its checkpoints check)

Each adapter is imported by its own module path, so that `import dtcore` never needs the library it
adapts; nothing in dtcore imports them.
"""
