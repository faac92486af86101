"""Property-based tests of the chat layer on token ids.

1. round trip: ``parse(encode(x)) == normalize(x)`` for generated requests;
2. re-render stability: what parse returns renders to the same text (and ids);
3. injection-freedom: text never becomes a marker id;
4. never crash: strict parses raise only XtmlError, lenient parses never raise;
5. (grammar equivalence is in test_grammar_equivalence.py);
6. completion parses of generated assistant messages, whole and truncated.

Also: cached vs segment-wise encoding, error and diagnostic offsets, Python
values json would convert silently, and message fields that a role cannot
carry (refused, never dropped).

Profiles (``ci``, ``fuzz``) come from conftest.py; HYPOTHESIS_PROFILE=fuzz runs longer.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import xtml
from tests.helpers.strategies import (
    K3,
    MARKERS,
    SLOW,
    assistant_messages,
    completion_of,
    has_adjacent_text,
    id_lists,
    junk,
    junk_requests,
    marker_ids,
    marker_soup,
    python_values,
    vocab,
)
from xtml import testing as xt

k3 = K3


def _encode(body: dict[str, Any], kwargs: dict[str, Any]) -> list[int]:
    return k3.encode(body, vocab(), **kwargs)


def _marker_counts(ids: list[int]) -> Counter[int]:
    wanted = set(marker_ids().values())
    return Counter(i for i in ids if i in wanted)


# -- 1. round trip -----------------------------------------------------------------

@SLOW
@given(xt.requests(K3, keywords=True))
def test_round_trip_ids(req: tuple[dict[str, Any], dict[str, Any]]) -> None:
    body, kwargs = req
    before = copy.deepcopy((body, kwargs))
    ids = _encode(body, kwargs)
    expected = k3.normalize(body, **kwargs)
    assert (body, kwargs) == before, "render or normalize mutated its input"
    note(f"ids={ids}")
    assert k3.parse(ids, vocab()) == expected
    lenient = k3.parse(ids, vocab(), lenient=True)
    assert lenient.pop("diagnostics") == []
    assert lenient == expected


@SLOW
@given(xt.requests(K3, keywords=True))
def test_round_trip_text_when_unambiguous(req: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """The text form is ambiguous only where body text holds marker literals."""
    body, kwargs = req
    text, segments = k3.render(body, **kwargs)
    special = "".join(s.text for s in segments if s.special)
    unambiguous = all(text.count(m) == special.count(m) for m in MARKERS)
    event(f"text form unambiguous: {unambiguous}")
    if unambiguous:
        assert k3.parse(text) == k3.normalize(body, **kwargs)


# -- 2. re-render stability ----------------------------------------------------------

def test_normal_form_keeps_tool_result_names() -> None:
    """Minimal case of test_rerender_is_stable: a tool result named unlike the
    call at its position (and not matched by id)."""
    req = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
           {"role": "tool", "name": "g", "content": "r"}]
    normal = k3.normalize(req)
    assert normal["messages"][1]["name"] == "g"
    assert k3.render(normal).text == k3.render(req).text

@SLOW
@given(xt.requests(K3, keywords=True))
def test_rerender_is_stable(req: tuple[dict[str, Any], dict[str, Any]]) -> None:
    body, kwargs = req
    ids = _encode(body, kwargs)
    parsed = k3.parse(ids, vocab())
    assert k3.render(parsed).text == k3.render(body, **kwargs).text
    # The normal form is a fixed point of normalize.
    assert k3.normalize(parsed) == parsed
    if not has_adjacent_text(k3.document(body, **kwargs)):
        assert k3.encode(parsed, vocab()) == ids


# -- 3. injection-freedom ------------------------------------------------------------

@SLOW
@given(xt.requests(K3, keywords=True))
def test_marker_ids_come_only_from_special_segments(req: tuple[dict[str, Any], dict[str, Any]]) -> None:
    body, kwargs = req
    ids = _encode(body, kwargs)
    _, segments = k3.render(body, **kwargs)
    counts = _marker_counts(ids)
    for s, mid in marker_ids().items():
        expected = sum(seg.text.count(s) for seg in segments if seg.special)
        assert counts[mid] == expected, f"{s!r}: {counts[mid]} ids, {expected} in special segments"


@SLOW
@given(xt.requests(K3, keywords=True))
def test_cached_encode_equals_segmentwise_encoding(req: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Binding.encode (caches, one batch) gives the ids of encoding each segment on its own."""
    body, kwargs = req
    b = k3.bind(vocab())
    assert _encode(body, kwargs) == b.encode_segments(k3.render(body, **kwargs).segments)


