"""Real traffic in: the request bodies clients send (OpenAI, vLLM, SGLang),
replayed API messages, objects with model_dump, prefill, tools from Python
functions, and K3's option precedence."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import xtml
from tests.helpers.docs import run_examples
from tests.helpers.strategies import K3, vocab
from xtml import testing as xt
from xtml.chat import fields
from xtml.chat.fields import FIELDS, IGNORED, PROMPT, REFUSED, function_tool
from xtml.markup.segments import Segment
from xtml.testing import strategies as xts

ROOT = Path(__file__).parent.parent
DOC = (ROOT / "docs" / "requests.md").read_text(encoding="utf-8")
BASE = xtml.load("xtml-base")
U = {"role": "user", "content": "What's the weather in Paris?"}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
MARKER = re.compile("(" + "|".join(map(re.escape, K3.markers.all())) + ")")


def ids_of_text(text: str) -> list[int]:
    """Ids of text in the text form (marker strings as their ids): what a
    model would generate."""
    return K3.bind(vocab()).encode_segments(
        [Segment(p, bool(MARKER.fullmatch(p))) for p in MARKER.split(text) if p])


def without_ignored(body: dict[str, Any]) -> dict[str, Any]:
    """The body without its ignored keys (and without refused keys, which are
    empty when accepted), at the top level and in chat_template_kwargs."""
    def keep(k: str) -> bool:
        return fields.BY_NAME[k].effect == PROMPT
    out = {k: v for k, v in body.items() if keep(k)}
    if isinstance(out.get("chat_template_kwargs"), dict):
        out["chat_template_kwargs"] = {k: v for k, v in out["chat_template_kwargs"].items() if keep(k)}
    return out


# -- the table ---------------------------------------------------------------------------------

def test_doc_table_is_the_data() -> None:
    m = re.search(r"<!-- table: generated from xtml/chat/fields.py -->\n(.*?)\n<!-- end of table -->", DOC, re.S)
    assert m is not None, "docs/requests.md lost its table markers"
    # Regenerate with: python -c 'from xtml.chat.fields import markdown_table; print(markdown_table())'
    assert m.group(1) == fields.markdown_table()
    rows = [r for r in m.group(1).splitlines()[2:]]
    assert len(rows) == len(FIELDS) and all(r.count("|") == 6 for r in rows)


def test_table_entries_are_well_formed() -> None:
    assert len({f.name for f in FIELDS}) == len(FIELDS)
    for f in FIELDS:
        assert f.effect in (PROMPT, IGNORED, REFUSED), f
        assert f.sources and set(f.sources) <= {"openai", "vllm", "sglang", "transformers", "xtml"}, f
        assert f.note and "|" not in f.note, f
        assert bool(f.feeds) == (f.effect == PROMPT), f
    assert set(fields.OPTIONS) <= {f.name for f in FIELDS if f.effect == PROMPT}


# A value each prompt field accepts: every prompt field has a reading (a field
# added to the table without one fails here).
PROMPT_SAMPLES: dict[str, Any] = {
    "messages": [U], "tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"},
    "reasoning_effort": "low", "functions": [TOOL["function"]], "function_call": {"name": "get_weather"},
    "extra_body": {"top_k": 3}, "chat_template_kwargs": {"thinking": False}, "add_generation_prompt": True,
    "continue_final_message": False, "enable_thinking": True, "reasoning": {"effort": "high"}, "thinking": True,
    "thinking_effort": "high", "response_schema": None, "image_prompts": None,
}


@pytest.mark.parametrize("name", [f.name for f in FIELDS if f.effect == PROMPT])
def test_every_prompt_field_has_a_reading(k3: xtml.Template, name: str) -> None:
    assert name in PROMPT_SAMPLES, f"add a sample for prompt field {name!r}"
    body: dict[str, Any] = {"messages": [U], name: PROMPT_SAMPLES[name]}
    if name in ("function_call", "tool_choice"):
        body["tools" if name == "tool_choice" else "functions"] = [TOOL if name == "tool_choice" else TOOL["function"]]
    assert k3.render(body).text


def test_every_openai_sdk_request_key_is_known() -> None:
    from openai.types.chat import completion_create_params as ccp

    keys = set(ccp.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert keys - {f.name for f in FIELDS} == set()


def test_every_openai_sdk_message_field_replays(k3: xtml.Template) -> None:
    from openai.types.chat import ChatCompletionMessage

    full = {k: None for k in ChatCompletionMessage.model_fields} | {"role": "assistant", "content": "ok"}
    assert k3.render([U, full]) == k3.render([U, {"role": "assistant", "content": "ok"}])


# -- real request bodies: ignored fields change nothing ------------------------------------------

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    U,
    {"role": "assistant", "content": None, "refusal": None, "annotations": [], "audio": None, "function_call": None,
     "tool_calls": [{"id": "call_abc", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_abc", "content": "sunny, 21C"},
    {"role": "assistant", "content": "Sunny, 21C.", "refusal": None, "annotations": [], "audio": None,
     "function_call": None, "tool_calls": []},
    {"role": "user", "content": "And tomorrow?"},
]

REAL_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("openai-sdk", {
        "model": "gpt-4o", "messages": HISTORY, "tools": [TOOL], "tool_choice": "auto", "temperature": 0.7,
        "top_p": 1, "n": 1, "stop": ["\n\n"], "max_tokens": 256, "max_completion_tokens": 256, "stream": True,
        "stream_options": {"include_usage": True}, "seed": 7, "user": "u-1", "metadata": {"team": "a"},
        "store": False, "logprobs": True, "top_logprobs": 3, "logit_bias": {"50256": -100},
        "frequency_penalty": 0.1, "presence_penalty": 0.2, "parallel_tool_calls": True,
        "prediction": {"type": "content", "content": "Sunny"}, "modalities": ["text"], "audio": None,
        "service_tier": "auto", "verbosity": "low", "prompt_cache_key": "k", "safety_identifier": "s",
        "web_search_options": {"search_context_size": "low"}, "reasoning_effort": "high",
        "prompt_cache_retention": "24h", "moderation": None,
    }),
    ("vllm", {
        "model": "moonshotai/Kimi-K3", "messages": HISTORY, "tools": [TOOL], "top_k": 20, "min_p": 0.05,
        "repetition_penalty": 1.05, "min_tokens": 1, "skip_special_tokens": False,
        "spaces_between_special_tokens": True, "include_stop_str_in_output": False, "ignore_eos": False,
        "echo": False, "priority": 0, "request_id": "req-1", "return_token_ids": True,
        "structured_outputs": {"json": {"type": "object"}}, "guided_json": {"type": "object"},
        "guided_regex": None, "guided_choice": None, "guided_grammar": None, "guided_decoding_backend": "xgrammar",
        "guided_whitespace_pattern": None, "chat_template": None, "documents": None,
        "chat_template_kwargs": {"thinking": False}, "add_special_tokens": False, "truncate_prompt_tokens": 4096,
        "mm_processor_kwargs": {"max_pixels": 1 << 20}, "cache_salt": "salt", "kv_transfer_params": None,
        "vllm_xargs": {"x": 1}, "return_tokens_as_token_ids": False, "bad_words": ["foo"],
        "prompt_logprobs": None, "allowed_token_ids": None, "length_penalty": 1.0, "use_beam_search": False,
        "stop_token_ids": [163586], "add_generation_prompt": True, "continue_final_message": False,
        "thinking_token_budget": 1024, "include_reasoning": True, "session_id": "s-1",
    }),
    ("sglang", {
        "model": "default", "messages": HISTORY, "tools": [TOOL], "tool_choice": "required", "regex": None,
        "ebnf": None, "json_schema": None, "stop_regex": None, "no_stop_trim": False, "lora_path": None,
        "session_params": None, "separate_reasoning": True, "stream_reasoning": True,
        "return_hidden_states": False, "rid": "r-1", "extra_key": None, "cache_salt": None, "priority": None,
        "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None, "routed_dp_rank": None,
        "custom_logit_processor": None, "custom_params": None, "max_dynamic_patch": None,
        "min_dynamic_patch": None, "images_config": None, "input_ids": None, "return_meta_info": False,
        "chat_template_kwargs": {"enable_thinking": True, "spaces_between_special_tokens": False},
        "reasoning_effort": "low",
    }),
]


@pytest.mark.parametrize("name, body", REAL_BODIES, ids=[n for n, _ in REAL_BODIES])
def test_real_bodies_render_as_without_their_ignored_fields(k3: xtml.Template, name: str,
                                                            body: dict[str, Any]) -> None:
    before = copy.deepcopy(body)
    stripped = without_ignored(body)
    assert len(stripped) < len(body) - 5  # the body did carry ignored fields
    assert k3.encode(body, vocab()) == k3.encode(stripped, vocab())
    assert k3.normalize(body) == k3.normalize(stripped)
    assert body == before


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                max_size=3),
                    max_leaves=6)
IGNORED_NAMES = sorted(f.name for f in FIELDS if f.effect == IGNORED)


@settings(max_examples=40)
@given(xt.requests(K3, max_messages=4), st.dictionaries(st.sampled_from(IGNORED_NAMES), JSON, max_size=8),
       st.dictionaries(st.sampled_from(IGNORED_NAMES), JSON, max_size=3))
def test_ignored_fields_never_change_the_ids(body: dict[str, Any], top: dict[str, Any],
                                             in_kwargs: dict[str, Any]) -> None:
    noisy = {**top, **body}
    if in_kwargs:
        noisy["chat_template_kwargs"] = {**in_kwargs, **body.get("chat_template_kwargs", {})}
    assert K3.encode(noisy, vocab()) == K3.encode(body, vocab())


# -- unknown keys ----------------------------------------------------------------------------------

MISSPELT: list[tuple[Any, dict[str, Any], type[xtml.XtmlError], str]] = [
    ({"messages": [U], "thinkng": False}, {}, xtml.RequestError,
     r"unknown request key 'thinkng' \(did you mean 'thinking'\?\) \(at thinkng\)"),
    ({"messages": [U], "reasoning_efort": "low"}, {}, xtml.RequestError, "did you mean 'reasoning_effort'"),
    ({"messages": [U], "chat_template_kwargs": {"enable_thinkng": False}}, {}, xtml.OptionError,
     r"unknown option 'enable_thinkng' \(did you mean 'enable_thinking'\?\) "
     r"\(at option 'chat_template_kwargs.enable_thinkng'\)"),
    ([U], {"tool_choise": "auto"}, xtml.OptionError, "did you mean 'tool_choice'"),
    ([U], {"zzzzzz": 1}, xtml.OptionError, r"unknown option 'zzzzzz' \(known: tools, thinking"),
    ([{**U, "reasoning_contnet": "x"}], {}, xtml.MessageError,
     r"unknown message field 'reasoning_contnet' \(did you mean 'reasoning_content'\?\) \(at messages\[0\]"),
    ({"messages": [U], "qqqqqq": 1}, {}, xtml.RequestError, r"unknown request key 'qqqqqq' \(at qqqqqq\)"),
]


@pytest.mark.parametrize("request_, options, error, message", MISSPELT, ids=[str(m[3])[:40] for m in MISSPELT])
def test_unknown_keys_are_errors_with_a_hint(k3: xtml.Template, request_: Any, options: dict[str, Any],
                                             error: type[xtml.XtmlError], message: str) -> None:
    with pytest.raises(error, match=message):
        k3.render(request_, **options)


def test_unknown_keys_can_be_ignored(k3: xtml.Template) -> None:
    noisy = {"messages": [{**U, "x_trace": "t"}], "x_client": "v2", "chat_template_kwargs": {"x_flag": 1}}
    plain = {"messages": [U], "chat_template_kwargs": {}}
    for method in (k3.render, k3.normalize, k3.document):
        assert method(noisy, unknown_keys="ignore") == method(plain)
    assert k3.encode(noisy, vocab(), unknown_keys="ignore") == k3.encode(plain, vocab())
    assert k3.encode_training(noisy, vocab(), unknown_keys="ignore").ids == \
        k3.encode_training(plain, vocab()).ids
    assert k3.completion_grammar(noisy, unknown_keys="ignore") == k3.completion_grammar(plain)
    with pytest.raises(xtml.RequestError, match="x_client"):
        k3.render(noisy, unknown_keys="error")
    # Keyword options are the caller's own: always checked.
    with pytest.raises(xtml.OptionError, match="did you mean 'thinking'"):
        k3.render(plain, unknown_keys="ignore", thinkng=False)
    # Known keys keep their rules.
    with pytest.raises(xtml.OptionError, match="documents"):
        k3.render({**plain, "documents": [{"text": "d"}]}, unknown_keys="ignore")
    with pytest.raises(xtml.OptionError, match="unknown_keys must be one of 'error', 'ignore'"):
        k3.render(plain, unknown_keys="drop")
    # A request cannot set it.
    with pytest.raises(xtml.RequestError, match="unknown request key 'unknown_keys'"):
        k3.render({**plain, "unknown_keys": "ignore"})


@pytest.mark.parametrize("key, value", [("documents", [{"title": "t", "text": "x"}]), ("chat_template", "{{ x }}"),
                                        ("input_ids", [1, 2, 3])])
def test_refused_keys_take_only_empty_values(k3: xtml.Template, key: str, value: Any) -> None:
    empties: tuple[Any, ...] = (None, [], "")
    for empty in empties:
        assert k3.render({"messages": [U], key: empty}) == k3.render([U])
    with pytest.raises(xtml.OptionError, match=f"'{key}' cannot be honoured") as e:
        k3.render({"messages": [U], key: value})
    assert e.value.option == key
    with pytest.raises(xtml.OptionError) as e:
        k3.render({"messages": [U], "chat_template_kwargs": {key: value}})
    assert e.value.option == f"chat_template_kwargs.{key}"


# -- precedence ----------------------------------------------------------------------------------------

def test_option_levels(k3: xtml.Template) -> None:
    on, off = k3.render([U], thinking=True), k3.render([U], thinking=False)
    assert on != off
    body = {"messages": [U], "thinking": True, "chat_template_kwargs": {"thinking": False}}
    assert k3.render(body) == off  # chat_template_kwargs over the body
    assert k3.render(body, thinking=True) == on  # keywords over both
    assert k3.render({**body, "extra_body": {"chat_template_kwargs": {"thinking": True}}}) == on
    assert k3.render({"messages": [U], "thinking": True, "extra_body": {"thinking": False}}) == off


def test_reasoning_effort_none_wins_over_thinking_in_k3(k3: xtml.Template) -> None:
    off = k3.render([U], thinking=False)
    assert k3.render([U], reasoning_effort="none", thinking=True) == off
    assert k3.render({"messages": [U], "reasoning_effort": "none", "chat_template_kwargs": {"thinking": True}}) == off
    assert k3.render([U], reasoning_effort="none", enable_thinking=True) == off


def test_reasoning_effort_none_against_thinking_is_an_error_in_base() -> None:
    assert not BASE.dialect.off_wins and K3.dialect.off_wins
    with pytest.raises(xtml.OptionError, match="switches thinking off, but thinking is on"):
        BASE.render([U], reasoning_effort="none", thinking=True)
    assert BASE.render([U], reasoning_effort="none") == BASE.render([U], thinking=False)


def test_thinking_wins_over_enable_thinking(k3: xtml.Template) -> None:
    assert k3.render([U], thinking=False, enable_thinking=True) == k3.render([U], thinking=False)
    assert k3.render([U], thinking=True, enable_thinking=False) == k3.render([U], thinking=True)


def test_thinking_effort_wins_and_reasoning_effort_is_then_not_read(k3: xtml.Template) -> None:
    low = k3.render([U], thinking_effort="low")
    assert "`thinking_effort=low`" in low.text
    assert k3.render([U], thinking_effort="low", reasoning_effort="high") == low
    # As the reference encoder: an effort K3 does not take passes when overridden.
    assert k3.render([U], thinking_effort="low", reasoning_effort="medium") == low
    assert k3.render([U], reasoning_effort="high").text.count("`thinking_effort=high`") == 1


def test_medium_is_refused_and_the_error_says_why(k3: xtml.Template) -> None:
    for key in ("thinking_effort", "reasoning_effort"):
        with pytest.raises(xtml.OptionError) as e:
            k3.render([U], **{key: "medium"})
        assert e.value.option == key
        assert f"{key} must be one of low, high, max" in e.value.msg
        assert "names 'medium', but kimi-k3 accepts only low, high, max" in e.value.msg
    # xtml-base's prose names no effort: no such note.
    with pytest.raises(xtml.OptionError) as e:
        BASE.render([U], thinking_effort="max")
    assert e.value.msg == "thinking_effort must be one of low, medium, high, not 'max'"


def test_an_effort_turns_thinking_on_unless_told_otherwise() -> None:
    assert "Reasoning effort: low." in BASE.render([U], reasoning_effort="low").text
    assert BASE.render([U], reasoning_effort="low", thinking=False) == BASE.render([U])
    assert BASE.render([U], thinking_effort="low") == BASE.render([U])  # thinking_effort alone sets the effort
    assert BASE.render({"messages": [U], "reasoning": {"enabled": True}}) == BASE.render([U], thinking=True)


def test_sglang_reasoning_object(k3: xtml.Template) -> None:
    assert k3.render({"messages": [U], "reasoning": {"effort": "low"}}) == k3.render([U], reasoning_effort="low")
    assert k3.render({"messages": [U], "reasoning": {"effort": "none"}}) == k3.render([U], thinking=False)
    with pytest.raises(xtml.OptionError, match="reasoning must be an object"):
        k3.render({"messages": [U], "reasoning": "high"})


def test_response_schema(k3: xtml.Template) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    want = k3.render([U], response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert k3.render([U], response_format={"type": "json_schema"}, response_schema=schema) == want
    assert k3.render([U], response_format="json_schema", response_schema=schema) == want
    # It wins over the schema inside response_format, as in the reference encoder.
    other = {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}
    assert k3.render([U], response_format=other, response_schema=schema) == want
    for rf in (None, {"type": "json_object"}, "text"):
        with pytest.raises(xtml.OptionError, match="response_schema is the schema of a json_schema"):
            k3.render([U], response_format=rf, response_schema=schema)


# -- deprecated functions --------------------------------------------------------------------------------

def test_functions_and_function_call_are_tools_and_tool_choice(k3: xtml.Template) -> None:
    fn = TOOL["function"]
    assert k3.render({"messages": [U], "functions": [fn], "function_call": "none"}) == \
        k3.render({"messages": [U], "tools": [TOOL], "tool_choice": "none"})
    assert k3.render({"messages": [U], "functions": [fn], "function_call": {"name": "get_weather"}}) == \
        k3.render({"messages": [U], "tools": [TOOL], "tool_choice": {"type": "function",
                                                                     "function": {"name": "get_weather"}}})
    with pytest.raises(xtml.OptionError, match="not both"):
        k3.render({"messages": [U], "functions": [fn], "tools": [TOOL]})
    with pytest.raises(xtml.OptionError, match="not both"):
        k3.render({"messages": [U], "tools": [TOOL], "function_call": "auto", "tool_choice": "auto"})
    with pytest.raises(xtml.OptionError, match="function_call must be"):
        k3.render({"messages": [U], "functions": [fn], "function_call": {"nom": "x"}})


def test_deprecated_function_messages_replay(k3: xtml.Template) -> None:
    old: list[dict[str, Any]] = [U, {"role": "assistant", "content": None,
               "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
           {"role": "function", "name": "get_weather", "content": "sunny"}]
    new: list[dict[str, Any]] = [U, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "name": "get_weather", "content": "sunny"}]
    assert k3.render(old) == k3.render(new)
    with pytest.raises(xtml.MessageError, match="not both") as e:
        k3.render([U, {**new[1], "function_call": old[1]["function_call"]}])
    assert e.value.index == 1


# -- replayed messages and objects ---------------------------------------------------------------------

def _sdk_turn() -> tuple[list[Any], list[dict[str, Any]]]:
    from openai.types.chat import ChatCompletionMessage

    call: dict[str, Any] = {"id": "call_abc", "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    # As the API returns them: every field present, empty ones null.
    first = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None, "audio": None,
         "function_call": None, "annotations": []})
    cited = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": "Sunny [1].", "refusal": None, "audio": None, "function_call": None,
         "tool_calls": [], "annotations": [{"type": "url_citation", "url_citation": {
             "start_index": 6, "end_index": 9, "title": "W", "url": "https://w.example/paris"}}]})
    replay: list[Any] = [U, first, {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"}, cited]
    plain: list[dict[str, Any]] = [U, {"role": "assistant", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
             {"role": "assistant", "content": "Sunny [1]."}]
    return replay, plain


def test_openai_sdk_messages_replay_as_objects_and_dumps(k3: xtml.Template) -> None:
    replay, plain = _sdk_turn()
    dumped = [m.model_dump() if hasattr(m, "model_dump") else m for m in replay]
    assert set(dumped[3]) >= {"refusal", "annotations", "audio", "function_call", "tool_calls"}
    want = k3.encode(plain, vocab())
    assert k3.encode(replay, vocab()) == want
    assert k3.encode(dumped, vocab()) == want
    assert k3.encode({"messages": replay, "model": "gpt-4o"}, vocab()) == want


def test_api_fields_with_values_are_still_refused(k3: xtml.Template) -> None:
    with pytest.raises(xtml.MessageError, match="'refusal' cannot be rendered"):
        k3.render([U, {"role": "assistant", "content": None, "refusal": "I can't."}])
    with pytest.raises(xtml.MessageError, match="'audio' cannot be rendered"):
        k3.render([U, {"role": "assistant", "content": None, "audio": {"id": "audio_1"}}])
    with pytest.raises(xtml.MessageError, match="'annotations' cannot be rendered"):
        k3.render([{**U, "annotations": [{"type": "url_citation"}]}])


class _Message(BaseModel):
    role: str = "user"
    content: str | None = None
    name: str | None = None


class _Request(BaseModel):
    messages: list[_Message]
    model: str = "m"
    tool_choice: str = "none"  # a server default, not the caller's
    thinking: bool | None = None
    tools: list[Any] | None = None


class _Function(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(BaseModel):
    type: str = "function"
    function: _Function


def test_pydantic_requests_messages_and_tools(k3: xtml.Template) -> None:
    plain = [{"role": "user", "content": "hi"}]
    assert k3.render(_Request(messages=[_Message(content="hi")])) == k3.render(plain)
    assert k3.render(_Request(messages=[_Message(content="hi")], tool_choice="none")) == \
        k3.render({"messages": plain, "tool_choice": "none"})
    assert k3.render(_Request(messages=[_Message(content="hi")], thinking=False)) == k3.render(plain, thinking=False)
    assert k3.render([_Message(content="hi")]) == k3.render(plain)
    # A tool model without its None fields; a None inside a schema is kept.
    params = {"type": "object", "properties": {"x": {"type": "integer", "default": None}}}
    tool = _Tool(function=_Function(name="f", parameters=params))
    want = {"type": "function", "function": {"name": "f", "parameters": params}}
    assert k3.render(plain, tools=[tool]) == k3.render(plain, tools=[want])
    assert k3.render(_Request(messages=[_Message(content="hi")], tools=[tool])) == k3.render(plain, tools=[want])
    assert k3.render([{"role": "system", "content": "", "tools": [tool]}, *plain]) == \
        k3.render([{"role": "system", "content": "", "tools": [want]}, *plain])


def test_openai_sdk_tool_objects(k3: xtml.Template) -> None:
    from openai.types.chat import ChatCompletionFunctionTool

    tool = ChatCompletionFunctionTool.model_validate(TOOL)
    assert k3.render([U], tools=[tool]) == k3.render([U], tools=[TOOL])


def test_transformers_fast_tokenizer_is_a_tokenizer(k3: xtml.Template) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is in the test extra; not installed")
    from tests.helpers.tokenizers import deepseek_path

    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=deepseek_path())
    hf.add_special_tokens({"additional_special_tokens": list(k3.markers.all())})
    replay, _ = _sdk_turn()
    ids = k3.encode(replay, hf)
    assert ids == k3.encode(replay, vocab())
    assert k3.parse(ids, hf) == k3.normalize(replay)
    open_id = hf.convert_tokens_to_ids("<|open|>")
    assert ids.count(open_id) == k3.render(replay).text.count("<|open|>")


# -- continue_final_message -------------------------------------------------------------------------------

def test_prefill_renders_the_final_message_open(k3: xtml.Template) -> None:
    # The prefill renders themselves (with reasoning, without, after calls)
    # are golden files: tests/data/golden/render/prefill-*.
    chat = [U, {"role": "assistant", "content": "It is", "reasoning_content": "Check."}]
    plain = k3.render(chat, continue_final_message=True, thinking=False).text
    # The same as the closed render, cut after the last text.
    closed = k3.render(chat, add_generation_prompt=False, thinking=False).text
    assert closed == plain + "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"


def test_prefill_puts_one_shot_options_before_the_open_message(k3: xtml.Template) -> None:
    # Rendered whole in tests/data/golden/render/prefill-json.
    chat = [U, {"role": "assistant", "content": "{"}]
    text = k3.render(chat, continue_final_message=True, response_format={"type": "json_object"}).text
    assert text.index('type="response-format"') < text.rindex('role="assistant"')


def test_prefill_option_errors(k3: xtml.Template) -> None:
    chat = [U, {"role": "assistant", "content": "It is"}]
    with pytest.raises(xtml.OptionError, match="drop add_generation_prompt=true") as e:
        k3.render({"messages": chat, "continue_final_message": True, "add_generation_prompt": True})
    assert e.value.option == "continue_final_message"
    assert k3.render(chat, continue_final_message=True, add_generation_prompt=False) == \
        k3.render(chat, continue_final_message=True)
    with pytest.raises(xtml.OptionError, match="must be an assistant message"):
        k3.render([U], continue_final_message=True)
    with pytest.raises(xtml.OptionError, match="must be true or false"):
        k3.render(chat, continue_final_message="yes")
    with pytest.raises(xtml.OptionError, match="training example ends with its last message closed"):
        k3.encode_training({"messages": chat, "chat_template_kwargs": {"continue_final_message": True}}, vocab())
    with pytest.raises(TypeError, match="completion=True"):
        k3.parse("x", prefill=chat[-1])
    assert k3.normalize(chat, continue_final_message=True)["continue_final_message"] is True
    assert k3.render(chat, continue_final_message=False) == k3.render(chat)


def test_prefill_round_trip_with_text_and_calls(k3: xtml.Template) -> None:
    tok = vocab()
    start = {"role": "assistant", "content": "The answer is"}
    for thinking in (True, False):
        prompt = k3.encode([U, start], tok, continue_final_message=True, thinking=thinking)
        assert tok.decode(prompt).endswith("<|open|>response<|sep|>The answer is")
        gen = ids_of_text(" 42.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>")
        want = {"role": "assistant", "content": "The answer is 42."}
        assert k3.parse(gen, tok, completion=True, thinking=thinking, prefill=start) == want
        assert k3.parse(" 42.<|close|>response<|sep|><|close|>message<|sep|>", completion=True,
                        thinking=thinking, prefill=start) == want
    called = {"role": "assistant", "reasoning_content": "Two calls.", "content": "",
              "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": {"a": 1}}}]}
    gen = ids_of_text('<|open|>call tool="g" index="2"<|sep|><|open|>argument key="b" type="string"<|sep|>hi'
                      "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>")
    got = k3.parse(gen, tok, completion=True, prefill=called)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got["tool_calls"]] == [
        ("f", '{"a": 1}'), ("g", '{"b": "hi"}')]
    assert got["reasoning_content"] == "Two calls."
    # Cut off: lenient parsing returns the message so far.
    cut = k3.parse(ids_of_text(" 4"), tok, completion=True, lenient=True, thinking=False, prefill=start)
    assert cut["content"] == "The answer is 4" and cut["diagnostics"][0]["kind"] == "truncated"


@settings(max_examples=40)
@given(xts.assistant_messages(K3, images=False), st.booleans(),
       st.text(st.characters(codec="utf-8", exclude_characters="<|>"), max_size=12))
def test_prefill_parse_gives_the_whole_message(message: dict[str, Any], thinking: bool, more: str) -> None:
    """The prefilled message rendered open, then what the model generates
    after it, read back with ``prefill``: the whole message."""
    tok = vocab()
    whole = K3.normalize([message], thinking=thinking, add_generation_prompt=False)["messages"][0]
    if "tool_calls" in whole:
        more, rest = "", "<|close|>tools<|sep|>"
    else:
        rest = "<|close|>response<|sep|>"
        if isinstance(whole["content"], str):
            whole["content"] += more
        else:
            more = ""
    gen = ids_of_text(more + rest + "<|close|>message<|sep|>")
    assert K3.parse(gen, tok, completion=True, thinking=thinking, prefill=message) == whole


# -- tools from Python functions -----------------------------------------------------------------------

def get_weather(city: str, unit: Literal["c", "f"] = "c", days: int | None = None) -> str:
    """Get the current weather.

    Looks it up.

    Args:
        city: The city name.
        unit: The temperature unit.
    """
    return "sunny"


def test_function_tool_schema() -> None:
    tool = function_tool(get_weather)
    assert tool == {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather.\n\nLooks it up.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"description": "The city name.", "type": "string"},
            "unit": {"description": "The temperature unit.", "default": "c", "enum": ["c", "f"], "type": "string"},
            "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}}}}}
    assert function_tool(get_weather) is tool  # made once per function


def test_callables_are_taken_wherever_tools_are(k3: xtml.Template) -> None:
    schema = function_tool(get_weather)
    want = k3.render([U], tools=[schema])
    assert k3.render([U], tools=[get_weather]) == want
    assert k3.render({"messages": [U], "tools": [get_weather]}) == want
    assert k3.render({"messages": [U], "functions": [get_weather]}) == want
    assert k3.render([{"role": "system", "content": "", "tools": [get_weather]}, U]) == \
        k3.render([{"role": "system", "content": "", "tools": [schema]}, U])


def _no_hint(city) -> str:  # type: ignore[no-untyped-def]
    return city  # type: ignore[no-any-return]


def _star(*cities: str) -> str:
    return ""


def test_function_tool_errors(k3: xtml.Template) -> None:
    with pytest.raises(xtml.OptionError, match="'city' has no type hint") as e:
        k3.render([U], tools=[TOOL, _no_hint])
    assert e.value.option == "tools[1]"
    with pytest.raises(xtml.OptionError, match=r"no \*args"):
        k3.render([U], tools=[_star])


def test_function_tools_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh(q: str) -> str:
        """Search."""
        return q

    monkeypatch.setitem(sys.modules, "docstring_parser", None)
    with pytest.raises(xtml.OptionError, match=r"pip install 'xtml\[functions\]'"):
        K3.render([U], tools=[fresh])


# -- docs/requests.md ---------------------------------------------------------------------------------

def test_requests_doc_python_examples_run() -> None:
    run_examples("docs/requests.md", at_least=4)


def test_a_training_example_cannot_leave_its_last_message_open() -> None:
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    with pytest.raises(xtml.OptionError, match="continue_final_message") as e:
        K3.encode_training({"messages": chat, "continue_final_message": True}, vocab())
    assert e.value.location == "option 'continue_final_message'"
    K3.encode_training({"messages": chat, "continue_final_message": False}, vocab())
