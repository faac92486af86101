"""The OpenAI shapes (xtml.serving.openai): every batch and stream output is
what the openai SDK's own types accept, the chunks of a stream add up to the
batch message, call ids are OpenAI's, cut-off calls are withheld, and the
command line prints the same objects."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import xtml
from tests.helpers.docs import run_examples, shown_on_page
from tests.helpers.strategies import K3, SLOW, assistant_messages, vocab
from xtml import testing as xt
from xtml.serving import openai as shapes

OPEN, CLOSE, SEP, END = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
DOC = Path(__file__).parent.parent / "docs" / "serving.md"


def counter(prefix: str = "call_") -> Callable[[], str]:
    n = itertools.count(1)
    return lambda: f"{prefix}{next(n)}"


def call(name: str, k: int, args: list[tuple[str, str, str]], *, closed: bool = True) -> str:
    body = "".join(f'{OPEN}argument key="{key}" type="{t}"{SEP}{v}{CLOSE}argument{SEP}' for key, t, v in args)
    return f'{OPEN}call tool="{name}" index="{k}"{SEP}{body}' + (f"{CLOSE}call{SEP}" if closed else "")


def is_object(s: str) -> bool:
    try:
        return isinstance(json.loads(s), dict)
    except ValueError:
        return False


def tools(*calls: str) -> str:
    return f"{CLOSE}response{SEP}{OPEN}tools{SEP}{''.join(calls)}{CLOSE}tools{SEP}{CLOSE}message{SEP}{END}"


# -- running both sides ----------------------------------------------------------------

def stream(ids: list[int], thinking: bool, *, chunks: list[int] | None = None, **kw: Any,
           ) -> tuple[list[dict[str, Any]], shapes.ChunkStream]:
    """The chunks of a completion streamed token by token (or in ``chunks``:
    sizes of successive feed_many calls)."""
    sp = K3.stream(vocab(), thinking=thinking)
    cs = shapes.ChunkStream(model="m", id="chatcmpl-1", created=7, ids=counter(), **kw)
    out: list[dict[str, Any]] = []
    i = k = 0
    while i < len(ids):
        n = chunks[k % len(chunks)] if chunks else 1
        out += cs.feed(sp.feed_many(ids[i : i + n]) if n > 1 else sp.feed(ids[i]))
        i += n
        k += 1
    out += cs.feed(sp.close())
    return out, cs


def joined(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client assembles from the chunks (checked against the SDK's types
    on the way)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: list[str] = []
    diags: list[dict[str, Any]] = []
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
        assert c["id"] == "chatcmpl-1" and c["object"] == "chat.completion.chunk"
        if not c["choices"]:
            continue
        (ch,) = c["choices"]
        assert not finish, "a chunk after the one with finish_reason"
        d = ch["delta"]
        content.append(d.get("content") or "")
        reasoning.append(d.get("reasoning_content") or "")
        for tc in d.get("tool_calls", ()):
            if "id" in tc:
                assert tc["index"] not in calls, "a call started twice"
                assert tc["index"] == len(calls), "calls start in order"
                calls[tc["index"]] = {"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}
            calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
        if ch["finish_reason"] is not None:
            finish.append(ch["finish_reason"])
            diags = ch["xtml_diagnostics"]
    assert len(finish) == 1
    return {"content": "".join(content), "reasoning": "".join(reasoning), "calls": calls, "finish": finish[0],
            "diagnostics": diags}


def check(ids: list[int], thinking: bool, chunks: list[int] | None = None) -> shapes.Shaped:
    """Batch and stream shapes of one completion agree, and the SDK takes them."""
    parsed = K3.parse(ids, vocab(), completion=True, lenient=True, thinking=thinking)
    batch = shapes.shape_message(parsed, ids=counter())
    whole = shapes.chat_completion(parsed, model="m", ids=counter(), prompt_tokens=3, completion_tokens=len(ids))
    ChatCompletion.model_validate(whole)
    assert whole["choices"][0]["message"] == batch.message
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": len(ids), "total_tokens": 3 + len(ids)}
    msg = batch.message
    calls = {k: {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for k, c in enumerate(msg.get("tool_calls", ()))}
    withheld = [d for d in batch.diagnostics if d["kind"] == "withheld-call"]
    assert batch.finish_reason in ("stop", "tool_calls", "length")
    if batch.finish_reason != "length":
        assert not withheld
    for mode in (True, False):
        out, cs = stream(ids, thinking, chunks=chunks, stream_arguments=mode)
        got = joined(out)
        what = f"stream_arguments={mode}"
        assert got["finish"] == batch.finish_reason, what
        assert got["content"] == (msg["content"] or ""), what
        assert got["reasoning"] == msg.get("reasoning_content", ""), what
        # The stream's final message is the batch's, with the stream's ids.
        assert cs.message == msg, what
        # Reasoning tokens counted the same way, whole and streamed.
        assert cs.reasoning_tokens(len(ids)) == K3.reasoning_tokens(ids, vocab(), thinking=thinking), what
        ChatCompletion.model_validate(cs.completion())
        # The same repairs reported, whichever way the completion came.
        assert sorted(d["kind"] for d in got["diagnostics"]) == sorted(d["kind"] for d in batch.diagnostics), what
        if not mode:
            assert got["calls"] == calls, what  # sent whole: exactly the batch's calls
            continue
        assert {k: got["calls"][k] for k in calls} == calls, what
        for k in set(got["calls"]) - set(calls):
            # Started, then cut off: never a complete JSON object.
            assert any(d["index"] == k and d["id"] == got["calls"][k]["id"] for d in got["diagnostics"]
                       if d["kind"] == "withheld-call"), what
            assert not is_object(got["calls"][k]["arguments"]), what
    return batch


# -- properties --------------------------------------------------------------------------

def case_of(m: dict[str, Any], thinking: bool) -> tuple[list[int], dict[str, Any], bool] | None:
    return xt.completion_case(K3, {"messages": [{"role": "user", "content": "hi"}, m], "thinking": thinking},
                              vocab())


# Messages with calls half of the time; cuts anywhere, and near the end (in
# the calls) as often.
MESSAGES = st.one_of(assistant_messages(name=False),
                     assistant_messages(name=False).filter(lambda m: bool(m.get("tool_calls"))))
CUTS = st.lists(st.one_of(st.integers(0, 10**6), st.integers(-40, -1)), max_size=3)


@SLOW
@given(MESSAGES, st.booleans(), CUTS, xt.chunk_sizes())
def test_batch_and_stream_shapes_agree(m: dict[str, Any], thinking: bool, cuts: list[int], sizes: list[int]) -> None:
    case = case_of(m, thinking)
    if case is None:
        return
    ids, expected, on = case
    batch = check(ids, on, sizes)
    # Whole: the normal form's message, in OpenAI's shape, and nothing to report
    # but image parts, which an assistant message's text content cannot hold.
    assert batch.finish_reason == ("tool_calls" if expected.get("tool_calls") else "stop")
    assert {d["kind"] for d in batch.diagnostics} <= {"dropped-part"}
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in expected.get("tool_calls", ())]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in batch.message.get("tool_calls", ())] == want
    event(f"{len(want)} calls")
    check(ids[:-1], on)  # without the stop token, as engines hand it back
    for cut in cuts:
        got = check(ids[: max(0, len(ids) + cut) if cut < 0 else cut % (len(ids) + 1)], on, sizes)
        event(f"cut: {got.finish_reason}" + (", a call withheld" if any(
            d["kind"] == "withheld-call" for d in got.diagnostics) else ""))


# Every JSON type, marker literals and escapes inside values, a json block, a
# call without arguments.
EVERY_TYPE = {
    "role": "assistant",
    "reasoning_content": "Think <|close|>think<|sep|> \u00e9",
    "content": "Use <|open|>tools<|sep|> \"quoted\"\n",
    "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": json.dumps({
            "s": "a<|close|>argument<|sep|>\"\\\n\t\x00\u2028\U0001f600", "i": -3, "big": 2**70, "x": 1.5e-7,
            "t": True, "n": None, "o": {"k": [1, "<|end_of_msg|>"], "e": {}}, "a": [], "empty": ""})}},
        {"type": "function", "function": {"name": "g", "arguments": "not JSON <|end_of_msg|>"}},
        {"type": "function", "function": {"name": "h", "arguments": "{}"}},
    ],
}


@pytest.mark.parametrize("thinking", [True, False])
def test_every_truncation_of_every_json_type(thinking: bool) -> None:
    case = case_of(EVERY_TYPE, thinking)
    assert case is not None
    ids, expected, on = case
    assert check(ids, on).message["tool_calls"][0]["function"]["arguments"] == \
        expected["tool_calls"][0]["function"]["arguments"]
    for n in range(len(ids)):
        check(ids[:n], on)


def test_the_sdk_assembles_the_batch_message() -> None:
    """The openai SDK's own stream accumulator gives the batch message."""
    case = case_of(EVERY_TYPE, True)
    assert case is not None
    ids, _, on = case
    out, cs = stream(ids, on)
    state = ChatCompletionStreamState()
    for c in out:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    msg = cs.message
    assert msg is not None
    assert final.message.content == msg["content"]
    assert [(t.id, t.function.name, t.function.arguments) for t in final.message.tool_calls or ()] == \
        [(t["id"], t["function"]["name"], t["function"]["arguments"]) for t in msg["tool_calls"]]
    assert (final.message.model_extra or {}).get("reasoning_content") == msg["reasoning_content"]


