"""A layout stream's fast path for one id of content (``content_text``,
what the vLLM plugin calls per delta): where it takes an id, the text it
returns is the one event ``feed`` gives, and the stream goes on as if fed;
where it does not, nothing is fed."""

from __future__ import annotations

import random
from typing import Any

import pytest

import xtml
from xtml.chat.template_file import LAYOUT_BUILTIN
from xtml.template import LayoutTemplate
from xtml.vocab.vocabulary import byte_vocabulary


def _shown(e: Any) -> tuple[Any, ...]:
    return (e.type, e.channel, e.text, e.message, e.diagnostic, e.stop_reason)


@pytest.mark.parametrize("name", LAYOUT_BUILTIN)
def test_content_text_is_the_event_feed_gives(name: str) -> None:
    tpl = xtml.load(name)
    assert isinstance(tpl, LayoutTemplate)
    vocab = byte_vocabulary(tpl.layout.tokens)
    stops = list(tpl.layout.stops)
    pieces = [*tpl.layout.tokens, "Hello", " there", ", world.", "  ", "\n", "\n\n", "é", "中文", "{", "}",
              '{"name": "f", "arguments": {"a": 1}}', '{"name": "f", "parameters": {}}', "<think>", "</think>",
              "<tool_call>", "[TOOL_CALLS]", "functions.f:0"]
    rng = random.Random(name)
    taken = 0
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.7:
            text += rng.choice(stops)
        ids = tpl.completion_ids(text, vocab)
        fed = tpl.stream(vocab)
        want = [_shown(e) for t in ids for e in fed.feed(t)] + [_shown(e) for e in fed.close()]
        fast = tpl.stream(vocab)
        got: list[tuple[Any, ...]] = []
        for t in ids:
            s = fast.content_text(t)
            if s is None:
                got += [_shown(e) for e in fast.feed(t)]
            else:
                taken += 1
                got.append(("text", "response", s, None, None, None))
        got += [_shown(e) for e in fast.close()]
        assert got == want, text
    if name in ("smollm2", "llama-3.1", "qwen3", "kimi-k2", "kimi-k2-thinking", "glm-4.6", "mistral-small-3.1"):
        assert taken > 100  # plain content goes the fast way


def test_content_text_refuses_what_only_feed_reads() -> None:
    tpl = xtml.load("llama-3.1")
    vocab = byte_vocabulary(tpl.layout.tokens)
    stream = tpl.stream(vocab)
    ids = tpl.completion_ids("Hi there", vocab)
    # Nothing read yet (the message starts), then a bad id, a token, and a
    # byte of a character cut in two: each left to feed.
    assert stream.content_text(ids[0]) is None
    stream.feed(ids[0])
    assert stream.content_text(-1) is None
    assert stream.content_text(vocab.special_id("<|eot_id|>") or 0) is None
    assert stream.content_text(ids[1]) == "i"
    cut = vocab.encode_texts(["é"])[0]
    assert stream.content_text(cut[0]) is None
