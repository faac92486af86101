"""Conversations (``Template.conversation``): the ids they keep are always
those of ``encode`` of the whole request.

1. a property over random sequences of operations (appending messages and
   completions, changing tools, thinking and effort, image prompts, cutting
   the conversation short, one-shot options) on K3 and xtml-base: after every
   step, ``prompt_ids`` equals ``encode`` of the same whole request, or both
   raise the same error, and a failed step changes nothing;
2. the cases where a new message changes what came before it, and errors.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

import xtml
from tests.helpers.docs import run_examples, shown_on_page
from tests.helpers.strategies import SLOW
from tests.helpers.tokenizers import deepseek_path
from xtml import testing as xt
from xtml.chat.fields import request_options
from xtml.codec.conversation import CONVERSATION_OPTIONS, ONE_SHOT_OPTIONS, Conversation
from xtml.testing import strategies as xts

K3 = xtml.load("kimi-k3")
BASE = xtml.load("xtml-base")
TEMPLATES = {"kimi-k3": K3, "xtml-base": BASE}
IMAGE_PROMPT = {
    "kimi-k3": "<|media_begin|>image 3x2<|media_content|><|media_pad|><|media_end|>",
    "xtml-base": "<|x_media|>image 3x2<|x_pad|><|x_media_end|>",
}


@cache
def vocab() -> xtml.Vocabulary:
    """The deepseek tokenizer with the K3 and xtml-base markers as special tokens."""
    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=(*K3.markers.all(), *BASE.markers.all()))


class Model:
    """What the conversation should hold, kept the plain way: the messages
    and options of the whole request."""

    def __init__(self, template: xtml.Template) -> None:
        self.t = template
        self.messages: list[Any] = []
        self.options: dict[str, Any] = {}

    def request(self, **one: Any) -> dict[str, Any]:
        return {"messages": list(self.messages), **self.options, **one}

    def encode(self, **one: Any) -> list[int] | str:
        """The ids of the whole request, or the error it raises."""
        try:
            return self.t.encode(self.request(**one), vocab())
        except xtml.XtmlError as e:
            return f"{type(e).__name__}: {e}"

    def thinking(self) -> bool:
        opts = {k: v for k, v in self.options.items() if k != "image_prompts"}
        return bool(self.t.normalize({"messages": [], **opts})["thinking"])


def _prompt(conv: Conversation, **one: Any) -> list[int] | str:
    try:
        return conv.prompt_ids(**one)
    except xtml.XtmlError as e:
        return f"{type(e).__name__}: {e}"


def _state(conv: Conversation) -> tuple[Any, ...]:
    return copy.deepcopy(conv.messages), conv.ids, conv.options


def _check(conv: Conversation, model: Model, **one: Any) -> None:
    assert list(conv.messages) == model.messages
    want = model.encode(**one)
    assert _prompt(conv, **one) == want
    if not isinstance(want, str) and not one:
        assert conv.ids == model.t.encode(model.request(), vocab(), add_generation_prompt=False)


def _options(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A generated request's options: those of the conversation, and the
    one-shot ones."""
    opts = request_options({k: v for k, v in body.items() if k != "messages"}, False)
    return ({k: v for k, v in opts.items() if k in CONVERSATION_OPTIONS},
            {k: v for k, v in opts.items() if k in ONE_SHOT_OPTIONS})


def _completion_ids(conv: Conversation, model: Model, message: dict[str, Any]) -> list[int] | None:
    """The ids a model would generate to write ``message`` after the prompt
    (None if the message does not render, or the prompt is no prefix)."""
    prompt = _prompt(conv)
    try:
        whole = model.t.encode({**model.request(), "messages": [*model.messages, message]}, vocab(),
                               add_generation_prompt=False)
    except xtml.XtmlError:
        return None
    if isinstance(prompt, str) or whole[: len(prompt)] != prompt:
        return None
    return whole[len(prompt) :]


def _expected_completion(model: Model, ids: list[int], index: int) -> dict[str, Any]:
    parsed = model.t.parse(ids, vocab(), completion=True, thinking=model.thinking())
    for k, call in enumerate(parsed.get("tool_calls") or (), start=1):
        call["id"] = f"call_{index}_{k}"
    return parsed