# -- call ids -------------------------------------------------------------------------------

def test_call_ids_are_openai_style_and_unique_across_parses() -> None:
    text = tools(call("f", 1, [("a", "string", "x")]), call("g", 2, []))
    parsed = K3.parse(text, completion=True, lenient=True, thinking=False)
    assert [c["id"] for c in parsed["tool_calls"]] == ["call_0_1", "call_0_2"]  # the normal form's, unchanged
    seen = set()
    for _ in range(50):
        for c in shapes.shape_message(parsed).message["tool_calls"]:
            assert re.fullmatch(r"call_[A-Za-z0-9_-]{24}", c["id"])
            seen.add(c["id"])
    assert len(seen) == 100
    mine = shapes.shape_message(parsed, ids=counter("id-")).message["tool_calls"]
    assert [c["id"] for c in mine] == ["id-1", "id-2"]


def test_a_streamed_call_keeps_its_first_chunk_id() -> None:
    ids = K3.completion_ids(tools(call("f", 1, [("a", "string", "x")]), call("g", 2, [])), vocab())
    sp = K3.stream(vocab(), thinking=False)
    cs = shapes.ChunkStream(model="m")
    out = [c for t in ids for c in cs.feed(sp.feed(t))] + cs.feed(sp.close())
    first = [tc["id"] for c in out for tc in c["choices"][0]["delta"].get("tool_calls", ()) if "id" in tc]
    assert len(first) == 2 and first[0] != first[1]
    assert cs.message is not None
    assert [c["id"] for c in cs.message["tool_calls"]] == first
    assert [c["id"] for c in cs.completion()["choices"][0]["message"]["tool_calls"]] == first


