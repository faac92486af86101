"""spec.md's examples are test vectors: extracted from the fenced blocks and checked."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import xtml

SPEC = Path(__file__).parent.parent / "spec.md"
_FENCE = re.compile(r"^(`{3,})(\w+) (example|parse|error|normal)=([\w-]+)[ \t]*$")


def blocks() -> dict[tuple[str, str], dict[str, str]]:
    """(kind, name) → {language: content} for every tagged block."""
    out: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    lines = SPEC.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, kind, name = m.groups()
        end = lines.index(fence, i + 1)
        body = "\n".join(lines[i + 1 : end])
        key = ("example", name) if kind == "normal" else (kind, name)
        out[key]["normal" if kind == "normal" else lang] = body
        i = end + 1
    return out


BLOCKS = blocks()


def test_spec_has_examples() -> None:
    kinds = {k for k, _ in BLOCKS}
    assert kinds == {"example", "parse", "error"}
    assert len(BLOCKS) >= 10


def _ids(kind: str) -> list[str]:
    return [name for k, name in BLOCKS if k == kind]


@pytest.mark.parametrize("name", _ids("example"))
def test_render_example(k3: xtml.Template, vocab: xtml.Vocabulary, name: str) -> None:
    b = BLOCKS[("example", name)]
    case: dict[str, Any] = json.loads(b["json"])
    req, opts = case["request"], case.get("options", {})
    checked = 0
    if "xtml" in b:
        assert k3.render(req, **opts).text == b["xtml"]
        checked += 1
    if "segments" in b:
        assert [[s.text, s.special] for s in k3.render(req, **opts).segments] == json.loads(b["segments"])
        checked += 1
    if "normal" in b:
        assert k3.normalize(req, **opts) == json.loads(b["normal"])
        checked += 1
    assert checked, f"example {name} has nothing to check"
    # Every example also round-trips through token ids.
    assert k3.parse(k3.encode(req, vocab, **opts), vocab) == k3.normalize(req, **opts)


@pytest.mark.parametrize("name", _ids("parse"))
def test_parse_example(k3: xtml.Template, name: str) -> None:
    b = BLOCKS[("parse", name)]
    case = json.loads(b["json"])
    assert k3.parse(b["xtml"], **case.get("options", {})) == case["result"]


@pytest.mark.parametrize("name", _ids("error"))
def test_error_example(k3: xtml.Template, name: str) -> None:
    b = BLOCKS[("error", name)]
    with pytest.raises(xtml.XtmlError) as e:
        if "json" in b:
            case = json.loads(b["json"])
            k3.render(case["request"], **case.get("options", {}))
        else:
            k3.parse(b["xtml"])
    assert str(e.value) == b["text"]
