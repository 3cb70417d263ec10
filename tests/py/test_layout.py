"""The rules of the house, checked on the tree: no import circle and dependencies one way, the
_C stub in step with the module, every DTCORE_ name declared and read only through the
registry, benchmarks and examples on public names only, and no file past 800 lines."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
from pathlib import Path

import pytest

import dtcore
from dtcore import _C

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "dtcore"


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every dtcore module `path` imports, at module level or inside a function."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("dtcore")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if not base.startswith("dtcore"):
                continue
            for a in node.names:  # `from .. import context` imports a module; `from .x import f`, module x
                candidate = f"{base}.{a.name}"
                found.add(candidate if _is_module(candidate) else base)
    return {m for m in found if _is_module(m) and m != name}


def _is_module(name: str) -> bool:
    """A source module, a package, the extension (_C.pyi) or the generated build record (.py.in)."""
    base = PACKAGE.parent / Path(*name.split("."))
    return any(Path(f"{base}{ext}").is_file() for ext in (".py", ".pyi", ".py.in")) or (base / "__init__.py").is_file()


# Command-line entries at the top of the package (python -m dtcore.monitor, python -m dtcore.plot) that only
# call into an area: they belong to that area.
ENTRIES = {"dtcore.monitor": "train", "dtcore.plot": "train"}


def _area(module: str) -> str:
    if module in ENTRIES:
        return ENTRIES[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "base"


# Which areas each may import (DESIGN.md: bootstrap <- comm <- reducer; check uses bootstrap and comm;
# launch uses check).
ALLOWED = {
    "base": {"base"},
    "bootstrap": {"base", "bootstrap"},
    "comm": {"base", "bootstrap", "comm"},
    "reducer": {"base", "bootstrap", "comm", "reducer"},
    "activation": {"base", "bootstrap", "comm", "reducer", "activation"},
    "check": {"base", "bootstrap", "comm", "check"},
    # zero=3's default units are the blocks activation checkpointing finds (activation/blocks.py)
    "zero": {"base", "bootstrap", "comm", "reducer", "activation", "zero"},
    "checkpoint": {"base", "bootstrap", "comm", "reducer", "activation", "zero", "checkpoint"},
    # The launcher runs the checker's probes before a job; train is not imported (it is the program launched).
    "launch": {"base", "bootstrap", "comm", "check", "launch"},
    "train": {"base", "bootstrap", "comm", "reducer", "activation", "zero", "checkpoint", "train"},
    # Adapters to other libraries' loops, on top of everything (public names only: see below); nothing imports them.
    "integrations": {
        "base",
        "bootstrap",
        "comm",
        "reducer",
        "activation",
        "check",
        "zero",
        "checkpoint",
        "train",
        "launch",
        "integrations",
    },
}
# Areas that may use the package's face (`import dtcore`, its public names), as a user's script does.
ON_THE_FACE = {"integrations"}


def test_no_import_circle_and_dependencies_point_one_way():
    graph = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}
    graph.pop("dtcore")  # the package's face imports every area, and nothing imports it back
    wrong = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if (d == "dtcore" and _area(m) not in ON_THE_FACE) or (d != "dtcore" and _area(d) not in ALLOWED[_area(m)])
    )
    assert wrong == [], f"imports against the direction of DESIGN.md: {wrong}"

    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                pytest.fail(f"import circle: {' -> '.join(path[path.index(d) :] + [d])}")
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def _stub() -> ast.Module:
    return ast.parse((PACKAGE / "_C.pyi").read_text())


def _names(body: list[ast.stmt]) -> set[str]:
    out = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


TYPE_ONLY = {"Argument"}  # aliases the stub defines for its own annotations


def test_the_stub_lists_exactly_what_the_module_has():
    module = {n for n in dir(_C) if not n.startswith("__") or n == "__version__"}
    stub = _names(_stub().body) - TYPE_ONLY
    if not _C.has_nccl:
        stub.discard("nccl_communicator")
    assert sorted(module - stub) == [] and sorted(stub - module) == [], (module - stub, stub - module)
    for node in _stub().body:
        if not isinstance(node, ast.ClassDef) or issubclass(getattr(_C, node.name), BaseException):
            continue
        cls = getattr(_C, node.name)
        members = {n for n, v in vars(cls).items() if not n.startswith("_")}
        declared = _names(node.body) - {"__init__"}
        assert members == declared, (node.name, sorted(members - declared), sorted(declared - members))


KNOB = re.compile(r"\bDTCORE_[A-Z0-9_]*[A-Z0-9]\b")
# Reading the environment by a DTCORE_ name, or making one up, outside the registry.
READ_AROUND = re.compile(
    r"""(environ(\.get)?\s*[\[(]\s*|getenv\s*\(\s*|\.get\s*\(\s*)f?["']DTCORE_|f["']DTCORE_\{"""
    r"""|["']DTCORE_["']\s*\+"""
)


def _build_names() -> set[str]:
    names = set(KNOB.findall((ROOT / "CMakeLists.txt").read_text()))
    for path in _tracked("csrc"):
        names |= set(re.findall(r"#\s*define\s+(DTCORE_\w+)", path.read_text()))
    return names


def test_every_dtcore_name_is_a_declared_knob_or_a_build_name():
    knobs = {k[0] for k in _C.knobs()}
    builds = _build_names()
    undeclared = {}
    for path in _tracked():
        if path.parts[len(ROOT.parts)] == "tests" or path.suffix in (".png", ".so"):
            continue
        for name in set(KNOB.findall(path.read_text(errors="replace"))) - knobs - builds:
            undeclared.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert undeclared == {}, f"DTCORE_ names that are neither knobs (common/knobs.h) nor build names: {undeclared}"


def test_knobs_are_read_only_through_the_registry():
    registry = ROOT / "csrc" / "dtcore" / "common" / "knobs.h"
    offenders = []
    for path in _tracked("python", "csrc", "benchmarks", "examples", "tools"):
        if path == registry:
            continue
        cpp = path.suffix in (".cpp", ".h")
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("//")[0] if cpp else line  # C++ comments may name a knob; code spells knobs::kX
            if READ_AROUND.search(code) or (cpp and '"DTCORE_' in code):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("folder", ["benchmarks", "examples", "python/dtcore/integrations"])
def test_benchmarks_and_examples_use_public_names_only(folder):
    private = []
    for path in _tracked(folder):
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dtcore"):
                names = node.module.split(".") + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [p for a in node.names if a.name.startswith("dtcore") for p in a.name.split(".")]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "dtcore":
                names = [node.attr]
            if any(n.startswith("_") for n in names):
                private.append(f"{path.relative_to(ROOT)}:{node.lineno}: {'.'.join(names)}")
    assert private == []


def test_public_packages_say_what_they_export():
    for module in (
        dtcore,
        dtcore.bootstrap,
        dtcore.comm,
        dtcore.reducer,
        dtcore.activation,
        dtcore.check,
        dtcore.train,
        dtcore.units,
        dtcore.zero,
    ):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)
    # wrap's keywords are the two constructors' (zero=0/1/2's and zero=3's), declared there once
    constructors = (dtcore.DistributedModel, dtcore.FullyShardedModel)
    keywords = set().union(*(inspect.signature(c).parameters.keys() for c in constructors)) - {"module"}
    assert inspect.signature(dtcore.wrap).parameters.keys() - {"model"} == keywords


def test_no_file_past_800_lines():
    long = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in _tracked("python", "csrc", "tests", "benchmarks", "examples")
        if p.suffix in (".py", ".cpp", ".h", ".pyi") and (n := len(p.read_text().splitlines())) > 800
    ]
    assert long == []
