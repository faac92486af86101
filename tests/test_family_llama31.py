"""The ``llama-3.1`` layout dialect against Llama 3.1's own chat template
(``meta-llama-Llama-3.1-8B-Instruct.jinja`` of llama.cpp's sdist, rendered
by transformers): byte-equal text wherever the official template renders, a
located refusal wherever it raises (and where it would write a list of
parts as its Python repr), every field it leaves out reported, and the
text read back: prompts on ids, completions strictly, leniently and as a
stream.

No Llama 3 tokenizer is on PyPI without a licence gate, so ids are those
of a byte vocabulary with the dialect's tokens added."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.cli import run
from tests.helpers.families import llama_template
from tests.helpers.family_requests import REFERENCES, family_requests, features, hf_render
from xtml.chat.layout_file import check_any_text
from xtml.chat.template_file import builtin_files
from xtml.errors import MessageError, OptionError, RequestError
from xtml.vocab.vocabulary import byte_vocabulary

# More than the generator's default: a fifth of the requests hold content
# as parts, which the template writes as a Python repr and xtml refuses.
N_REQUESTS = 460
REF = REFERENCES["llama-3.1"]
TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
          "<|eom_id|>", "<|python_tag|>")


@pytest.fixture(scope="module")
def tpl() -> xtml.Template:
    return xtml.load("llama-3.1")


@pytest.fixture(scope="module")
def official() -> str:
    return llama_template(REF.source, REF.sha256)


@pytest.fixture(scope="module")
def vocab() -> Any:
    return byte_vocabulary(TOKENS)


def _cases() -> list[dict[str, Any]]:
    return family_requests("llama-3.1", N_REQUESTS)


def _with_options(k: int, case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request and keyword options: every other case carries its options
    in ``chat_template_kwargs`` instead."""
    req, opts = case["request"], case["options"]
    if k % 2:
        return {**req, "chat_template_kwargs": dict(opts)}, {}
    return req, dict(opts)


def _parts_anywhere_written_as_repr(case: dict[str, Any]) -> bool:
    """Whether the template writes some message's list of parts as its
    Python repr (it trims every content but a tool result's)."""
    req, opts = case["request"], case["options"]
    msgs = req["messages"]
    first_user = -1
    if req.get("tools") is not None and opts.get("tools_in_user_message", True):
        first_user = 1 if msgs and msgs[0]["role"] == "system" else 0
    for i, m in enumerate(msgs):
        if isinstance(m.get("content"), list) and (m["role"] not in ("tool", "ipython") or i == first_user):
            return True
    return False


def _expected_drops(case: dict[str, Any]) -> set[tuple[int, str]]:
    req, opts = case["request"], case["options"]
    msgs = req["messages"]
    first_user = -1
    if req.get("tools") is not None and opts.get("tools_in_user_message", True):
        first_user = 1 if msgs and msgs[0]["role"] == "system" else 0
    out: set[tuple[int, str]] = set()
    for i, m in enumerate(msgs):
        for k, v in m.items():
            if v in (None, "", [], {}) or k in ("role", "content"):
                continue
            if k in ("name", "tool_call_id"):
                out.add((i, k))
            elif k == "tool_calls" and any(c.get("id") for c in v):
                out.add((i, "tool_calls.id"))
        if i == first_user:
            if m["role"] != "user":
                out.add((i, "role"))
            if m.get("tool_calls"):
                out.add((i, "tool_calls"))
        elif m.get("tool_calls") and m.get("content"):
            out.add((i, "content"))
    return out


def test_the_dialect_names_its_reference(tpl: xtml.Template) -> None:
    assert tpl.dialect.reference["sha256"] == REF.sha256  # type: ignore[attr-defined]


