"""Fuzz your own XTML template: hypothesis strategies and ready-made properties.

Everything template-specific (roles, efforts, image part types, markers,
element names) is read from the template, so the same strategies work for the
built-in ``kimi-k3`` and for any template file::

    from hypothesis import given, settings
    import xtml
    from xtml import testing as xt

    T = xtml.load("my-template.toml")
    TOK = xtml.load_tokenizer("tokenizer.json")

    @settings(deadline=None)
    @given(xt.requests(T))
    def test_round_trip(request):
        xt.check_round_trip(T, request, TOK)

Strategies:

* :func:`requests` — valid chat requests for a template, every option and
  message shape;
* :func:`texts` — adversarial text (marker literals and fragments, entities,
  quotes, unicode edge cases, NUL, whitespace, rarely huge strings);
* :func:`markup` — well-formed markup in text form, from the reference grammar;
* :func:`token_ids` — id soup biased toward the template's marker ids, and
  mutated ids of valid requests;
* :func:`stream_cases` / :func:`chunk_sizes` — inputs of the stream check.

Properties (each raises :class:`AssertionError` with a clear message):
:func:`check_round_trip`, :func:`check_injection_free`,
:func:`check_stream_equals_batch`, :func:`check_never_crash`,
:func:`check_markup_parses`. :func:`completion_case` renders a request's last
assistant message as a completion; :func:`find_failure` runs one property
outside a test suite and shrinks its failure (``xtml fuzz``, see
:mod:`xtml.fuzz`; docs/testing.md is the guide).

This module needs ``hypothesis`` (an optional dependency); ``import xtml``
does not import it.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from ..errors import MessageError, ParseError, XtmlError
from ..markup.grammar import document_parser, parse_lexemes
from ..markup.header import NAME_RE, escape
from ..markup.markers import (
    CLOSE,
    EMBED_BEGIN,
    EMBED_END,
    EMBED_INNER,
    EMBED_MARK,
    END,
    OPEN,
    SEP,
    TEXT,
)
from ..markup.parse import MAX_DEPTH, build, lex_text
from ..markup.segments import Segment
from ..serving.stream import StreamEvent
from ..template import Template, TokenizerLike, load

__all__ = [
    "Failure",
    "Outcome",
    "check_injection_free",
    "check_markup_parses",
    "check_never_crash",
    "check_round_trip",
    "check_stream_equals_batch",
    "chunk_sizes",
    "completion_case",
    "find_failure",
    "markup",
    "requests",
    "stream_cases",
    "texts",
    "token_ids",
]

_V = TypeVar("_V")

# -- text ------------------------------------------------------------------------

# Other models' special tokens: text that must stay text in any template.
# (Escapes, not the characters: some are look-alikes of ASCII.)
OTHER_MARKERS = (
    "<think>", "</think>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<s>", "</s>", "[INST]", "[/INST]", "<|EOT|>",
    "<tool_call>", "</tool_call>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>",
    "<\uff5cAssistant\uff5c>", "\uff5cDSML\uff5c",
)
# Attribute escaping, quoting and JSON look-alikes.
SYNTAX = (
    "&amp;", "&quot;", "&amp;quot;", "&", "&&", '"', "'", '="', ' key="', "=", "\\", "\\u0000", '\\"',
    "{", "}", "[", "]", "{}", "[]", "null", "true", "false", "1", "-0.0", "1e400", "NaN", '{"a": 1}',
    "```json\n", "\n```", "# Tools",
)
UNICODE = (
    "\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466", "\U0001f3f3\ufe0f\u200d\U0001f308",
    "e\u0301", "\u0301", "a\u0308\u0323", "\u202e", "\u200f", "\u0645\u0631\u062d\u0628\u0627",
    "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd", "\u6f22\u5b57", "\u30ab\u30bf\u30ab\u30ca", "\ud55c\uad6d\uc5b4",
    "\u200b", "\u200d", "\ufeff", "\ufffd", "\x00", "\x01", "\x1b", "\x7f", "\x85", "\u2028", "\u2029",
    "\U0010ffff", "\U0001f9ff", "\U000e0041", "\U0001d54f", "\u00df", "\u0130", "\ufb01", "\u212b", "\u2126",
    "\uffff", "\U0002a6d6",
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
    from ..chat.dialect import BUILTIN

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
        markers += [*m.all(), *([d.image_placeholder] if d.image_placeholder else [])]
        frags += [
            f"{m.close}{n['argument']}{m.sep}",
            f"{m.close}{n['message']}{m.sep}{m.end}",
            f'{m.open}{n["message"]} {n["role"]}="system"{m.sep}',
            f'{m.open}{n["message"]} {n["role"]}="user"{m.sep}',
            f'{m.open}{n["message"]} {n["role"]}="assistant"{m.sep}{m.open}{d.prompt_tag(True) or n["think"]}{m.sep}',
            f"{m.close}{n['think']}{m.sep}{m.open}{n['response']}{m.sep}",
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
            frags += [s[:half], s[half:], s[:-1], s[1:]]
        for sm in d.system.values():
            body = sm.body.render(**dict.fromkeys(sm.body.names, "x"))
            frags.append(body.split("\n", 1)[0])
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


def texts(template: Template | None = None, *, huge: bool = True) -> st.SearchStrategy[str]:
    """Adversarial text for any text field.

    Mostly concatenations of nasty pieces: every marker literal of
    ``template`` and of the built-in templates, fragments of markup built
    from the template's own names (``<|close|>argument<|sep|>``, open tags,
    halves of markers), ``&amp;`` and ``&quot;``, quotes, JSON look-alikes,
    other models' special tokens, unicode edge cases (emoji and ZWJ
    sequences, combining marks, right-to-left text and overrides, CJK,
    astral characters, BOM, zero-width characters; never surrogates), NUL and
    control characters, whitespace only, the empty string; sometimes long
    repeats, and about one string in 200 between 10,000 and 100,000
    characters (``huge=False`` leaves those out).
    """
    return _texts(template, 6, True, huge)


def _strip_markers(s: str, splitter: re.Pattern[str]) -> str:
    """``s`` without any marker literal (removing one may make another)."""
    while splitter.search(s):
        s = splitter.sub("", s)
    return s


# -- JSON ------------------------------------------------------------------------

@lru_cache(maxsize=64)
def _json_values(template: Template | None, max_leaves: int = 8) -> st.SearchStrategy[Any]:
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
def _json_objects(template: Template | None) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(_texts(template, 3, False, False), _json_values(template), max_size=4)


def _non_json(s: str) -> str:
    """``s`` unless it parses as JSON that is not an object (an invalid request)."""
    try:
        v = json.loads(s)
    except (ValueError, RecursionError):
        return s
    return s if isinstance(v, dict) else "~" + s


# -- requests --------------------------------------------------------------------

@dataclass(frozen=True)
class _Roles:
    plain: tuple[str, ...]
    """Spellings of roles whose messages are content (and a name)."""
    assistant: tuple[str, ...]
    tool: tuple[str, ...]
    system: tuple[str, ...]
    """Spellings of the system role (which may declare tools)."""


def _roles(template: Template) -> _Roles:
    d = template.dialect
    spell: dict[str, list[str]] = {r: [r, r] for r in d.roles}  # the role itself twice as often as an alias
    for alias, target in sorted(d.role_aliases.items()):
        if target in spell and alias not in spell:
            spell[target].append(alias)
    plain = tuple(s for r in d.roles if r not in ("assistant", "tool") for s in spell[r])
    return _Roles(plain, tuple(spell.get("assistant", ())), tuple(spell.get("tool", ())),
                  tuple(spell.get("system", ())))


@dataclass(frozen=True)
class _Gen:
    """The strategies :func:`requests` draws from, built once per template."""

    template: Template
    roles: _Roles
    text: st.SearchStrategy[str]
    short: st.SearchStrategy[str]
    nonempty: st.SearchStrategy[str]
    content: st.SearchStrategy[Any]
    arguments: st.SearchStrategy[Any]
    call_ids: st.SearchStrategy[str]
    tools: st.SearchStrategy[list[Any]]
    json_values: st.SearchStrategy[Any]
    json_objects: st.SearchStrategy[dict[str, Any]]
    image_prompt: st.SearchStrategy[str] | None


def _plugin_parts(template: Template) -> list[st.SearchStrategy[dict[str, Any]]]:
    """The content parts the template's plugins render (images, audio, a
    third-party element ...), from each plugin's own strategy."""
    out = []
    for ext in template.dialect.content:
        s = ext.strategy()
        if s is not None:
            out.append(s)
    return out


