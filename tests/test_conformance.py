"""The K3 reference vectors: render segment for segment, ids, parse back."""

from __future__ import annotations

import json
from typing import Any

import pytest

import xtml
from tests.helpers.cases import load_cases, request_of

VECTORS = load_cases("vectors.json")
ERRORS = load_cases("errors.json")


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_segments_match_reference(k3: xtml.Template, case: dict[str, Any]) -> None:
    text, segments = k3.render(request_of(case), **case["kwargs"])
    assert [[s.text, s.special] for s in segments] == case["segments"]
    assert text == case["text"]


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_ids_are_segmentwise_encoding(k3: xtml.Template, vocab: xtml.Vocabulary, case: dict[str, Any]) -> None:
    ids = k3.encode(request_of(case), vocab, **case["kwargs"])
    expected: list[int] = []
    b = k3.bind(vocab)
    for text, special in case["segments"]:
        if special:
            expected.extend(b.encode_segments([xtml.Segment(text, True)]))
        else:
            # Plain segments: the tokenizer's own encode of that text alone.
            expected.extend(vocab.tokenizer.encode(text, add_special_tokens=False).ids)
    assert ids == expected
    # The tree path (document → walk) and the event path (render → sink) agree.
    assert b.encode(k3.document(request_of(case), **case["kwargs"])) == ids


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_parse_ids_gives_normal_form(k3: xtml.Template, vocab: xtml.Vocabulary, case: dict[str, Any]) -> None:
    req = request_of(case)
    ids = k3.encode(req, vocab, **case["kwargs"])
    parsed = k3.parse(ids, vocab)
    assert parsed == k3.normalize(req, **case["kwargs"])
    # What parse returns renders to the same text again.
    assert k3.render(parsed).text == case["text"]


# Text form is ambiguous where text holds marker literals; these two do.
AMBIGUOUS = {"17_control_markers_in_user_text", "19_string_arg_containing_close_marker"}


@pytest.mark.parametrize("case", [c for c in VECTORS if c["name"] not in AMBIGUOUS],
                         ids=[c["name"] for c in VECTORS if c["name"] not in AMBIGUOUS])
def test_parse_text_gives_normal_form(k3: xtml.Template, case: dict[str, Any]) -> None:
    req = request_of(case)
    assert k3.parse(case["text"]) == k3.normalize(req, **case["kwargs"])


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_reference_errors(k3: xtml.Template, case: dict[str, Any]) -> None:
    with pytest.raises(xtml.XtmlError) as info:
        k3.render(request_of(case), **case["kwargs"])
    assert case["error"] in str(info.value)
    assert isinstance(info.value, xtml.RequestError)


def test_error_classes(k3: xtml.Template) -> None:
    by_name = {c["name"]: c for c in ERRORS}
    with pytest.raises(xtml.OptionError) as e1:
        k3.render(request_of(by_name["effort_medium"]), **by_name["effort_medium"]["kwargs"])
    assert e1.value.option == "thinking_effort"
    with pytest.raises(xtml.MessageError) as e2:
        k3.render(request_of(by_name["arguments_int"]))
    assert e2.value.index == 1 and e2.value.path == "tool_calls[0].function.arguments"
    with pytest.raises(xtml.MessageError) as e3:
        k3.render(request_of(by_name["tool_message_without_name"]))
    assert e3.value.index == 1


def test_string_argument_with_close_marker_survives_ids(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    case = next(c for c in VECTORS if c["name"] == "19_string_arg_containing_close_marker")
    ids = k3.encode(request_of(case), vocab, **case["kwargs"])
    msg = k3.parse(ids, vocab)["messages"][1]
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"text": "A<|close|>argument<|sep|>B", "n": 1}'


def test_response_schema_none_is_the_schema_null(k3: xtml.Template) -> None:
    """K3's reference encoder takes ``response_schema`` whenever it is
    given: given as None beside a json_schema response format, it writes
    the schema ``null``. The reference vector with a json_schema format,
    its schema's JSON replaced by ``null``, segment for segment."""
    case = next(c for c in VECTORS if c["name"] == "10_response_format_json_schema")
    schema = json.dumps(case["kwargs"]["response_format"]["json_schema"]["schema"], sort_keys=True,
                        separators=(",", ":"))
    assert case["text"].count(schema) == 1
    text, segments = k3.render(request_of(case), **case["kwargs"], response_schema=None)
    assert text == case["text"].replace(schema, "null")
    assert [[s.text, s.special] for s in segments] == [[t.replace(schema, "null"), special]
                                                       for t, special in case["segments"]]
    # At every level the options are read from, as a keyword is.
    body = {**request_of(case), **case["kwargs"]}
    assert k3.render({**body, "response_schema": None}).text == text
    assert k3.render({**body, "chat_template_kwargs": {"response_schema": None}}).text == text
    # Beside no json_schema format it is absent, as the reference ignores it.
    assert k3.render(request_of(case), response_schema=None) == k3.render(request_of(case))
