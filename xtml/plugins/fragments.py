"""The reference grammar with plugins' fragments, built strictly.

A fragment is Lark text appended to ``grammar/xtml.lark``: it may ``%extend``
a rule or terminal of the core and add rules of its own. The result must
build as a strict LALR parser (no shift/reduce or reduce/reduce conflict),
so two fragments that make parsing ambiguous fail when the template loads.
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import TemplateError


@lru_cache(maxsize=32)
def _build(text: str) -> str | None:
    from lark import Lark
    from lark.exceptions import GrammarError, LarkError

    try:
        Lark(text, start="document", parser="lalr", lexer="basic", strict=True)
    except GrammarError as e:
        return str(e)
    except LarkError as e:
        return f"{type(e).__name__}: {e}"
    return None


def combine(fragments: list[tuple[str, str]]) -> str:
    """The core grammar plus each ``(plugin name, fragment)``; raises
    :class:`TemplateError` naming the plugins when it does not build."""
    from ..markup.reference import grammar_text

    core = grammar_text()
    if not fragments:
        return core
    text = core + "".join(f"\n// plugin {name}\n{frag}\n" for name, frag in fragments)
    err = _build(text)
    if err is None:
        return text
    # Say which plugin breaks it: the first whose fragment, added alone, fails.
    for name, frag in fragments:
        alone = _build(core + f"\n{frag}\n")
        if alone is not None:
            raise TemplateError(f"plugin {name!r}'s grammar fragment does not build: {alone.splitlines()[0]}")
    names = ", ".join(repr(n) for n, _ in fragments)
    raise TemplateError(f"the grammar fragments of plugins {names} conflict: {err.splitlines()[0]}")