def _without_image_prompts(body: dict[str, Any], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    body = {k: v for k, v in body.items() if k != "image_prompts"}
    if "chat_template_kwargs" in body:
        body["chat_template_kwargs"] = {k: v for k, v in body["chat_template_kwargs"].items()
                                        if k != "image_prompts"}
    return body, {k: v for k, v in kwargs.items() if k != "image_prompts"}


@SLOW
@given(xt.requests(K3, keywords=True),
       st.one_of(st.sampled_from(MARKERS), xt.texts(K3, max_pieces=1, long=False, huge=False),
                 xt.texts(K3, huge=False)),
       st.sampled_from(["user", "system", "assistant", "tool"]))
def test_marker_literal_in_content_adds_no_marker_id(
    req: tuple[dict[str, Any], dict[str, Any]], literal: str, role: str
) -> None:
    # With image prompts given, a placeholder literal in text is an image by
    # design (as the model's processor reads it): leave them out here.
    body, kwargs = _without_image_prompts(*req)

    def with_content(content: str) -> list[int]:
        msgs: list[dict[str, Any]] = [{"role": role, "content": content}]
        if role == "tool":
            # Named, and not in the run of the last assistant's results (a run
            # with an unmatched message is not reordered, which could make the
            # base request invalid).
            msgs = [{"role": "user", "content": "-"}, {**msgs[0], "name": "t"}]
        b = dict(body, messages=[*body["messages"], *msgs])
        return _encode(b, kwargs)

    assert _marker_counts(with_content(literal)) == _marker_counts(with_content("x"))


# -- 4. never crash ------------------------------------------------------------------

def _strict(data: Any, **kw: Any) -> dict[str, Any] | None:
    try:
        out = k3.parse(data, vocab() if isinstance(data, list) else None, **kw)
    except xtml.XtmlError:
        return None
    assert isinstance(out, dict)
    return out


def _lenient(data: Any, **kw: Any) -> dict[str, Any]:
    out = k3.parse(data, vocab() if isinstance(data, list) else None, lenient=True, **kw)
    assert isinstance(out, dict)
    diags = out["diagnostics"]
    assert isinstance(diags, list)
    for d in diags:
        assert set(d) == {"kind", "offset", "message"}
        assert isinstance(d["offset"], int)
        assert 0 <= d["offset"] <= len(data), f"diagnostic offset outside the input ({len(data)}): {d}"
    return out


@SLOW
@given(id_lists(), st.sampled_from([None, True, False]))
def test_random_ids_never_crash(ids: list[int], thinking: bool | None) -> None:
    strict = _strict(ids)
    lenient = _lenient(ids)
    if strict is not None:
        assert lenient == {**strict, "diagnostics": []}
    _strict(ids, completion=True, thinking=thinking)
    out = _lenient(ids, completion=True, thinking=thinking)
    assert out["role"] == "assistant"


@SLOW
@given(marker_soup(), st.sampled_from([None, True, False]))
def test_random_text_never_crashes(text: str, thinking: bool | None) -> None:
    _strict(text)
    _lenient(text)
    _strict(text, completion=True, thinking=thinking)
    assert _lenient(text, completion=True, thinking=thinking)["role"] == "assistant"


@SLOW
@given(st.one_of(id_lists(), marker_soup()), st.booleans(), st.sampled_from([None, True, False]))
def test_error_offsets_are_inside_the_input(data: list[int] | str, completion: bool, thinking: bool | None) -> None:
    """A ParseError's offset indexes the input as given (for a completion, not
    the generation prompt put in front of it)."""
    try:
        k3.parse(data, vocab() if isinstance(data, list) else None, completion=completion, thinking=thinking)
    except xtml.ParseError as e:
        assert 0 <= e.offset <= len(data), f"offset {e.offset} outside the input of length {len(data)}: {e}"


@SLOW
@given(st.data())
def test_ids_of_valid_requests_mutated_never_crash(data: st.DataObject) -> None:
    """Near-valid ids: a rendered request with a few ids dropped, duplicated or replaced."""
    body, kwargs = data.draw(xt.requests(K3, keywords=True))
    ids = _encode(body, kwargs)
    mids = sorted(marker_ids().values())
    for _ in range(data.draw(st.integers(1, 3))):
        if not ids:
            break
        i = data.draw(st.integers(0, len(ids) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "marker", "swap"]))
        if op == "drop":
            del ids[i]
        elif op == "dup":
            ids.insert(i, ids[i])
        elif op == "marker":
            ids[i] = data.draw(st.sampled_from(mids))
        else:
            j = data.draw(st.integers(0, len(ids) - 1))
            ids[i], ids[j] = ids[j], ids[i]
    _strict(ids)
    _lenient(ids)
    _lenient(ids, completion=True)