def _image_prompt_strategy(template: Template) -> st.SearchStrategy[str] | None:
    """Image prompts matching the template's pattern, or None if hypothesis
    cannot generate from it."""
    try:
        s = st.from_regex(template.dialect.image_prompt, fullmatch=True)
        s.validate()
    except Exception:  # an unsupported pattern: no image prompts then
        return None
    return s


def _is_image_prompt(template: Template, p: str) -> bool:
    """Whether ``p`` is an image prompt that renders as one embed span."""
    if not template.dialect.image_prompt.match(p):
        return False
    kinds = lex_text(p, template.markers).kinds
    return (len(kinds) >= 2 and kinds[0] == EMBED_BEGIN and kinds[-1] == EMBED_END
            and all(k in (TEXT, EMBED_INNER) for k in kinds[1:-1]))


@lru_cache(maxsize=64)
def _gen(template: Template, images: bool) -> _Gen:
    text = _texts(template, 6, True, True)
    short = _texts(template, 3, False, False)
    nonempty = _texts(template, 4, True, False).filter(bool)
    parts: list[st.SearchStrategy[Any]] = [
        st.builds(lambda t: {"type": "text", "text": t}, text),
        st.builds(lambda t: {"type": "text", "text": t}, short),
        st.builds(lambda t: {"type": "input_text", "text": t}, short),
        short,  # a bare string part
    ]
    if images:
        for plugin_part in _plugin_parts(template):
            parts += [plugin_part, plugin_part]
    content = st.one_of(text, text, st.lists(st.one_of(parts), max_size=4), st.none())
    objects = _json_objects(template)
    arguments = st.one_of(
        objects,
        objects,
        st.builds(lambda d, indent, ascii_: json.dumps(d, indent=indent, ensure_ascii=ascii_),
                  objects, st.sampled_from([None, 2]), st.booleans()),
        _texts(template, 4, True, False).map(_non_json),
        st.sampled_from([None, "", "  ", {}, "{}"]),
    )
    call_ids = st.one_of(st.sampled_from(["c1", "c2", "call_0_1", "call_1_1", "call_1_2"]),
                         _texts(template, 2, False, False))
    schema = st.builds(
        lambda name, desc, params: {"type": "function",
                                    "function": {"name": name, "description": desc, "parameters": params}},
        nonempty, short, objects)
    tools = st.lists(st.one_of(schema, schema, _json_values(template, 4)), min_size=1, max_size=3)
    return _Gen(template, _roles(template), text, short, nonempty, content, arguments, call_ids, tools,
                _json_values(template), objects, _image_prompt_strategy(template) if images else None)


@st.composite
def _tool_call(draw: st.DrawFn, g: _Gen) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": draw(g.nonempty)}
    args = draw(g.arguments)
    if args is not None or draw(st.booleans()):
        fn["arguments"] = args
    if draw(st.integers(0, 4)) == 4:
        call: dict[str, Any] = dict(fn)  # the flat form, without "function"
    else:
        call = {"type": "function", "function": fn}
    if draw(st.integers(0, 3)) > 0:
        call["id"] = draw(g.call_ids)
    return call


def _assistant(draw: st.DrawFn, g: _Gen, role: str) -> dict[str, Any]:
    m: dict[str, Any] = {"role": role}
    c = draw(g.content)
    if c is not None or draw(st.booleans()):
        m["content"] = c
    if draw(st.booleans()):
        key = draw(st.sampled_from(["reasoning_content", "reasoning_content", "reasoning", "thinking"]))
        m[key] = draw(g.text)
    if draw(st.booleans()):
        m["tool_calls"] = draw(st.lists(_tool_call(g), max_size=3))
    if draw(st.integers(0, 4)) == 4:
        m["name"] = draw(g.short)
    if draw(st.integers(0, 7)) == 7:
        m.update({"refusal": None, "annotations": []})  # empty API fields are accepted
    return m


