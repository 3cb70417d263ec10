"""Refuses to load dtcore._C against a torch other than the one it was built against.

A C++ extension built for one torch fails under another with `undefined symbol` or, worse, runs
with a mismatched ABI. This check runs before `_C` is imported and names both versions and the
rebuild command instead. One exception: `python -m dtcore.check` must still run to report the
mismatch as a FAIL item (with the rebuild command) next to everything else it checks, so there
the package loads as far as it can and records what stopped it in `load_error`.
"""

from __future__ import annotations

import sys

REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps ."

# Set (instead of raising) when the checker runs and dtcore cannot load as built; see the module doc.
load_error: str | None = None


def torch_mismatch() -> str | None:
    """The error text when the running torch is not the one dtcore was built against, else None."""
    import torch

    from . import _build_info as built

    running_abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    if torch.__version__ == built.torch_version and running_abi == built.torch_cxx11_abi:
        return None
    return (
        f"dtcore {built.version} was built against torch {built.torch_version} "
        f"(C++11 ABI {int(built.torch_cxx11_abi)}), but this Python runs torch {torch.__version__} "
        f"(C++11 ABI {int(running_abi)}). A C++ extension must be rebuilt for the torch it runs with. "
        f"Fix: in dtcore's source directory run `{REBUILD}`, or install the torch it was built for "
        f"(pip install torch=={built.torch_version.split('+')[0]})."
    )


def running_checker() -> bool:
    """True when this process is `python -m dtcore.check`."""
    argv = getattr(sys, "orig_argv", [])  # Python >= 3.10, which dtcore requires
    return "-mdtcore.check" in argv or any(a == "-m" and b == "dtcore.check" for a, b in zip(argv, argv[1:]))
