"""Training masks of the layout dialects (``smollm2``, ``qwen3``): the ids
are ``encode``'s, and each trained assistant message trains exactly what
the model generates after the generation prompt, which reads back (as a
completion) as that message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.families import chatml_requests, smollm2_gguf
from xtml.chat.dialect import Training
from xtml.errors import XtmlError
from xtml.training import IGNORE_INDEX, MapFunction, TrainingExample
from xtml.vocab.vocabulary import byte_vocabulary

N_REQUESTS = 400
ROLES = {"smollm2": ("system", "user", "assistant", "tool", "developer"), "qwen3": ("system", "user", "assistant",
                                                                                  "tool")}


def _requests(name: str) -> list[dict[str, Any]]:
    return chatml_requests(3, N_REQUESTS, roles=ROLES[name], thinking=name == "qwen3")


def _prompt_text(tpl: xtml.Template, req: dict[str, Any]) -> str:
    """The generation prompt under a request's options."""
    probe = {**req, "messages": [{"role": "user", "content": "x"}]}
    with_prompt = tpl.render({**probe, "add_generation_prompt": True}).text
    return with_prompt[len(tpl.render({**probe, "add_generation_prompt": False}).text):]


def _trained(ex: TrainingExample, span: Any, runs: bool = False) -> list[int]:
    """The trained ids of a message span; they are one run (``runs``: one
    or more)."""
    where = [k for k in range(span.start, span.end) if ex.mask[k]]
    if where and not runs:
        assert where == list(range(where[0], where[-1] + 1))
    return [ex.ids[k] for k in where]


def _run_ends(ex: TrainingExample, span: Any) -> list[int]:
    """The last id of each trained run of a message span."""
    return [ex.ids[k] for k in range(span.start, span.end)
            if ex.mask[k] and (k + 1 >= len(ex.mask) or not ex.mask[k + 1])]


def _examples(tpl: xtml.Template, vocab: Any) -> list[tuple[dict[str, Any], TrainingExample]]:
    out = []
    for req in _requests(tpl.name):
        try:
            ex = tpl.encode_training(req, vocab)
        except XtmlError as e:
            with pytest.raises(type(e)):
                tpl.encode(req, vocab)  # refused as encode refuses it
            continue
        out.append((req, ex))
    return out


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_trained_ids_are_the_answers_as_completions(name: str) -> None:
    tpl = xtml.load(name)
    vocab = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    counts = {"requests": 0, "answers": 0, "last_turns": 0, "prompt_stripped": 0}
    for req, ex in _examples(tpl, vocab):
        counts["requests"] += 1
        assert ex.ids == tpl.encode(req, vocab), req
        assert ex.labels == [t if m else IGNORE_INDEX for t, m in zip(ex.ids, ex.mask)]
        text = tpl.render(req).text
        prompt = _prompt_text(tpl, req)
        normal = tpl.normalize(req)["messages"]
        shift = len(normal) - len(req["messages"])
        inside = 0
        whole = [s for s in ex.spans if s.channel is None]
        assert [s.message for s in whole if s.message is not None] == list(range(len(req["messages"])))[
            len(req["messages"]) - len([s for s in whole if s.message is not None]):]
        for s in whole:
            got = _trained(ex, s)
            inside += len(got)
            if s.role != "assistant" or s.message is None:
                assert got == [], req  # other roles and the template's own messages
                continue
            counts["answers"] += 1
            # What the answer parses back to, strictly, as a completion: the
            # message as the render wrote it.
            assert tpl.parse(got, vocab, completion=True) == normal[s.message + shift], req
            # It ends with the stop token and starts where the generation
            # prompt (or, where the message does not begin with it, the
            # frame that opens the turn) ends.
            assert got[-1] in tpl.bind(vocab).stop_ids
            k = len(vocab.decode(ex.ids[:ex.mask.index(1, s.start)]))
            before = text[:k]
            frame = vocab.decode(ex.ids[s.start:s.body_start])
            assert before.endswith(prompt) or (before.endswith(frame) and not text[k - len(frame):].startswith(
                prompt)), req
            counts["prompt_stripped"] += before.endswith(prompt) and prompt != frame
        assert ex.trained == inside  # nothing outside an assistant message is trained
        msgs = req["messages"]
        if msgs[-1]["role"] == "assistant" and len(msgs) > 1:
            # The last answer is what follows the prompt of the request
            # without it (where the history reads the same either way).
            full = tpl.encode({**req, "add_generation_prompt": False}, vocab)
            head = tpl.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, vocab)
            last = next(s for s in reversed(whole) if s.message == len(msgs) - 1)
            if full[:len(head)] == head:
                assert _trained(ex, last) == full[len(head):-1], req
                counts["last_turns"] += 1
    assert counts["requests"] >= 250 and counts["answers"] >= 150 and counts["last_turns"] >= 20, counts
    if name == "qwen3":
        assert counts["prompt_stripped"] >= 5, counts  # thinking off: the prompt's closed block is not trained


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_a_real_tokenizer_trains_the_same_text(name: str) -> None:
    """Over SmolLM2's own vocabulary (for qwen3 one without its added
    tokens, which it spells as text) the trained ids decode to the same
    answers as over a byte vocabulary, but where one id holds the end of
    the generation prompt and the start of the answer (the text between
    two tokens is tokenized whole, as ``encode`` and the engines do): that
    id is trained."""
    tpl = xtml.load(name)
    smol = xtml.load_tokenizer(smollm2_gguf())
    exact = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    counts = {"answers": 0, "shared": 0}
    for req, ex in _examples(tpl, smol):
        assert ex.ids == tpl.encode(req, smol)
        want = tpl.encode_training(req, exact)
        prompt = _prompt_text(tpl, req)
        spans = [s for s in ex.spans if s.channel is None]
        assert [(s.message, s.role) for s in spans] == [(s.message, s.role) for s in want.spans if s.channel is None]
        for s, w in zip(spans, [s for s in want.spans if s.channel is None]):
            got, answer = smol.decode(_trained(ex, s)), exact.decode(_trained(want, w))
            if got == answer:
                counts["answers"] += bool(answer)
                continue
            head = got[:len(got) - len(answer)]
            first = smol.decode(_trained(ex, s)[:1])
            assert got.endswith(answer) and head and prompt.endswith(head) and first.startswith(head), req
            counts["shared"] += 1
    assert counts["answers"] >= 100, counts
    print(f"{name}: {counts}")