@settings(SLOW, max_examples=60)
@pytest.mark.parametrize("name", list(TEMPLATES))
@given(data=st.data())
def test_prompt_ids_are_encode_of_the_whole_request(name: str, data: st.DataObject) -> None:
    t = TEMPLATES[name]
    first = data.draw(xts.requests(t, max_messages=0), label="options")
    opts, _ = _options(first)
    opts.pop("image_prompts", None)
    conv = t.conversation(vocab(), **opts)
    model = Model(t)
    model.options = {k: v for k, v in opts.items() if v is not None}
    pool: list[Any] = []
    for step in range(data.draw(st.integers(1, 12), label="steps")):
        op = data.draw(st.sampled_from(["extend", "extend", "extend", "completion", "completion", "options",
                                        "images", "truncate", "one-shot"]), label=f"op {step}")
        before = _state(conv)
        event(op)
        if op == "extend":
            if not pool:
                pool = data.draw(xts.requests(t, max_messages=8), label="messages")["messages"]
            k = data.draw(st.integers(min(1, len(pool)), len(pool)), label="how many")
            chunk, pool = pool[:k], pool[k:]
            want = t.encode if "image_prompts" not in model.options else None
            try:
                conv.extend(copy.deepcopy(chunk))
            except xtml.XtmlError as e:
                event("extend refused")
                note(f"extend refused: {e}")
                assert _state(conv) == before
                if want is not None:
                    with pytest.raises(xtml.XtmlError) as refused:
                        want({**model.request(), "messages": [*model.messages, *chunk]}, vocab(),
                             add_generation_prompt=False)
                    assert str(refused.value) == str(e)
                continue
            model.messages.extend(chunk)
        elif op == "completion":
            message = data.draw(xts.assistant_messages(t, images=False, name=False), label="completion")
            ids = _completion_ids(conv, model, message)
            if ids is None:
                event("completion skipped")
                continue
            expected = _expected_completion(model, ids, len(model.messages))
            got = conv.append_completion(ids)
            assert got == expected
            model.messages.append(expected)
        elif op == "options":
            body = data.draw(xts.requests(t, max_messages=0), label="options")
            new, _ = _options(body)
            new.pop("image_prompts", None)
            if data.draw(st.booleans(), label="tools off"):
                new["tools"] = None
            try:
                conv.set_options(**new)
            except xtml.XtmlError as e:
                assert _state(conv) == before
                assert isinstance(model.encode(**{**model.options, **new}), str), e
                continue
            model.options = {k: v for k, v in {**model.options, **new}.items() if v is not None}
        elif op == "images":
            # Image prompts for every image so far (or a wrong count).
            n = xts._count_images(t, model.messages) + data.draw(st.sampled_from([0, 0, 0, 1]), label="extra")
            prompts = [IMAGE_PROMPT[name]] * n if data.draw(st.booleans(), label="prompts on") else None
            conv.set_options(image_prompts=prompts)
            model.options = {k: v for k, v in {**model.options, "image_prompts": prompts}.items()
                             if v is not None}
        elif op == "truncate":
            n = data.draw(st.integers(0, len(model.messages)), label="keep")
            conv.truncate(n)
            del model.messages[n:]
        else:
            body = data.draw(xts.requests(t, max_messages=0), label="one-shot")
            _, one = _options(body)
            if data.draw(st.booleans(), label="continue"):
                one = {"continue_final_message": True}
            _check(conv, model, **one)
        event("prompt refused" if isinstance(model.encode(), str) else "prompt checked")
        _check(conv, model)


# -- what a new message changes before it ------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "g"}}]


def _same(conv: Conversation, t: xtml.Template = K3, **one: Any) -> list[int]:
    """``prompt_ids`` after checking them against ``encode``."""
    ids = conv.prompt_ids(**one)
    assert ids == t.encode(conv.request(**one), vocab())
    return ids


def _calls(*names: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "reasoning_content": "why",
            "tool_calls": [{"id": f"id_{n}", "type": "function", "function": {"name": n, "arguments": "{}"}}
                           for n in names]}


def test_a_tool_result_reorders_the_run_before_it() -> None:
    conv = K3.conversation(vocab(), tools=TOOLS)
    conv.extend([{"role": "user", "content": "go"}, _calls("f", "g")])
    conv.append({"role": "tool", "tool_call_id": "id_g", "content": "G"})
    before = _same(conv)
    # Both results name their calls: the run is put in call order, so the
    # earlier result moves (and its index changes).
    conv.append({"role": "tool", "tool_call_id": "id_f", "content": "F"})
    after = _same(conv)
    history = K3.encode(conv.request(), vocab(), add_generation_prompt=False)
    assert after[: len(history)] == history
    cut = len(K3.encode({**conv.request(), "messages": list(conv.messages[:2])}, vocab(),
                        add_generation_prompt=False))
    assert before[:cut] == after[:cut] and before[cut:] != after[cut : len(before)]
    # A result without an id after them: the run keeps the order given.
    conv.append({"role": "tool", "name": "g", "content": "G again"})
    _same(conv)


