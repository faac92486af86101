"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README has no Python example"
    scope: dict[str, object] = {}
    for code in blocks:  # later blocks build on earlier ones, as a reader does
        exec(compile(code, str(README), "exec"), scope)
