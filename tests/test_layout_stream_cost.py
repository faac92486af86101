"""The cost of a layout dialect's parse on ids and of its stream, counted
at 1x and 4x the text between the same tokens: at the stop token, where the
stream makes its message, no id is read again (the ids are lexed as they
come) and the Python work is the same at both lengths (a re-parse of the
whole message grew with it); a batch parse does the same Python work at
both; a live reader keeps no string that grows with the answer."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import pytest

import xtml
from xtml.chat.template_file import LAYOUT_BUILTIN
from xtml.template import LayoutTemplate
from xtml.vocab.tokens import TokenBinding
from xtml.vocab.vocabulary import Vocabulary, byte_vocabulary

TEXT = "Streaming parsers read model output as it comes: Ünïcödé, 中文 and 🎉 cross token boundaries. "


def _answer(tpl: LayoutTemplate, vocab: Vocabulary, reps: int) -> list[int]:
    """An answer with reasoning (where the format has it) and content, as
    the model writes it after the generation prompt, up to its stop token."""
    user = [{"role": "user", "content": "Go on."}]
    # The options as given, then each boolean flipped: a prompt that holds a
    # closed block (thinking off) is extended by no rendered answer.
    flips = [{k: not v} for k, v in tpl.layout.options.items() if isinstance(v, bool)]
    for opts in ({}, *flips):
        for answer in ({"role": "assistant", "reasoning_content": TEXT * reps, "content": TEXT * reps},
                       {"role": "assistant", "content": TEXT * reps}):
            prompt = tpl.render({"messages": user}, **opts).text
            whole = tpl.render({"messages": [*user, answer], "add_generation_prompt": False}, **opts).text
            text = whole[len(prompt):]
            if whole.startswith(prompt) and (reps == 1 or "reasoning_content" not in answer
                                            or tpl.parse(_answer_ids(tpl, vocab, text), vocab, completion=True)
                                            .get("reasoning_content")):
                return _answer_ids(tpl, vocab, text)
    raise AssertionError(f"{tpl.layout.name}: no answer extends the prompt")


def _answer_ids(tpl: LayoutTemplate, vocab: Vocabulary, text: str) -> list[int]:
    # A close that ends a message but not the answer (harmony's <|end|>) is
    # not where the model stops.
    stops = [s for s, meaning in tpl.layout.stops.items() if meaning != "message_end"]
    if not any(s in text for s in stops):
        # A turn no marker closes: the model ends it with the next turn's token.
        text += next(s for s, meaning in tpl.layout.stops.items() if meaning == "end")
    at, stop = min((text.find(s), s) for s in stops if s in text)
    return tpl.completion_ids(text[:at + len(stop)], vocab)


class _Work:
    """Ids the binding lexes or decodes, and Python lines run, while on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.ids = 0
        self.lines = 0
        lex, runs = TokenBinding.lex, TokenBinding.decode_runs

        def counted_lex(b: TokenBinding, ids: Sequence[int]) -> Any:
            self.ids += len(ids) if self.on else 0
            return lex(b, ids)

        def counted_runs(b: TokenBinding, rs: list[Sequence[int]]) -> Any:
            self.ids += sum(map(len, rs)) if self.on else 0
            return runs(b, rs)

        monkeypatch.setattr(TokenBinding, "lex", counted_lex)
        monkeypatch.setattr(TokenBinding, "decode_runs", counted_runs)

    def tracer(self, frame: FrameType, event: str, arg: Any) -> Any:
        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                self.lines += 1
            return local
        return local

    def at_stop(self, tpl: LayoutTemplate, vocab: Vocabulary, ids: list[int]) -> tuple[int, int, Any]:
        """The work of feeding the last id (the stop token) and closing."""
        s = tpl.stream(vocab)
        s.feed_many(ids[:-1])
        self.ids = self.lines = 0
        self.on = True
        sys.settrace(self.tracer)
        try:
            events = s.feed(ids[-1]) + s.close()
        finally:
            sys.settrace(None)
            self.on = False
        return self.ids, self.lines, events


@pytest.mark.parametrize("name", list(LAYOUT_BUILTIN))
def test_the_stop_token_costs_the_same_at_any_length(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tpl = xtml.load(name)
    assert isinstance(tpl, LayoutTemplate)
    vocab = byte_vocabulary(tpl.layout.tokens)
    work = _Work(monkeypatch)
    got = []
    for reps in (4, 16):
        ids = _answer(tpl, vocab, reps)
        n_ids, lines, events = work.at_stop(tpl, vocab, ids)
        # The work measured is the real end: the batch parse's message.
        end = [e.message for e in events if e.type == "message_end"]
        assert end == [tpl.parse(ids, vocab, completion=True, lenient=True)], name
        got.append((len(ids), n_ids, lines))
    (short, ids_1, lines_1), (long, ids_4, lines_4) = got
    assert long > 3 * short
    # No id is read again at the end, and four times the answer is the same
    # Python work there (within what a regular expression compiled again,
    # once the `re` module's cache has let it go, costs in a long process).
    assert ids_1 == ids_4 == 0, got
    assert lines_4 <= lines_1 * 1.25, got


@pytest.mark.parametrize("name", list(LAYOUT_BUILTIN))
def test_a_live_reader_holds_no_text_that_grows_with_the_answer(name: str) -> None:
    """The strings the reader that sends text as it comes keeps between
    tokens hold what it has not yet sent: the same at any length. (A string
    of all that was sent, added to at each token, is copied whole each
    time.)"""
    tpl = xtml.load(name)
    assert isinstance(tpl, LayoutTemplate)
    vocab = byte_vocabulary(tpl.layout.tokens)
    held = []
    for reps in (4, 16):
        ids = _answer(tpl, vocab, reps)
        s = tpl.stream(vocab)
        s.feed_many(ids[:-1])
        live = s._rich
        if live is None:
            pytest.skip(f"{name}'s answer is not read by a live reader")
        held.append(sum(len(v) for k in type(live).__slots__ if isinstance(v := getattr(live, k), str)))
    assert held[1] == held[0], held


def _lines(f: Any, *args: Any, **kwargs: Any) -> int:
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal count
            if event == "line":
                count += 1
            return local
        return local

    sys.settrace(tracer)
    try:
        f(*args, **kwargs)
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("name", list(LAYOUT_BUILTIN))
def test_a_parse_on_ids_does_python_work_per_token_not_per_character(name: str) -> None:
    """A prompt and an answer four times as long, with the same tokens: the
    same Python work (a loop over every character made it four times)."""
    tpl = xtml.load(name)
    assert isinstance(tpl, LayoutTemplate)
    vocab = byte_vocabulary(tpl.layout.tokens)
    lines = []
    for reps in (4, 16):
        req = {"messages": [{"role": "system", "content": TEXT * reps}, {"role": "user", "content": TEXT * reps},
                            {"role": "assistant", "content": TEXT * reps}, {"role": "user", "content": TEXT}]}
        prompt = tpl.encode(req, vocab)
        answer = _answer(tpl, vocab, reps)
        # (and warm; a format may trim content, as Llama 3.1's does)
        assert tpl.parse(prompt, vocab)["messages"][1]["content"] == tpl.normalize(req)["messages"][1]["content"]
        lines.append((_lines(tpl.parse, prompt, vocab), _lines(tpl.parse, answer, vocab, completion=True)))
    # Not equal to the line: a regular expression the `re` module's cache has
    # let go (in a long process) is compiled again by Python code.
    assert all(big <= small * 1.25 for small, big in zip(*lines, strict=True)), lines