def test_tool_results_are_numbered_across_a_user_message() -> None:
    conv = K3.conversation(vocab())
    conv.extend([_calls("f", "g"), {"role": "tool", "content": "F"}, {"role": "user", "content": "and?"}])
    conv.append({"role": "tool", "content": "G"})  # index 2 and name g, from the assistant's calls
    _same(conv)
    assert 'tool="g" index="2"' in K3.render(conv.request()).text


def test_changing_options_renders_again_only_what_differs() -> None:
    conv = K3.conversation(vocab(), tools=TOOLS)
    conv.extend([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning_content": "r"},
                 {"role": "user", "content": "more"}])
    _same(conv)
    for change in ({"thinking": False}, {"tools": None}, {"thinking": True, "thinking_effort": "low"},
                   {"reasoning_effort": "none"}, {"tools": TOOLS[:1]}, {"functions": [TOOLS[1]["function"]]},
                   {"enable_thinking": False, "thinking": None}):
        conv.set_options(**change)
        _same(conv)
        _same(conv, tool_choice="required", response_format={"type": "json_object"})
    assert conv.tools == [TOOLS[1]]


def test_python_functions_as_tools() -> None:
    def lookup(city: str) -> str:
        """Weather in a city."""
        return city

    conv = K3.conversation(vocab(), tools=[lookup])
    conv.append({"role": "user", "content": "weather?"})
    _same(conv)
    assert conv.tools is not None and conv.tools[0]["function"]["name"] == "lookup"


def test_image_prompts_count_across_the_conversation() -> None:
    prompt = IMAGE_PROMPT["kimi-k3"]
    image = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "this?"}]}
    conv = K3.conversation(vocab(), image_prompts=[prompt])
    conv.append(image)
    _same(conv)
    conv.append({"role": "assistant", "content": "a cat"})
    conv.append(image)
    with pytest.raises(xtml.OptionError, match="1 prompts, 2 images"):
        conv.prompt_ids()
    conv.set_options(image_prompts=[prompt, prompt.replace("3x2", "5x5")])
    ids = _same(conv)
    assert K3.bind(vocab()).marker_ids["<|media_begin|>"] in ids


def test_continue_final_message_and_its_completion() -> None:
    conv = K3.conversation(vocab(), thinking=False)
    conv.extend([{"role": "user", "content": "count"}, {"role": "assistant", "content": "1, 2"}])
    _same(conv, continue_final_message=True)
    # What the model writes after the open final message.
    more = K3.completion_ids(", 3<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", vocab())
    got = conv.append_completion(more)
    assert got["content"] == "1, 2, 3"
    assert [m["content"] for m in conv.messages] == ["count", "1, 2, 3"]
    _same(conv)
    # Once another prompt was made, a completion is a new message again.
    conv.append({"role": "user", "content": "again"})
    conv.prompt_ids()
    conv.append_completion(K3.completion_ids("4<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
                                             vocab()))
    assert [m["content"] for m in conv.messages] == ["count", "1, 2, 3", "again", "4"]
    _same(conv)


def test_completion_with_tool_calls_gets_conversation_ids() -> None:
    conv = K3.conversation(vocab(), tools=TOOLS)
    conv.append({"role": "user", "content": "go"})
    prompt = conv.prompt_ids()
    text = ("plan<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
            '<|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'
            "<|close|>message<|sep|><|end_of_msg|>")
    msg = conv.append_completion(K3.completion_ids(text, vocab()))
    assert msg["tool_calls"][0]["id"] == "call_1_1" and len(prompt) < len(conv.ids)
    conv.append({"role": "tool", "tool_call_id": "call_1_1", "content": "done"})
    _same(conv)
    assert 'tool="f" index="1"' in K3.render(conv.request()).text


def test_stream_reads_what_append_completion_reads() -> None:
    conv = K3.conversation(vocab())
    conv.append({"role": "user", "content": "hi"})
    conv.prompt_ids()
    ids = K3.completion_ids("hm<|close|>think<|sep|><|open|>response<|sep|>hello<|close|>response<|sep|>"
                            "<|close|>message<|sep|><|end_of_msg|>", vocab())
    stream = conv.stream()
    events = stream.feed_many(ids) + stream.close()
    streamed = next(e.message for e in events if e.type == "message_end")
    assert conv.append_completion(ids) == streamed


