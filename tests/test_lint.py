"""The code holds to its own standards: mypy strict and ruff, as part of the suite."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.need import need

ROOT = Path(__file__).parent.parent


def _tool(name: str) -> list[str]:
    return [need(name, "tests/run (installs the test extras)")]


def test_mypy_strict() -> None:
    res = subprocess.run([*_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff() -> None:
    res = subprocess.run([*_tool("ruff"), "check", "xtml", "tests", "bench", "fuzzing"], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
