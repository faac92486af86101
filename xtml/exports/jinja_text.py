"""Dialect text as Jinja source every engine reads alike: string literals
and comment text (shared by the exports of both kinds of dialect)."""

from __future__ import annotations

import re

from ..errors import TemplateError, shown

__all__ = ["comment", "quote"]


# The escapes every engine's string literals read (llama.cpp's reads no \\u).
_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def quote(s: str) -> str:
    """``s`` as a Jinja expression that every engine reads as that string.

    Inside a string token Jinja2 and llama.cpp's engine read braces as
    text, but ``@huggingface/jinja`` rewrites the template's source with
    regular expressions before it tokenizes it (transformers'
    ``{% generation %}`` tag is removed, strings included), and an engine
    may trim at ``{X-`` and ``-X}`` the same way. So no literal holds a
    brace next to another character: the string is cut after every ``{``
    and before every ``}`` and its pieces joined with ``~``, and no
    delimiter is ever spelt inside a literal."""
    bad = next((ch for ch in s if ord(ch) < 0x20 and ch not in _ESCAPES), None)
    if bad is not None:
        raise TemplateError(f"a control character U+{ord(bad):04X} in the dialect's text {shown(s)} has no Jinja "
                            "spelling every engine reads")
    pieces = [p for p in _BRACES.split(s) if p] or [""]
    lits = ["'" + "".join(_ESCAPES.get(ch, ch) for ch in p) + "'" for p in pieces]
    return lits[0] if len(lits) == 1 else "(" + " ~ ".join(lits) + ")"


_BRACES = re.compile(r"(?<=\{)|(?=\})")


def comment(s: str) -> str:
    """``s`` for the inside of a ``{#- … -#}`` comment: a space between any
    two of ``{ % # }`` that meet, so that it can neither end the comment
    nor open anything (which an engine's source rewriting could read)."""
    return _DELIMS.sub(" ", s)


_DELIMS = re.compile(r"(?<=[{%#}])(?=[{%#}])")