def test_truncate_and_copy() -> None:
    conv = K3.conversation(vocab(), tools=TOOLS)
    conv.extend([{"role": "user", "content": "a"}, _calls("f", "g"), {"role": "tool", "tool_call_id": "id_g",
                 "content": "G"}, {"role": "tool", "tool_call_id": "id_f", "content": "F"}])
    fork = conv.copy()
    conv.truncate(3)  # the run loses its first result in call order: the other moves back
    _same(conv)
    assert len(conv) == 3 and len(fork) == 4
    _same(fork)
    fork.append({"role": "user", "content": "b"})
    _same(fork)
    _same(conv)
    conv.truncate(0)
    assert conv.prompt_ids() == K3.encode({"messages": [], "tools": TOOLS}, vocab())


def test_a_run_rendered_out_of_order_stays_right_through_later_changes() -> None:
    """A run of results answered out of call order renders in call order:
    its messages' ids are not in message order, through option changes,
    copies, cuts inside the run and a continued final message."""
    conv = K3.conversation(vocab(), tools=TOOLS)
    conv.extend([{"role": "user", "content": "go"}, _calls("f", "g", "h"),
                 {"role": "tool", "tool_call_id": "id_h", "content": "H"},
                 {"role": "tool", "tool_call_id": "id_f", "content": "F"},
                 {"role": "tool", "tool_call_id": "id_g", "content": "G"},
                 {"role": "assistant", "content": "done"}])
    _same(conv)
    _same(conv, continue_final_message=True)
    fork = conv.copy()
    fork.set_options(thinking_effort="low")
    _same(fork, continue_final_message=True)
    conv.set_options(thinking=False)
    _same(conv)
    _same(fork)
    conv.set_options(thinking=True)
    fork.truncate(4)  # inside the run: H and F are left, F first
    _same(fork)
    fork.append({"role": "tool", "tool_call_id": "id_g", "content": "G2"})
    _same(fork)
    assert [m["content"] for m in fork.messages] == ["go", "", "H", "F", "G2"]
    conv.append({"role": "user", "content": "more"})
    _same(conv)
    # The last message is G, the last rendered H: neither can be continued.
    conv.truncate(5)
    with pytest.raises(xtml.OptionError, match="continue_final_message"):
        conv.prompt_ids(continue_final_message=True)
    _same(conv)

def test_appended_messages_are_copied() -> None:
    conv = K3.conversation(vocab())
    part = {"type": "text", "text": "one"}
    conv.append({"role": "user", "content": [part]})
    part["text"] = "two"
    assert conv.messages[0]["content"][0]["text"] == "one"
    _same(conv)


def test_options_are_copied() -> None:
    """A tool list (or image prompts) the caller changes afterwards changes
    neither the ids nor what request() says they are of."""
    tools = copy.deepcopy(TOOLS)
    conv = K3.conversation(vocab(), tools=tools)
    conv.append({"role": "user", "content": "a"})
    tools.append({"type": "function", "function": {"name": "h"}})
    tools[0]["function"]["name"] = "changed"
    assert [t["function"]["name"] for t in conv.request()["tools"]] == ["f", "g"]
    _same(conv)
    prompts = [IMAGE_PROMPT["kimi-k3"]]
    conv.set_options(image_prompts=prompts)
    prompts.append(IMAGE_PROMPT["kimi-k3"])
    conv.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]})
    assert conv.request()["image_prompts"] == [IMAGE_PROMPT["kimi-k3"]]
    _same(conv)


