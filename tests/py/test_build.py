"""The build refuses the wrong torch clearly: at import, and when pip builds in isolation."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_under_another_torch_names_both_versions_and_the_rebuild_command():
    code = "import torch; torch.__version__ = '9.9.9+fake'; import dtcore"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    from dtcore import _build_info

    assert "ImportError" in out.stderr
    assert "9.9.9+fake" in out.stderr and _build_info.torch_version in out.stderr
    assert "pip install --no-build-isolation" in out.stderr
    assert "undefined symbol" not in out.stderr  # refused before _C was loaded


def test_build_records_what_it_was_built_against():
    import torch

    from dtcore import _C, _build_info

    assert _build_info.torch_version == torch.__version__ == _C.built_torch_version
    assert _build_info.with_nccl == _C.has_nccl
    assert _build_info.version == _C.__version__


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not on PATH")
def test_configure_without_torch_fails_fast_with_the_command_to_use(tmp_path):
    # What `pip install .` (build isolation: no torch) runs into.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    out = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), f"-DPython_EXECUTABLE={venv / 'bin' / 'python'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "pip install --no-build-isolation ." in text
    assert "import torch" in text


def test_the_set_up_installs_every_test_dependency_the_package_declares():
    # One list of what the tests need (pyproject's `test` extra); tools/setup.sh pins each of them.
    import re

    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    needed = {re.split(r"[<>=!~ ;\[]", spec, maxsplit=1)[0].lower() for spec in extra}
    setup = (ROOT / "tools" / "setup.sh").read_text()
    pinned = {name.lower() for name in re.findall(r"([A-Za-z][\w.-]*)==", setup)}
    assert needed <= pinned, f"tools/setup.sh does not install {sorted(needed - pinned)}"
    assert "numpy" in needed  # torch warns "Failed to initialize NumPy" without it: an error under the tests' filter