def _render_only_xtml_errors(request: Any) -> None:
    for fn in (k3.render, k3.normalize, lambda r: k3.encode(r, vocab())):
        try:
            fn(request)
        except xtml.XtmlError:
            pass


@SLOW
@given(junk())
def test_render_junk_raises_only_xtml_errors(request: Any) -> None:
    if not isinstance(request, dict | list):
        request = {"messages": request}
    _render_only_xtml_errors(request)


@SLOW
@given(junk_requests())
def test_render_near_valid_junk_raises_only_xtml_errors(request: Any) -> None:
    _render_only_xtml_errors(request)


@SLOW
@given(python_values(), st.sampled_from(["tools", "dynamic", "schema"]))
def test_python_values_in_json_fields_round_trip_or_are_refused(value: Any, where: str) -> None:
    """Tool lists and schemas are kept as objects in the normal form: what
    json cannot carry as given (non-string keys, sets, NaN) must be refused,
    not converted behind normalize's back."""
    if where == "tools":
        req: dict[str, Any] = {"messages": [], "tools": [value]}
    elif where == "dynamic":
        req = {"messages": [{"role": "system", "tools": [value]}]}
    else:
        req = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": value}}}
    try:
        expected = k3.normalize(req)
        ids = _encode(req, {})
    except xtml.XtmlError:
        return
    assert k3.parse(ids, vocab()) == expected


# -- 6. completions ------------------------------------------------------------------

@SLOW
@given(assistant_messages(images=False, name=False), st.booleans(), st.booleans())
def test_completion_parse(m: dict[str, Any], thinking: bool, tools: bool) -> None:
    comp, expected = completion_of(m, thinking, tools)
    end = marker_ids()[k3.markers.end]
    assert comp[-1] == end
    for ids in (comp, comp[:-1]):
        assert k3.parse(ids, vocab(), completion=True, thinking=thinking) == expected
        lenient = k3.parse(ids, vocab(), completion=True, thinking=thinking, lenient=True)
        assert lenient.pop("diagnostics") == []
        assert lenient == expected
    # The text form reads the same where no body text holds a marker literal.
    text = vocab().decode(comp)
    if sum(text.count(s) for s in MARKERS) == sum(_marker_counts(comp).values()):
        event("completion text form checked")
        assert k3.parse(text, completion=True, thinking=thinking) == expected


@SLOW
@given(assistant_messages(images=False, name=False), st.booleans(), st.data())
def test_truncated_completion(m: dict[str, Any], thinking: bool, data: st.DataObject) -> None:
    comp, expected = completion_of(m, thinking, False)
    cut = data.draw(st.integers(1, len(comp)), label="cut")  # cut 0: test_empty_completion_is_flagged
    ids = comp[:cut]
    out = k3.parse(ids, vocab(), completion=True, thinking=thinking, lenient=True)
    assert out["role"] == "assistant"
    closed = cut >= len(comp) - 1  # everything up to the end marker
    if closed:
        assert out.pop("diagnostics") == []
        assert out == expected
    else:
        assert out["diagnostics"], "a completion cut before its message closed has no diagnostic"
        with pytest.raises(xtml.ParseError):
            k3.parse(ids, vocab(), completion=True, thinking=thinking)


