"""Adversarial text and JSON: the strings a template must keep as text.

:func:`texts` draws from a catalogue of nasty pieces: the marker literals of
a template and of every built-in template, fragments of markup spelled with
the template's own names and prose, halves of markers, attribute escapes and
quotes, JSON look-alikes, other models' special tokens and unicode edge
cases. :func:`json_values` and :func:`json_objects` are JSON built from the
same text (for tool arguments, schemas and tool lists).

Needs ``hypothesis``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from hypothesis import strategies as st

from ..template import Template, load

__all__ = ["json_objects", "json_values", "texts"]

_V = TypeVar("_V")


# -- text ------------------------------------------------------------------------

# Other models' special tokens: text that must stay text in any template.
# (Escapes, not the characters: some are look-alikes of ASCII.)
OTHER_MARKERS = (
    "<think>", "</think>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<s>", "</s>", "[INST]", "[/INST]", "<|EOT|>",
    "<tool_call>", "</tool_call>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>",
    "<\uff5cAssistant\uff5c>", "\uff5cDSML\uff5c", "<dsml:",
)
# Attribute escaping, quoting and JSON look-alikes.
SYNTAX = (
    "&amp;", "&quot;", "&amp;quot;", "&", "&&", '"', "'", '="', ' key="', "=", "\\", "\\u0000", '\\"',
    "{", "}", "[", "]", "{}", "[]", "null", "true", "false", "1", "-0.0", "1e400", "NaN", '{"a": 1}',
    "```json\n", "\n```", "# Tools",
)
# With the Angstrom and ohm signs, the letters NFC turns them into.
UNICODE = (
    "\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466", "\U0001f3f3\ufe0f\u200d\U0001f308",
    "e\u0301", "\u0301", "a\u0308\u0323", "\u202e", "\u200f", "\u0645\u0631\u062d\u0628\u0627",
    "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd", "\u6f22\u5b57", "\u30ab\u30bf\u30ab\u30ca", "\ud55c\uad6d\uc5b4",
    "\u200b", "\u200d", "\ufeff", "\ufffd", "\x00", "\x01", "\x1b", "\x7f", "\x85", "\u2028", "\u2029",
    "\U0010ffff", "\U0001f9ff", "\U000e0041", "\U0001d54f", "\u00df", "\u0130", "\ufb01", "\u212b", "\u2126",
    "\u00c5", "\u03a9", "\uffff", "\U0002a6d6",
)
WHITESPACE = ("", " ", "  ", "\n", "\t", "\r", "\r\n", " \n\t ", "\u00a0", "\u3000", "\n\n\n")


@dataclass(frozen=True)
class _Pieces:
    markers: tuple[str, ...]
    """Marker literals of the template and of the built-in templates."""
    own: tuple[str, ...]
    """The template's own markers (drawn more often)."""
    fragments: tuple[str, ...]
    """Pieces of markup and other look-alikes."""


def _builtin_templates() -> list[Template]:
    from ..chat.template_file import BUILTIN

    seen: set[str] = set()
    out: list[Template] = []
    for name, file in sorted(BUILTIN.items()):
        if file not in seen:
            seen.add(file)
            out.append(load(name))
    return out


@lru_cache(maxsize=64)
def _pieces(template: Template | None) -> _Pieces:
    templates = [*([template] if template is not None else []), *_builtin_templates()]
    markers: list[str] = []
    frags: list[str] = []
    for t in templates:
        m, n, d = t.markers, t.dialect.names, t.dialect
        think, answer = d.channel_tag("reasoning") or "think", d.channel_tag("content") or "response"
        markers += [*m.all(), *([d.image_placeholder] if d.image_placeholder else [])]
        frags += [
            f"{m.close}{n['argument']}{m.sep}",
            f"{m.close}{n['message']}{m.sep}{m.end}",
            f'{m.open}{n["message"]} {n["role"]}="system"{m.sep}',
            f'{m.open}{n["message"]} {n["role"]}="user"{m.sep}',
            f'{m.open}{n["message"]} {n["role"]}="assistant"{m.sep}{m.open}{d.prompt_tag(True) or think}{m.sep}',
            f"{m.close}{think}{m.sep}{m.open}{answer}{m.sep}",
            f"{m.close}{think}{m.sep}",
            f'{m.open}{n["call"]} {n["tool"]}="x" {n["index"]}="1"{m.sep}',
            f'{m.open}{n["argument"]} {n["key"]}="a" {n["type"]}="string"{m.sep}',
            f'{m.open}{n["json"]} {n["type"]}="object"{m.sep}',
            f'{n["message"]} {n["role"]}="tool" {n["tool"]}="f" {n["index"]}="1"',
            *n.values(),
            *d.roles,
        ]
        if m.embed_begin and m.embed_end:
            inner = "".join(m.embed_inner[:2])
            frags.append(f"{m.embed_begin[0]}image 2x2{inner}{m.embed_end[0]}")
        for s in m.all():
            half = len(s) // 2
            # Halves, and a marker cut next to each end: for bracketed markers
            # the bracket pairs alone and a marker missing one.
            frags += [s[:half], s[half:], s[:-1], s[1:], s[:2], s[-2:], s[:-2], s[2:]]
        # The first and last line of each system message: its heading, and
        # where a value is stated (`thinking_effort=max`).
        strongest = d.efforts[-1] if d.efforts else "x"
        for sm in d.system.values():
            body = sm.body.render(**{k: strongest if k == "effort" else "x" for k in sm.body.names})
            lines = body.split("\n")
            frags += [lines[0], lines[-1]]
    own = tuple(dict.fromkeys(template.markers.all())) if template is not None else ()
    return _Pieces(tuple(dict.fromkeys(markers)), own,
                   tuple(x for x in dict.fromkeys([*frags, *SYNTAX, *OTHER_MARKERS]) if x))


