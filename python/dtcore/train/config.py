"""The trainer's configuration: plain dataclass sections, presets, TOML files and `--key=value` overrides.

Each section is one concern; each field has a docstring (the string right under it), which
`--help` and docs/train.md are generated from (`reference_markdown`), so neither can drift.
Values are applied in order: defaults, `--preset`, `--config FILE.toml`, then `--key=value`.
A key is `section.field` or a field name that only one section has. Unknown keys and invalid
values are ConfigErrors that list the valid ones and name the closest match.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import types
import typing
from typing import Any, Literal

import tomllib

from .. import _C
from ..reducer.model import DEFAULT_BUCKET_MB
from .metrics import STRAGGLER_FACTOR, WINDOW

_REDUCER = _C.ReducerOptions()  # dtcore.wrap's defaults, written once in csrc/dtcore/reducer


@dataclasses.dataclass
class ModelConfig:
    """The built-in GPT of `python -m dtcore.train` (a Trainer given its own model ignores this section)."""

    n_layer: int = 2
    """Transformer blocks."""
    n_head: int = 2
    """Attention heads per block; n_embd must be a multiple of it."""
    n_embd: int = 64
    """Width of the residual stream."""
    block_size: int = 64
    """Context length in tokens: every training sequence has this many."""
    dropout: float = 0.0
    """Dropout probability in attention and after the MLP (0 for none)."""
    vocab_size: int = 0
    """Rows of the token embedding and of the logits; 0: the tokenizer's vocabulary. Otherwise at least the
    tokenizer's: a size padded for faster matmuls (GPT-2's 50257 as 50304, a multiple of 64, as nanoGPT does),
    whose extra rows no target ever names."""


@dataclasses.dataclass
class DataConfig:
    """The text `python -m dtcore.train` trains on."""

    path: str = ""
    """A UTF-8 text file to train on; empty: the corpus that ships with dtcore (the opening of
    Shakespeare's Coriolanus, public domain)."""
    tokenizer: Literal["char", "byte"] = "char"
    """char: one token per distinct character of the text (small vocabulary); byte: one token per
    UTF-8 byte (vocabulary 256, any text)."""
    eval_fraction: float = 0.1
    """Fraction of the text, at its end, held out for evaluation."""


@dataclasses.dataclass
class OptimConfig:
    """The optimizer (AdamW) and gradient clipping."""

    lr: float = 3e-3
    """Peak learning rate, reached at the end of warmup."""
    min_lr_ratio: float = 0.1
    """The cosine schedule ends at lr * min_lr_ratio."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    beta1: float = 0.9
    """AdamW's first-moment decay."""
    beta2: float = 0.95
    """AdamW's second-moment decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (dtcore.clip_grad_norm_); 0: no clipping."""


@dataclasses.dataclass
class TrainingConfig:
    """The loop: batch sizes, length, schedule, precision, evaluation."""

    num_iterations: int = 40
    """Optimizer steps to train for."""
    device_batch_size: int = 8
    """Sequences per micro-batch on each rank."""
    total_batch_size: int = 0
    """Sequences per optimizer step over all ranks; a multiple of device_batch_size x world size,
    the quotient being the micro-batches accumulated per step. 0: device_batch_size x world size."""
    warmup_steps: int = 5
    """Steps of linear warmup from 0 to optim.lr."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """After warmup: cosine decay to lr * min_lr_ratio at num_iterations, or constant."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """auto: bf16 autocast on a GPU that supports it, fp16 with a gradient scaler on one that does
    not, fp32 on CPU. bf16/fp16 autocast (fp16 adds the scaler); fp32: no autocast. On CUDA the
    trainer allows TF32 matmuls (what autocast leaves in fp32) and builds its AdamW fused."""
    compile: bool = False
    """Compile the wrapped model with torch.compile (model.compile(), after wrapping and activation
    checkpointing): the first step, and the first evaluation, take longer while graphs are compiled."""
    compile_backend: str = "inductor"
    """torch.compile's backend: inductor generates fused kernels; aot_eager traces forward and backward
    as inductor does but runs them eagerly, without generating code (for debugging a compiled run)."""
    seed: int = 1234
    """Every rank seeds Python, NumPy and torch with seed + rank."""
    deterministic: bool = False
    """Two runs of one configuration give the same bits: torch.use_deterministic_algorithms(True)
    (on CUDA with cuBLAS's fixed workspace, CUBLAS_WORKSPACE_CONFIG=:4096:8, unless set), and
    parallel.bucket_mb=auto takes fixed buckets of the default size, since a plan measured from
    timing may cut differently in another run. Slower on GPUs; on CPU most kernels are already
    deterministic, and a resumed run continues bit for bit without it (checkpoints keep the plan)."""
    eval_every: int = 20
    """Evaluate on held-out data every this many steps and at the end; 0: never."""
    eval_batches: int = 4
    """Micro-batches per rank in one evaluation."""


@dataclasses.dataclass
class CheckpointConfig:
    """Checkpoints in RUN_DIR/checkpoints/step_<8-digit step>/, through dtcore.save_checkpoint."""

    every: int = 0
    """Save every this many steps; 0: only at the end (and on preemption)."""
    at_end: bool = True
    """Save after the last step."""
    resume: str = "none"
    """none: start fresh; auto: continue from the newest complete checkpoint in RUN_DIR (fresh if
    there is none); or the path of a checkpoint directory."""
    async_save: bool = True
    """Write checkpoint files in the background; training goes on once the state is in host memory."""
    memory_every: int = 0
    """Copy every rank's state into its node's shared memory every this many steps, where a restarted job
    resumes from (within one step at memory_every=1); 0: never. Needs a launcher that restarts the job
    (dtcore.launch or torchrun with --max-restarts N); on several nodes each copy also goes to the next node,
    so that a node lost whole loses none. The memory, two copies of each rank's part of a checkpoint (and two
    of another node's rank), is in DTCORE_MEMORY_DIR (/dev/shm) until the launcher exits."""


@dataclasses.dataclass
class LoggingConfig:
    """Progress, metrics files and the run directory."""

    run_dir: str = "runs/train"
    """Where run.json, metrics/rank<r>.jsonl and checkpoints/ go."""
    log_every: int = 10
    """Rank 0 logs a line (step, loss, tokens/s, MFU, step time, memory) every this many steps."""
    progress: bool = True
    """Rank 0 shows a tqdm progress bar."""
    peak_tflops: float = 0.0
    """The device's peak dense bf16 TFLOP/s for MFU; 0: from dtcore's table (A100, H100, H200, B200)."""
    straggler_window: int = WINDOW
    """Every this many steps, ranks compare their median own times (step time less the wait for the others)."""
    straggler_ratio: float = STRAGGLER_FACTOR
    """A rank whose median own time (step time less its wait for the other ranks) exceeds the job's median by this
    factor is logged as a straggler."""
    tensorboard: bool = True
    """Write TensorBoard scalars to RUN_DIR/tensorboard when the tensorboard package is installed."""
    mlflow: bool = True
    """Log to an MLflow run when mlflow is installed and MLFLOW_TRACKING_URI is set."""
    plot: bool = True
    """At the end of the run, rank 0 writes PNG plots into RUN_DIR/plots (as python -m dtcore.plot does) when
    matplotlib is installed."""


@dataclasses.dataclass
class ParallelConfig:
    """How the model is distributed (dtcore.wrap) and how much memory it may save."""

    zero: Literal[0, 1, 2, 3] = _REDUCER.zero
    """0: every rank holds the whole optimizer state; 1: optimizer state sharded; 2: gradients too
    (dtcore.ShardedOptimizer); 3: parameters too, each transformer layer gathered while it runs."""
    activation_checkpointing: str = "none"
    """none, all, selective, every:<k> or budget:<size> (e.g. budget:2GB): see dtcore.checkpoint_activations."""
    bucket_mb: float | Literal["auto"] = DEFAULT_BUCKET_MB
    """Gradient bucket size in MiB for the overlapped all-reduce (zero=0/1/2; zero=3 reduces by layer), or auto:
    chosen from the first backward's timeline and the measured cost of an all-reduce (kept in checkpoints)."""


@dataclasses.dataclass
class TrainConfig:
    """Everything the trainer reads, one section per concern."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Every field as {section: {field: value}} (what run.json records)."""
        return dataclasses.asdict(self)


# The built-in GPT's sizes by name: the presets' models, and the ones the benchmarks and examples name
# (dtcore.train.demo.gpt.shape() gives each its vocabulary). GPT-2 small (124M parameters): GPT-2's
# vocabulary of 50257 padded to 50304 as nanoGPT does, so the logits' matmuls run on whole tiles; with
# the byte tokenizer the rows past 256 are never targeted.
SHAPES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),  # the defaults: seconds on a laptop CPU
    "small": ModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=128),  # ~0.8M parameters
    "20m": ModelConfig(n_layer=6, n_head=8, n_embd=512, block_size=128),  # ~19M: the CPU benchmark
    "gpt2": ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),  # 124M
}
_GPT2 = {f"model.{name}": value for name, value in dataclasses.asdict(SHAPES["gpt2"]).items()}
_GPU = {**_GPT2, "data.tokenizer": "byte", "training.total_batch_size": 512, "training.compile": True}
_GPU.update({"training.num_iterations": 5000, "training.warmup_steps": 200, "training.eval_every": 250})
_GPU.update({"optim.lr": 6e-4, "optim.weight_decay": 0.1, "optim.min_lr_ratio": 0.1, "checkpoint.every": 500})

