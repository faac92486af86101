"""The code holds to its own standards: mypy strict and ruff, as part of the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None and not (Path(sys.executable).parent / name).exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    exe = Path(sys.executable).parent / name
    return [str(exe) if exe.exists() else name]


def test_mypy_strict() -> None:
    res = subprocess.run([*_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff() -> None:
    res = subprocess.run([*_tool("ruff"), "check", "xtml", "tests", "bench", "fuzzing"], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