# -- cut-off calls ---------------------------------------------------------------------------

def test_a_call_cut_off_inside_its_arguments_is_withheld() -> None:
    text = f"{CLOSE}response{SEP}{OPEN}tools{SEP}" + call("f", 1, [("a", "string", "x")]) + \
        f'{OPEN}call tool="rm" index="2"{SEP}{OPEN}argument key="path" type="string"{SEP}/etc/pas'
    parsed = K3.parse(text, completion=True, lenient=True, thinking=False)
    assert len(parsed["tool_calls"]) == 2  # the parser repairs the cut call...
    got = shapes.shape_message(parsed, ids=counter())
    assert got.finish_reason == "length"  # ...the shapes do not hand it back
    assert [c["function"]["name"] for c in got.message["tool_calls"]] == ["f"]
    (w,) = [d for d in got.diagnostics if d["kind"] == "withheld-call"]
    assert (w["index"], w["name"], w["id"]) == (1, "rm", "call_2")
    ids = K3.completion_ids(text, vocab())
    out, _ = stream(ids, False)
    j = joined(out)
    assert j["finish"] == "length"
    assert j["calls"][1]["arguments"] == '{"path": "/etc/pas"'  # sent as it came, never closed
    assert [d["id"] for d in j["diagnostics"] if d["kind"] == "withheld-call"] == [j["calls"][1]["id"]]
    out, _ = stream(ids, False, stream_arguments=False)
    assert sorted(joined(out)["calls"]) == [0]
    check(ids, False)