# Micro-batches sized by memory.estimate to about 3/4 of the smallest GPU named or less: the fp32
# logits of a 50304-token vocabulary (3 x 4 bytes x 50304 per token) are most of a step's memory.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": ("a 2-layer GPT on CPU: 2 ranks on a 2-core machine in seconds", {}),
    "conservative": (
        "GPT-2 small (124M, compiled) for any GPU of 8 GB or more: small micro-batches, activations recomputed, ZeRO-2",
        {**_GPU, "training.device_batch_size": 4, "parallel.zero": 2, "parallel.activation_checkpointing": "all"},
    ),
    "balanced": (
        "GPT-2 small (124M, compiled) on GPUs of 16 GB or more: ZeRO-1, activations kept",
        {**_GPU, "training.device_batch_size": 8, "parallel.zero": 1},
    ),
    "sharded": (
        "GPT-2 small (124M, compiled) with every parameter sharded (ZeRO-3): GPUs of 8 GB or more, or a larger "
        "model (raise model.n_layer and model.n_embd) than one GPU holds",
        {**_GPU, "training.device_batch_size": 4, "parallel.zero": 3},
    ),
    "aggressive": (
        "GPT-2 small (124M, compiled) on GPUs of 40 GB or more: the largest micro-batches, nothing sharded or "
        "recomputed",
        {**_GPU, "training.device_batch_size": 32, "parallel.zero": 0},
    ),
}