def _tool_result(draw: st.DrawFn, g: _Gen, call_ids: list[str]) -> dict[str, Any]:
    m: dict[str, Any] = {"role": draw(st.sampled_from(g.roles.tool)), "content": draw(g.content)}
    if call_ids and draw(st.integers(0, 3)) > 0:
        m["tool_call_id"] = draw(st.sampled_from(call_ids))
    elif draw(st.integers(0, 3)) == 3:
        m["tool_call_id"] = draw(g.call_ids)
    how = draw(st.sampled_from(["none", "name", "name", "tool"]))
    if how != "none":
        m[how] = draw(g.nonempty)
    return m


@st.composite
def _messages(draw: st.DrawFn, g: _Gen, max_messages: int) -> list[dict[str, Any]]:
    r = g.roles
    kinds: list[str] = []
    if r.plain:
        kinds += ["plain"] * 3
    if r.assistant:
        kinds += ["assistant"] * 2
        if r.tool:
            kinds += ["round"] * 2
    if r.tool:
        kinds.append("tool")
    if r.system:
        kinds.append("tools")
    out: list[dict[str, Any]] = []
    call_ids: list[str] = []
    if not kinds:
        return out
    for _ in range(draw(st.integers(0, max_messages))):
        kind = draw(st.sampled_from(kinds))
        if kind == "tools":
            # A dynamic tool declaration: tools, and no content or name.
            m: dict[str, Any] = {"role": draw(st.sampled_from(r.system)), "tools": draw(g.tools)}
            c = draw(st.sampled_from(["absent", "", None, [], [{"type": "text", "text": ""}]]))
            if c != "absent":
                m["content"] = c
        elif kind in ("assistant", "round"):
            m = _assistant(draw, g, draw(st.sampled_from(r.assistant)))
            if kind == "round" and not m.get("tool_calls"):
                m["tool_calls"] = draw(st.lists(_tool_call(g), min_size=1, max_size=3))
            call_ids = [str(c["id"]) for c in m.get("tool_calls") or () if c.get("id") is not None]
            if kind == "round":
                # The calls' results, in any order, matched by id or not.
                n = len(m["tool_calls"])
                run = [_tool_result(draw, g, call_ids) for _ in range(draw(st.integers(1, n + 1)))]
                out.append(m)
                out.extend(draw(st.permutations(run)))
                continue
        elif kind == "tool":
            m = _tool_result(draw, g, call_ids)
        else:
            m = {"role": draw(st.sampled_from(r.plain)), "content": draw(g.content)}
            if draw(st.integers(0, 3)) == 3:
                m["name"] = draw(g.short)
        if draw(st.integers(0, 9)) == 9:
            m["id"] = draw(g.call_ids) if m["role"] not in r.tool else m.get("tool_call_id", "x")
        out.append(m)
    return out


def _count_images(template: Template, messages: list[dict[str, Any]]) -> int:
    """Images as the template counts them when image prompts are given:
    image parts, and every placeholder literal in text."""
    d = template.dialect
    ph = d.image_placeholder
    n = 0
    if not ph:
        return 0
    image_types = d.plugins["image"].part_types
    for m in messages:
        if m.get("tools") and d.role_aliases.get(m["role"], m["role"]) == "system":
            continue
        c = m.get("content")
        if isinstance(c, str):
            n += c.count(ph)
        elif isinstance(c, list):
            for p in c:
                if isinstance(p, str):
                    n += p.count(ph)
                elif p.get("type") in image_types:
                    n += 1
                else:
                    n += str(p.get("text", "")).count(ph)
    return n


def _name_unresolved_tools(template: Template, body: dict[str, Any], name: str) -> None:
    """Give a name to each tool result whose tool the template cannot find
    (the one fix-up that keeps generated requests valid)."""
    msgs = body["messages"]
    for _ in range(len(msgs) + 1):
        try:
            template.normalize(body)
            return
        except MessageError as e:
            if not (e.path == "name" and 0 <= e.index < len(msgs) and "name" not in msgs[e.index]
                    and "tool" not in msgs[e.index]):
                return
            msgs[e.index]["name"] = name
        except XtmlError:
            return  # left as it is: the check functions report it


@st.composite
def _requests(draw: st.DrawFn, template: Template, images: bool, max_messages: int) -> dict[str, Any]:
    g = _gen(template, images)
    d = template.dialect
    messages = draw(_messages(g, max_messages))
    opts: dict[str, Any] = {}
    thinking = draw(st.sampled_from([None, True, False]))
    if thinking is not None:
        opts[draw(st.sampled_from(["thinking", "thinking", "enable_thinking"]))] = thinking
    efforts = [None, None, *d.efforts, *(d.thinking_off if thinking is not True else ())]
    reasoning_effort = draw(st.sampled_from(efforts))
    if reasoning_effort is not None:
        opts["reasoning_effort"] = reasoning_effort
    effort = draw(st.sampled_from([None, *d.efforts]))
    if effort is not None:
        opts["thinking_effort"] = effort
    tc = draw(st.sampled_from([None, "auto", "none", "required", "named"]))
    if tc == "named":
        opts["tool_choice"] = {"type": "function", "function": {"name": draw(g.nonempty)}}
    elif tc is not None:
        opts["tool_choice"] = tc
    rf = draw(st.sampled_from([None, "text", "bare", "json_object", "json_schema", "json_schema_flat"]))
    if rf == "json_schema":
        opts["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": draw(g.json_values)}}
    elif rf == "json_schema_flat":
        opts["response_format"] = {"type": "json_schema", "json_schema": draw(g.json_objects)}
    elif rf == "bare":
        opts["response_format"] = draw(st.sampled_from(["text", "json_object"]))
    elif rf is not None:
        opts["response_format"] = {"type": rf}
    agp = draw(st.sampled_from([None, True, False]))
    if agp is not None:
        opts["add_generation_prompt"] = agp
    if draw(st.booleans()):
        opts["tools"] = draw(st.one_of(g.tools, st.just([])))
    if g.image_prompt is not None and draw(st.booleans()):
        n = _count_images(template, messages)
        if n <= 8:
            prompts = draw(st.lists(g.image_prompt, min_size=n, max_size=n))
            if all(_is_image_prompt(template, p) for p in prompts):
                opts["image_prompts"] = prompts
    body: dict[str, Any] = {"messages": messages}
    for k, v in opts.items():
        if draw(st.integers(0, 2)) == 2:
            body.setdefault("chat_template_kwargs", {})[k] = v
        else:
            body[k] = v
    if draw(st.integers(0, 5)) == 5:
        body["model"] = "any"
        body["temperature"] = 0.6
    _name_unresolved_tools(template, body, "t")
    return body


