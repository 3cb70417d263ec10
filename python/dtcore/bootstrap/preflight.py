"""init(preflight=True)'s probes: the resource checker's, registered here when dtcore.check is
imported (which `import dtcore` does). The checker sits above bootstrap (it uses bootstrap, never
the reverse), so bootstrap holds only this hook. Torch-free, like the checker's local probes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _C

# Called with init()'s world and settings arguments; raises on a FAIL.
_probes: Callable[[dict[str, Any], dict[str, Any]], None] | None = None


def register(probes: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
    global _probes
    _probes = probes


def run(overrides: dict[str, Any], settings_args: dict[str, Any]) -> None:
    if _probes is None:
        raise _C.ConfigError(
            "init(preflight=True) needs the resource checker, which is not loaded. "
            "Fix: import dtcore (the package), not only dtcore.bootstrap."
        )
    _probes(overrides, settings_args)