def test_an_append_that_is_not_a_tool_result_renders_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only tool results are resolved against the messages before them
    (back to the latest assistant message): any other message appended is
    resolved alone, however long the conversation since that message."""
    conv = K3.conversation(vocab(), tools=TOOLS)
    conv.extend([{"role": "user", "content": "a"}, _calls("f", "g"), {"role": "tool", "content": "1"}])
    conv.extend([{"role": "user", "content": str(k)} for k in range(50)])
    windows: list[int] = []
    real = conv._resolve
    monkeypatch.setattr(conv, "_resolve", lambda window, w, o: windows.append(len(window)) or real(window, w, o))
    conv.append({"role": "user", "content": "next"})
    conv.append({"role": "assistant", "content": "sure"})
    assert windows == [1, 1]
    conv.append({"role": "tool", "name": "f", "content": "2"})  # resolved with the assistant message before it
    assert windows == [1, 1, 2]
    _same(conv)


# -- errors ------------------------------------------------------------------------

def test_a_bad_message_is_located_in_the_whole_conversation_and_changes_nothing() -> None:
    conv = K3.conversation(vocab(), tools=TOOLS)
    conv.extend([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                 {"role": "user", "content": "c"}])
    before = (conv.messages, conv.ids, conv.prompt_ids())
    with pytest.raises(xtml.MessageError) as e:
        conv.extend([{"role": "assistant", "content": "ok"}, {"role": "user", "content": 5}])
    assert e.value.index == 4 and e.value.path == "content"
    with pytest.raises(xtml.MessageError) as e:
        conv.append({"role": "nobody", "content": "x"})
    assert e.value.index == 3 and e.value.path == "role"
    # A tool result with nothing to name it: the window is resolved again.
    with pytest.raises(xtml.MessageError) as e:
        conv.append({"role": "tool", "content": "x"})
    assert e.value.index == 3 and e.value.path == "name"
    with pytest.raises(xtml.MessageError, match="not JSON"):
        conv.append({"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                                                       "arguments": {"x": object()}}}]})
    # Errors inside a value of a message (a tool declaration's schema) too.
    bad = {"role": "system", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "default": float("nan")}}}]}
    with pytest.raises(xtml.RequestError) as r:
        conv.append(bad)
    with pytest.raises(xtml.RequestError) as whole:
        K3.encode({**conv.request(), "messages": [*conv.messages, bad]}, vocab())
    assert r.value.location == whole.value.location == "messages[3].tools"
    assert (conv.messages, conv.ids, conv.prompt_ids()) == before


def test_option_errors() -> None:
    conv = K3.conversation(vocab())
    conv.append({"role": "user", "content": "a"})
    before = (conv.messages, conv.ids, conv.options)
    with pytest.raises(xtml.OptionError, match="thinking_effort must be one of"):
        conv.set_options(thinking_effort="enormous")
    with pytest.raises(xtml.OptionError, match="pass it to prompt_ids"):
        conv.set_options(tool_choice="required")
    with pytest.raises(xtml.OptionError, match="set_options"):
        conv.prompt_ids(thinking=False)
    with pytest.raises(xtml.OptionError, match="unknown option"):
        conv.set_options(temprature=0.5)
    with pytest.raises(xtml.OptionError, match="continue_final_message"):
        conv.prompt_ids(continue_final_message=True)  # the last message is the user's
    with pytest.raises(xtml.OptionError, match="when the conversation is made"):
        conv.prompt_ids(max_chars=5)
    with pytest.raises(xtml.OptionError, match="pass it to prompt_ids"):
        K3.conversation(vocab(), tool_choice="none")
    assert (conv.messages, conv.ids, conv.options) == before


def test_size_limit_is_that_of_encode() -> None:
    msgs = [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "y" * 40}]
    need = 0
    for limit in range(100, 200):
        try:
            K3.encode({"messages": msgs, "thinking": False}, vocab(), max_chars=limit)
        except xtml.RequestError:
            continue
        need = limit
        break
    assert need
    conv = K3.conversation(vocab(), thinking=False, max_chars=need)
    conv.extend(msgs)
    assert conv.prompt_ids() == K3.encode(conv.request(), vocab(), max_chars=need)
    # A one-shot option counts too.
    with pytest.raises(xtml.RequestError, match="too large"):
        K3.encode(conv.request(tool_choice="none"), vocab(), max_chars=need)
    with pytest.raises(xtml.RequestError, match="too large"):
        conv.prompt_ids(tool_choice="none")
    with pytest.raises(xtml.RequestError, match="too large"):
        conv.append({"role": "user", "content": "z"})
    assert len(conv) == 2
    small = K3.conversation(vocab(), thinking=False, max_chars=need - 1)
    small.append(msgs[0])
    with pytest.raises(xtml.RequestError, match="too large"):
        small.append(msgs[1])


def test_completion_errors_change_nothing() -> None:
    conv = K3.conversation(vocab())
    conv.append({"role": "user", "content": "hi"})
    ids = conv.prompt_ids()
    broken = K3.completion_ids("x<|close|>response<|sep|>", vocab())  # closes what is not open
    with pytest.raises(xtml.ParseError):
        conv.append_completion(broken)
    assert len(conv) == 1 and conv.prompt_ids() == ids
    lenient = conv.append_completion(broken, lenient=True)
    assert lenient["diagnostics"] and "diagnostics" not in conv.messages[-1]
    _same(conv)


def test_bad_arguments() -> None:
    conv = K3.conversation(vocab())
    with pytest.raises(xtml.RequestError, match="list of messages"):
        conv.extend({"role": "user", "content": "x"})
    with pytest.raises(xtml.RequestError, match="truncate"):
        conv.truncate(-1)
    with pytest.raises(xtml.OptionError, match="unknown_keys"):
        K3.conversation(vocab(), unknown_keys="maybe")


@pytest.mark.parametrize("bad", [5, "hi", None, b"x", 1.5, object()])
def test_what_is_not_a_message_is_located_and_changes_nothing(bad: Any) -> None:
    conv = K3.conversation(vocab(), [{"role": "user", "content": "a"}])
    before = (conv.messages, conv.ids)
    with pytest.raises(xtml.MessageError, match="a message must be an object") as e:
        conv.append(bad)
    assert e.value.index == 1 and e.value.location == "messages[1]"
    with pytest.raises(xtml.MessageError, match="a message must be an object") as e:
        conv.extend([{"role": "assistant", "content": "b"}, bad])
    assert e.value.index == 2
    with pytest.raises(xtml.MessageError, match="a message must be an object") as e:
        K3.conversation(vocab(), [bad])
    assert e.value.index == 0
    # encode says the same of the same request.
    with pytest.raises(xtml.MessageError, match="a message must be an object") as whole:
        K3.encode({"messages": [*conv.messages, bad]}, vocab())
    assert whole.value.index == 1
    assert (conv.messages, conv.ids) == before


@pytest.mark.parametrize("many", [[{"role": "user", "content": "x"}], ({"role": "user", "content": "x"},), []])
def test_append_of_a_list_names_extend(many: Any) -> None:
    conv = K3.conversation(vocab(), [{"role": "user", "content": "a"}])
    before = (conv.messages, conv.ids)
    with pytest.raises(xtml.MessageError, match=r"append takes one message.*extend\(\)") as e:
        conv.append(many)
    assert e.value.index == 1
    assert (conv.messages, conv.ids) == before
    conv.extend(many)
    assert len(conv) == 1 + len(many)


def test_unknown_keys_ignored_as_encode_ignores_them() -> None:
    conv = K3.conversation(vocab(), unknown_keys="ignore")
    conv.append({"role": "user", "content": "hi", "x_trace": 1})
    assert conv.messages == ({"role": "user", "content": "hi"},)
    assert conv.prompt_ids() == K3.encode({"messages": [{"role": "user", "content": "hi", "x_trace": 1}]},
                                          vocab(), unknown_keys="ignore")


def test_option_sets_cover_every_option() -> None:
    from xtml.chat.fields import OPTIONS

    assert CONVERSATION_OPTIONS | ONE_SHOT_OPTIONS == set(OPTIONS)
    assert not CONVERSATION_OPTIONS & ONE_SHOT_OPTIONS


def test_repr_len_and_seeded_messages() -> None:
    conv = K3.conversation(vocab(), [{"role": "user", "content": "hi"}], thinking=False)
    assert len(conv) == 1 and not conv.thinking and conv.tools is None
    assert conv.prompt_ids() == K3.encode([{"role": "user", "content": "hi"}], vocab(), thinking=False)
    assert repr(conv).startswith("<xtml.Conversation 'kimi-k3': 1 messages")


@settings(SLOW, max_examples=30)
@given(xt.requests(K3))
def test_a_whole_request_at_once(body: dict[str, Any]) -> None:
    opts, one = _options(body)
    try:
        want: Any = K3.encode(body, vocab())
    except xtml.XtmlError as e:
        want = f"{type(e).__name__}: {e}"
    try:
        conv = K3.conversation(vocab(), body["messages"], **opts)
    except xtml.XtmlError as e:
        assert isinstance(want, str), e
        return
    assert _prompt(conv, **one) == want


# -- docs/conversation.md ----------------------------------------------------------

DOC = Path(__file__).parent.parent / "docs" / "conversation.md"


def test_conversation_doc_python_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    text, _ = run_examples(DOC, at_least=2)
    shown_on_page(text, capsys.readouterr().out, at_least=3)