def requests(template: Template, *, images: bool = True, max_messages: int = 6) -> st.SearchStrategy[dict[str, Any]]:
    """Valid chat requests for ``template``: chat-completions bodies.

    Messages of every role the template accepts (and its role aliases):
    content as text or a list of text and image parts (the template's image
    part types), names; assistant messages with reasoning (under each of its
    keys), tool calls in both forms with typed arguments (nested JSON),
    JSON-string or non-JSON-string arguments, with and without ids; tool
    results in any order, matched by ``tool_call_id`` or not, named by
    ``name``, ``tool`` or their position; dynamic tool declarations.
    Options, in the body or under ``chat_template_kwargs``: ``thinking`` /
    ``enable_thinking``, ``thinking_effort`` and ``reasoning_effort`` from the
    template's efforts, ``tool_choice`` (named too), ``response_format``,
    ``add_generation_prompt``, ``tools``, ``image_prompts`` (drawn from the
    template's image prompt pattern), and API keys the template ignores.
    Text fields are :func:`texts`.

    A tool result whose tool the template cannot resolve gets a ``name``.
    ``images=False`` leaves out the parts plugins render (images, audio,
    video, third-party elements).
    """
    return _requests(template, images, max_messages)


# -- markup ----------------------------------------------------------------------

_SLOT = re.compile("\x01([A-Z_]+)(?::([0-9]+))?\x02")


@lru_cache(maxsize=64)
def _skeletons(template: Template) -> st.SearchStrategy[str]:
    """Derivations of rule ``document`` of the reference grammar, each
    terminal as a slot ``\\x01KIND:i\\x02`` (``i``: which marker string)."""
    m = template.markers

    def slot(kind: str, strings: Sequence[str]) -> st.SearchStrategy[str]:
        if not strings:
            # The template has no such marker: the embed becomes text.
            return st.just(f"\x01{TEXT}\x02")
        return st.sampled_from([f"\x01{kind}:{i}\x02" for i in range(len(strings))])

    explicit = {
        OPEN: slot(OPEN, [m.open]),
        CLOSE: slot(CLOSE, [m.close]),
        SEP: slot(SEP, [m.sep]),
        END: slot(END, [m.end]),
        EMBED_BEGIN: slot(EMBED_BEGIN, m.embed_begin if m.embed_end else ()),
        EMBED_INNER: slot(EMBED_INNER, m.embed_inner if m.embed_begin and m.embed_end else ()),
        EMBED_END: slot(EMBED_END, m.embed_end if m.embed_begin else ()),
        EMBED_MARK: slot(EMBED_MARK, m.embed_mark),
        TEXT: st.just(f"\x01{TEXT}\x02"),
    }
    return from_lark(document_parser(), start="document", explicit=explicit)


def _marker_string(template: Template, kind: str, i: int) -> str:
    m = template.markers
    single = {OPEN: m.open, CLOSE: m.close, SEP: m.sep, END: m.end}
    if kind in single:
        return single[kind]
    groups = {EMBED_BEGIN: m.embed_begin, EMBED_INNER: m.embed_inner, EMBED_END: m.embed_end,
              EMBED_MARK: m.embed_mark}
    return groups[kind][i]


@st.composite
def _headers(draw: st.DrawFn, template: Template, value: st.SearchStrategy[str]) -> tuple[str, str]:
    """(tag, header text): a tag name and escaped attributes."""
    names = sorted(set(template.dialect.names.values()))
    name = st.one_of(st.sampled_from(names), st.sampled_from(names), st.from_regex(NAME_RE, fullmatch=True))
    tag = draw(name)
    attrs = draw(st.lists(st.tuples(name, value), max_size=3))
    return tag, tag + "".join(f' {k}="{escape(v)}"' for k, v in attrs)


@st.composite
def _markup(draw: st.DrawFn, template: Template) -> str:
    skeleton = draw(_skeletons(template))
    splitter = template.markers.splitter()
    body = _texts(template, 4, False, False).map(lambda s: _strip_markers(s, splitter))
    out: list[str] = []
    kinds: list[str] = []
    stack: list[str] = []
    prev = ""
    depth = 0
    for mt in _SLOT.finditer(skeleton):
        kind, index = mt.group(1), int(mt.group(2) or 0)
        if kind != TEXT:
            out.append(_marker_string(template, kind, index))
            kinds.append(kind)
        elif prev == OPEN:
            tag, header = draw(_headers(template, body))
            stack.append(tag)
            depth = max(depth, len(stack))
            out.append(header)
            kinds.append(TEXT)
        elif prev == CLOSE:
            out.append(stack.pop())
            kinds.append(TEXT)
        else:
            s = draw(body)
            out.append(s)
            if s and not (kinds and kinds[-1] == TEXT):
                kinds.append(TEXT)
        prev = kind
    text = "".join(out)
    # Markers that text around a marker could spell across the boundary (not
    # possible with K3's markers, but with others), and nesting beyond the
    # limit, are rejected rather than returned ill-formed.
    assume(depth <= MAX_DEPTH and lex_text(text, template.markers).kinds == kinds)
    return text


def markup(template: Template) -> st.SearchStrategy[str]:
    """Well-formed XTML documents in text form, for ``template``'s markers.

    Generated from the reference grammar (``grammar/xtml.lark``, rule
    ``document``) with :func:`hypothesis.extra.lark.from_lark`. The grammar
    ``%declare``\\ s its terminals and from_lark concatenates terminals
    without knowing their context, so each terminal is first drawn as a
    slot and the slots are then filled by place: markers with the template's
    marker strings (embeds become text where the template has no embed
    markers), the TEXT after OPEN with a random header (a tag name, often
    one of the template's names, and escaped attributes), the TEXT after
    CLOSE with the name of the element it closes (the grammar cannot say
    so), and body text with :func:`texts` stripped of marker literals. Every
    string therefore parses (strictly, with ``xtml.markup.build`` over
    ``lex_text`` and with the grammar itself); they are markup, not
    necessarily chat the template understands.
    """
    return _markup(template)