def test_text_against_the_official_template(tpl: xtml.Template, official: str) -> None:
    counts = {"equal": 0, "refused": 0, "refused_repr": 0, "dropped": 0}
    covered: dict[str, int] = {}
    for k, case in enumerate(_cases()):
        req, opts = _with_options(k, case)
        try:
            want = hf_render("llama-3.1", official, case)
        except Exception as e:
            assert str(e) in REF.raises, (k, e)
            with pytest.raises(RequestError) as caught:
                tpl.render(req, **opts)
            assert caught.value.location, (k, case)
            if isinstance(caught.value, MessageError):
                assert 0 <= caught.value.index < len(case["request"]["messages"])
            counts["refused"] += 1
            continue
        if _parts_anywhere_written_as_repr(case):
            with pytest.raises(MessageError) as repr_caught:
                tpl.render(req, **opts)
            assert repr_caught.value.path == "content", (k, case)
            counts["refused_repr"] += 1
            continue
        r = tpl.render(req, **opts)
        assert r.text == want, (k, case)
        counts["equal"] += 1
        assert {(d.message, d.field) for d in r.dropped} == _expected_drops(case), (k, case)
        counts["dropped"] += bool(r.dropped)
        for f in features("llama-3.1", case):
            covered[f] = covered.get(f, 0) + 1
        covered["eom"] = covered.get("eom", 0) + ("<|eom_id|>" in want)
        covered["python_tag_call"] = covered.get("python_tag_call", 0) + ("<|eom_id|>" in want and ".call(" in want)
        covered["tools_in_system"] = covered.get("tools_in_system", 0) + ("You have access" in want)
        covered["tools_in_user"] = covered.get("tools_in_user", 0) + ("Given the following functions" in want)
    print("llama-3.1:", counts, covered)
    assert counts["equal"] + counts["refused"] + counts["refused_repr"] == N_REQUESTS
    assert counts["equal"] >= 300 and counts["refused"] >= 30 and counts["dropped"] >= 50
    for f in ("option:date_string", "option:tools_in_user_message", "option:builtin_tools", "tools", "tool_call",
              "tool_result", "marker_text", "ends:assistant", "ends:tool", "ends:user",
              "no_generation_prompt", "system", "no_system", "eom", "python_tag_call", "tools_in_system",
              "tools_in_user"):
        assert covered.get(f, 0) >= 3, (f, covered)


def test_each_raise_of_the_template_is_a_located_refusal(tpl: xtml.Template) -> None:
    user = {"role": "user", "content": "hi"}
    two = {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}] * 2}
    with pytest.raises(MessageError) as e:
        tpl.render([user, two])
    assert e.value.location == "messages[1].tool_calls"
    with pytest.raises(MessageError):
        tpl.render([user, {**two, "tool_calls": []}])
    with pytest.raises(RequestError) as e2:
        tpl.render({"messages": [{"role": "system", "content": "s"}], "tools": [{"type": "function"}]})
    assert e2.value.location == "messages"
    builtin = {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "brave_search", "arguments": '{"query": "x"}'}}]}
    with pytest.raises(MessageError) as e3:
        tpl.render([user, builtin], builtin_tools=["brave_search"])
    assert e3.value.location == "messages[1].tool_calls[0].function.arguments"
    with pytest.raises(MessageError):
        tpl.render([user, {"role": "tool"}])  # tojson of nothing raises there
    with pytest.raises(OptionError):
        tpl.render([user], date_string=5)
    with pytest.raises(OptionError):
        tpl.render([user], builtin_tools="brave_search")


def test_parse_gives_the_normal_form_back(tpl: xtml.Template, vocab: Any) -> None:
    n = texts = 0
    for k, case in enumerate(_cases()):
        req, opts = _with_options(k, case)
        try:
            r = tpl.render(req, **opts)
        except RequestError:
            continue
        normal = tpl.normalize(req, **opts)
        assert tpl.parse(tpl.encode(req, vocab, **opts), vocab) == normal, (k, case)
        # The normal form is a request that renders the same text.
        assert tpl.render(normal).text == r.text, (k, case)
        n += 1
        if not r.ambiguous:
            assert tpl.parse(r.text) == normal, (k, case)
            texts += 1
    assert n >= 300 and texts >= 200


def _ids(tpl: xtml.Template, vocab: Any, text: str) -> list[int]:
    return tpl.completion_ids(text, vocab)


ANSWER = "The weather in Paris is sunny.<|eot_id|>"
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
# The template writes a value as it is: quotes and separators inside it too.
BUILTIN = '<|python_tag|>brave_search.call(query="weather "today", Paris", n="2")<|eom_id|>'


def _stream(tpl: xtml.Template, vocab: Any, ids: list[int], rng: random.Random, lenient: bool) -> list[Any]:
    parser = tpl.stream(vocab, lenient=lenient)
    events: list[Any] = []
    k = 0
    while k < len(ids):
        step = rng.randint(1, 6)
        events += parser.feed_many(ids[k:k + step])
        k += step
    return events + parser.close()


