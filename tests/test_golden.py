"""Golden files: what a request renders to in each dialect, and the
``chat.completion.chunk`` stream of a completion, each kept whole in a file
under tests/data/golden/ beside the case that makes it.

A render case is ``render/NAME.json`` (``dialects``, ``request``, and the
render ``options``); its expected text is ``render/NAME.DIALECT.txt``. A
stream case is ``stream/NAME.json`` (the ``completion`` as text, ``thinking``,
the ``ChunkStream`` ``options``, the sizes of the ``feed`` calls, and the
``usage`` counts that close it); its chunks are ``stream/NAME.jsonl``, one
JSON object a line.

``XTML_REGEN=1 tests/run tests/test_golden.py`` writes every expected file
anew from what the code gives now and prints a unified diff of each one it
changes; review the diff before committing the files.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk

import xtml
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml.serving import openai as shapes

GOLDEN = Path(__file__).parent / "data" / "golden"
REGEN = os.environ.get("XTML_REGEN") == "1"


def _cases(kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, json.loads(p.read_text(encoding="utf-8"))) for p in sorted((GOLDEN / kind).glob("*.json"))]


RENDERS = _cases("render")
STREAMS = _cases("stream")


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def _diff(path: Path, old: str, new: str) -> str:
    name = path.relative_to(GOLDEN.parent.parent.parent)
    return "".join(difflib.unified_diff(_lines(old), _lines(new), f"a/{name}", f"b/{name}"))


def _expected(path: Path, got: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``got`` is the content of ``path``; with XTML_REGEN=1 it becomes it,
    and the change is printed as a diff."""
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if REGEN:
        if old != got:
            path.write_text(got, encoding="utf-8", newline="")
            with capsys.disabled():
                print("\n" + _diff(path, old or "", got))
        return
    assert old is not None, f"{path} is missing: XTML_REGEN=1 tests/run tests/test_golden.py writes it"
    assert got == old, f"{path} is not what the code gives now (XTML_REGEN=1 rewrites it):\n{_diff(path, old, got)}"


# -- renders -----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "dialect", "case"),
                         [(n, d, c) for n, c in RENDERS for d in c["dialects"]],
                         ids=[f"{n}.{d}" for n, c in RENDERS for d in c["dialects"]])
def test_render(name: str, dialect: str, case: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    text = xtml.load(dialect).render(case["request"], **case.get("options", {})).text
    _expected(GOLDEN / "render" / f"{name}.{dialect}.txt", text, capsys)


# -- chunk streams -----------------------------------------------------------------------

def _counter() -> Callable[[], str]:
    n = itertools.count(1)
    return lambda: f"call_{next(n)}"


def chunks_of(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of the case's completion, fed to the stream parser in
    pieces of the ``feed`` sizes (in turn; one id at a time by default)."""
    tpl = xtml.load(case.get("dialect", "kimi-k3"))
    tok = vocab()
    if tpl.markers.all() != xtml.load("kimi-k3").markers.all():
        tok = xtml.load_tokenizer(str(tok.source), add_special_tokens=tpl.markers.all())
    ids = tpl.completion_ids(case["completion"], tok)
    sp = tpl.stream(tok, thinking=case["thinking"])
    cs = shapes.ChunkStream(model="m", id="chatcmpl-1", created=7, ids=_counter(), template=tpl,
                            **case.get("options", {}))
    sizes = itertools.cycle(case.get("feed", [1]))
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(ids):
        n = next(sizes)
        out += cs.feed(sp.feed_many(ids[i : i + n]))
        i += n
    out += cs.feed(sp.close())
    if "usage" in case:
        out += cs.close(prompt_tokens=case["usage"]["prompt_tokens"], completion_tokens=len(ids))
    return out


@pytest.mark.parametrize(("name", "case"), STREAMS, ids=[n for n, _ in STREAMS])
def test_stream(name: str, case: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    chunks = chunks_of(case)
    for c in chunks:
        ChatCompletionChunk.model_validate(c)  # what is kept is what the SDK takes
    got = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in chunks)
    _expected(GOLDEN / "stream" / f"{name}.jsonl", got, capsys)


# -- the folder itself ---------------------------------------------------------------------

def test_every_expected_file_has_its_case() -> None:
    """An expected file whose case was renamed or dropped is found, rather
    than left to mislead."""
    want = {f"{n}.{d}.txt" for n, c in RENDERS for d in c["dialects"]}
    assert sorted(p.name for p in (GOLDEN / "render").glob("*.txt") if p.name not in want) == []
    streams = {f"{n}.jsonl" for n, _ in STREAMS}
    assert sorted(p.name for p in (GOLDEN / "stream").glob("*.jsonl") if p.name not in streams) == []
    assert len(RENDERS) >= 5 and len(STREAMS) >= 4