# -- token ids -------------------------------------------------------------------

@st.composite
def _mutated_ids(draw: st.DrawFn, template: Template, tokenizer: TokenizerLike) -> list[int]:
    """The ids of a valid request cut off, or with a few ids dropped,
    duplicated, replaced by markers or swapped."""
    b = template.bind(tokenizer)
    try:
        ids = template.encode(draw(requests(template, max_messages=3)), b.vocab)
    except XtmlError:
        return []
    mids = sorted(b.marker_ids.values())
    for _ in range(draw(st.integers(1, 3))):
        if not ids:
            break
        i = draw(st.integers(0, len(ids) - 1))
        op = draw(st.sampled_from(["cut", "drop", "dup", "marker", "swap"]))  # cuts shrink best
        if op == "cut":
            ids = ids[:i]
        elif op == "drop":
            del ids[i]
        elif op == "dup":
            ids.insert(i, ids[i])
        elif op == "marker":
            ids[i] = draw(st.sampled_from(mids))
        elif op == "swap":
            j = draw(st.integers(0, len(ids) - 1))
            ids[i], ids[j] = ids[j], ids[i]
    return ids


def token_ids(template: Template, tokenizer: TokenizerLike, *, max_size: int = 60) -> st.SearchStrategy[list[int]]:
    """Token ids for ``tokenizer``: mostly soup biased toward the template's
    marker ids and the ids of its tag headers (``message role="assistant"``,
    ``think``, ...), sometimes the ids of a valid request with a few ids
    dropped, duplicated, replaced, swapped or cut off. Every id is in the
    vocabulary."""
    b = template.bind(tokenizer)
    n, d = template.dialect.names, template.dialect
    mids = sorted(b.marker_ids.values())
    size = b.vocab.size
    words = [*sorted(set(n.values())), *(f'{n["message"]} {n["role"]}="{r}"' for r in d.roles),
             f'{n["call"]} {n["tool"]}="f" {n["index"]}="1"', f'{n["argument"]} {n["key"]}="a" {n["type"]}="string"',
             f'{n["json"]} {n["type"]}="object"', "hello", " ", "\n", "{}", '"']
    pieces = [ids for ids in b.vocab.encode_texts(words) if ids]
    one = st.one_of(st.sampled_from(mids), st.sampled_from(mids), st.integers(0, size - 1),
                    st.integers(0, min(size - 1, 1000))) if mids else st.integers(0, size - 1)
    chunk = st.one_of(one.map(lambda i: [i]), one.map(lambda i: [i]), st.sampled_from(pieces)) if pieces \
        else one.map(lambda i: [i])
    soup = st.lists(chunk, max_size=max_size).map(lambda cs: [i for c in cs for i in c][:max_size * 2])
    return st.one_of(soup, soup, _mutated_ids(template, tokenizer))


# -- properties ------------------------------------------------------------------

def _show(x: Any, limit: int = 300) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _difference(want: Any, got: Any, path: str = "") -> str | None:
    """Where two JSON-like values first differ, or None if they are equal."""
    if type(want) is not type(got) and not (isinstance(want, int | float) and isinstance(got, int | float)):
        return f"{path or 'the value'}: expected {_show(want)}, got {_show(got)}"
    if isinstance(want, dict):
        for k in want:
            if k not in got:
                return f"{path}.{k}: missing (expected {_show(want[k])})" if path else f"{k}: missing"
        for k in got:
            if k not in want:
                return f"{path}.{k}: unexpected {_show(got[k])}" if path else f"{k}: unexpected {_show(got[k])}"
        for k in want:
            diff = _difference(want[k], got[k], f"{path}.{k}" if path else str(k))
            if diff is not None:
                return diff
        return None
    if isinstance(want, list):
        for i, (a, b) in enumerate(zip(want, got)):
            diff = _difference(a, b, f"{path}[{i}]")
            if diff is not None:
                return diff
        if len(want) != len(got):
            return f"{path or 'the list'}: expected {len(want)} items, got {len(got)}"
        return None
    if want != got or type(want) is not type(got):
        return f"{path or 'the value'}: expected {_show(want)}, got {_show(got)}"
    return None


def _assert_equal(want: Any, got: Any, what: str) -> None:
    if want != got:
        raise AssertionError(f"{what}: {_difference(want, got) or f'{_show(want)} != {_show(got)}'}")


def _call(what: str, fn: Callable[..., _V], *args: Any, **kwargs: Any) -> _V:
    """``fn(*args, **kwargs)``; any exception becomes an AssertionError naming ``what``."""
    try:
        return fn(*args, **kwargs)
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}") from e


def _text_form_ambiguous(template: Template, segments: Sequence[Segment]) -> bool:
    """Whether some marker literal in the text form comes from text rather
    than from a special segment (the text form then reads back otherwise)."""
    splitter = template.markers.splitter()
    whole = len(splitter.findall("".join(s.text for s in segments)))
    return whole != sum(len(splitter.findall(s.text)) for s in segments if s.special)


def _spells_text_mark(template: Template, segments: Sequence[Segment], tokenizer: TokenizerLike) -> bool:
    """Whether text spells a marker that the vocabulary has no id for (an
    optional marker): decoded, it reads as the marker, as the model's own
    processor reads it, so such a request does not round-trip by design."""
    marks = template.bind(tokenizer).text_marks
    if not marks:
        return False
    runs: list[str] = []
    run: list[str] = []
    for seg in segments:
        if seg.special:
            runs.append("".join(run))
            run = []
        else:
            run.append(seg.text)
    runs.append("".join(run))
    return any(m in r for r in runs for m in marks)


