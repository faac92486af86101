"""The assistant's channels as the dialect's data: ``[channels] order`` and
``[channels.holds]``, checked with located errors, and dialects that rename,
reorder or reassign their channels rendering and parsing back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import xtml
from xtml.chat.dialect import Channel
from xtml.testing.validate import validate

K3_TEXT = (Path(xtml.__file__).parent / "dialects" / "kimi-k3.toml").read_text(encoding="utf-8")
HOLDS_TABLE = '[channels.holds]\n# What each channel holds: reasoning_content, content, tool_calls.\n' \
              'think = "reasoning"\nresponse = "content"\ntools = "tool_calls"\n'

RICH = {
    "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "let me look", "reasoning_content": "use the tool",
         "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Oslo", "days": 2}}},
                        {"function": {"name": "raw", "arguments": "not json"}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "done"},
        {"role": "user", "content": "thanks"},
    ],
    "tools": [{"type": "function", "function": {"name": "get"}}, {"type": "function", "function": {"name": "raw"}}],
    "thinking": True,
}


def _write(tmp: Path, text: str, name: str = "d.toml") -> Path:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return path


def _line_of(text: str, needle: str, after: str = "") -> int:
    return text[: text.index(needle, text.index(after))].count("\n") + 1


def test_the_shipped_dialects_declare_their_channels_as_data() -> None:
    d = xtml.load("kimi-k3").dialect
    assert d.assistant_channels == (Channel("think", "think", "reasoning"), Channel("response", "response", "content"),
                                    Channel("tools", "tools", "tool_calls"))
    assert d.channel_order == ("think", "response", "tools") and d.channels() == ("think", "response", "tools")
    assert [d.channel_tag(k) for k in ("reasoning", "content", "tool_calls", "audio")] == [
        "think", "response", "tools", None]


def test_holds_defaults_when_the_table_is_absent(tmp_path: Path) -> None:
    assert HOLDS_TABLE in K3_TEXT
    bare = xtml.load(_write(tmp_path, K3_TEXT.replace(HOLDS_TABLE, ""))).dialect
    assert bare.assistant_channels == xtml.load("kimi-k3").dialect.assistant_channels


HOLDS_CASES: list[tuple[str, str, str, str, str]] = [
    # (id, old, new, key of the problem, in its message or hint)
    ("unknown kind", 'think = "reasoning"', 'think = "reasonin"', "channels.holds.think", "did you mean 'reasoning'?"),
    ("kind twice", 'tools = "tool_calls"', 'tools = "content"', "channels.holds.tools",
     "'content' is held by both 'response' and 'tools'"),
    ("channel missing", 'tools = "tool_calls"\n', "", "channels.holds", "add tools = 'tool_calls'"),
    ("unknown channel", 'tools = "tool_calls"', 'tool = "tool_calls"', "channels.holds.tool",
     "did you mean 'tools'?"),
    ("not a string", 'think = "reasoning"', "think = 1", "channels.holds.think", "must be a string"),
    ("not a table", HOLDS_TABLE, "", "channels.holds", "'holds' must be a table"),
    ("unknown channel in order", 'order = ["think", "response", "tools"]', 'order = ["think", "respons", "tools"]',
     "channels.order", "did you mean 'response'?"),
    ("channel listed twice", 'order = ["think", "response", "tools"]', 'order = ["think", "think", "tools"]',
     "channels.order", "listed twice"),
]


@pytest.mark.parametrize("case", HOLDS_CASES, ids=[c[0] for c in HOLDS_CASES])
def test_channel_declarations_are_checked_with_located_problems(case: tuple[str, str, str, str, str],
                                                                 tmp_path: Path) -> None:
    name, old, new, key, said = case
    assert old in K3_TEXT
    text = K3_TEXT.replace(old, new, 1)
    if name == "not a table":
        text = text.replace("[channels]\n", '[channels]\nholds = "all"\n', 1)
    path = _write(tmp_path, text)
    report = validate(path)
    found = [f for f in report.findings if f.key == key]
    assert found, report.findings
    f = found[0]
    assert said in f"{f.message}; {f.hint}"
    # Located at the key itself, or at the table when it is the key that is missing.
    leaf = key.rsplit(".", 1)[1]
    want = (_line_of(text, "[channels.holds]") if key == "channels.holds" and name != "not a table"
            else _line_of(text, f"\n{leaf} =", "[channels]") + 1)
    assert f.line == want
    with pytest.raises(xtml.TemplateError, match=rf"\(at {re.escape(str(path))}:\d+:\d+: {re.escape(key)}\)"):
        xtml.load(path)


def test_every_holds_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = K3_TEXT.replace('think = "reasoning"', 'think = "thoughts"').replace('tools = "tool_calls"', "")
    report = validate(_write(tmp_path, text))
    assert {f.key for f in report.findings} == {"channels.holds.think", "channels.holds"}


def test_the_prompt_may_not_open_a_channel_after_the_content_one(tmp_path: Path) -> None:
    # With the kinds reassigned, "content" is held by the tools channel: the
    # prompt opening think, written after it, could never reach content.
    text = K3_TEXT.replace('order = ["think", "response", "tools"]', 'order = ["response", "tools", "think"]')
    text = text.replace('response = "content"', 'response = "tool_calls"').replace('tools = "tool_calls"',
                                                                                    'tools = "content"')
    report = validate(_write(tmp_path, text))
    bad = [f for f in report.findings if f.key == "generation.thinking"]
    assert bad and "'tools', the channel holding content" in bad[0].message


def _renamed(order: str, holds: dict[str, str], plain: str = "response", thinking: str = "think") -> str:
    text = K3_TEXT
    for old, new in (('think = "think"', 'think = "analysis"'), ('response = "response"', 'response = "final"'),
                     ('tools = "tools"', 'tools = "commentary"'),
                     ('channels = ["think", "response", "tools"]', 'channels = ["analysis", "final", "commentary"]'),
                     ('order = ["think", "response", "tools"]', f"order = {order}"),
                     ('plain = "response"', f'plain = "{plain}"'), ('thinking = "think"', f'thinking = "{thinking}"')):
        assert old in text, old
        text = text.replace(old, new, 1)
    table = "[channels.holds]\n" + "".join(f'{k} = "{v}"\n' for k, v in holds.items())
    return text.replace(HOLDS_TABLE, table)


DEFAULT = {"think": "reasoning", "response": "content", "tools": "tool_calls"}


@pytest.mark.parametrize(("order", "holds", "plain", "thinking", "written"), [
    ('["think", "tools", "response"]', DEFAULT, "response", "think", ("analysis", "commentary", "final")),
    ('["tools", "think", "response"]', DEFAULT, "response", "think", ("commentary", "analysis", "final")),
    # The kinds move between the keys: "response" now names the reasoning.
    ('["response", "think", "tools"]', {"think": "content", "response": "reasoning", "tools": "tool_calls"},
     "think", "response", ("final", "analysis", "commentary")),
], ids=["tools-before-final", "tools-first", "kinds-reassigned"])
def test_renamed_and_reordered_channels_render_and_parse_back(order: str, holds: dict[str, str], plain: str,
                                                              thinking: str, written: tuple[str, ...],
                                                              tmp_path: Path) -> None:
    t = xtml.load(_write(tmp_path, _renamed(order, holds, plain, thinking)))
    d = t.dialect
    assert d.channels() == written
    assert {ch.holds: ch.tag for ch in d.assistant_channels} == {
        kind: {"think": "analysis", "response": "final", "tools": "commentary"}[k] for k, kind in holds.items()}
    m = t.markers
    text = t.render(RICH).text
    first = text[text.index('role="assistant"'):]
    first = first[: first.index(m.end)]
    at = [first.index(f"{m.open}{tag}{m.sep}") for tag in written]
    assert at == sorted(at), first
    for old in ("think", "response", "tools"):
        assert f"{m.open}{old}" not in text
    normal = t.normalize(RICH)
    assert t.parse(text) == normal
    msg = normal["messages"][1]
    assert list(msg) == ["role", "content", "reasoning_content", "tool_calls"]
    # Each kind is written in the channel holding it.
    for kind, said in (("reasoning", "use the tool"), ("content", "let me look"), ("tool_calls", "Oslo")):
        tag = d.channel_tag(kind)
        assert tag is not None
        inner = first[first.index(f"{m.open}{tag}{m.sep}"):]
        assert inner.index(said) < inner.index(f"{m.close}{tag}{m.sep}")


@pytest.mark.parametrize(("order", "holds", "plain", "thinking"), [
    ('["think", "tools", "response"]', DEFAULT, "response", "think"),
    ('["response", "think", "tools"]', {"think": "content", "response": "reasoning", "tools": "tool_calls"},
     "think", "response"),
], ids=["tools-before-final", "kinds-reassigned"])
def test_renamed_channels_stream_shape_and_constrain_as_data(order: str, holds: dict[str, str], plain: str,
                                                             thinking: str, tmp_path: Path,
                                                             vocab: xtml.Vocabulary) -> None:
    """The stream, the OpenAI chunks and the completion grammar read the
    channels from the dialect's data, not from their K3 names."""
    from xtml.serving.openai import ChunkStream

    t = xtml.load(_write(tmp_path, _renamed(order, holds, plain, thinking)))
    d = t.dialect
    user, answer = RICH["messages"][0], RICH["messages"][1]
    head = {"messages": [user], "tools": RICH["tools"], "thinking": True}
    prompt = t.render(head).text
    whole = t.render({**head, "messages": [user, answer], "add_generation_prompt": False}).text
    assert whole.startswith(prompt)
    ids = t.completion_ids(whole[len(prompt):], vocab)
    batch = t.parse(ids, vocab, completion=True, thinking=True)
    assert batch["reasoning_content"] == "use the tool" and batch["content"] == "let me look"
    assert [c["function"]["name"] for c in batch["tool_calls"]] == ["get", "raw"]

    stream = t.stream(vocab, thinking=True)
    events = [e for i in ids for e in stream.feed(i)] + stream.close()
    assert events[-1].type == "message_end" and events[-1].message == batch
    said = {tag: "".join(e.text or "" for e in events if e.type == "text" and e.channel == tag)
            for tag in d.channels()}
    assert said[d.channel_tag("reasoning")] == "use the tool"
    assert said[d.channel_tag("content")] == "let me look"
    assert [e.call["function"]["name"] for e in events if e.type == "tool_call_end" and e.call] == ["get", "raw"]

    chunks = ChunkStream(model="m", template=t)
    out = [*chunks.feed(events), *chunks.close()]
    deltas = [c["choices"][0]["delta"] for c in out if c.get("choices")]
    assert "".join(x.get("reasoning_content") or "" for x in deltas) == "use the tool"
    assert "".join(x.get("content") or "" for x in deltas) == "let me look"

    grammar = t.completion_grammar(head, vocab)
    for tag in d.channels():
        assert f'<|close|> "{tag}" <|sep|>' in grammar, tag
    for old in ("think", "response", "tools"):
        assert f'"{old}" <|sep|>' not in grammar, old


@pytest.mark.parametrize("thinking", [False, True])
def test_the_generation_prompt_is_recognised_as_built(thinking: bool) -> None:
    from xtml.chat.prompt import generation_prompt, is_generation_prompt
    from xtml.markup.nodes import Element, Text

    for t in (xtml.load("kimi-k3"), xtml.load("xtml-base")):
        d = t.dialect
        prompt = generation_prompt(d, thinking)
        assert is_generation_prompt(d, prompt, thinking)
        assert not is_generation_prompt(d, generation_prompt(d, not thinking), thinking) or \
            d.prompt_tag(True) == d.prompt_tag(False)
        assert not is_generation_prompt(d, Element(prompt.tag, prompt.attrs, prompt.children, closed=True), thinking)
        assert not is_generation_prompt(d, Element(prompt.tag, prompt.attrs, (*prompt.children, Text("x")),
                                                   closed=False), thinking)