def test_completions_parse_back_with_their_finish(tpl: xtml.Template, vocab: Any) -> None:
    want = {
        ANSWER: ({"role": "assistant", "content": "The weather in Paris is sunny."}, "stop"),
        CALL: ({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            "tool_calls"),
        BUILTIN: ({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "brave_search",
                                              "arguments": '{"query": "weather \\"today\\", Paris", "n": "2"}'}}]},
            "tool_calls"),
    }
    rng = random.Random(3)
    for text, (message, finish) in want.items():
        ids = _ids(tpl, vocab, text)
        assert tpl.parse(ids, vocab, completion=True) == message
        assert tpl.parse(ids, vocab, completion=True, lenient=True) == message
        assert tpl.parse(text, completion=True) == message
        for _ in range(20):
            for lenient in (False, True):
                events = _stream(tpl, vocab, ids, rng, lenient)
                ends = [e for e in events if e.type == "message_end"]
                assert [e.message for e in ends] == [message]
                assert ends[0].stop_reason == finish
                joined = "".join(e.text or "" for e in events if e.type == "text" and e.channel == "response")
                assert joined == message["content"]
    # Content goes out as it comes: all but its trailing space before the
    # stop token is fed.
    ids = _ids(tpl, vocab, "Hello there, world.  ")
    parser = tpl.stream(vocab)
    early = parser.feed_many(ids)
    assert "".join(e.text or "" for e in early if e.type == "text") == "Hello there, world."
    assert [(e.message or {})["content"] for e in parser.feed_many(_ids(tpl, vocab, "<|eot_id|>"))
            if e.type == "message_end"] == ["Hello there, world."]
    # A built-in call's arguments read back as the arguments the history
    # writes them from.
    req = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "brave_search",
                                          "arguments": {"query": 'weather "today", Paris', "n": "2"}}}]}],
           "add_generation_prompt": False, "builtin_tools": ["brave_search"]}
    assert tpl.render(req).text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n" + BUILTIN)


def test_a_rendered_answer_parses_back(tpl: xtml.Template, vocab: Any) -> None:
    """The last assistant turn of a rendered request, as a completion after
    the generation prompt: its content or its call."""
    n = 0
    for case in _cases():
        req, opts = case["request"], case["options"]
        msgs = req["messages"]
        if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
            continue
        try:
            normal = tpl.normalize({**req, "add_generation_prompt": False}, **opts)
            whole = tpl.encode({**req, "add_generation_prompt": False}, vocab, **opts)
            prompt = tpl.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, vocab, **opts)
        except RequestError:
            continue
        if whole[:len(prompt)] != prompt:
            continue  # the last message is the one that holds the tools
        got = tpl.parse(whole[len(prompt):], vocab, completion=True)
        want = dict(normal["messages"][-1])
        for call in want.get("tool_calls", ()):
            args = call["function"]["arguments"]
            if not isinstance(args, str):
                call["function"]["arguments"] = json.dumps(args, ensure_ascii=False)
        assert got == want, case
        n += 1
    assert n >= 60


def test_any_answer_parses_leniently_and_streams_as_it_parses(tpl: xtml.Template, vocab: Any) -> None:
    rng = random.Random(11)
    pieces = ["<|python_tag|>", "brave_search.call(", 'query="x"', ")", '{"name": "f", ', '"parameters": {"a": 1}}',
              "hi ", "\n", "<|start_header_id|>", "<|eom_id|>", "é", '{"name":"f","parameters":{}}', '"q"',
              '{"name": "g", "parameters": {"b": "{x}"}}', " {", '{"name": "']
    kinds: set[str] = set()
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        if rng.random() < 0.7:
            text += rng.choice(["<|eot_id|>", "<|eom_id|>"])
        ids = _ids(tpl, vocab, text)
        batch = tpl.parse(ids, vocab, completion=True, lenient=True)
        diags = batch.pop("diagnostics", [])
        for d in diags:
            assert 0 <= d["offset"] <= len(ids) and d["message"]
            kinds.add(d["kind"])
        if not diags:
            assert tpl.parse(ids, vocab, completion=True) == batch
        else:
            with pytest.raises(xtml.ParseError):
                tpl.parse(ids, vocab, completion=True)
        events = _stream(tpl, vocab, ids, rng, True)
        assert [e.message for e in events if e.type == "message_end"] == [batch], text
        assert "".join(e.text or "" for e in events if e.type == "text") == batch["content"]
        assert [e.diagnostic for e in events if e.type == "diagnostic"] == diags
    assert {"truncated", "bad-call", "stray-token", "respelled", "after-end", "call-after-text"} <= kinds, kinds


