"""Render: request shapes, options, and every bad input ends in a located XtmlError."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

import xtml

U = {"role": "user", "content": "hi"}


def test_bare_list_and_body_agree(k3: xtml.Template) -> None:
    assert k3.render([U]).text == k3.render({"messages": [U]}).text


def test_options_from_body_kwargs_and_chat_template_kwargs(k3: xtml.Template) -> None:
    a = k3.render({"messages": [U], "thinking": False}).text
    b = k3.render({"messages": [U]}, thinking=False).text
    c = k3.render({"messages": [U], "chat_template_kwargs": {"enable_thinking": False}}).text
    d = k3.render({"messages": [U], "model": "kimi-k3", "temperature": 0.2}, reasoning_effort="none").text
    assert a == b == c == d
    assert "<|open|>response<|sep|>" in a and "think" not in a


def test_reasoning_effort_alias(k3: xtml.Template) -> None:
    text = k3.render([U], reasoning_effort="low").text
    assert "`thinking_effort=low`" in text


def test_developer_is_system(k3: xtml.Template) -> None:
    assert k3.render([{"role": "developer", "content": "be brief"}]).text == k3.render(
        [{"role": "system", "content": "be brief"}]).text


def test_reasoning_aliases(k3: xtml.Template) -> None:
    base = k3.render([U, {"role": "assistant", "reasoning_content": "r", "content": "a"}]).text
    for key in ("reasoning", "thinking"):
        assert k3.render([U, {"role": "assistant", key: "r", "content": "a"}]).text == base


def test_inputs_are_not_mutated(k3: xtml.Template) -> None:
    import copy

    msgs: list[dict[str, Any]] = [
        U,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "b", "function": {"name": "g", "arguments": {"y": 2}}}]},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
    ]
    before = copy.deepcopy(msgs)
    k3.render(msgs)
    assert msgs == before


def test_tool_results_reordered_to_call_order(k3: xtml.Template) -> None:
    msgs = [
        U,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "function": {"name": "f", "arguments": {}}},
            {"id": "b", "function": {"name": "g", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
    ]
    norm = k3.normalize(msgs)
    tools = [m for m in norm["messages"] if m["role"] == "tool"]
    assert [(t["name"], t["content"], t["tool_call_id"]) for t in tools] == [
        ("f", "A", "call_1_1"), ("g", "B", "call_1_2")]


REFUSED = tomllib.loads((Path(__file__).parent / "data" / "cases" / "render-refused.toml").read_text(
    encoding="utf-8"))["case"]


@pytest.mark.parametrize("case", REFUSED, ids=[c["says"] for c in REFUSED])
def test_bad_input(k3: xtml.Template, case: dict[str, Any]) -> None:
    request_ = case["messages"] if "messages" in case else case["request"]
    error = getattr(xtml, case["error"])
    with pytest.raises(error, match=case["says"]) as e:
        k3.render(request_, **case.get("options", {}))
    assert " (at " in str(e.value) or isinstance(e.value, xtml.RequestError)


def test_arguments_that_are_not_json_are_refused(k3: xtml.Template) -> None:
    # A set: no data file can hold one.
    msgs = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"x": {1, 2}}}}]}]
    with pytest.raises(xtml.MessageError, match="is not JSON"):
        k3.render(msgs)


def test_empty_api_fields_are_accepted(k3: xtml.Template) -> None:
    k3.render([U, {"role": "assistant", "content": "a", "refusal": None, "annotations": []}])


def test_image_parts_and_prompts(k3: xtml.Template) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "see"},
                                         {"type": "image_url", "image_url": {"url": "data:,"}}]}]
    assert "<|kimi_image_placeholder|>" in k3.render(msgs).text
    prompt = "<|media_begin|>image 4x4<|media_content|><|media_pad|><|media_end|>"
    assert prompt in k3.render(msgs, image_prompts=[prompt]).text
    norm = k3.normalize(msgs, image_prompts=[prompt])
    assert norm["messages"][0]["content"] == [{"type": "text", "text": "see"}, {"type": "image"}]
    assert norm["image_prompts"] == [prompt]


def test_named_tool_choice_and_string_response_format(k3: xtml.Template) -> None:
    named = {"type": "function", "function": {"name": "f"}}
    assert k3.render([U], tool_choice=named).text == k3.render([U], tool_choice="auto").text
    assert k3.render([U], response_format="json_object").text == k3.render(
        [U], response_format={"type": "json_object"}).text
    assert k3.render([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]).text == k3.render([U]).text


def test_str_subclasses_render_as_their_value(k3: xtml.Template) -> None:
    # An Enum member with str as its base is what some codebases keep their
    # prompts and argument strings in; its str() is "Name.MEMBER", its value
    # is what renders.
    from enum import Enum

    class Text(str, Enum):  # noqa: UP042 - not StrEnum: its str() is the name, the case at stake
        HI = "hello"
        ARGS = '{"city": "Paris"}'
        RAW = "not json"

    plain = [{"role": "user", "content": "hello"},
             {"role": "assistant", "content": "hello",
              "tool_calls": [{"id": "a", "function": {"name": "w", "arguments": '{"city": "Paris"}'}},
                             {"id": "b", "function": {"name": "w", "arguments": "not json"}}]}]
    sub = [{"role": "user", "content": Text.HI},
           {"role": "assistant", "content": [{"type": "text", "text": Text.HI}],
            "tool_calls": [{"id": "a", "function": {"name": "w", "arguments": Text.ARGS}},
                           {"id": "b", "function": {"name": "w", "arguments": Text.RAW}}]}]
    assert k3.render(sub).text == k3.render(plain).text
    assert k3.normalize(sub) == k3.normalize(plain)



def test_encode_holds_collections_off_and_gives_them_back(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    """The checks and the render of a long request make objects by the
    thousand and no garbage: the collector is off while encode reads the
    messages, and on again after it, after a bad request too."""
    import gc
    from collections.abc import Iterator, Mapping

    states: list[bool] = []

    class Message(Mapping[str, Any]):
        def __init__(self, d: dict[str, Any]) -> None:
            self.d = d

        def __getitem__(self, k: str) -> Any:
            states.append(gc.isenabled())
            return self.d[k]

        def __iter__(self) -> Iterator[str]:
            return iter(self.d)

        def __len__(self) -> int:
            return len(self.d)

    req = [Message({"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}) for i in range(20)]
    expected = k3.encode([dict(m) for m in req], vocab)
    states.clear()
    assert gc.isenabled()
    assert k3.encode(req, vocab) == expected
    assert states and not any(states)
    assert gc.isenabled()
    states.clear()
    with pytest.raises(xtml.MessageError):
        k3.encode([*req, Message({"role": "nobody", "content": "x"})], vocab)
    assert states and not any(states)
    assert gc.isenabled()
