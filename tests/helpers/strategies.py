"""Hypothesis strategies shared by the property tests, beyond xtml.testing.

Requests, adversarial text and token ids come from :mod:`xtml.testing` (e.g.
``xt.requests(K3, keywords=True)``, ``xt.texts(K3)``); :func:`assistant_messages`
and :func:`id_lists` are its strategies bound to K3 and :func:`vocab`.

Everything here is independent of ``conftest.py``: the tokenizer is
:func:`vocab` (tests.helpers.tokenizers.k3_vocab, a real byte-level BPE with
the K3 markers added as special tokens, loaded once), the template :data:`K3`.

Strategies:

* :func:`junk` / :func:`junk_requests` — arbitrary JSON-ish Python values,
  and valid requests with parts replaced by them (for never-crash tests);
* :func:`marker_soup` — random text of markers and bits of headers;
* :func:`trees` / :func:`documents` — random XTML trees for the grammar tests;
* :func:`python_values` — JSON-like Python values json would convert silently;
* :func:`completions` — what a model may write after the prompt, hostile too;
  :func:`completion_of` — a message's completion ids and what parsing them gives.

:data:`SLOW` is the settings of tests whose examples each take a while.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml import testing as xt
from xtml.markup.nodes import Document, Element, Embed, EndOfMessage, Node, Text
from xtml.testing import strategies as xts

K3 = xtml.load("kimi-k3")
PLACEHOLDER = "<|kimi_image_placeholder|>"
MARKERS: tuple[str, ...] = tuple(dict.fromkeys((*K3.markers.all(), PLACEHOLDER)))
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@cache
def marker_ids() -> dict[str, int]:
    return dict(K3.bind(vocab()).marker_ids)


# -- xtml.testing bound to K3 ------------------------------------------------------
# Requests, text and ids come from xtml.testing (the kit users fuzz their own
# templates with); these bind it to K3 and vocab().

def assistant_messages(*, images: bool = True, name: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    """One K3 assistant message (for completion parses)."""
    return xts.assistant_messages(K3, images=images, name=name)


def id_lists(max_size: int = 60) -> st.SearchStrategy[list[int]]:
    """Token ids of vocab() biased toward the markers, and mutated ids of
    valid requests (the tokenizer is loaded when the first is drawn)."""
    return st.deferred(lambda: xt.token_ids(K3, vocab(), max_size=max_size))


# -- documents -------------------------------------------------------------------

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
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(), xt.texts(K3, max_pieces=2, long=False, huge=False),
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
    body = copy.deepcopy(draw(xt.requests(K3)))
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
    st.builds(lambda p: Embed(p), st.from_regex(K3.dialect.image_prompt, fullmatch=True)),
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


# -- completions --------------------------------------------------------------------

CONV = [{"role": "user", "content": "hi"}]


def completion_of(m: dict[str, Any], thinking: bool, tools: bool) -> tuple[list[int], dict[str, Any]]:
    """The ids of assistant message ``m`` after the generation prompt of a
    one-message chat, and the message a parse of them gives."""
    extra: dict[str, Any] = {"thinking": thinking}
    if tools:
        extra["tools"] = [{"type": "function", "function": {"name": "f"}}]
    full = K3.encode([*CONV, m], vocab(), add_generation_prompt=False, **extra)
    prefix = K3.encode(CONV, vocab(), add_generation_prompt=True, **extra)
    assert full[: len(prefix)] == prefix, "the generation prompt is not a prefix of the rendered message"
    expected = K3.normalize([*CONV, m], add_generation_prompt=False, **extra)["messages"][-1]
    # A completion is read on its own: its calls are numbered as message 0.
    for k, c in enumerate(expected.get("tool_calls", ()), start=1):
        assert c["id"] == f"call_{len(CONV)}_{k}"
        c["id"] = f"call_0_{k}"
    return full[len(prefix):], expected


@st.composite
def completions(draw: st.DrawFn, t: xtml.Template, tok: xtml.Vocabulary) -> tuple[list[Any], bool]:
    """What a model may write after the prompt: a rendered assistant message,
    maybe cut, with ids dropped, or with ids, markers and ids that are no
    token at all put in; or soup of ids biased toward the markers."""
    if draw(st.integers(0, 3)) == 0:
        return list(draw(xt.token_ids(t, tok))), draw(st.booleans())
    case = xt.completion_case(t, draw(xt.requests(t)), tok)
    assume(case is not None)
    assert case is not None
    ids: list[Any] = list(case[0])
    markers = sorted(t.bind(tok).marker_ids.values())
    for _ in range(draw(st.integers(0, 3))):
        if not ids:
            break
        i = draw(st.integers(0, len(ids) - 1))
        op = draw(st.sampled_from(["cut", "drop", "id", "marker", "bad"]))
        if op == "cut":
            ids = ids[:i]
        elif op == "drop":
            del ids[i]
        elif op == "id":
            ids.insert(i, draw(st.integers(0, tok.size - 1)))
        elif op == "marker":
            ids.insert(i, draw(st.sampled_from(markers)))
        else:
            ids.insert(i, draw(st.sampled_from([-1, tok.size, 2**40, None, "7", 1.5])))
    return ids, case[2]
