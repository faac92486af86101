"""What a dialect file that renders only (no reader reads what it writes
yet) is held to: every reader refuses it by name, the Jinja export refuses
it, and ``xtml validate`` accepts it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.cli import run
from xtml.vocab.vocabulary import byte_vocabulary

__all__ = ["READERS", "export_refuses", "readers_refuse", "validates"]

_ASK = {"messages": [{"role": "user", "content": "q"}]}

READERS = [
    pytest.param(lambda t, v: t.parse(t.encode(_ASK, v), v), id="parse"),
    pytest.param(lambda t, v: t.stream(v), id="stream"),
    pytest.param(lambda t, v: t.completion_grammar(_ASK, v), id="grammar"),
    pytest.param(lambda t, v: t.normalize(_ASK), id="normalize"),
    pytest.param(lambda t, v: t.encode_training(_ASK, v), id="training"),
]
"""Each reader of a template, called on a one-question request."""


def readers_refuse(tpl: xtml.Template, call: Any, names: str) -> None:
    """``call`` refuses the dialect with an ``OptionError`` that names what
    it writes (``names``: a pattern of those names, in order)."""
    v = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    with pytest.raises(xtml.OptionError, match=rf"not yet available for the layout dialect {re.escape(repr(tpl.name))}"
                                               rf" .*{names}.*only render is"):
        call(tpl, v)


def export_refuses(tpl: xtml.Template) -> None:
    from xtml.exports.layout_jinja import layout_jinja_template

    with pytest.raises(xtml.TemplateError, match="does not write the layout field"):
        layout_jinja_template(tpl.dialect)  # type: ignore[arg-type]


def validates(path: Path) -> None:
    code, out, err = run(["validate", str(path)])
    assert code == 0 and "valid" in out and err == "", (out, err)