def test_hostile_answers_lose_nothing_silently(tpl: xtml.Template, vocab: Any) -> None:
    # Marker text inside arguments is text in ids: the call reads whole.
    args = '{"q": "a <|eot_id|> b"}'
    ids = vocab.encode_texts(['{"name": "search", "parameters": ' + args + "}"])[0] + _ids(tpl, vocab, "<|eot_id|>")
    out = tpl.parse(ids, vocab, completion=True)
    assert out["tool_calls"][0]["function"]["arguments"] == args
    # Cut inside a call: withheld and said, never half read.
    cut = tpl.parse(_ids(tpl, vocab, CALL[:30]), vocab, completion=True, lenient=True)
    assert "tool_calls" not in cut and [d["kind"] for d in cut["diagnostics"]] == ["truncated", "truncated"]
    with pytest.raises(xtml.ParseError):
        tpl.parse(_ids(tpl, vocab, CALL[:30]), vocab, completion=True)
    cut = tpl.parse(_ids(tpl, vocab, BUILTIN[:25]), vocab, completion=True, lenient=True)
    assert "tool_calls" not in cut and [d["kind"] for d in cut["diagnostics"]] == ["truncated", "truncated"]
    # Arguments that are not an object: withheld with a diagnostic.
    bad = tpl.parse(_ids(tpl, vocab, '{"name": "f", "parameters": [1]}<|eot_id|>'), vocab, completion=True,
                    lenient=True)
    assert "tool_calls" not in bad and [d["kind"] for d in bad["diagnostics"]] == ["bad-argument"]
    # A call spaced otherwise: kept in a lenient parse, said; refused strictly.
    spaced = '{"name":"f","parameters":{"a":1}}<|eot_id|>'
    loose = tpl.parse(_ids(tpl, vocab, spaced), vocab, completion=True, lenient=True)
    assert loose["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert [d["kind"] for d in loose["diagnostics"]] == ["respelled"]
    with pytest.raises(xtml.ParseError):
        tpl.parse(_ids(tpl, vocab, spaced), vocab, completion=True)
    # A call after text: said, and read leniently with the text before it.
    for call, name in ((CALL, "get_weather"), (BUILTIN, "brave_search")):
        ids = _ids(tpl, vocab, "Let me look. " + call)
        after = tpl.parse(ids, vocab, completion=True, lenient=True)
        assert after["content"] == "Let me look." and after["tool_calls"][0]["function"]["name"] == name
        assert [d["kind"] for d in after["diagnostics"]] == ["call-after-text"]
        # At the call's token; a JSON call is inside the text run, located at its start.
        at = len(_ids(tpl, vocab, "Let me look. ")) if call == BUILTIN else 0
        assert after["diagnostics"][0]["offset"] == at
        with pytest.raises(xtml.ParseError):
            tpl.parse(ids, vocab, completion=True)


def test_options_under_the_templates_names(tpl: xtml.Template) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    kw = tpl.render({"messages": msgs, "tools": tools}, date_string="1 Jan 2025", tools_in_user_message=False,
                    builtin_tools=["wolfram_alpha", "code_interpreter"]).text
    body = tpl.render({"messages": msgs, "tools": tools, "chat_template_kwargs": {
        "date_string": "1 Jan 2025", "tools_in_user_message": False,
        "builtin_tools": ["wolfram_alpha", "code_interpreter"]}}).text
    assert kw == body
    assert "Environment: ipython\nTools: wolfram_alpha\n\n" in kw and "Today Date: 1 Jan 2025\n" in kw
    assert "You have access to the following functions." in kw and "Given the following" not in kw
    # Keyword options win over chat_template_kwargs.
    mixed = tpl.render({"messages": msgs, "chat_template_kwargs": {"date_string": "x"}}, date_string="y").text
    assert "Today Date: y\n" in mixed


def test_the_command_line_renders_and_validates(tmp_path: Path, tpl: xtml.Template) -> None:
    req = {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}}]}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req), encoding="utf-8")
    code, out, _ = run(["render", "-t", "llama-3.1", str(path)])
    assert code == 0 and out == tpl.render(req).text + "\n"
    code, out, _ = run(["validate", str(builtin_files(layout=True)["llama-3.1"])])
    assert code == 0 and ": valid" in out, out
    code, out, _ = run(["validate", "llama-3.1", "--format", "json", "-n", "0"])
    assert code == 0 and json.loads(out)["valid"]
    text = builtin_files(layout=True)["llama-3.1"].read_text(encoding="utf-8")
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('builtin_when = "builtin_tools"', 'builtin_when = "nope"'), encoding="utf-8")
    code, out, _ = run(["validate", str(bad)])
    assert code == 1 and "calls.builtin_when" in out