def check_round_trip(template: Template, request: Any, tokenizer: TokenizerLike | None = None) -> None:
    """``parse(encode(request)) == normalize(request)``, strictly and leniently
    (with no diagnostics); render and normalize leave the request unchanged;
    the normal form is a fixed point of normalize and renders to the same
    text.

    With ``tokenizer=None`` the text form is checked instead, where it is
    unambiguous (no marker literal in body text; otherwise only the fixed
    point is checked). Likewise, where the vocabulary spells an optional
    marker as text, a request holding a literal of it in text is not parsed
    back (it would read as the marker, by design)."""
    before = copy.deepcopy(request)
    expected = _call("normalize", template.normalize, request)
    rendered = _call("render", template.render, request)
    if tokenizer is None:
        if not _text_form_ambiguous(template, rendered.segments):
            got = _call("parse of the rendered text", template.parse, rendered.text)
            _assert_equal(expected, got, "parse(render(x).text) differs from normalize(x)")
    else:
        ids = _call("encode", template.encode, request, tokenizer)
        if not _spells_text_mark(template, rendered.segments, tokenizer):
            got = _call("parse of the encoded ids", template.parse, ids, tokenizer)
            _assert_equal(expected, got, "parse(encode(x)) differs from normalize(x)")
            lenient = _call("lenient parse of the encoded ids", template.parse, ids, tokenizer, lenient=True)
            diags = lenient.pop("diagnostics", None)
            if diags:
                raise AssertionError(f"lenient parse of valid ids reports diagnostics: {_show(diags)}")
            _assert_equal(expected, lenient, "lenient parse(encode(x)) differs from normalize(x)")
    _assert_equal(before, request, "render or normalize changed the request it was given")
    again = _call("normalize of the normal form", template.normalize, expected)
    _assert_equal(expected, again, "the normal form is not a fixed point of normalize")
    text = _call("render of the normal form", template.render, expected).text
    if text != rendered.text:
        at = next((i for i, (a, b) in enumerate(zip(text, rendered.text)) if a != b),
                  min(len(text), len(rendered.text)))
        raise AssertionError(f"the normal form renders differently from the request, from character {at}: "
                             f"{_show(rendered.text[at:at + 80])} became {_show(text[at:at + 80])}")


def check_injection_free(template: Template, request: Any, tokenizer: TokenizerLike) -> None:
    """No text becomes a marker: each marker id occurs in ``encode(request)``
    exactly as often as its marker in the special segments of
    ``render(request)``; no other special token of the vocabulary occurs at
    all; and the ids are those of encoding the segments one by one."""
    b = template.bind(tokenizer)
    segments = _call("render", template.render, request).segments
    ids = _call("encode", template.encode, request, b.vocab)
    splitter = template.markers.splitter()
    want: Counter[int] = Counter()
    for seg in segments:
        if seg.special:
            for mt in splitter.finditer(seg.text):
                mid = b.marker_ids.get(mt.group())
                if mid is not None:
                    want[mid] += 1
    got = Counter(i for i in ids if i in b.kind_of_id)
    for mid in sorted(set(want) | set(got)):
        if want[mid] != got[mid]:
            marker = b.kind_of_id[mid][1]
            raise AssertionError(f"marker {marker!r} (id {mid}) occurs {got[mid]} times in the ids but "
                                 f"{want[mid]} times in the special segments: text became a marker"
                                 if got[mid] > want[mid] else
                                 f"marker {marker!r} (id {mid}) occurs {got[mid]} times in the ids but "
                                 f"{want[mid]} times in the special segments: a marker was lost")
    special = b.vocab.special_ids()
    for k, i in enumerate(ids):
        if i in special and i not in b.kind_of_id:
            raise AssertionError(f"special token {b.vocab.id_to_token(i)!r} (id {i}) at token {k}: text became "
                                 f"a special token of the vocabulary")
    segmentwise = _call("encode_segments", b.encode_segments, segments)
    if ids != segmentwise:
        at = next((k for k, (x, y) in enumerate(zip(ids, segmentwise)) if x != y), min(len(ids), len(segmentwise)))
        raise AssertionError(f"encode() differs from encoding the segments one by one, from token {at}: "
                             f"{ids[at:at + 8]} vs {segmentwise[at:at + 8]}")


def completion_case(template: Template, request: Any,
                    tokenizer: TokenizerLike) -> tuple[list[int], dict[str, Any], bool] | None:
    """The request's last assistant message as a model would generate it:
    (the ids after the generation prompt, the message as the batch parser
    should return it, thinking mode), or None when there is no assistant
    message.

    The history is the messages before it, with the request's options but
    those rendered after the history (``tool_choice``, ``response_format``)
    and ``image_prompts``; the message loses its ``name`` (the generation
    prompt has none) and its call ids become ``call_0_K``."""
    d = template.dialect
    if isinstance(request, dict):
        body = dict(request)
        messages = list(body.get("messages") or ())
    else:
        body, messages = {}, list(request)
    drop = ("tool_choice", "response_format", "image_prompts", "add_generation_prompt")
    for key in drop:
        body.pop(key, None)
    if isinstance(body.get("chat_template_kwargs"), dict):
        body["chat_template_kwargs"] = {k: v for k, v in body["chat_template_kwargs"].items() if k not in drop}

    def is_assistant(m: Any) -> bool:
        role = m.get("role") if isinstance(m, dict) else None
        return isinstance(role, str) and d.role_aliases.get(role, role) == "assistant"

    last = next((i for i in range(len(messages) - 1, -1, -1) if is_assistant(messages[i])), None)
    if last is None:
        return None
    m = {k: v for k, v in messages[last].items() if k != "name"}
    history = {**body, "messages": messages[:last]}
    whole = {**body, "messages": [*messages[:last], m]}
    b = template.bind(tokenizer)
    full = _call("encode", template.encode, whole, b.vocab, add_generation_prompt=False)
    prefix = _call("encode", template.encode, history, b.vocab, add_generation_prompt=True)
    if full[: len(prefix)] != prefix:
        raise AssertionError("the generation prompt is not a prefix of the rendered assistant message")
    normal = _call("normalize", template.normalize, whole, add_generation_prompt=False)
    expected = normal["messages"][-1]
    for k, c in enumerate(expected.get("tool_calls", ()), start=1):
        c["id"] = f"call_0_{k}"
    return full[len(prefix):], expected, bool(normal["thinking"])