def test_the_last_call_of_a_cut_completion_is_withheld_even_if_closed() -> None:
    """The rule is decided on what a parse returns: a cut completion's last call."""
    text = f"{CLOSE}response{SEP}{OPEN}tools{SEP}" + call("f", 1, [("n", "number", "1")])
    parsed = K3.parse(text, completion=True, lenient=True, thinking=False)
    got = shapes.shape_message(parsed)
    assert (got.finish_reason, got.message) == ("length", {"role": "assistant", "content": ""})
    out, _ = stream(K3.completion_ids(text, vocab()), False)
    assert joined(out)["calls"][0]["arguments"] == '{"n": 1'


def test_an_early_end_marker_is_no_cut() -> None:
    parsed = K3.parse("hi" + END, completion=True, lenient=True, thinking=False)
    assert shapes.shape_message(parsed).finish_reason == "stop"
    text = f"{CLOSE}response{SEP}{OPEN}tools{SEP}" + call("f", 1, []) + END
    got = shapes.shape_message(K3.parse(text, completion=True, lenient=True, thinking=False))
    assert got.finish_reason == "tool_calls" and len(got.message["tool_calls"]) == 1
    check(K3.completion_ids(text, vocab()), False)


def test_an_end_marker_after_content_is_not_an_empty_completion() -> None:
    parsed = K3.parse("hi" + END, completion=True, lenient=True, thinking=False)
    assert "the completion is empty" not in [d["message"] for d in parsed["diagnostics"]]


def test_a_call_after_a_response_left_open_is_read_from_ids_and_withheld_from_text() -> None:
    """In text, the tools markup may be quoted from user text (a web page the
    model echoes): a call that exists only because the open response was
    repaired is withheld unless asked for; ids have no such ambiguity."""
    text = f"hi{OPEN}tools{SEP}" + call("f", 1, [("a", "string", "x")]) + f"{CLOSE}tools{SEP}{CLOSE}message{SEP}{END}"
    got = shapes.shape_message(K3.parse(text, completion=True, lenient=True, thinking=False))
    assert not got.message.get("tool_calls") and got.message["content"] == "hi"
    assert "withheld-call" in [d["kind"] for d in got.diagnostics]
    opted = shapes.shape_message(K3.parse(text, completion=True, lenient=True, thinking=False, repaired_calls=True))
    assert opted.message.get("tool_calls") and opted.message["content"] == "hi"
    ids = K3.completion_ids(text, vocab())
    assert K3.parse(ids, vocab(), completion=True, lenient=True, thinking=False).get("tool_calls")
    check(ids, False)


def test_a_huge_number_argument_is_kept_as_a_string() -> None:
    text = tools(call("f", 1, [("n", "number", "1" * 5000)]))
    got = shapes.shape_message(K3.parse(text, completion=True, lenient=True, thinking=False))
    assert json.loads(got.message["tool_calls"][0]["function"]["arguments"]) == {"n": "1" * 5000}


# -- arguments the parser reads otherwise than they streamed ----------------------------------

