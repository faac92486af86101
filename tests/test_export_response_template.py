"""The response-template export, read by transformers' own parser: for
completions xtml renders, ``tokenizer.parse_response`` (and the streaming
parser fed one id at a time) gives what :meth:`xtml.Template.parse` gives,
in content, reasoning and tool calls, for both built-in dialects, thinking
on and off.

The tokenizer is a real ``PreTrainedTokenizerFast`` (a 129k-id byte-level
BPE) with the dialect's markers added as special tokens, so transformers
parses token ids with the markers as control tokens. Where the response
template cannot say what the dialect says, the export lists a limit and a
named test below shows the difference; the fuzzed comparison expects
exactly those differences (:func:`documented`) and counts them.
"""

from __future__ import annotations

import collections
import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.tokenizers import deepseek_path
from xtml import testing as xt
from xtml.errors import ParseError, XtmlError
from xtml.exports.response_template import response_template
from xtml.markup.header import escape
from xtml.testing.strategies import assistant_messages

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

DIALECTS = ("kimi-k3", "xtml-base")
PER_DIALECT = 300
# The options completion_case leaves out of the history (they render after it).
DROP = ("tool_choice", "response_format", "image_prompts", "add_generation_prompt")
MODE_KEYS = ("thinking", "enable_thinking", "reasoning_effort")