def chunk_sizes() -> st.SearchStrategy[list[int]]:
    """How to cut a completion for :func:`check_stream_equals_batch`: sizes
    of successive ``feed_many`` calls (cycled), or ``[]`` for one token at a
    time."""
    return st.lists(st.integers(1, 8), max_size=4)


def stream_cases(template: Template, *, images: bool = True) -> st.SearchStrategy[tuple[dict[str, Any], list[int]]]:
    """``(request, chunks)`` pairs for :func:`check_stream_equals_batch`."""
    return st.tuples(requests(template, images=images), chunk_sizes())


def _stream(template: Template, tokenizer: TokenizerLike, ids: list[int], thinking: bool,
            chunks: Sequence[int] | None, *, keep: bool = True, lenient: bool = True) -> list[StreamEvent]:
    sp = template.stream(tokenizer, thinking=thinking, keep=keep, lenient=lenient)
    events: list[StreamEvent] = []
    if not chunks:
        for t in ids:
            events += sp.feed(t)
    else:
        i = k = 0
        while i < len(ids):
            n = max(1, chunks[k % len(chunks)])
            events += sp.feed_many(ids[i : i + n])
            i += n
            k += 1
    events += sp.close()
    return events


def _message_end(events: list[StreamEvent], what: str) -> StreamEvent:
    """The one message_end event; only diagnostics (trailing output) may follow it."""
    ends = [k for k, e in enumerate(events) if e.type == "message_end"]
    if len(ends) != 1:
        raise AssertionError(f"{what}: {len(ends)} message_end events, expected exactly one")
    after = [e.type for e in events[ends[0] + 1 :] if e.type != "diagnostic"]
    if after:
        raise AssertionError(f"{what}: events after message_end: {after[:5]}")
    return events[ends[0]]


def check_stream_equals_batch(template: Template, request: Any, tokenizer: TokenizerLike,
                              chunks: Sequence[int] | None = None) -> None:
    """Streaming a completion gives what the batch parser gives.

    The request's last assistant message is rendered as a completion after
    the generation prompt (see :func:`completion_case`; nothing is checked
    when there is none). With and without the stop token: the batch parse,
    strict and lenient, is the message's normal form; streamed token by token
    (or in ``chunks``: sizes of successive ``feed_many`` calls), the
    ``message_end`` message is the batch parse, the stop reason fits, no
    diagnostic is reported, the text deltas of each channel add up to the
    reasoning and the content, the ``tool_call_end`` calls are the message's
    calls, and a strict stream and one with ``keep=False`` agree."""
    if _spells_text_mark(template, _call("render", template.render, request).segments, tokenizer):
        return  # text that reads as a marker, by design (see check_round_trip)
    case = completion_case(template, request, tokenizer)
    if case is None:
        return
    comp, expected, thinking = case
    stops = set(template.bind(tokenizer).stop_ids)
    if comp and comp[-1] in stops:
        _check_stream(template, tokenizer, comp, expected, thinking, chunks, "with the stop token")
        _check_stream(template, tokenizer, comp[:-1], expected, thinking, chunks, "without the stop token")
    else:
        _check_stream(template, tokenizer, comp, expected, thinking, chunks, "(no stop token)")


def _check_stream(template: Template, tokenizer: TokenizerLike, ids: list[int], expected: dict[str, Any],
                  thinking: bool, chunks: Sequence[int] | None, what: str) -> None:
    n = template.dialect.names
    batch = _call("strict completion parse", template.parse, ids, tokenizer, completion=True, thinking=thinking)
    _assert_equal(expected, batch, f"completion parse {what} differs from the normal form")
    lenient = _call("lenient completion parse", template.parse, ids, tokenizer, completion=True,
                    thinking=thinking, lenient=True)
    diags = lenient.pop("diagnostics", None)
    if diags:
        raise AssertionError(f"lenient completion parse {what} reports diagnostics: {_show(diags)}")
    events = _call("streaming", _stream, template, tokenizer, ids, thinking, chunks)
    bad = [e.diagnostic for e in events if e.type == "diagnostic"]
    if bad:
        raise AssertionError(f"the stream {what} reports diagnostics: {_show(bad)}")
    end = _message_end(events, f"the stream {what}")
    _assert_equal(batch, end.message, f"the streamed message {what} differs from the batch parse")
    reason = "tool_calls" if batch.get("tool_calls") else "stop"
    if end.stop_reason != reason:
        raise AssertionError(f"stop_reason {end.stop_reason!r} {what}, expected {reason!r}")
    think = "".join(e.text or "" for e in events if e.type == "text" and e.channel == n["think"])
    if think != batch.get("reasoning_content", ""):
        raise AssertionError(f"the think deltas {what} add up to {_show(think)}, "
                             f"the reasoning is {_show(batch.get('reasoning_content', ''))}")
    if isinstance(batch.get("content"), str):
        response = "".join(e.text or "" for e in events if e.type == "text" and e.channel == n["response"])
        if response != batch["content"]:
            raise AssertionError(f"the response deltas {what} add up to {_show(response)}, "
                                 f"the content is {_show(batch['content'])}")
    calls = [e.call for e in events if e.type == "tool_call_end"]
    _assert_equal(batch.get("tool_calls", []), calls, f"the tool_call_end calls {what}")
    strict = _call("a strict stream", _stream, template, tokenizer, ids, thinking, chunks, lenient=False)
    _assert_equal(batch, _message_end(strict, f"the strict stream {what}").message,
                  f"the strict stream's message {what}")
    light = _call("a stream with keep=False", _stream, template, tokenizer, ids, thinking, chunks, keep=False)
    want = {"role": "assistant", **({"tool_calls": batch["tool_calls"]} if batch.get("tool_calls") else {})}
    _assert_equal(want, _message_end(light, f"the keep=False stream {what}").message,
                  f"the keep=False stream's message {what}")


def _check_diagnostics(out: Any, length: int, what: str) -> None:
    if not isinstance(out, dict):
        raise AssertionError(f"{what} returned {type(out).__name__}, not a dict")
    diags = out.get("diagnostics")
    if not isinstance(diags, list):
        raise AssertionError(f"{what}: 'diagnostics' is {_show(diags)}, not a list")
    for x in diags:
        if not isinstance(x, dict) or set(x) != {"kind", "offset", "message"}:
            raise AssertionError(f"{what}: malformed diagnostic {_show(x)}")
        if not isinstance(x["offset"], int) or not 0 <= x["offset"] <= length:
            raise AssertionError(f"{what}: diagnostic offset outside the input (length {length}): {_show(x)}")