@pytest.mark.parametrize(("args", "want", "diverged"), [
    ([("a", "number", "1"), ("b", "number", "2"), ("a", "number", "3")], '{"a": 3, "b": 2}', True),
    ([("a", "number", "1"), ("a", "number", "1")], '{"a": 1}', False),  # the same again: nothing changed
    ([("n", "number", "1E2"), ("s", "number", "x"), ("u", "date", "today"), ("f", "number", "NaN"),
      ("o", "object", '{"a":[1e999]}'), ("big", "number", "9" * 5000)],
     '{"n": 100.0, "s": "x", "u": "today", "f": "NaN", "o": "{\\"a\\":[1e999]}", "big": "' + "9" * 5000 + '"}',
     False),  # respelled, or kept as strings (not of the type, or not standard JSON), as the parser reads them
])
def test_arguments_read_otherwise(args: list[tuple[str, str, str]], want: str, diverged: bool) -> None:
    ids = K3.completion_ids(tools(call("f", 1, args)), vocab())
    parsed = K3.parse(ids, vocab(), completion=True, lenient=True, thinking=False)
    assert parsed["tool_calls"][0]["function"]["arguments"] == want
    out, cs = stream(ids, False)
    j = joined(out)
    assert cs.message is not None and cs.message["tool_calls"][0]["function"]["arguments"] == want
    kinds = [d["kind"] for d in j["diagnostics"]]
    assert ("diverged-call" in kinds) is diverged
    assert (j["calls"][0]["arguments"] == want) is not diverged
    if diverged:
        assert not is_object(j["calls"][0]["arguments"])


def test_a_json_block_is_sent_whole() -> None:
    block = f'{OPEN}json type="string"{SEP}[1, 2{CLOSE}json{SEP}'
    text = tools(f'{OPEN}call tool="f" index="1"{SEP}{block}{CLOSE}call{SEP}')
    out, cs = stream(K3.completion_ids(text, vocab()), False)
    pieces = [tc["function"]["arguments"] for c in out for tc in c["choices"][0]["delta"].get("tool_calls", ())]
    assert pieces == ["", "[1, 2"]
    assert cs.message is not None and cs.message["tool_calls"][0]["function"]["arguments"] == "[1, 2"


# -- the objects --------------------------------------------------------------------------------

def test_reasoning_tokens_count_up_to_the_reasoning_close() -> None:
    """usage.completion_tokens_details.reasoning_tokens: the ids up to and
    with the reasoning channel's close; all of them in an answer cut off
    while reasoning; none when the prompt opened no reasoning."""
    v = vocab()
    reasoning = K3.completion_ids("let me think", v)
    close = K3.completion_ids(f"{CLOSE}think{SEP}", v)
    answer = K3.completion_ids(f"{OPEN}response{SEP}ok{CLOSE}response{SEP}{CLOSE}message{SEP}", v)
    ids = [*reasoning, *close, *answer]
    assert K3.reasoning_tokens(ids, v, thinking=True) == len(reasoning) + len(close)
    assert K3.reasoning_tokens(reasoning, v, thinking=True) == len(reasoning)
    assert K3.reasoning_tokens(answer, v, thinking=False) == 0
    _, cs = stream(ids, True, include_usage=True)
    (u,) = cs.close(prompt_tokens=5, completion_tokens=len(ids))
    assert u["usage"]["completion_tokens_details"] == {"reasoning_tokens": len(reasoning) + len(close)}
    whole = shapes.chat_completion(K3.parse(ids, v, completion=True, lenient=True, thinking=True), model="m",
                                   prompt_tokens=5, completion_tokens=len(ids),
                                   reasoning_tokens=K3.reasoning_tokens(ids, v, thinking=True))
    ChatCompletion.model_validate(whole)
    assert whole["usage"] == u["usage"]


