"""Running the Python examples of a Markdown page, as a reader would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent.parent


def run_examples(page: str | Path, *, at_least: int = 1) -> tuple[str, dict[str, Any]]:
    """Run every ```python block of ``page`` (a path, or one relative to the
    repository) in one scope, in order, as later blocks use what earlier ones
    made; blocks marked ``python no-run`` (they need a server, files or a
    cluster) must at least compile. Returns the page's text and the scope."""
    path = Path(page) if Path(page).is_absolute() else ROOT / page
    text = path.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= at_least, f"{path.name} lost its examples"
    scope: dict[str, Any] = {"__name__": f"docs_{path.stem}"}
    for code in blocks:
        exec(compile(code, str(path), "exec"), scope)
    for code in re.findall(r"```python no-run\n(.*?)```", text, re.S):
        compile(code, str(path), "exec")
    return text, scope


def shown_on_page(text: str, printed: str, *, at_least: int = 1) -> None:
    """Each line the examples printed is on the page as a ``# line``
    comment: what the page shows is what the code prints."""
    lines = printed.splitlines()
    assert len(lines) >= at_least
    for line in lines:
        assert f"\n# {line}\n" in text, line