@pytest.mark.parametrize("thinking", [True, False])
def test_empty_completion_is_flagged(thinking: bool) -> None:
    """A generation that produced nothing (cut at 0) is a truncated message too."""
    out = k3.parse([], vocab(), completion=True, thinking=thinking, lenient=True)
    assert out["role"] == "assistant"
    assert out["diagnostics"], f"empty completion parsed leniently without a diagnostic: {out}"
    with pytest.raises(xtml.ParseError):
        k3.parse([], vocab(), completion=True, thinking=thinking)


@SLOW
@given(assistant_messages(images=False, name=False), st.booleans(), st.data())
def test_truncated_completion_keeps_what_was_complete(m: dict[str, Any], thinking: bool,
                                                      data: st.DataObject) -> None:
    """Best effort: text already generated is not lost, i.e. the truncated
    parse's reasoning/content are prefixes of the full ones."""
    comp, expected = completion_of(m, thinking, False)
    cut = data.draw(st.integers(0, len(comp)), label="cut")
    out = k3.parse(comp[:cut], vocab(), completion=True, thinking=thinking, lenient=True)
    for key in ("reasoning_content", "content"):
        got, full = out.get(key, ""), expected.get(key, "")
        if isinstance(got, str) and isinstance(full, str) and got:
            # A cut inside a multi-byte character decodes to U+FFFD at the end.
            assert full.startswith(got.rstrip("\ufffd")), key
    got_calls = out.get("tool_calls", [])
    assert len(got_calls) <= len(expected.get("tool_calls", []))


# -- nothing is dropped silently (spec §7) -----------------------------------------

def _silent_drop_cases() -> list[tuple[str, dict[str, Any]]]:
    v = "KEEP-ME"
    tool = [{"type": "function", "function": {"name": v}}]
    return [
        ("reasoning_content on user", {"role": "user", "content": "hi", "reasoning_content": v}),
        ("reasoning on system", {"role": "system", "content": "hi", "reasoning": v}),
        ("thinking on tool", {"role": "tool", "name": "t", "content": "hi", "thinking": v}),
        ("tools on user", {"role": "user", "content": "hi", "tools": tool}),
        ("tools on assistant", {"role": "assistant", "content": "hi", "tools": tool}),
        ("tools on tool", {"role": "tool", "name": "t", "content": "hi", "tools": tool}),
        ("tool on user", {"role": "user", "content": "hi", "tool": v}),
        ("name on a tool declaration", {"role": "system", "tools": [{"name": "f"}], "name": v}),
    ]


@pytest.mark.parametrize("case", _silent_drop_cases(), ids=lambda c: c[0])
def test_fields_that_cannot_render_are_refused(case: tuple[str, dict[str, Any]]) -> None:
    """A message field with content that the template cannot render is
    refused, naming the message and the field."""
    _, msg = case
    field = next(k for k, v in msg.items() if "KEEP-ME" in json.dumps(v)) if "KEEP-ME" in json.dumps(msg) \
        else next(k for k in ("tools",) if k in msg)
    for call in (lambda: k3.normalize([msg], thinking=True), lambda: k3.render([msg], thinking=True)):
        with pytest.raises(xtml.MessageError) as e:
            call()
        assert e.value.location == f"messages[0].{field}", e.value.location


@pytest.mark.parametrize("msg", [
    {"role": "assistant", "content": "hi", "reasoning_content": "KEEP-ME"},
    {"role": "tool", "name": "t", "content": "KEEP-ME"},
    {"role": "user", "content": "hi", "name": "KEEP-ME"},
    {"role": "system", "tools": [{"type": "function", "function": {"name": "KEEP-ME"}}]},
])
def test_fields_that_render_reach_the_tokens(msg: dict[str, Any]) -> None:
    """The other side of the refusals above: a field the template takes is
    in the rendered text and comes back from a parse."""
    assert "KEEP-ME" in k3.render([msg], thinking=True).text
    assert "KEEP-ME" in json.dumps(k3.normalize([msg], thinking=True), ensure_ascii=False)