def sections() -> list[tuple[str, type]]:
    """(name, dataclass) of every section, in order."""
    return [(f.name, hints(TrainConfig)[f.name]) for f in dataclasses.fields(TrainConfig)]


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The field types of `cls` (this module's annotations are strings: `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of `cls`, read from its source (so there is one copy)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def all_keys() -> list[str]:
    """Every `section.field`."""
    return [f"{name}.{f.name}" for name, cls in sections() for f in dataclasses.fields(cls)]


def _choices(tp: Any) -> tuple | None:
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def _members(tp: Any) -> tuple:
    """The types of a union (`float | Literal["auto"]`), else ()."""
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ()


def type_name(tp: Any) -> str:
    if _members(tp):
        return " | ".join(type_name(m) for m in _members(tp))
    choices = _choices(tp)
    if choices is not None:
        return " | ".join(repr(c) if isinstance(c, str) else str(c) for c in choices)
    return getattr(tp, "__name__", str(tp))


def resolve_key(key: str, source: str) -> str:
    """`section.field` for a full key or a field name only one section has; ConfigError otherwise."""
    key = key.replace("-", "_")
    keys = all_keys()
    if key in keys:
        return key
    owners = [k for k in keys if k.split(".", 1)[1] == key]
    if len(owners) == 1:
        return owners[0]
    if len(owners) > 1:
        raise _C.ConfigError(
            f"{source}: the key {key!r} is in several sections ({', '.join(owners)}). Fix: name the section, "
            f"e.g. --{owners[0]}=..."
        )
    names = keys + sorted({k.split(".", 1)[1] for k in keys})
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise _C.ConfigError(
        f"{source}: unknown key {key!r}.{hint} Valid keys: {', '.join(keys)} (or a field name alone where only "
        "one section has it). Fix: use one of them, e.g. --training.num_iterations=100."
    )


def parse_value(key: str, raw: Any, source: str) -> Any:
    """`raw` (a string from the command line, or a TOML value) converted to the field's type and checked."""
    section, name = key.split(".")
    cls = dict(sections())[section]
    tp = hints(cls)[name]

    def bad(expected: str, options: list[str] | None = None) -> _C.ConfigError:
        close = difflib.get_close_matches(str(raw), options or [], n=1, cutoff=0.3)
        hint = f" Closest: {close[0]!r}." if close else ""
        return _C.ConfigError(
            f"{source}: {key}={raw!r} is not {expected}.{hint} Fix: give {key} one of the valid values "
            f"({field_docs(cls).get(name, '')})"
        )

    if _members(tp):  # e.g. float | Literal["auto"]: the first member that takes the value
        for member in _members(tp):
            try:
                return _convert(member, raw, bad)
            except _C.ConfigError:
                continue
        raise bad(type_name(tp))
    return _convert(tp, raw, bad)


def _convert(tp: Any, raw: Any, bad: Any) -> Any:
    choices = _choices(tp)
    if choices is not None:
        for choice in choices:
            if raw == choice or str(raw) == str(choice):
                return choice
        options = [str(c) for c in choices]
        raise bad(f"one of {', '.join(options)}", options)
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        lowered = str(raw).lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise bad("a boolean (true or false)", ["true", "false"])
    if tp is int:
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise bad("a whole number")
        try:
            return int(raw) if not isinstance(raw, str) else int(raw.replace("_", ""), 0)
        except ValueError:
            raise bad("a whole number") from None
    if tp is float:
        if isinstance(raw, bool):
            raise bad("a number")
        try:
            return float(raw)
        except ValueError:
            raise bad("a number") from None
    if tp is str:
        if not isinstance(raw, str):
            raise bad("a string")
        return raw
    raise AssertionError(f"no parser for the type {tp}")


def apply(config: TrainConfig, key: str, raw: Any, source: str) -> None:
    key = resolve_key(key, source)
    section, name = key.split(".")
    setattr(getattr(config, section), name, parse_value(key, raw, source))


def from_preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        close = difflib.get_close_matches(name, list(PRESETS), n=1, cutoff=0.3)
        hint = f" Closest: {close[0]!r}." if close else ""
        raise _C.ConfigError(
            f"--preset {name!r} is not a preset.{hint} Valid presets: {', '.join(PRESETS)}. Fix: --preset tiny "
            "(CPU, seconds) or one sized for your device's memory (python -m dtcore.train --help lists them)."
        )
    config = TrainConfig()
    for key, value in PRESETS[name][1].items():
        apply(config, key, value, f"preset {name}")
    return config


def load_toml(config: TrainConfig, path: str) -> str | None:
    """Applies a TOML file ([section] tables of fields); returns its top-level `preset`, if any."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise _C.ConfigError(
            f"--config {path}: cannot read it ({e.strerror}). Fix: give an existing TOML file."
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise _C.ConfigError(f"--config {path}: not valid TOML ({e}). Fix: correct the file.") from None
    preset = data.pop("preset", None)
    for section, values in data.items():
        if not isinstance(values, dict):
            apply(config, section, values, f"--config {path}")
            continue
        for name, value in values.items():
            apply(config, f"{section}.{name}", value, f"--config {path} [{section}]")
    return preset


def parse_args(argv: list[str]) -> TrainConfig:
    """`--preset P`, `--config F.toml` and `--key=value` (or `--key value`) into a checked TrainConfig."""
    preset, toml_path, overrides = None, None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise _C.ConfigError(
                f"command line: unexpected argument {arg!r}. Fix: every argument is --key=value "
                "(python -m dtcore.train --help lists the keys)."
            )
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise _C.ConfigError(f"command line: --{key} has no value. Fix: --{key}=VALUE.")
            value, i = argv[i + 1], i + 1
        i += 1
        if key == "preset":
            preset = value
        elif key == "config":
            toml_path = value
        else:
            overrides.append((key, value))
    config = TrainConfig()
    if toml_path is not None:  # read first for its preset; applied over the preset below
        probe = TrainConfig()
        file_preset = load_toml(probe, toml_path)
        preset = preset or file_preset
    if preset is not None:
        config = from_preset(preset)
    if toml_path is not None:
        load_toml(config, toml_path)
    for key, value in overrides:
        apply(config, key, value, "command line")
    return config