def _piece(p: _Pieces) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(p.own or p.markers),
        st.sampled_from(p.markers),
        st.sampled_from(p.fragments),
        st.sampled_from(UNICODE),
        st.sampled_from(WHITESPACE),
        st.text(max_size=8),
    )


@st.composite
def _rarely(draw: st.DrawFn, common: st.SearchStrategy[_V], rare: st.SearchStrategy[_V], one_in: int) -> _V:
    # 37 is no boundary value: hypothesis favours 0 and the bounds.
    if draw(st.integers(0, one_in - 1)) == 37 % one_in:
        return draw(rare)
    return draw(common)


def _repeat(p: str, n: int) -> str:
    """``p`` repeated to ``n`` characters."""
    return (p * (n // max(1, len(p)) + 1))[:n]


@lru_cache(maxsize=256)
def _texts(template: Template | None, max_pieces: int, long: bool, huge: bool) -> st.SearchStrategy[str]:
    p = _pieces(template)
    piece = _piece(p)
    options: list[st.SearchStrategy[str]] = [
        st.lists(piece, max_size=max_pieces).map("".join),
        st.lists(piece, max_size=max_pieces).map("".join),
        st.sampled_from(WHITESPACE + p.markers),
        st.text(max_size=30),
    ]
    if long:
        # Long, not huge: a long piece repeated 300 times would pass 10,000
        # characters, which only `huge` may.
        options.append(st.builds(lambda s, k: (s * k)[:9_999], piece.filter(bool), st.integers(20, 300)))
    common = st.one_of(options)
    if not huge:
        return common
    big = st.builds(_repeat, st.one_of(st.sampled_from(p.markers + p.fragments), st.text(min_size=1, max_size=8)),
                    st.integers(10_000, 100_000))
    return _rarely(common, big, 200)


def texts(template: Template | None = None, *, max_pieces: int = 6, long: bool = True,
          huge: bool = True) -> st.SearchStrategy[str]:
    """Adversarial text for any text field.

    Mostly concatenations of up to ``max_pieces`` nasty pieces: every marker
    literal of ``template`` and of the built-in templates, fragments of
    markup built from the template's own names (``<|close|>argument<|sep|>``,
    open tags, halves of markers, a marker without its last two characters),
    lines of its system prose, ``&amp;`` and ``&quot;``, quotes, JSON
    look-alikes, other models' special tokens, unicode edge cases (emoji and
    ZWJ sequences, combining marks, right-to-left text and overrides, CJK,
    astral characters, BOM, zero-width characters; never surrogates), NUL and
    control characters, whitespace only, the empty string; with ``long``,
    sometimes a piece repeated up to 9,999 characters, and with ``huge``
    about one string in 200 between 10,000 and 100,000 characters.
    ``max_pieces=1`` gives single pieces.
    """
    return _texts(template, max_pieces, long, huge)


# -- JSON ------------------------------------------------------------------------

@lru_cache(maxsize=64)
def json_values(template: Template | None = None, max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """JSON values (finite floats, integers beyond 64 bits, :func:`texts` as
    strings and keys), nested up to ``max_leaves`` leaves."""
    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        _texts(template, 3, False, False),
    )
    keys = _texts(template, 2, False, False)
    return st.recursive(
        leaf,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
        max_leaves=max_leaves,
    )


@lru_cache(maxsize=64)
def json_objects(template: Template | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects of :func:`json_values` with adversarial keys."""
    return st.dictionaries(_texts(template, 3, False, False), json_values(template), max_size=4)