LLAMA = builtin_files(layout=True)["llama-3.1"].read_text(encoding="utf-8")


@pytest.mark.parametrize(("text", "key", "words"), [
    (LLAMA.replace('tool_indent = 4', 'tool_indent = "4"'), "turns.tool_indent", "integer"),
    (LLAMA.replace('tools_user_when = "tools_in_user_message"', 'tools_user_when = "nope"'),
     "turns.tools_user_when", "bool option"),
    (LLAMA.replace('{?builtin_tools}<|eom_id|>', '{?builtins}<|eom_id|>'), "calls.close", "unknown condition"),
    (LLAMA.replace('builtin = "<|python_tag|>{name}', 'builtin = "{name}'), "calls.builtin", "opens with a token"),
    (LLAMA.replace('max = 1', 'max = -1'), "calls.max", "non-negative"),
    (LLAMA.replace('date_string = { type = "string", default = "26 Jul 2024" }',
                   'date_string = { type = "string" }'), "options.date_string.default", "needs a default"),
    (LLAMA.replace('alias = { ipython = "tool" }', 'alias = { ipython = "nobody" }'), "roles.alias.ipython",
     "alias"),
    (LLAMA.replace('[tools]\nrender = "turns"', '[tools]\nrender = "drop"'), "turns", "go together"),
    # What only a [turns] format reads is not silently ignored elsewhere.
    (builtin_files(layout=True)["qwen3"].read_text(encoding="utf-8").replace(
        '[calls]\nrender = "each"', '[calls]\nrender = "each"\nmax = 1'), "calls.max", "[turns]"),
    (builtin_files(layout=True)["qwen3"].read_text(encoding="utf-8").replace(
        '[options]\n', '[options]\nday = { type = "string", default = "x" }\n'), "options.day", "[turns]"),
])
def test_the_file_checker_locates_problems_of_the_new_keys(text: str, key: str, words: str) -> None:
    d, problems = check_any_text(text, "t.toml")
    assert d is None
    assert any(p.key == key and words in p.message for p in problems), [(p.key, p.message) for p in problems]


def test_null_options_are_not_given(tpl: xtml.Template) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert tpl.render(msgs, date_string=None, builtin_tools=None, tools_in_user_message=None).text \
        == tpl.render(msgs).text


def test_the_gateway_serves_it_with_finish_reasons(tpl: xtml.Template, vocab: Any) -> None:
    """Through the gateway and the openai SDK, in front of a stand-in engine:
    a built-in call ending in <|eom_id|> comes back as tool_calls, an answer
    streams with finish_reason "stop"; the engine is sent the prompt's ids."""
    import openai

    from tests.helpers.engines import StandIn, running
    from xtml.serving.gateway import create_app

    engine = StandIn("vllm", eog=tpl.bind(vocab).stop_ids, vocab_size=vocab.size)
    engine.answer = _ids(tpl, vocab, '<|python_tag|>brave_search.call(query="x")<|eom_id|>')
    msgs: Any = [{"role": "user", "content": "hi"}]
    with running(engine) as e, running(create_app(tpl, vocab, e.url, grammar=False)) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none")
        r = client.chat.completions.create(model="m", messages=msgs,
                                           extra_body={"chat_template_kwargs": {"builtin_tools": ["brave_search"]}})
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
        call = choice.message.tool_calls[0]
        assert call.function.name == "brave_search"  # type: ignore[union-attr]
        assert call.function.arguments == '{"query": "x"}'  # type: ignore[union-attr]
        engine.answer = _ids(tpl, vocab, "Hello there.<|eot_id|>")
        chunks = [c for c in client.chat.completions.create(model="m", messages=msgs, stream=True) if c.choices]
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello there."
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_arguments_nested_past_pythons_reader_are_a_bad_argument(tpl: xtml.Template, vocab: Any) -> None:
    """A model can write arrays nested deeper than Python's JSON reader
    recurses: a call like any other whose arguments are not JSON (withheld
    and said leniently, a ParseError strictly), never a RecursionError."""
    deep = '{"name": "f", "parameters": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    for text, kinds in ((deep + "<|eot_id|>", ["bad-argument"]),
                        ("<|python_tag|>" + deep + "<|eom_id|>", ["respelled", "bad-argument"])):
        ids = tpl.completion_ids(text, vocab)
        out = tpl.parse(ids, vocab, completion=True, lenient=True)
        assert "tool_calls" not in out and [d["kind"] for d in out["diagnostics"]] == kinds
        with pytest.raises(xtml.ParseError):
            tpl.parse(ids, vocab, completion=True)
