"""The K3 request cases kept as JSON under tests/data/k3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent.parent / "data"


def load_cases(name: str) -> list[dict[str, Any]]:
    cases = json.loads((DATA / "k3" / name).read_text(encoding="utf-8"))
    assert cases, f"no cases in {name}"
    return cases


def request_of(case: dict[str, Any]) -> dict[str, Any]:
    req: dict[str, Any] = {"messages": case["messages"]}
    if case.get("tools") is not None:
        req["tools"] = case["tools"]
    return req
