"""What the tests that run inside vLLM's venv share."""

from __future__ import annotations

import json
from importlib.metadata import distribution
from pathlib import Path
from typing import Any


def dist_folder(where: Path) -> Path:
    """xtml's installed metadata (its ``vllm.general_plugins`` entry point),
    as vLLM's entry-point lookup reads it, in a folder to put on ``sys.path``
    of vLLM's venv, which has no xtml installed."""
    info = where / "xtml-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xtml\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(distribution("xtml").read_text("entry_points.txt") or "")
    return where


def as_json(arguments: Any) -> Any:
    """Arguments as parsed JSON; a json block's text that is not JSON stays
    the text xtml returns."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def parsed_message(template: Any, vocab: Any, ids: list[int], thinking: bool) -> dict[str, Any]:
    """``Template.parse(ids, completion=True, lenient=True)`` in the shape a
    vLLM parser's answer is compared in: reasoning, content, and calls as
    ``[name, arguments as JSON]``."""
    msg = template.parse(ids, vocab, completion=True, lenient=True, thinking=thinking)
    content = msg.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return {"reasoning": msg.get("reasoning_content") or "", "content": content or "",
            "tool_calls": [[c["function"]["name"], as_json(c["function"]["arguments"])]
                           for c in msg.get("tool_calls") or ()]}