def check_never_crash(template: Template, ids_or_text: Sequence[int] | str,
                      tokenizer: TokenizerLike | None = None) -> None:
    """Arbitrary input never crashes a parser.

    For each of a conversation parse and completion parses in thinking and
    non-thinking mode: a strict parse returns a dict or raises
    :class:`xtml.XtmlError` (a :class:`~xtml.ParseError` with its offset
    inside the input); a lenient parse returns a dict with well-formed
    diagnostics (offsets inside the input) and, where the strict parse
    succeeded, the same result with no diagnostics. Token ids (which need
    ``tokenizer``) are also streamed: a lenient stream never raises and ends
    with one ``message_end``; a strict one raises only XtmlError. Ids
    outside the vocabulary may make the batch parsers raise XtmlError."""
    is_text = isinstance(ids_or_text, str)
    if not is_text and tokenizer is None:
        raise TypeError("checking token ids needs their tokenizer")
    data: Any = ids_or_text if is_text else list(ids_or_text)
    tok = None if is_text else tokenizer
    if is_text:
        valid = True
        opens = lex_text(data, template.markers).kinds.count(OPEN)
    else:
        b = template.bind(tokenizer)
        valid = all(type(i) is int and 0 <= i < b.vocab.size for i in data)
        opens = sum(1 for i in data if b.kind_of_id.get(i, ("",))[0] == OPEN) if valid else 0
    # Nesting deeper than the limit is refused in lenient mode too (spec 3.6);
    # a completion starts two elements deep.
    too_deep = opens + 2 > MAX_DEPTH
    for completion, thinking in ((False, None), (True, True), (True, False)):
        what = "completion parse (thinking)" if thinking else (
            "completion parse (no thinking)" if completion else "parse")
        strict: dict[str, Any] | None = None
        try:
            strict = template.parse(data, tok, completion=completion, thinking=thinking)
        except ParseError as e:
            if not 0 <= e.offset <= len(data):
                raise AssertionError(f"strict {what}: ParseError offset {e.offset} outside the input "
                                     f"(length {len(data)}): {e}") from e
        except XtmlError:
            pass
        except Exception as e:
            raise AssertionError(f"strict {what} raised {type(e).__name__} (not an XtmlError): {e}") from e
        else:
            if not isinstance(strict, dict):
                raise AssertionError(f"strict {what} returned {type(strict).__name__}, not a dict")
        try:
            lenient = template.parse(data, tok, completion=completion, thinking=thinking, lenient=True)
        except XtmlError as e:
            if valid and not (too_deep and isinstance(e, ParseError)):
                raise AssertionError(f"lenient {what} raised {type(e).__name__}: {e}") from e
            continue
        except Exception as e:
            raise AssertionError(f"lenient {what} raised {type(e).__name__}: {e}") from e
        _check_diagnostics(lenient, len(data), f"lenient {what}")
        if completion and lenient.get("role") != "assistant":
            raise AssertionError(f"lenient {what}: role {lenient.get('role')!r}, not 'assistant'")
        if strict is not None:
            _assert_equal({**strict, "diagnostics": []}, lenient,
                          f"lenient {what} differs from the strict one (which succeeded)")
    if is_text or tokenizer is None:
        return
    for thinking in (True, False):
        try:
            events = _stream(template, tokenizer, data, thinking, None)
        except Exception as e:
            raise AssertionError(f"a lenient stream (thinking={thinking}) raised {type(e).__name__}: {e}") from e
        end = _message_end(events, f"the lenient stream (thinking={thinking})")
        if not isinstance(end.message, dict) or end.message.get("role") != "assistant":
            raise AssertionError(f"the lenient stream (thinking={thinking}) ended with {_show(end.message)}")
        try:
            _stream(template, tokenizer, data, thinking, None, lenient=False)
        except XtmlError:
            pass
        except Exception as e:
            raise AssertionError(f"a strict stream (thinking={thinking}) raised {type(e).__name__} "
                                 f"(not an XtmlError): {e}") from e


def check_markup_parses(template: Template, text: str) -> None:
    """Well-formed markup (from :func:`markup`) parses strictly, and the fast
    driver and the reference grammar build the same tree."""
    lx = lex_text(text, template.markers)
    doc = _call("build", build, lx)
    ref = _call("the reference grammar", parse_lexemes, lex_text(text, template.markers), source=text)
    if doc.nodes != ref.nodes:
        raise AssertionError("the parser and the reference grammar build different trees")


# -- running a property outside a test suite -------------------------------------

@dataclass
class Failure:
    """The minimal failing example of a property and what it raised."""

    example: Any
    """The shrunk input (None if the failure happened while generating it)."""
    error: BaseException


@dataclass
class Outcome:
    """What :func:`find_failure` found."""

    examples: int
    """How many inputs the property ran on (shrinking included)."""
    failure: Failure | None


def find_failure(strategy: st.SearchStrategy[_V], check: Callable[[_V], None], *, examples: int,
                 seed: int | None = None) -> Outcome:
    """Run ``check`` on up to ``examples`` inputs drawn from ``strategy``;
    on failure, shrink and return the minimal failing input.

    No example database, no deadline, no health checks; ``seed`` makes the
    run reproducible. This is what ``xtml fuzz`` runs; in a test suite, use
    ``@given`` instead."""
    count = 0
    last: list[Any] = [None]

    def prop(x: _V) -> None:
        nonlocal count
        count += 1
        last[0] = copy.deepcopy(x)
        check(x)
        last[0] = None

    # No explain phase: it re-runs the minimal example many times to say
    # which parts of it matter, which we do not report.
    phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
    run = settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck),
                   report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False,
                   phases=phases)(given(strategy)(prop))
    if seed is not None:
        run = hypothesis_seed(seed)(run)
    try:
        run()
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        return Outcome(count, Failure(last[0], e))
    return Outcome(count, None)
