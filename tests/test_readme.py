"""The README's Python example runs as written."""

from __future__ import annotations

from pathlib import Path

from tests.docs import run_examples

README = Path(__file__).parent.parent / "README.md"


def test_readme_python_example_runs() -> None:
    run_examples(README)