class Setup:
    """A dialect's template, xtml vocabulary and transformers tokenizer
    (with the exported response template set)."""

    def __init__(self, name: str) -> None:
        self.tpl = xtml.load(name)
        self.d = self.tpl.dialect
        self.vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=self.tpl.markers.all())
        backend = tokenizers.Tokenizer.from_str(self.vocab.tokenizer.to_str())
        # xtml's copy reads marker strings in text as text; transformers'
        # tokenizer matches its special tokens as usual.
        backend.encode_special_tokens = False
        self.tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend)
        self.template, self.limits = response_template(self.d)
        self.tok.response_template = self.template

    def prompt_and_completion(self, body: dict[str, Any]) -> tuple[list[int], list[int], bool]:
        """(prompt ids, completion ids, thinking) for a request whose last
        message is the assistant's, as :func:`xt.completion_case` cuts it."""
        case = xt.completion_case(self.tpl, body, self.vocab)
        assert case is not None
        ids, _, thinking = case
        prompt = self.tpl.encode({**body, "messages": body["messages"][:-1]}, self.vocab, add_generation_prompt=True)
        whole = self.tpl.encode(body, self.vocab, add_generation_prompt=False)
        assert whole == prompt + ids
        return prompt, ids, thinking

    def texts(self, body: dict[str, Any]) -> tuple[str, str, xtml.template.Rendered]:
        """(prompt text, completion text, the whole render)."""
        prompt = self.tpl.render({**body, "messages": body["messages"][:-1]}, add_generation_prompt=True).text
        whole = self.tpl.render(body, add_generation_prompt=False)
        assert whole.text.startswith(prompt)
        return prompt, whole.text[len(prompt):], whole

    def xtml(self, ids: list[int], thinking: bool) -> dict[str, Any]:
        return self.tpl.parse(ids, self.vocab, completion=True, thinking=thinking)

    def by_ids(self, prompt: list[int], ids: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = self.tok.parse_response(ids, prefix=prompt)
        return out

    def streamed(self, prompt: list[int], ids: list[int]) -> dict[str, Any]:
        parser = self.tok.get_response_parser(prefix=prompt, token_ids=True)
        for i in ids:
            parser.feed([i])
        message, _ = parser.finalize()
        out: dict[str, Any] = message
        return out

    def by_text(self, prompt: str, text: str) -> dict[str, Any]:
        out: dict[str, Any] = self.tok.parse_response(text, prefix=prompt)
        return out


@cache
def setup(name: str) -> Setup:
    return Setup(name)


# -- what is compared ------------------------------------------------------------

def xtml_view(msg: dict[str, Any]) -> dict[str, Any]:
    """An xtml message as compared: content, reasoning, calls as (name,
    arguments), arguments parsed when they are JSON (a json block's raw text
    is not)."""
    calls = []
    for c in msg.get("tool_calls", ()):
        raw = c["function"]["arguments"]
        try:
            args: Any = json.loads(raw)
        except ValueError:
            args = raw
        calls.append((c["function"]["name"], args))
    return {"content": msg.get("content"), "reasoning_content": msg.get("reasoning_content"), "tool_calls": calls}


def hf_view(msg: dict[str, Any]) -> dict[str, Any]:
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", ())]
    return {"content": msg.get("content"), "reasoning_content": msg.get("reasoning_content"), "tool_calls": calls}


def documented(d: xtml.chat.dialect.Dialect, view: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """What transformers gives for an xtml view, by the export's limits,
    and which limits that took: names and keys stay escaped; a json block
    (arguments that are not a JSON object) is one argument named after its
    tag."""
    kinds: set[str] = set()
    calls = []
    for name, args in view["tool_calls"]:
        if escape(name) != name:
            kinds.add("unescaped name")
        if isinstance(args, dict):
            if any(escape(k) != k for k in args):
                kinds.add("unescaped key")
            args = {escape(k): v for k, v in args.items()}
        else:
            kinds.add("json block")
            args = {d.names["json"]: args}
        calls.append((escape(name), args))
    return {**view, "tool_calls": calls}, kinds


# -- the fuzzed comparison -------------------------------------------------------

@st.composite
def bodies(draw: st.DrawFn, tpl: xtml.Template) -> dict[str, Any]:
    """A request (a history of any shape) ending with an assistant message,
    thinking on or off, without the options that render after the history
    (completion_case drops them too)."""
    body = dict(draw(xt.requests(tpl, max_messages=4)))
    body["messages"] = [*body["messages"], draw(assistant_messages(tpl, images=False, name=False))]
    for key in (*DROP, *MODE_KEYS):
        body.pop(key, None)
    if isinstance(body.get("chat_template_kwargs"), dict):
        body["chat_template_kwargs"] = {k: v for k, v in body["chat_template_kwargs"].items()
                                        if k not in (*DROP, *MODE_KEYS)}
    body["thinking"] = draw(st.booleans())
    return body


@pytest.mark.parametrize("name", DIALECTS)
def test_parse_response_equals_xtml(name: str) -> None:
    """By ids (whole and streamed one id at a time) for every completion,
    marker literals in its text included; by text where the render holds
    no marker literal."""
    s = setup(name)
    n: collections.Counter[str] = collections.Counter()

    @settings(derandomize=True, database=None, max_examples=PER_DIALECT, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(bodies(s.tpl))
    def run(body: dict[str, Any]) -> None:
        n["drawn"] += 1
        try:
            s.tpl.render(body, add_generation_prompt=False)
        except XtmlError:
            n["refused by render"] += 1
            return
        prompt, ids, thinking = s.prompt_and_completion(body)
        assert thinking is body["thinking"]
        want = xtml_view(s.xtml(ids, thinking))
        expect, kinds = documented(s.d, want)
        got = hf_view(s.by_ids(prompt, ids))
        assert got == expect
        assert hf_view(s.streamed(prompt, ids)) == expect
        prompt_text, text, rendered = s.texts(body)
        n["checked"] += 1
        n[f"checked, thinking={thinking}"] += 1
        n["equal"] += got == want
        for k in kinds:
            n[f"documented: {k}"] += 1
        n["marker literal in the completion's text"] += any(a.offset >= len(prompt_text) for a in rendered.ambiguous)
        n["with calls"] += bool(want["tool_calls"])
        n["typed arguments"] += sum(len(a) for _, a in want["tool_calls"] if isinstance(a, dict))
        n["with reasoning"] += bool(want["reasoning_content"])
        if not rendered.ambiguous:
            # From text, only where no marker literal stands in the text.
            assert hf_view(s.by_text(prompt_text, text)) == expect
            n["checked from text"] += 1

    run()
    print(f"\n{name}: {dict(sorted(n.items()))}")
    assert n["checked, thinking=True"] >= PER_DIALECT // 4
    assert n["checked, thinking=False"] >= PER_DIALECT // 4


# -- the limits, one named test each ---------------------------------------------

def _completion(s: Setup, message: dict[str, Any], *, thinking: bool = True,
                history: list[dict[str, Any]] | None = None) -> tuple[list[int], list[int], dict[str, Any]]:
    body = {"messages": [*(history or [{"role": "user", "content": "hi"}]), message], "thinking": thinking}
    prompt, ids, _ = s.prompt_and_completion(body)
    return prompt, ids, s.xtml(ids, thinking)


def _ids(s: Setup, text: str) -> list[int]:
    """Ids of markup text, every marker string its special id."""
    return s.tpl.completion_ids(text, s.vocab)


def _prompt(s: Setup, thinking: bool) -> list[int]:
    return s.tpl.encode({"messages": [{"role": "user", "content": "hi"}], "thinking": thinking}, s.vocab,
                        add_generation_prompt=True)


LIMITS = {
    "attribute values are not unescaped": "test_attribute_values_are_not_unescaped",
    "a call's json fallback block": "test_json_fallback_block_is_one_argument",
    "typed argument values are not checked": "test_typed_argument_values_are_not_checked",
    "a typed value Python's json cannot read": "test_unreadable_typed_value_fails_the_parse",
    "marker literals": "test_marker_literal_in_text",
    "U+FDD2": "test_noncharacter_fdd2_is_dropped_from_ids",
    "markup is not checked": "test_markup_is_not_checked",
    "a call without a": "test_call_without_name_is_dropped",
    "content parts": "test_content_parts_come_back_as_text",
    "calls get no id": "test_calls_get_no_id",
    "output after the message's end": "test_output_after_the_end",
}


@pytest.mark.parametrize("name", DIALECTS)
def test_template_is_accepted_and_every_limit_has_a_test(name: str) -> None:
    from transformers.utils.chat_parsing.response_templates import load_response_template

    s = setup(name)
    load_response_template(s.template)
    assert json.loads(json.dumps(s.template)) == s.template  # saved in tokenizer_config.json as it is
    assert len(s.limits) == len(LIMITS)
    for line in s.limits:
        assert "\n" not in line
        hit = [test for start, test in LIMITS.items() if line.startswith(start)]
        assert len(hit) == 1, line
        assert hit[0] in globals()
    # Nothing of the other dialect leaks into this one's template.
    other = setup(next(x for x in DIALECTS if x != name))
    text = json.dumps(s.template)
    for marker in other.tpl.markers.all():
        assert json.dumps(marker)[1:-1] not in text


@pytest.mark.parametrize("name", DIALECTS)
def test_attribute_values_are_not_unescaped(name: str) -> None:
    s = setup(name)
    call = {"type": "function", "function": {"name": 'a&b"c', "arguments": {'k"&': 1, "plain": "x&y"}}}
    prompt, ids, want = _completion(s, {"role": "assistant", "content": "", "tool_calls": [call]})
    assert want["tool_calls"][0]["function"]["name"] == 'a&b"c'
    got = s.by_ids(prompt, ids)["tool_calls"][0]["function"]
    assert got == {"name": "a&amp;b&quot;c", "arguments": {"k&quot;&amp;": 1, "plain": "x&y"}}


@pytest.mark.parametrize("name", DIALECTS)
def test_json_fallback_block_is_one_argument(name: str) -> None:
    s = setup(name)
    call = {"type": "function", "function": {"name": "f", "arguments": "not json {"}}
    prompt, ids, want = _completion(s, {"role": "assistant", "content": "ok", "tool_calls": [call]})
    assert want["tool_calls"][0]["function"]["arguments"] == "not json {"
    got = s.by_ids(prompt, ids)["tool_calls"][0]["function"]
    assert got == {"name": "f", "arguments": {s.d.names["json"]: "not json {"}}


@pytest.mark.parametrize("name", DIALECTS)
def test_typed_argument_values_are_not_checked(name: str) -> None:
    s = setup(name)
    m, n = s.tpl.markers, s.d.names
    think = s.d.channel_tag("reasoning")
    answer = s.d.channel_tag("content")
    tools = s.d.channel_tag("tool_calls")

    def arg(key: str, typ: str, value: str) -> str:
        head = f'{m.open}{n["argument"]} {n["key"]}="{key}" {n["type"]}="{typ}"{m.sep}'
        return f'{head}{value}{m.close}{n["argument"]}{m.sep}'

    text = (f"{m.close}{think}{m.sep}{m.open}{answer}{m.sep}{m.close}{answer}{m.sep}{m.open}{tools}{m.sep}"
            f'{m.open}{n["call"]} {n["tool"]}="f" {n["index"]}="1"{m.sep}'
            + arg("a", "number", "twelve") + arg("b", "number", '"12"') + arg("c", "number", "NaN")
            + f"{m.close}{n['call']}{m.sep}{m.close}{tools}{m.sep}{m.close}{n['message']}{m.sep}{m.end}")
    ids = _ids(s, text)
    with pytest.raises(ParseError):
        s.xtml(ids, True)
    lenient = s.tpl.parse(ids, s.vocab, completion=True, thinking=True, lenient=True)
    assert json.loads(lenient["tool_calls"][0]["function"]["arguments"]) == {"a": "twelve", "b": '"12"', "c": "NaN"}
    got = s.by_ids(_prompt(s, True), ids)["tool_calls"][0]["function"]["arguments"]
    assert got["a"] == "twelve"
    assert got["b"] == "12"  # a string, in a number argument
    assert got["c"] != got["c"]  # NaN


@pytest.mark.parametrize("value", ["1" * 5000, "[" * 50_000 + "]" * 50_000], ids=["digits", "depth"])
@pytest.mark.parametrize("name", DIALECTS)
def test_unreadable_typed_value_fails_the_parse(name: str, value: str) -> None:
    s = setup(name)
    m, n = s.tpl.markers, s.d.names
    think, answer, tools = (s.d.channel_tag(h) for h in ("reasoning", "content", "tool_calls"))
    typ = "number" if value[0] == "1" else "array"
    text = (f"{m.close}{think}{m.sep}{m.open}{answer}{m.sep}hi{m.close}{answer}{m.sep}{m.open}{tools}{m.sep}"
            f'{m.open}{n["call"]} {n["tool"]}="f" {n["index"]}="1"{m.sep}'
            f'{m.open}{n["argument"]} {n["key"]}="a" {n["type"]}="{typ}"{m.sep}{value}{m.close}{n["argument"]}{m.sep}'
            f"{m.close}{n['call']}{m.sep}{m.close}{tools}{m.sep}{m.close}{n['message']}{m.sep}{m.end}")
    ids = _ids(s, text)
    with pytest.raises(ParseError):
        s.xtml(ids, True)
    lenient = s.tpl.parse(ids, s.vocab, completion=True, thinking=True, lenient=True)
    assert lenient["content"] == "hi"
    assert json.loads(lenient["tool_calls"][0]["function"]["arguments"]) == {"a": value}
    with pytest.raises((ValueError, RecursionError)):
        s.by_ids(_prompt(s, True), ids)


@pytest.mark.parametrize("name", DIALECTS)
def test_noncharacter_fdd2_is_dropped_from_ids(name: str) -> None:
    s = setup(name)
    call = {"type": "function", "function": {"name": "f\ufdd2", "arguments": {"k": "v\ufdd2"}}}
    message = {"role": "assistant", "content": "a\ufdd2b", "tool_calls": [call]}
    prompt, ids, want = _completion(s, message)
    assert want["content"] == "a\ufdd2b"
    got = s.by_ids(prompt, ids)
    assert got["content"] == "ab"
    assert got["tool_calls"][0]["function"] == {"name": "f", "arguments": {"k": "v"}}
    # From text, where nothing is defused, it stays.
    prompt_text, text, _ = s.texts({"messages": [{"role": "user", "content": "hi"}, message], "thinking": True})
    assert s.by_text(prompt_text, text)["content"] == "a\ufdd2b"


@pytest.mark.parametrize("name", DIALECTS)
def test_marker_literal_in_text(name: str) -> None:
    s = setup(name)
    m = s.tpl.markers
    answer = s.d.channel_tag("content")
    content = f"quoted: {m.close}{answer}{m.sep} and {m.open}x{m.sep} rest"
    call = {"type": "function", "function": {"name": "f", "arguments": {"q": f"{m.end}{m.close}"}}}
    message = {"role": "assistant", "content": content, "reasoning_content": f"r{m.open}", "tool_calls": [call]}
    prompt, ids, want = _completion(s, message)
    assert want["content"] == content
    # From ids the spelled markers stay text ...
    assert hf_view(s.by_ids(prompt, ids)) == xtml_view(want)
    assert hf_view(s.streamed(prompt, ids)) == xtml_view(want)
    # ... from text they are markup: the response channel ends early.
    prompt_text, text, rendered = s.texts({"messages": [{"role": "user", "content": "hi"}, message], "thinking": True})
    assert rendered.ambiguous
    got = s.by_text(prompt_text, text)
    assert got["content"] == "quoted: "


@pytest.mark.parametrize("name", DIALECTS)
def test_markup_is_not_checked(name: str) -> None:
    s = setup(name)
    m, n = s.tpl.markers, s.d.names
    think, answer = s.d.channel_tag("reasoning"), s.d.channel_tag("content")
    # Text outside a channel, the response channel twice, then the think
    # channel out of order.
    text = (f"r{m.close}{think}{m.sep}stray{m.open}{answer}{m.sep}one{m.close}{answer}{m.sep}"
            f"{m.open}{answer}{m.sep}two{m.close}{answer}{m.sep}{m.open}{think}{m.sep}late{m.close}{think}{m.sep}"
            f"{m.close}{n['message']}{m.sep}{m.end}")
    ids = _ids(s, text)
    with pytest.raises(ParseError):
        s.xtml(ids, True)
    lenient = s.tpl.parse(ids, s.vocab, completion=True, thinking=True, lenient=True)
    assert lenient["diagnostics"]
    got = s.by_ids(_prompt(s, True), ids)
    assert got == {"role": "assistant", "content": "two", "reasoning_content": "late"}
    assert "diagnostics" not in got


@pytest.mark.parametrize("name", DIALECTS)
def test_call_without_name_is_dropped(name: str) -> None:
    s = setup(name)
    m, n = s.tpl.markers, s.d.names
    think, answer, tools = (s.d.channel_tag(h) for h in ("reasoning", "content", "tool_calls"))
    text = (f"{m.close}{think}{m.sep}{m.open}{answer}{m.sep}{m.close}{answer}{m.sep}{m.open}{tools}{m.sep}"
            f'{m.open}{n["call"]} {n["index"]}="1"{m.sep}{m.close}{n["call"]}{m.sep}'
            f'{m.open}{n["call"]} {n["tool"]}="g" {n["index"]}="2"{m.sep}'
            f'{m.open}{n["argument"]} {n["type"]}="string"{m.sep}v{m.close}{n["argument"]}{m.sep}'
            f'{m.open}{n["argument"]} {n["type"]}="string" {n["key"]}="k"{m.sep}w{m.close}{n["argument"]}{m.sep}'
            f"{m.close}{n['call']}{m.sep}{m.close}{tools}{m.sep}{m.close}{n['message']}{m.sep}{m.end}")
    ids = _ids(s, text)
    lenient = s.tpl.parse(ids, s.vocab, completion=True, thinking=True, lenient=True)
    assert [c["function"]["name"] for c in lenient["tool_calls"]] == ["", "g"]
    got = s.by_ids(_prompt(s, True), ids)
    # The second call keeps its keyed argument (attributes in any order),
    # and loses the one without a key.
    assert [c["function"] for c in got["tool_calls"]] == [{"name": "g", "arguments": {"k": "w"}}]


def test_content_parts_come_back_as_text() -> None:
    s = setup("kimi-k3")
    message = {"role": "assistant", "content": [{"type": "text", "text": "see "}, {"type": "image_url",
                                                  "image_url": {"url": "https://example.com/a.png"}}]}
    prompt, ids, want = _completion(s, message)
    assert isinstance(want["content"], list)
    got = s.by_ids(prompt, ids)
    assert got["content"] == "see " + s.d.image_placeholder


@pytest.mark.parametrize("name", DIALECTS)
def test_calls_get_no_id(name: str) -> None:
    s = setup(name)
    call = {"type": "function", "function": {"name": "f", "arguments": {}}, "id": "abc"}
    prompt, ids, want = _completion(s, {"role": "assistant", "content": "", "tool_calls": [call]})
    assert want["tool_calls"][0]["id"] == "call_0_1"
    assert s.by_ids(prompt, ids)["tool_calls"] == [{"type": "function", "function": {"name": "f", "arguments": {}}}]


@pytest.mark.parametrize("name", DIALECTS)
def test_output_after_the_end(name: str) -> None:
    s = setup(name)
    prompt, ids, _ = _completion(s, {"role": "assistant", "content": "first"})
    _, more, _ = _completion(s, {"role": "assistant", "content": "second"})
    after = ids + _ids(s, _reopen(s)) + more
    with pytest.raises(ParseError):
        s.xtml(after, True)
    lenient = s.tpl.parse(after, s.vocab, completion=True, thinking=True, lenient=True)
    assert lenient["content"] == "first"
    assert any(x["kind"] == "trailing-output" for x in lenient["diagnostics"])
    assert s.by_ids(prompt, after)["content"] == "second"


def _reopen(s: Setup) -> str:
    """The open tags of a second assistant message, as the generation
    prompt writes them."""
    return "".join(seg.text for seg in s.tpl.generation_prompt(thinking=True))