def _chat() -> dict[str, Any]:
    return {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "a", "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "assistant", "reasoning_content": "Report it.", "content": "Sunny."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "reasoning_content": "Polite.", "content": "You're welcome."},
    ], "tools": [{"type": "function", "function": {"name": "w"}}], "add_generation_prompt": False}


def _runs(vocab: Any, ex: TrainingExample) -> list[str]:
    out: list[str] = []
    prev = 0
    for t, m in zip(ex.ids, ex.mask):
        if m and not prev:
            out.append("")
        if m:
            out[-1] += vocab.decode([t])
        prev = m
    return out


def test_qwen3_trains_reasoning_content_calls_and_the_stop() -> None:
    tpl = xtml.load("qwen3")
    vocab = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    ex = tpl.encode_training(_chat(), vocab)
    call = '<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call>'
    # The history drops reasoning before the last query; the last answer
    # keeps its reasoning block. Never the frame the prompt opens.
    assert _runs(vocab, ex) == [f"Checking.\n{call}<|im_end|>", "Sunny.<|im_end|>",
                                "<think>\nPolite.\n</think>\n\nYou're welcome.<|im_end|>"]
    assert [(s.message, s.role) for s in ex.spans if s.channel is None] == [
        (0, "system"), (1, "user"), (2, "assistant"), (3, "tool"), (4, "assistant"), (5, "user"), (6, "assistant")]
    assert [vocab.decode(ex.ids[s.start:s.end]) for s in ex.spans if s.message == 6 and s.channel] == [
        "Polite.", "You're welcome."]
    assert [s.channel for s in ex.spans if s.message == 2] == [None, "response", "tools"]
    # With thinking off the prompt writes the closed reasoning block: the
    # answer after it is what the model generates.
    bye = {**_chat(), "messages": [*_chat()["messages"][:6], {"role": "assistant", "content": "Bye."}]}
    off = tpl.encode_training(bye, vocab, enable_thinking=False)
    assert _runs(vocab, off)[-1] == "Bye.<|im_end|>"
    on = tpl.encode_training(bye, vocab)
    assert _runs(vocab, on)[-1] == "<think>\n\n</think>\n\nBye.<|im_end|>"


def test_train_selects_messages_and_parts() -> None:
    tpl = xtml.load("qwen3")
    vocab = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    chat = _chat()
    assert _runs(vocab, tpl.encode_training(chat, vocab, train="last")) == [
        "<think>\nPolite.\n</think>\n\nYou're welcome.<|im_end|>"]
    assert _runs(vocab, tpl.encode_training(chat, vocab, train=[4])) == ["Sunny.<|im_end|>"]
    assert tpl.encode_training(chat, vocab, train=set()).trained == 0
    assert tpl.encode_training(chat, vocab, train="all") == tpl.encode_training(chat, vocab)
    assert _runs(vocab, tpl.encode_training(chat, vocab, train=Training(channels=("response",), end=False))) == [
        "Checking.", "Sunny.", "You're welcome."]
    assert _runs(vocab, tpl.encode_training(chat, vocab, train=Training(channels=("tools",)))) == [
        '\n<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>', "<|im_end|>",
        "<|im_end|>"]
    assert _runs(vocab, tpl.encode_training(chat, vocab, train=Training(roles=("user",)))) == [
        "Weather in Paris?<|im_end|>", "Thanks!<|im_end|>"]
    with pytest.raises(xtml.OptionError) as e:
        tpl.encode_training(chat, vocab, train=[1])
    assert str(e.value) == "train names message 1, a user message; trained roles: assistant (at option 'train')"
    with pytest.raises(xtml.OptionError) as e:
        tpl.encode_training(chat, vocab, train=Training(exclude=("json",)))
    assert "a layout format has no elements to exclude" in str(e.value)
    with pytest.raises(xtml.RequestError):
        tpl.encode_training(chat, vocab, max_chars=10)