def test_usage_chunk_and_usage_nulls() -> None:
    ids = K3.completion_ids(f"hi{CLOSE}response{SEP}{CLOSE}message{SEP}", vocab())
    out, cs = stream(ids, False, include_usage=True)
    assert all(c["usage"] is None for c in out)
    with pytest.raises(TypeError):
        cs.close()
    # The usage chunk itself is a golden file: tests/data/golden/stream/usage.
    (u,) = cs.close(prompt_tokens=5, completion_tokens=len(ids))
    ChatCompletionChunk.model_validate(u)
    assert cs.close(prompt_tokens=5, completion_tokens=1) == []
    plain = shapes.ChunkStream(model="m")
    assert "usage" not in plain.feed([])[0]
    with pytest.raises(RuntimeError):
        plain.close()


def test_chat_completion_fields_and_choices() -> None:
    a = K3.parse("4" + f"{CLOSE}response{SEP}{CLOSE}message{SEP}", completion=True, lenient=True, thinking=False)
    b = K3.parse("cut", completion=True, lenient=True, thinking=False)
    got = shapes.chat_completion([a, b], model="kimi", id="chatcmpl-x", created=1)
    ChatCompletion.model_validate(got)
    assert {k: got[k] for k in ("id", "object", "created", "model")} == \
        {"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "kimi"}
    assert "usage" not in got
    assert [(c["index"], c["message"]["content"], c["finish_reason"], c["logprobs"]) for c in got["choices"]] == \
        [(0, "4", "stop", None), (1, "cut", "length", None)]
    assert got["choices"][0]["xtml_diagnostics"] == []
    assert [d["kind"] for d in got["choices"][1]["xtml_diagnostics"]] == ["truncated"]
    with pytest.raises(TypeError):
        shapes.chat_completion(a, model="m", prompt_tokens=1)
    with pytest.raises(xtml.RequestError, match="tool_calls"):
        shapes.shape_message({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]})
    with pytest.raises(xtml.RequestError, match="role"):
        shapes.shape_message({"role": "user", "content": "x"})


