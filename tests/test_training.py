"""Training render: element spans, loss masks, budgets and the batched map
function (without datasets or Ray; those are in test_dataset.py and
test_ray.py)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import xtml
from tests.helpers.strategies import documents
from tests.helpers.tokenizers import deepseek_path, k3_vocab
from xtml.chat.dialect import Training
from xtml.chat.prompt import generation_prompt
from xtml.markup.nodes import Element
from xtml.markup.segments import to_text
from xtml.testing import requests
from xtml.training import IGNORE_INDEX, MapFunction, TrainingExample, overruns
from xtml.vocab.spans import encode_spans

K3 = xtml.load("kimi-k3")
BASE = xtml.load("xtml-base")

CHAT: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Use the tool.", "content": "",
         "tool_calls": [{"id": "a", "function": {"name": "w", "arguments": {"city": "Paris"}}},
                        {"id": "b", "function": {"name": "log", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "b", "content": "logged"},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "assistant", "reasoning_content": "Report it.", "content": "Sunny."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ],
    "tools": [{"type": "function", "function": {"name": "w"}}],
    "thinking_effort": "low",
    "add_generation_prompt": False,
}


def runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """Maximal runs of masked ids."""
    out: list[list[int]] = []
    prev = 0
    for t, m in zip(ids, mask):
        if m and not prev:
            out.append([])
        if m:
            out[-1].append(t)
        prev = m
    return out


def element_tree(tpl: xtml.Template, request: Any, **options: Any) -> list[Any]:
    return list(tpl.document(request, **options).nodes)


# -- spans ----------------------------------------------------------------------------


@given(documents())
def test_spans_of_any_tree_match_binding_encode(nodes: list[Any]) -> None:
    b = K3.bind(k3_vocab())
    enc = encode_spans(b, nodes)
    assert enc.ids == b.encode(nodes)
    for s in enc.elements:
        el = s.element
        # Each element's slice is that element encoded on its own; its body
        # slice is its children encoded on their own.
        assert enc.ids[s.start:s.end] == b.encode([el])
        assert enc.ids[s.body:s.body_end] == b.encode(list(el.children))
        assert s.start < s.body <= s.body_end <= s.end
    for k, s in enumerate(enc.elements):
        if s.parent >= 0:
            p = enc.elements[s.parent]
            assert p.body <= s.start and s.end <= p.body_end and s.depth == p.depth + 1
            assert k in enc.subtree(s.parent)
        else:
            assert s.depth == 0
    end_id = b.marker_ids[K3.markers.end]
    assert [i for i, t in enumerate(enc.ids) if t == end_id] == enc.ends


@given(requests(K3))
def test_spans_of_rendered_requests_match_encode(request: dict[str, Any]) -> None:
    b = K3.bind(k3_vocab())
    enc = encode_spans(b, element_tree(K3, request))
    assert enc.ids == K3.encode(request, k3_vocab())
    tops = enc.top()
    assert [enc.elements[t].element for t in tops] == [n for n in element_tree(K3, request)
                                                        if isinstance(n, Element)]


# -- masks ----------------------------------------------------------------------------


def expected_mask(tpl: xtml.Template, ex: TrainingExample, trained: set[int], rules: Training) -> list[int]:
    """The mask the rules describe, built from the spans a second way: set
    the trained channels (or bodies) and ends, then clear excluded elements
    found in a fresh encode of the tree."""
    want = [0] * len(ex.ids)
    by_message: dict[int, list[Any]] = {}
    for s in ex.spans:
        if s.message is not None:
            by_message.setdefault(s.message, []).append(s)
    for i in trained:
        whole = next(s for s in by_message[i] if s.channel is None)
        chans = [s for s in by_message[i] if s.channel is not None]
        if rules.channels and chans:
            for s in chans:
                if s.channel in rules.channels:
                    want[s.start:s.end] = [1] * (s.end - s.start)
        else:
            want[whole.body_start:whole.body_end] = [1] * (whole.body_end - whole.body_start)
        if rules.end:
            want[whole.body_end:whole.end] = [1] * (whole.end - whole.body_end)
    return want


def excluded_ranges(tpl: xtml.Template, request: Any, vocab: Any, tags: tuple[str, ...]) -> list[tuple[int, int]]:
    enc = encode_spans(tpl.bind(vocab), element_tree(tpl, request))
    return [(s.start, s.end) for s in enc.elements if s.element.tag in tags and s.depth > 0]


def check_example(tpl: xtml.Template, request: Any, vocab: Any, ex: TrainingExample, trained: set[int],
                  rules: Training) -> None:
    assert ex.ids == tpl.encode(request, vocab)
    assert len(ex.mask) == len(ex.ids) and set(ex.mask) <= {0, 1}
    want = expected_mask(tpl, ex, trained, rules)
    for a, b in excluded_ranges(tpl, request, vocab, rules.exclude):
        want[a:b] = [0] * (b - a)
    assert ex.mask == want
    assert ex.labels == [t if m else IGNORE_INDEX for t, m in zip(ex.ids, ex.mask)]
    # Nothing outside a trained message is ever trained: not the template's
    # own messages, not other roles, not the generation prompt.
    inside = [0] * len(ex.ids)
    for s in ex.spans:
        if s.channel is None and s.message in trained:
            inside[s.start:s.end] = [1] * (s.end - s.start)
    assert all(i or not m for i, m in zip(inside, ex.mask))


@given(requests(K3))
def test_k3_masks_line_up_with_channel_spans(request: dict[str, Any]) -> None:
    vocab = k3_vocab()
    ex = K3.encode_training(request, vocab)
    note(repr(ex.spans))
    rules = K3.dialect.training
    trained = {s.message for s in ex.spans if s.role == "assistant" and s.channel is None and s.message is not None}
    check_example(K3, request, vocab, ex, trained, rules)
    # Decoding the masked ids of each trained message gives its channels'
    # text form (json fallback blocks cut out), then its close tag and end.
    doc = [n for n in element_tree(K3, request) if isinstance(n, Element) and n.closed]
    whole = [s for s in ex.spans if s.channel is None]
    assert len(doc) == len(whole)
    mk = K3.markers
    for el, span in zip(doc, whole):
        if span.message not in trained:
            continue
        text = "".join(to_text([_without(c, "json")], mk) for c in el.children if isinstance(c, Element))
        text += f"{mk.close}message{mk.sep}{mk.end}"
        masked = [t for t, m in zip(ex.ids[span.start:span.end], ex.mask[span.start:span.end]) if m]
        assert vocab.decode(masked) == text


def _without(el: Element, tag: str) -> Element:
    kids = tuple(_without(c, tag) if isinstance(c, Element) else c for c in el.children
                 if not (isinstance(c, Element) and c.tag == tag))
    return Element(el.tag, el.attrs, kids, el.closed)


def test_k3_example_trains_assistant_channels_and_ends_only() -> None:
    vocab = k3_vocab()
    ex = K3.encode_training(CHAT, vocab)
    assert ex.ids == K3.encode(CHAT, vocab)
    texts = [vocab.decode(r) for r in runs(ex.ids, ex.mask)]
    assert texts == [
        '<|open|>think<|sep|>Use the tool.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
        '<|open|>tools<|sep|><|open|>call tool="w" index="1"<|sep|><|open|>argument key="city" type="string"'
        '<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool="log" index="2"<|sep|>',
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
        "<|open|>think<|sep|>Report it.<|close|>think<|sep|><|open|>response<|sep|>Sunny.<|close|>response<|sep|>"
        "<|close|>message<|sep|><|end_of_msg|>",
        "<|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>You're welcome.<|close|>response<|sep|>"
        "<|close|>message<|sep|><|end_of_msg|>",
    ]
    # Spans: the template's two option messages first, then every message
    # by its index in the request (tool results in call order).
    assert [(s.message, s.role) for s in ex.spans if s.channel is None] == [
        (None, "system"), (None, "system"), (0, "system"), (1, "user"), (2, "assistant"), (4, "tool"),
        (3, "tool"), (5, "assistant"), (6, "user"), (7, "assistant")]
    assert [s.channel for s in ex.spans if s.message == 2] == [None, "think", "response", "tools"]
    think = ex.channels("think")[0]
    assert vocab.decode(ex.ids[think.body_start:think.body_end]) == "Use the tool."
    assert ex.effort == "low" and ex.trained == sum(len(r) for r in runs(ex.ids, ex.mask))


def test_train_last_turn_and_explicit_indexes() -> None:
    vocab = k3_vocab()
    rules = K3.dialect.training
    last = K3.encode_training(CHAT, vocab, train="last")
    check_example(K3, CHAT, vocab, last, {7}, rules)
    # The last turn is everything after the last user message: with a tool
    # round in it, both assistant messages of that turn.
    head = {**CHAT, "messages": CHAT["messages"][:6]}
    check_example(K3, head, vocab, K3.encode_training(head, vocab, train="last"), {2, 5}, rules)
    check_example(K3, CHAT, vocab, K3.encode_training(CHAT, vocab, train=[2, 7]), {2, 7}, rules)
    check_example(K3, CHAT, vocab, K3.encode_training(CHAT, vocab, train=set()), set(), rules)
    assert K3.encode_training(CHAT, vocab, train=set()).trained == 0
    assert K3.encode_training(CHAT, vocab, train="all").mask == K3.encode_training(CHAT, vocab).mask
    ending_with_user = {**CHAT, "messages": CHAT["messages"][:7]}
    assert K3.encode_training(ending_with_user, vocab, train="last").trained == 0


@pytest.mark.parametrize(("train", "message"), [
    ([1], "train names message 1, a user message; trained roles: assistant (at option 'train')"),
    ([0], "train names message 0, a system message; trained roles: assistant (at option 'train')"),
    ([3], "train names message 3, a tool message; trained roles: assistant (at option 'train')"),
    ([99], "train names message 99, which the request does not have (at option 'train')"),
    (["2"], "train names message '2', which the request does not have (at option 'train')"),
    ("first", "train must be 'all', 'last', message indexes or a Training, not 'first' (at option 'train')"),
    (3, "train must be 'all', 'last', message indexes or a Training, not int (at option 'train')"),
])
def test_bad_train_values_are_option_errors(train: Any, message: str) -> None:
    with pytest.raises(xtml.OptionError) as e:
        K3.encode_training(CHAT, k3_vocab(), train=train)
    assert str(e.value) == message


@pytest.mark.parametrize("rules", [
    Training(),  # whole bodies, end included
    Training(channels=("response",), end=False),
    Training(channels=("think", "response", "tools"), exclude=("argument",)),
    Training(roles=("assistant", "user"), channels=("response",)),
])
def test_custom_training_rules(rules: Training) -> None:
    vocab = k3_vocab()
    ex = K3.encode_training(CHAT, vocab, train=rules)
    trained = {s.message for s in ex.spans if s.channel is None and s.role in rules.roles and s.message is not None
               and not (s.role == "system")}
    check_example(K3, CHAT, vocab, ex, trained, rules)


def test_whole_body_training_decodes_to_the_message_body() -> None:
    vocab = k3_vocab()
    ex = K3.encode_training(CHAT, vocab, train=Training(roles=("user",), end=False))
    assert [vocab.decode(r) for r in runs(ex.ids, ex.mask)] == ["Weather in Paris?", "Thanks!"]


def test_generation_prompt_is_never_trained() -> None:
    vocab = k3_vocab()
    req = {**CHAT, "add_generation_prompt": True}
    ex = K3.encode_training(req, vocab)
    assert ex.ids == K3.encode(req, vocab)
    prompt = K3.bind(vocab).encode([generation_prompt(K3.dialect, True)])
    assert ex.ids[-len(prompt):] == prompt and not any(ex.mask[-len(prompt):])
    assert ex.mask[: len(ex.ids) - len(prompt)] == K3.encode_training(CHAT, vocab).mask
    assert max(s.end for s in ex.spans) == len(ex.ids) - len(prompt)


@given(requests(BASE))
def test_another_template_masks(request: dict[str, Any]) -> None:
    vocab = base_vocab()
    ex = BASE.encode_training(request, vocab)
    rules = BASE.dialect.training
    trained = {s.message for s in ex.spans
               if s.role in rules.roles and s.channel is None and s.message is not None}
    check_example(BASE, request, vocab, ex, trained, rules)


_base: list[xtml.Vocabulary] = []


def base_vocab() -> xtml.Vocabulary:
    if not _base:
        _base.append(xtml.load_tokenizer(deepseek_path(), add_special_tokens=BASE.markers.all()))
    return _base[0]


# -- budgets --------------------------------------------------------------------------


def test_think_budget_overruns() -> None:
    vocab = k3_vocab()
    budget = K3.dialect.training.budgets["low"]
    long = " ".join(["step"] * (budget + 10))
    req = {"messages": [{"role": "user", "content": "go"},
                        {"role": "assistant", "reasoning_content": long, "content": "done"},
                        {"role": "user", "content": "again"},
                        {"role": "assistant", "reasoning_content": "short", "content": "ok"}],
           "thinking_effort": "low", "add_generation_prompt": False}
    ex = K3.encode_training(req, vocab)
    found = overruns(ex, K3.dialect)
    assert len(found) == 1
    o = found[0]
    assert (o.message, o.effort, o.budget) == (1, "low", budget)
    assert o.tokens == len(vocab.encode_texts([long])[0]) > budget
    assert overruns(K3.encode_training(req, vocab, thinking_effort="high"), K3.dialect) == []
    # Without thinking there is no think channel, so nothing to check.
    off = K3.encode_training(req, vocab, thinking=False)
    assert off.effort is None and off.channels("think") == [] and overruns(off, K3.dialect) == []


# -- the map function (plain dict batches) --------------------------------------------


def test_map_function_rows_and_bad_rows() -> None:
    fn = MapFunction("kimi-k3", deepseek_path(), add_markers=True)
    good = CHAT["messages"]
    batch = {
        "messages": [good, [{"role": "wizard", "content": "x"}], '[{"role": "user", "content": "hi"}]', "{nope"],
        "thinking_effort": ["low", None, None, None],
        "id": ["a", "b", "c", "d"],  # other columns are ignored
    }
    out = fn(batch)
    assert set(out) == {"input_ids", "loss_mask", "labels", "length", "error"}
    vocab = k3_vocab()
    first = K3.encode_training({"messages": good, "thinking_effort": "low", "add_generation_prompt": False}, vocab)
    assert out["input_ids"][0] == first.ids and out["loss_mask"][0] == first.mask
    assert out["labels"][0] == first.labels and out["length"][0] == len(first.ids) and out["error"][0] == ""
    assert out["input_ids"][1] == [] and out["length"][1] == 0
    assert out["error"][1] == "role 'wizard' is not one of system, user, assistant, tool (at messages[0].role)"
    assert out["input_ids"][2] == K3.encode([{"role": "user", "content": "hi"}], vocab, add_generation_prompt=False)
    assert out["error"][3].startswith("column 'messages': invalid JSON: ")
    assert fn({"request": ['{"messages": [{"role": "user", "content": "hi"}]}']})["input_ids"] == [out["input_ids"][2]]
    assert fn({"text": ["x"]})["error"] == ["the row has no 'messages' or 'request' column"]


def test_map_function_pickles_by_its_arguments() -> None:
    fn = MapFunction("kimi-k3", deepseek_path(), train=[5, 2], add_markers=True, labels=False)
    fn.one({"messages": CHAT["messages"]})  # loads the tokenizer in this process
    data = pickle.dumps(fn)
    assert len(data) < 1000  # the arguments, not the loaded tokenizer
    back = pickle.loads(data)
    assert (back.template, back.tokenizer, back.train, back.add_markers, back.labels) == (
        "kimi-k3", deepseek_path(), (5, 2), True, False)
    batch = {"messages": [CHAT["messages"]]}
    assert "labels" not in back(batch)
    assert MapFunction("kimi-k3", deepseek_path(), add_markers=True, train="last")(batch)["loss_mask"] == [
        K3.encode_training({"messages": CHAT["messages"], "add_generation_prompt": False}, k3_vocab(),
                           train="last").mask]


@given(st.lists(requests(K3, images=False), min_size=1, max_size=3))
def test_map_function_equals_encode_training(reqs: list[dict[str, Any]]) -> None:
    fn = MapFunction("kimi-k3", deepseek_path(), add_markers=True)
    out = fn({"request": reqs})
    for r, ids, mask, err in zip(reqs, out["input_ids"], out["loss_mask"], out["error"]):
        want = r if "add_generation_prompt" in r or "add_generation_prompt" in r.get("chat_template_kwargs", {}) \
            else {**r, "add_generation_prompt": False}
        ex = K3.encode_training(want, k3_vocab())
        assert (ids, mask, err) == (ex.ids, ex.mask, "")


def test_examples_compare_by_value_and_are_read_only() -> None:
    vocab = k3_vocab()
    a, b = K3.encode_training(CHAT, vocab), K3.encode_training(CHAT, vocab)
    assert a == b and a is not b and a != K3.encode_training(CHAT, vocab, train="last")
    assert a.spans == b.spans and a.spans is a.spans  # made once, then kept
    with pytest.raises(AttributeError):
        a.ids = []  # type: ignore[misc]
    fresh = K3.encode_training(CHAT, vocab)
    for ex in (a, fresh):  # spans made, and not yet made
        back = pickle.loads(pickle.dumps(ex))
        assert back == b and back.spans == b.spans and back.training == b.training