def test_the_generation_prompt_and_the_default_system_are_never_trained() -> None:
    tpl = xtml.load("smollm2")
    vocab = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    req = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
                        {"role": "user", "content": "bye"}]}
    ex = tpl.encode_training(req, vocab)
    assert ex.ids == tpl.encode(req, vocab) and tpl.render(req).text.endswith("<|im_start|>assistant\n")
    assert _runs(vocab, ex) == ["Hello!<|im_end|>"]
    assert [(s.message, s.role) for s in ex.spans if s.channel is None] == [
        (None, "system"), (0, "user"), (1, "assistant"), (2, "user")]
    assert max(s.end for s in ex.spans) == len(ex.ids) - len(tpl.encode_request(
        {"messages": [{"role": "user", "content": "x"}]}, vocab).ids) + len(
        tpl.encode({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False}, vocab))


def test_the_map_function_and_the_dataset_commands(tmp_path: Path) -> None:
    from tests.helpers.tokenizers import deepseek_path
    from xtml.cli.main import main

    tpl = xtml.load("qwen3")
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=tpl.dialect.tokens)  # type: ignore[attr-defined]
    rows = [_chat()["messages"], [{"role": "wizard", "content": "x"}]]
    out = MapFunction("qwen3", deepseek_path(), add_markers=True)({"messages": rows})
    want = tpl.encode_training({"messages": rows[0], "add_generation_prompt": False}, vocab)
    assert out["input_ids"][0] == want.ids and out["loss_mask"][0] == want.mask and out["error"][0] == ""
    assert out["input_ids"][1] == [] and out["error"][1].startswith("role 'wizard' is not one of this format's")
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"messages": r}) + "\n" for r in rows))
    code = main(["render-dataset", str(src), "-t", "qwen3", "--tokenizer", deepseek_path(), "--add-markers",
                 "-o", str(tmp_path / "out.parquet")])
    assert code == 1  # the bad row is skipped and reported
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["input_ids"] for r in table] == [want.ids] and [r["loss_mask"] for r in table] == [want.mask]
    assert main(["lint-dataset", str(src), "-t", "qwen3", "--tokenizer", deepseek_path(), "--add-markers"]) == 1


def _family_dialects() -> list[str]:
    from tests.helpers.family_requests import REFERENCES
    from xtml.chat.template_file import builtin_files

    return sorted(set(REFERENCES) & set(builtin_files(layout=True)))


@pytest.mark.parametrize("name", _family_dialects())
def test_every_layout_dialect_trains_only_its_answers(name: str) -> None:
    """The other built-in layout dialects, on their generated requests: the
    ids are encode's, every written message is found as the request's own
    (by role), and what is trained is in assistant messages only, each run
    ending with one of the dialect's stop tokens (or, where no marker closes
    a turn, followed by the stop that opens the next one, trained)."""
    from tests.helpers.family_requests import family_requests

    tpl = xtml.load(name)
    vocab = byte_vocabulary(tpl.dialect.tokens)  # type: ignore[attr-defined]
    stops = set(tpl.bind(vocab).stop_ids)
    d = tpl.layout  # type: ignore[attr-defined]
    # A close that ends a message but not the answer (harmony's <|end|>)
    # ends what an answer's message in a prompt trains.
    ends = stops | {vocab.special_id(t) for t, meaning in d.stops.items() if meaning == "message_end"}
    # Results folded into the calling turn are not the model's: the answer's
    # span trains the calls and the token that opens their results, then the
    # content after them (two runs).
    folded = bool(getattr(d, "folded_turns", False))
    answers = 0
    for case in family_requests(name, 150):
        req, opts = case["request"], case["options"]
        try:
            ex = tpl.encode_training(req, vocab, **opts)
        except XtmlError as e:
            with pytest.raises(type(e)):
                tpl.encode(req, vocab, **opts)
            continue
        assert ex.ids == tpl.encode(req, vocab, **opts), case
        inside = 0
        for s in ex.spans:
            if s.channel is not None:
                continue
            if s.message is not None:
                assert req["messages"][s.message]["role"] == s.role, case
            got = _trained(ex, s, runs=folded and s.role == "assistant")
            inside += len(got)
            if s.role != "assistant" or s.message is None:
                if tpl.layout.open_turns and got and got == [ex.ids[s.start]] and got[0] in stops:  # type: ignore[attr-defined]
                    inside -= 1  # the stop that ends the answer before: counted with it
                else:
                    assert got == [], case
            elif tpl.layout.open_turns:  # type: ignore[attr-defined]
                answers += bool(got)
                if s.end < len(ex.ids) and ex.ids[s.end] in stops:
                    # No marker closes the turn: the model ends it with the
                    # token that opens the next, trained there.
                    assert ex.mask[s.end], case
                    inside += 1
            elif got:
                answers += 1
                assert all(t in ends for t in _run_ends(ex, s)), case
        assert inside == ex.trained, case
    assert answers >= 50