def test_image_parts_are_left_out_of_the_content() -> None:
    got = shapes.shape_message({"role": "assistant", "content": [
        {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]})
    assert got.message == {"role": "assistant", "content": "ab"}
    assert [d["kind"] for d in got.diagnostics] == ["dropped-part"]


def test_renamed_channels_need_the_template() -> None:
    base = xtml.load("xtml-base")
    tok = xtml.load_tokenizer(str(vocab().source), add_special_tokens=base.markers.all())
    ids = base.completion_ids("why<|x_close|>reasoning<|x_sep|><|x_open|>answer<|x_sep|>so"
                              "<|x_close|>answer<|x_sep|><|x_close|>msg<|x_sep|>", tok)
    sp = base.stream(tok, thinking=True)
    events = sp.feed_many(ids) + sp.close()
    cs = shapes.ChunkStream(model="m", id="chatcmpl-1", template=base)
    got = joined(cs.feed(events))
    assert (got["reasoning"], got["content"], got["finish"]) == ("why", "so", "stop")
    with pytest.raises(ValueError, match="template="):
        shapes.ChunkStream(model="m").feed(events)


def test_sse() -> None:
    assert shapes.sse({"a": "é"}) == 'data: {"a":"é"}\n\n'
    assert shapes.SSE_DONE == "data: [DONE]\n\n"


def test_completion_ids() -> None:
    text = tools(call("f", 1, [("a", "string", "x y")]))
    ids = K3.completion_ids(text, vocab())
    assert vocab().decode(ids) == text
    assert K3.parse(ids, vocab(), completion=True, thinking=False) == K3.parse(text, completion=True, thinking=False)
    markers = K3.bind(vocab()).marker_ids
    assert sum(1 for t in ids if t in markers.values()) == sum(text.count(m) for m in markers) == 17
    with pytest.raises(TypeError):
        K3.completion_ids([1, 2], vocab())  # type: ignore[arg-type]


# -- the command line ---------------------------------------------------------------------------

def run_cli(argv: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    import io

    from xtml.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


COMPLETION = "Six.<|close|>think<|sep|><|open|>response<|sep|>6<|close|>response<|sep|><|close|>message<|sep|>"


def test_cli_openai(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["parse", "-", "--completion", "--openai"], COMPLETION, monkeypatch, capsys)
    assert code == 0
    got = json.loads(out)
    ChatCompletion.model_validate(got)
    assert got["model"] == "kimi-k3"
    assert got["choices"][0]["message"] == {"role": "assistant", "content": "6", "reasoning_content": "Six."}


def test_cli_stream(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ids = K3.completion_ids(tools(call("f", 1, [("q", "string", "x y")])), vocab())
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(ids))
    tok = str(vocab().source)
    code, out, _ = run_cli(["parse", str(path), "--tokenizer", tok, "--add-markers", "--completion", "--openai",
                            "--stream", "--thinking", "false"], "", monkeypatch, capsys)
    assert code == 0
    chunks = [json.loads(line) for line in out.splitlines()]
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    args = "".join(tc["function"]["arguments"] for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", ()))
    assert args == '{"q": "x y"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # Text, as server-sent events.
    code, out, _ = run_cli(["parse", "-", "--from", "text", "--tokenizer", tok, "--add-markers", "--completion",
                            "--sse"], COMPLETION, monkeypatch, capsys)
    assert code == 0
    events = out.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert json.loads(events[-3].removeprefix("data: "))["choices"][0]["finish_reason"] == "stop"


def test_cli_usage_errors_and_hint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["parse", "-", "--openai"], COMPLETION, monkeypatch, capsys)
    assert code == 2 and "--completion" in err
    code, _, err = run_cli(["parse", "-", "--completion", "--stream"], COMPLETION, monkeypatch, capsys)
    assert code == 2 and "--tokenizer" in err
    code, out, err = run_cli(["parse", "-"], COMPLETION, monkeypatch, capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "line 1, column 1" in err and "add --completion" in err
    code, out, err = run_cli(["parse", "-", "--lenient"], COMPLETION, monkeypatch, capsys)
    assert code == 0 and "hint" in err and "add --completion" in err
    conversation = '<|open|>message role="user"<|sep|>hi<|close|>message<|sep|><|end_of_msg|><|close|>x'
    code, _, err = run_cli(["parse", "-"], conversation, monkeypatch, capsys)
    assert code == 1 and "--completion" not in err


# -- docs/serving.md --------------------------------------------------------------------------------

def test_serving_doc_python_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    text, _ = run_examples(DOC, at_least=3)
    shown_on_page(text, capsys.readouterr().out, at_least=15)


def test_serving_doc_command_lines_parse() -> None:
    from xtml.cli import _parser

    lines = [ln for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
             for ln in block.splitlines() if ln.startswith("xtml ")]
    assert len(lines) == 3
    for ln in lines:
        args = _parser().parse_args(shlex.split(ln)[1:])
        assert args.command == "parse" and args.completion


# -- stop sequences ----------------------------------------------------------------------------

def _texts(stops: shapes.StopSequences, pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The text deltas of ``pieces`` ((field, text), each its own chunk, then
    a final chunk) after the filter."""
    cs = shapes.ChunkStream(model="m", id="chatcmpl-1", created=0)
    out: list[tuple[str, str]] = []
    for field, text in pieces:
        chunk = cs._chunk({field: text})
        for c in stops.chunks([chunk]):
            out += [(k, v) for k, v in c["choices"][0]["delta"].items()]
    final = cs._chunk({}, "stop")
    final["choices"][0]["xtml_diagnostics"] = []
    for c in stops.chunks([final]):
        out += [(k, v) for k, v in c["choices"][0]["delta"].items()]
    return out


def test_stop_sequences_hold_back_what_could_start_one() -> None:
    # "spec" spelled over three deltas: "sp" is held, then given up with the rest.
    s = shapes.StopSequences(["spec", "END"])
    assert _texts(s, [("content", "Four, and the sp"), ("content", "e"), ("content", "c is at")]) == [
        ("content", "Four, and the ")]
    assert s.found == "spec"
    # A prefix that turns out not to be one goes out, whole and in order.
    s = shapes.StopSequences(["spec"])
    assert "".join(t for _, t in _texts(s, [("content", "a sp"), ("content", "ot"), ("content", " sp")])) \
        == "a spot sp"
    assert s.found is None
    # Reasoning held at its end goes out before the content that follows it.
    s = shapes.StopSequences(["Eas"])
    assert _texts(s, [("reasoning_content", "Think E"), ("content", "Hi")]) == [
        ("reasoning_content", "Think "), ("reasoning_content", "E"), ("content", "Hi")]
    # The first of several in the text wins; nothing after it goes out.
    s = shapes.StopSequences(["c", "ab"])
    assert _texts(s, [("content", "xabc"), ("content", "more")]) == [("content", "x")]
    assert s.found == "ab"


def test_stop_sequences_cut_a_whole_message() -> None:
    shaped = shapes.Shaped({"role": "assistant", "content": "one END two", "reasoning_content": "why"}, "stop", [])
    cut = shapes.StopSequences(["END"]).message(shaped, 9)
    assert cut.message == {"role": "assistant", "content": "one ", "reasoning_content": "why"}
    assert [d["kind"] for d in cut.diagnostics] == ["stop-sequence"] and "'END'" in cut.diagnostics[0]["message"]
    # In the reasoning: the content after it goes too.
    cut = shapes.StopSequences(["h"]).message(shaped, 9)
    assert cut.message == {"role": "assistant", "content": "", "reasoning_content": "w"}
    # Never written: the same object.
    assert shapes.StopSequences(["zz"]).message(shaped, 9) is shaped


def test_stop_sequences_that_overlap_end_where_the_engine_stops() -> None:
    # An engine checks as it generates: of two that overlap, the one that
    # ends first stops it, in a whole answer and a stream alike.
    shaped = shapes.Shaped({"role": "assistant", "content": "xabcdeyy"}, "stop", [])
    assert shapes.StopSequences(["abcde", "bc"]).message(shaped, 0).message["content"] == "xa"
    for pieces in (["xabcdeyy"], list("xabcdeyy"), ["xab", "cdeyy"]):
        got = _texts(shapes.StopSequences(["abcde", "bc"]), [("content", p) for p in pieces])
        assert "".join(t for _, t in got) == "xa", pieces


def test_held_text_goes_out_before_a_call_and_a_call_after_a_stop_is_left_out() -> None:
    cs = shapes.ChunkStream(model="m", id="chatcmpl-1", created=0)
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "calc", "arguments": ""}}
    # "z" could start "zz": held, then the call ends the text before it.
    s = shapes.StopSequences(["zz"])
    out = s.chunks([cs._chunk({"content": "Checking fiz"}), cs._chunk({"tool_calls": [call]})])
    assert [list(c["choices"][0]["delta"].items()) for c in out] == [
        [("content", "Checking fi")], [("content", "z")], [("tool_calls", [call])]]
    # After the stop sequence, nothing: not the call, and no tool_calls finish.
    s = shapes.StopSequences(["fiz"])
    final = cs._chunk({}, "tool_calls")
    final["choices"][0]["xtml_diagnostics"] = []
    out = s.chunks([cs._chunk({"content": "Checking fiz"}), cs._chunk({"tool_calls": [call]}), final])
    assert [c["choices"][0]["delta"] for c in out] == [{"content": "Checking "}, {}]
    assert out[-1]["choices"][0]["finish_reason"] == "stop"
    assert [d["kind"] for d in out[-1]["choices"][0]["xtml_diagnostics"]] == ["stop-sequence"]
    whole = shapes.Shaped({"role": "assistant", "content": "Checking fiz", "tool_calls": [call]}, "tool_calls", [])
    cut = shapes.StopSequences(["fiz"]).message(whole, 0)
    assert cut.message == {"role": "assistant", "content": "Checking "} and cut.finish_reason == "stop"
