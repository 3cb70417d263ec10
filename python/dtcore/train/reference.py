"""The trainer's reference, generated from the configuration dataclasses so that it cannot drift:
`python -m dtcore.train --help` (`help_text`) and the tables of docs/train.md (`reference_markdown`;
tests/py/train/test_config.py checks the file against it).
"""

from __future__ import annotations

import dataclasses
import inspect

from ..exit_codes import EXIT_PREEMPTED
from .config import PRESETS, field_docs, hints, sections, type_name
from .memory import preset_memory

EXIT_STATUS = (
    ("0", "trained to training.num_iterations"),
    (
        "1",
        "the run failed; the error is logged without a stack (a CommError with the health monitor's verdict, "
        "or the out-of-memory diagnosis)",
    ),
    ("2", "bad arguments or configuration"),
    (
        str(EXIT_PREEMPTED),
        "stopped by SIGTERM/SIGUSR1 after every rank saved a checkpoint: run again with --checkpoint.resume=auto",
    ),
    ("128+N", "a second signal N ended it at once"),
)


def help_text() -> str:
    """`python -m dtcore.train --help`: usage, presets and every field, from the dataclasses."""
    lines = [
        "usage: python -m dtcore.train [--preset NAME] [--config FILE.toml] [--section.field=VALUE ...]",
        "",
        "Trains the built-in GPT (or any model through dtcore.Trainer) under torchrun, dtcore.launch, SLURM or",
        "alone. Values apply in order: defaults, --preset, --config (TOML: [section] tables), --key=value.",
        "",
        "presets (expected memory per device from dtcore.train.memory.estimate):",
    ]
    for name, (doc, _) in PRESETS.items():
        lines.append(f"  {name:13s} {doc} (~{preset_memory(name)})")
    for section, cls in sections():
        lines += ["", f"[{section}] {inspect.getdoc(cls)}"]
        docs = field_docs(cls)
        default = cls()
        for f in dataclasses.fields(cls):
            lines.append(f"  --{section}.{f.name}={getattr(default, f.name)!r}  ({type_name(hints(cls)[f.name])})")
            lines.append(f"      {docs[f.name]}")
    lines += ["", "exit status:"] + [f"  {code:6s} {meaning}" for code, meaning in EXIT_STATUS]
    lines += ["", "Guide: docs/train.md (resume, preemption, run directory, out-of-memory diagnosis)."]
    return "\n".join(lines)


def reference_markdown() -> str:
    """The configuration reference in docs/train.md, generated from the dataclasses."""
    out = ["| preset | what | expected memory per device |", "|---|---|---|"]
    out += [f"| `{name}` | {doc} | {preset_memory(name)} |" for name, (doc, _) in PRESETS.items()]
    for section, cls in sections():
        out += ["", f"### `[{section}]`", "", inspect.getdoc(cls) or "", "", "| key | type | default | meaning |"]
        out.append("|---|---|---|---|")
        docs = field_docs(cls)
        default = cls()
        for f in dataclasses.fields(cls):
            tp = type_name(hints(cls)[f.name]).replace("|", "\\|")
            out.append(f"| `{section}.{f.name}` | {tp} | `{getattr(default, f.name)!r}` | {docs[f.name]} |")
    return "\n".join(out) + "\n"


BEGIN = "<!-- reference: generated from the dataclasses by dtcore.train.reference; do not edit by hand -->"
END = "<!-- end of reference -->"


def docs_with_reference(text: str) -> str:
    """`text` (docs/train.md) with the part between BEGIN and END replaced by reference_markdown()."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n\n{reference_markdown()}\n{END}{tail}"


if __name__ == "__main__":  # python -m dtcore.train.reference docs/train.md: rewrites the reference in place
    import sys

    path = sys.argv[1]
    with open(path) as f:
        updated = docs_with_reference(f.read())
    with open(path, "w") as f:
        f.write(updated)
