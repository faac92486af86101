"""What the tests of the layout dialects of other families share: each
dialect's reference cases (a generated request, and the official template's
text or what it raised), the official template itself, and the checks every
dialect file is held to alike.

A template of llama.cpp's sdist (a reference without a commit) is rendered
by transformers at test time; one the sdist does not carry as pinned has its
renders committed next to the dialect (tests/data/families/<name>.jsonl)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.cli import run
from tests.helpers.families import llama_template
from tests.helpers.family_requests import REFERENCES, family_requests, hf_render
from tests.helpers.kimi_families import Case, check_texts

__all__ = ["dialect_fixtures", "edited", "names_its_reference", "reference_cases", "reference_template",
           "refused_edit", "texts_match", "validates"]

DATA = Path(__file__).resolve().parent.parent / "data" / "families"


@cache
def reference_template(name: str) -> str:
    """The official template of dialect ``name``, out of llama.cpp's sdist
    and checked by the sha256 its reference pins."""
    ref = REFERENCES[name]
    return llama_template(ref.source, ref.sha256)


@cache
def _reference_cases(name: str) -> tuple[Case, ...]:
    if REFERENCES[name].commit is not None:
        return tuple(_committed_cases(name))
    template = reference_template(name)
    out: list[Case] = []
    for case in family_requests(name):
        try:
            out.append((case, hf_render(name, template, case), None))
        except Exception as e:  # the template's raise is the reference
            out.append((case, None, str(e)))
    return tuple(out)


def reference_cases(name: str) -> list[Case]:
    """Each generated request of dialect ``name`` with the official
    template's text, or what it raised (rendered once per run)."""
    return list(_reference_cases(name))


def _committed_cases(name: str) -> list[Case]:
    """The committed renders of a template that is not in the sdist, checked
    to be of the pinned template and of today's generator."""
    lines = (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["sha256"] == REFERENCES[name].sha256 and header["dialect"] == name
    rows = [json.loads(x) for x in lines[1:]]
    generated = family_requests(name)
    assert [{"request": r["request"], "options": r["options"]} for r in rows] == generated
    return [({"request": r["request"], "options": r["options"]}, r.get("text"), r.get("raises")) for r in rows]


def dialect_fixtures(name: str, file: Path | None = None) -> tuple[Callable[[], xtml.Template],
                                                                  Callable[[], list[Case]]]:
    """A family test module's fixtures ``tpl`` (dialect ``name``, built in
    or held by ``file``) and ``cases`` (its reference cases), each made once
    per module."""

    @pytest.fixture(scope="module", name="tpl")
    def tpl() -> xtml.Template:
        return xtml.load(name if file is None else str(file))

    @pytest.fixture(scope="module", name="cases")
    def cases() -> list[Case]:
        return reference_cases(name)

    return tpl, cases


def texts_match(tpl: xtml.Template, cases: list[Case], drops: Any, repr_refused: Any = None) -> dict[str, int]:
    """``check_texts`` over a dialect's 400 reference cases, each byte-equal
    or refused and at least 300 byte-equal; its counts, printed and
    returned for the dialect's own floors."""
    counts = check_texts(tpl, cases, drops, repr_refused)
    print(tpl.name, counts)
    assert counts["equal"] + counts["refused"] + counts["refused_repr"] == len(cases) == 400
    assert counts["equal"] >= 300
    return counts


def names_its_reference(name: str) -> Callable[[xtml.Template], None]:
    """A test that the dialect names the sha256 of the template it mirrors."""

    def test(tpl: xtml.Template) -> None:
        assert tpl.dialect.reference["sha256"] == REFERENCES[name].sha256  # type: ignore[attr-defined]

    return test


def validates(path: Path) -> None:
    """``xtml validate`` accepts the file."""
    code, out, err = run(["validate", str(path)])
    assert code == 0 and "valid" in out and err == "", (out, err)


def edited(file: Path, tmp_path: Path, old: str, new: str) -> Path:
    """A copy of a dialect file with its first ``old`` (which it must hold)
    made ``new``."""
    text = file.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def refused_edit(file: Path, tmp_path: Path, old: str, new: str, match: str) -> xtml.TemplateError:
    """What loading the copy of ``file`` with ``old`` made ``new`` raises,
    checked to be a ``TemplateError`` that matches ``match``."""
    with pytest.raises(xtml.TemplateError, match=match) as e:
        xtml.load(str(edited(file, tmp_path, old, new)))
    return e.value
