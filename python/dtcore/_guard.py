"""Refuses to load dtcore._C against a torch other than the one it was built against.

A C++ extension built for one torch fails under another with `undefined symbol` or, worse, runs
with a mismatched ABI. This check runs before `_C` is imported and names both versions and the
rebuild command instead.
"""

from __future__ import annotations

REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps ."


def check_torch_matches_build() -> None:
    import torch

    from . import _build_info as built

    running_abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    if torch.__version__ != built.torch_version or running_abi != built.torch_cxx11_abi:
        raise ImportError(
            f"dtcore {built.version} was built against torch {built.torch_version} "
            f"(C++11 ABI {int(built.torch_cxx11_abi)}), but this Python runs torch {torch.__version__} "
            f"(C++11 ABI {int(running_abi)}). A C++ extension must be rebuilt for the torch it runs with. "
            f"Fix: in dtcore's source directory run `{REBUILD}`, or install the torch it was built for "
            f"(pip install torch=={built.torch_version.split('+')[0]})."
        )
