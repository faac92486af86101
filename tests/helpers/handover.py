"""Requests as callers hand them to an engine's chat template."""

from __future__ import annotations

import json
from typing import Any


def objects_for_arguments(messages: list[Any]) -> list[Any]:
    """A copy of ``messages`` whose tool-call arguments that are JSON object
    strings are the objects: what llama.cpp and vLLM hand a template, and
    what docs/exports.md tells callers of ``apply_chat_template`` to pass
    (a string that is not a JSON object stays as it is)."""
    msgs = json.loads(json.dumps(messages))
    for m in msgs:
        for c in (m.get("tool_calls") or ()) if isinstance(m, dict) else ():
            fn = c.get("function", c)
            a = fn.get("arguments")
            if isinstance(a, str) and a.strip():
                try:
                    parsed = json.loads(a)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
    return list(msgs)
