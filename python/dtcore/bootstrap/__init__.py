"""Bootstrap: from a launcher's environment to a validated, connected world (csrc/dtcore/bootstrap).

context.py holds the process's Context and its lifecycle, join.py is `dtcore.init()` (and the
checker's own way in), fingerprint.py says what every rank must agree on, preflight.py holds the
checker's probes for init(preflight=True). context and join (which import torch) are loaded on
first use, so that the checker's local probes can use fingerprint and accelerate without torch's
Python (Note [The checker without torch's Python] in dtcore/_guard.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {"Context": "context", "get_context": "context", "is_initialized": "context", "shutdown": "context"}
_LAZY["init"] = "join"


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'dtcore.bootstrap' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from .context import Context, get_context, is_initialized, shutdown
    from .join import init

__all__ = ["Context", "init", "get_context", "is_initialized", "shutdown"]
