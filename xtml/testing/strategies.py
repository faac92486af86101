"""Hypothesis strategies for a template: what the checks of
:mod:`xtml.testing.checks` run on.

* :func:`requests` — valid chat requests, every option and message shape
  (:func:`assistant_messages`: one assistant message, for completions);
* :func:`markup` — well-formed markup in text form, from the reference grammar;
* :func:`token_ids` — id soup biased toward the template's marker ids, and
  mutated ids of valid requests;
* :func:`stream_cases` / :func:`chunk_sizes` — inputs of the stream check.

Text fields are :func:`xtml.testing.adversarial.texts`. Everything
template-specific (roles, efforts, image part types, markers, element names)
is read from the template, so the same strategies work for the built-in
``kimi-k3`` and for any template file. Needs ``hypothesis``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, overload

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from ..errors import MessageError, XtmlError
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
from ..markup.parse import MAX_DEPTH, lex_text
from ..markup.reference import document_parser
from ..plugins import jsonfmt
from ..template import Template, TokenizerLike
from .adversarial import json_objects, json_values, texts

__all__ = ["assistant_messages", "chunk_sizes", "markup", "requests", "stream_cases", "token_ids"]


# -- requests --------------------------------------------------------------------

def _non_json(s: str) -> str:
    """``s`` unless it parses as JSON that is not an object (an invalid request)."""
    try:
        v = jsonfmt.read(s)
    except ValueError:
        return s
    return s if isinstance(v, dict) else "~" + s


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
    text = texts(template)
    short = texts(template, max_pieces=3, long=False, huge=False)
    nonempty = texts(template, max_pieces=4, huge=False).filter(bool)
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
    objects = json_objects(template)
    arguments = st.one_of(
        objects,
        objects,
        st.builds(lambda d, indent, ascii_: json.dumps(d, indent=indent, ensure_ascii=ascii_),
                  objects, st.sampled_from([None, 2]), st.booleans()),
        texts(template, max_pieces=4, huge=False).map(_non_json),
        st.sampled_from([None, "", "  ", {}, "{}"]),
    )
    call_ids = st.one_of(st.sampled_from(["c1", "c2", "call_0_1", "call_1_1", "call_1_2"]),
                         texts(template, max_pieces=2, long=False, huge=False))
    schema = st.builds(
        lambda name, desc, params: {"type": "function",
                                    "function": {"name": name, "description": desc, "parameters": params}},
        nonempty, short, objects)
    # A tool is a tool schema in one of the forms clients send (render and
    # the grammar refuse anything else alike): chat, flat (Responses API), bare.
    flat = st.builds(lambda name, desc, params: {"type": "function", "name": name, "description": desc,
                                                 "parameters": params}, nonempty, short, objects)
    bare = st.builds(lambda name, params: {"name": name, "parameters": params}, nonempty, objects)
    tools = st.lists(st.one_of(schema, schema, flat, bare), min_size=1, max_size=3)
    return _Gen(template, _roles(template), text, short, nonempty, content, arguments, call_ids, tools,
                json_values(template), objects, _image_prompt_strategy(template) if images else None)


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


def _assistant(draw: st.DrawFn, g: _Gen, role: str, name: bool = True) -> dict[str, Any]:
    m: dict[str, Any] = {"role": role}
    c = draw(g.content)
    if c is not None or draw(st.booleans()):
        m["content"] = c
    if draw(st.booleans()):
        key = draw(st.sampled_from(["reasoning_content", "reasoning_content", "reasoning", "thinking"]))
        m[key] = draw(g.text)
    if draw(st.booleans()):
        m["tool_calls"] = draw(st.lists(_tool_call(g), max_size=3))
    if name and draw(st.integers(0, 4)) == 4:
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


def _name_unresolved_tools(template: Template, body: dict[str, Any], options: dict[str, Any], name: str) -> None:
    """Give a name to each tool result whose tool the template cannot find
    (the one fix-up that keeps generated requests valid)."""
    msgs = body["messages"]
    for _ in range(len(msgs) + 1):
        try:
            template.normalize(body, **options)
            return
        except MessageError as e:
            if not (e.path == "name" and 0 <= e.index < len(msgs) and "name" not in msgs[e.index]
                    and "tool" not in msgs[e.index]):
                return
            msgs[e.index]["name"] = name
        except XtmlError:
            return  # left as it is: the check functions report it


@st.composite
def _requests(draw: st.DrawFn, template: Template, images: bool, max_messages: int, keywords: bool) -> Any:
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
    kwargs: dict[str, Any] = {}
    for k, v in opts.items():
        where = draw(st.integers(0, 3 if keywords else 2))
        if where == 2:
            body.setdefault("chat_template_kwargs", {})[k] = v
        elif where == 3:
            kwargs[k] = v
        else:
            body[k] = v
    if draw(st.integers(0, 5)) == 5:
        body["model"] = "any"
        body["temperature"] = 0.6
    _name_unresolved_tools(template, body, kwargs, "t")
    return (body, kwargs) if keywords else body


@overload
def requests(template: Template, *, images: bool = True, max_messages: int = 6,
             keywords: Literal[False] = False) -> st.SearchStrategy[dict[str, Any]]: ...


@overload
def requests(template: Template, *, images: bool = True, max_messages: int = 6,
             keywords: Literal[True]) -> st.SearchStrategy[tuple[dict[str, Any], dict[str, Any]]]: ...


@overload
def requests(template: Template, *, images: bool = True, max_messages: int = 6,
             keywords: bool) -> st.SearchStrategy[Any]: ...


def requests(template: Template, *, images: bool = True, max_messages: int = 6,
             keywords: bool = False) -> st.SearchStrategy[Any]:
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
    Text fields are :func:`~xtml.testing.adversarial.texts`.

    A tool result whose tool the template cannot resolve gets a ``name``.
    ``images=False`` leaves out the parts plugins render (images, audio,
    video, third-party elements). With ``keywords=True`` each example is
    ``(body, options)``, some options drawn out of the body into the keyword
    arguments to pass alongside it (``encode(body, tok, **options)``).
    """
    return _requests(template, images, max_messages, keywords)


