"""Refuses to load dtcore._C against a torch other than the one it was built against.

A C++ extension built for one torch fails under another with `undefined symbol` or, worse, runs
with a mismatched ABI. This check runs before `_C` is imported and names both versions and the
rebuild command instead. One exception: `python -m dtcore.check` must still run to report the
mismatch as a FAIL item (with the rebuild command) next to everything else it checks, so there
the package loads as far as it can and records what stopped it in `load_error`.

Note [The checker without torch's Python]
`import torch` costs over a second, almost all of it torch's own Python modules, none of which the
checker's local probes use: they need torch's facts (version, CUDA, ABI) and dtcore._C, which needs
only torch's shared libraries. So `python -m dtcore.check`, when nothing imported torch yet and
torch is a CPU build, reads the facts from torch/version.py and loads libtorch_python (which
brings libtorch, libtorch_cpu and libc10 through its RUNPATH) instead of importing torch: the
command takes 0.3 s instead of 1.5 (docs/benchmarks.md). dtcore._C then finds them by soname.
A later `import torch` (the checker's distributed mode) reuses the same libraries. A CUDA or
ROCm build is always imported: its libraries depend on the CUDA wheels that torch's own import
locates, and its facts (NCCL, the compiled architectures) are asked of torch itself. Every other
program imports torch as usual.
"""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import importlib
import importlib.util
import os
import sys

REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps ."

# Set (instead of raising) when the checker runs and dtcore cannot load as built; see the module doc.
load_error: str | None = None


@dataclasses.dataclass(frozen=True)
class TorchBuild:
    """The running torch, as every part of dtcore that reports it reads it (fingerprints, checker)."""

    version: str
    cuda: str  # "" for a build without CUDA
    cxx11_abi: bool
    nccl: str  # "2.27.5", or "" (a CPU build, or CUDA without NCCL)
    lib_dir: str  # torch's shared libraries


# Set by prepare() when the checker runs without torch's Python (see the Note).
_unimported: TorchBuild | None = None


def torch_build() -> TorchBuild:
    """The running torch's facts, asked of torch itself once it is imported (they are read each
    time, as torch.__version__ is); imports it unless prepare() found that it need not."""
    if _unimported is None or "torch" in sys.modules:
        return _imported_build()
    return _unimported


def _imported_build() -> TorchBuild:
    import torch

    nccl = ""
    if torch.version.cuda:
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # a CUDA torch built without NCCL
            pass
    return TorchBuild(
        version=torch.__version__,
        cuda=torch.version.cuda or "",
        cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        nccl=nccl,
        lib_dir=os.path.join(os.path.dirname(torch.__file__), "lib"),
    )


def _version_file() -> dict[str, object] | None:
    """torch/version.py's constants, read without importing torch; None where it cannot be read."""
    spec = importlib.util.find_spec("torch")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    base = spec.submodule_search_locations[0]
    try:
        with open(os.path.join(base, "version.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return None
    found: dict[str, object] = {"lib_dir": os.path.join(base, "lib")}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) else target
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            found[target.id] = node.value.value
    return found


def _unimported_build() -> TorchBuild | None:
    """The checker's torch facts without importing torch, where that is safe; see the Note."""
    if "torch" in sys.modules or not running_checker():
        return None
    facts = _version_file()
    if facts is None or not isinstance(facts.get("__version__"), str):
        return None
    if any(facts.get(k) for k in ("cuda", "hip", "rocm", "xpu")):
        return None  # an accelerator build: imported (see the Note)
    from . import _build_info as built

    return TorchBuild(
        version=str(facts["__version__"]),
        cuda="",
        # Unknown until dtcore._C loads; it can only load when the ABIs match (std::string in its
        # signatures is mangled differently), and prepare() imports torch when it does not.
        cxx11_abi=bool(built.torch_cxx11_abi),
        nccl="",
        lib_dir=str(facts["lib_dir"]),
    )


def prepare() -> str | None:
    """Makes torch's libraries available to dtcore._C and compares the running torch with the one
    dtcore was built against: the error text when they differ, else None."""
    global _unimported
    fast = _unimported_build()
    if fast is not None and _mismatch(fast) is None:
        try:
            ctypes.CDLL(os.path.join(fast.lib_dir, "libtorch_python.so"))
            importlib.import_module("dtcore._C")
            _unimported = fast
            return None
        except (OSError, ImportError):
            pass  # import torch, and judge it fully below
    return _mismatch(_imported_build())


def _mismatch(running: TorchBuild) -> str | None:
    from . import _build_info as built

    if running.version == built.torch_version and running.cxx11_abi == built.torch_cxx11_abi:
        return None
    return (
        f"dtcore {built.version} was built against torch {built.torch_version} "
        f"(C++11 ABI {int(built.torch_cxx11_abi)}), but this Python runs torch {running.version} "
        f"(C++11 ABI {int(running.cxx11_abi)}). A C++ extension must be rebuilt for the torch it runs with. "
        f"Fix: in dtcore's source directory run `{REBUILD}`, or install the torch it was built for "
        f"(pip install torch=={built.torch_version.split('+')[0]})."
    )


def torch_mismatch() -> str | None:
    """The error text when the running torch is not the one dtcore was built against, else None."""
    return _mismatch(torch_build())


def running_checker() -> bool:
    """True when this process is `python -m dtcore.check`."""
    argv = getattr(sys, "orig_argv", [])  # Python >= 3.10, which dtcore requires
    return "-mdtcore.check" in argv or any(a == "-m" and b == "dtcore.check" for a, b in zip(argv, argv[1:]))