@st.composite
def _assistant_messages(draw: st.DrawFn, template: Template, images: bool, name: bool) -> dict[str, Any]:
    g = _gen(template, images)
    return _assistant(draw, g, draw(st.sampled_from(g.roles.assistant)), name)


def assistant_messages(template: Template, *, images: bool = True,
                       name: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    """One assistant message as :func:`requests` draws them (a role spelling
    of the template's assistant, content, reasoning under any of its keys,
    tool calls), e.g. to render as a completion after a history of your
    own. ``name=False`` leaves out ``name`` (a generation prompt has none)."""
    if not _roles(template).assistant:
        raise ValueError("the template has no assistant role")
    return _assistant_messages(template, images, name)


# -- markup ----------------------------------------------------------------------

def _strip_markers(s: str, splitter: re.Pattern[str]) -> str:
    """``s`` without any marker literal (removing one may make another)."""
    while splitter.search(s):
        s = splitter.sub("", s)
    return s


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
    body = texts(template, max_pieces=4, long=False, huge=False).map(lambda s: _strip_markers(s, splitter))
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
    so), and body text with :func:`~xtml.testing.adversarial.texts` stripped
    of marker literals. Every string therefore parses (strictly, with ``xtml.markup.build`` over
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


# -- streams ---------------------------------------------------------------------

def chunk_sizes() -> st.SearchStrategy[list[int]]:
    """How to cut a completion for
    :func:`~xtml.testing.checks.check_stream_equals_batch`: sizes of
    successive ``feed_many`` calls (cycled), or ``[]`` for one token at a
    time."""
    return st.lists(st.integers(1, 8), max_size=4)


def stream_cases(template: Template, *, images: bool = True) -> st.SearchStrategy[tuple[dict[str, Any], list[int]]]:
    """``(request, chunks)`` pairs for
    :func:`~xtml.testing.checks.check_stream_equals_batch`."""
    return st.tuples(requests(template, images=images), chunk_sizes())
