"""Hostile input: cost that grows faster than the input, and hostile templates.

Each path gets a large-but-fast input (a few MB) that must complete, and a
regression test of the instance that once cost quadratic time or crashed.
Nothing here is timed: tests count work (index builds, parser calls, problem
counts, message lengths), or run the old worst case in a subprocess whose
generous timeout is only a guard (bench/bench_scale.py measures the slopes).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xtml
import xtml.chat.request_size as request_size_module
import xtml.chat.template_file as dialect_mod
from xtml.chat.dialect import Body
from xtml.chat.keys import KeyIndex
from xtml.chat.request_size import MAX_CHARS, _walk_size, request_size
from xtml.chat.template_file import (
    MAX_NESTING,
    MAX_PROBLEMS,
    MAX_STRING_CHARS,
    MAX_TEMPLATE_BYTES,
    builtin_files,
    check_text,
)
from xtml.markup import reference as grammar
from xtml.markup.parse import QUOTE_LIMIT, build, excerpt, lex_text
from xtml.template import Template
from xtml.testing.validate import validate

K3 = xtml.load("kimi-k3")
K3_TEXT = builtin_files()["kimi-k3"].read_text(encoding="utf-8")
ROOT = Path(__file__).resolve().parent.parent
# Longest an error message may be when it quotes hostile input: the quote is
# cut to QUOTE_LIMIT characters, the rest is the message's own words.
SHORT = 400


def fresh() -> Template:
    """A template of its own, so that setting limits leaves the shared one alone."""
    return Template(K3.dialect)


def run_guarded(code: str, timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter; the timeout only guards against
    the quadratic behaviour coming back (which takes many minutes there)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def conversation(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for n in range(turns):
        body = f"({n}) Streaming parsers read model output as it is generated. " * 4
        msgs += [{"role": "user", "content": body},
                 {"role": "assistant", "content": body,
                  "tool_calls": [{"id": "c1", "type": "function",
                                  "function": {"name": "search", "arguments": {"q": f"query {n}"}}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": f"result {n}"}]
    return msgs


# -- large but fast: each path completes on a few MB -------------------------------------


@pytest.fixture(scope="module")
def big() -> tuple[dict[str, Any], str]:
    req = {"messages": conversation(3000), "add_generation_prompt": False}
    return req, K3.render(req).text


def test_render_and_strict_text_parse_of_two_megabytes(big: tuple[dict[str, Any], str]) -> None:
    req, text = big
    assert len(text) > 2_000_000
    assert K3.parse(text) == K3.normalize(req)


def test_encode_and_parse_ids_of_two_megabytes(big: tuple[dict[str, Any], str]) -> None:
    from tests.helpers.tokenizers import k3_vocab

    req, _ = big
    vocab = k3_vocab()
    ids = K3.encode(req, vocab)
    assert K3.parse(ids, vocab) == K3.normalize(req)


def test_lenient_parse_of_a_body_split_by_stray_markers() -> None:
    k = 40_000
    text = ('<|open|>message role="user"<|sep|>' + "x" * 42 + "<|sep|>" + ("y" * 42 + "<|sep|>") * k
            + "<|close|>message<|sep|><|end_of_msg|>")
    got = K3.parse(text, lenient=True)
    content = got["messages"][0]["content"]
    assert content == "x" * 42 + "<|sep|>" + ("y" * 42 + "<|sep|>") * k
    assert len(got["diagnostics"]) == k + 1
    assert all(len(d["message"]) < SHORT for d in got["diagnostics"])


def test_normalize_one_image_and_many_text_parts() -> None:
    parts = [{"type": "image"}] + [{"type": "text", "text": f"p{i} "} for i in range(100_000)]
    got = K3.normalize({"messages": [{"role": "user", "content": parts}]})
    content = got["messages"][0]["content"]
    assert content[0]["type"] == "image"
    assert content[1] == {"type": "text", "text": "".join(f"p{i} " for i in range(100_000))}
    assert len(content) == 2


def test_image_prompt_of_two_megabytes_is_matched() -> None:
    prompt = "<|media_begin|>image 28x28<|media_content|>" + "<|media_pad|>" * 150_000 + "<|media_end|>"
    req = {"messages": [{"role": "user", "content": [{"type": "image"}]}], "image_prompts": [prompt]}
    assert prompt in K3.render(req).text


def test_template_of_a_megabyte_of_unknown_keys_is_checked() -> None:
    line = "unknown_key_{} = 1\n"
    n = (MAX_TEMPLATE_BYTES - len(K3_TEXT)) // len(line.format(99999)) - 10
    text = K3_TEXT.replace("[template]\n", "[template]\n" + "".join(line.format(i) for i in range(n)), 1)
    assert len(text) <= MAX_TEMPLATE_BYTES
    d, problems = check_text(text, "big.toml")
    assert d is None
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[0].line == K3_TEXT[: K3_TEXT.index("[template]")].count("\n") + 2
    assert problems[-1].message == f"{n - MAX_PROBLEMS:,} more problems not listed"


# -- regression: the quadratic joins (guarded subprocesses) --------------------------------


def test_lenient_join_stays_linear() -> None:
    # 600,000 pieces: joining with += copied the body again for each one
    # (minutes); one join takes seconds.
    out = run_guarded("""
        import xtml
        k3 = xtml.load("kimi-k3")
        k = 600_000
        text = '<|open|>message role="user"<|sep|>' + "ab<|sep|>" * k + '<|close|>message<|sep|><|end_of_msg|>'
        got = k3.parse(text, lenient=True)
        print(len(got["messages"][0]["content"]))
    """)
    assert int(out) == 600_000 * len("ab<|sep|>")


def test_normal_form_join_stays_linear() -> None:
    out = run_guarded("""
        import xtml
        k3 = xtml.load("kimi-k3")
        parts = [{"type": "image"}] + [{"type": "text", "text": "ab"}] * 2_000_000
        got = k3.normalize({"messages": [{"role": "user", "content": parts}]})
        print(len(got["messages"][0]["content"][1]["text"]))
    """)
    assert int(out) == 4_000_000


# -- regression: strict text parse without per-header Lark runs ---------------------------


def test_strict_text_parse_runs_no_header_parser(monkeypatch: pytest.MonkeyPatch, big: tuple[dict[str, Any], str]
                                                 ) -> None:
    calls = []
    real = grammar.header_parser

    def counting(strict: bool = False) -> Any:
        calls.append(strict)
        return real(strict)

    monkeypatch.setattr(grammar, "header_parser", counting)
    _, text = big
    grammar.parse_lexemes(lex_text(text[:200_000].rpartition("<|end_of_msg|>")[0] + "<|end_of_msg|>",
                                   K3.markers))
    bad = '<|open|>message role="' + "a&amp;" * 10_000 + "<|sep|>x<|close|>message<|sep|><|end_of_msg|>"
    with pytest.raises(xtml.ParseError):
        grammar.parse_lexemes(lex_text(bad, K3.markers), source=bad)
    assert calls == []


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_long_headers_take_memory_linear_in_them() -> None:
    # The header patterns kept backtracking state per character of a value
    # (170 bytes each); possessive repeats keep none. Peak resident memory
    # is read in a fresh process, with its high-water mark reset first.
    out = run_guarded("""
        import re
        from pathlib import Path
        from xtml.markup.reference import _header_stop
        from xtml.markup.header import parse_header

        def high_water() -> int:
            return int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

        n = 20_000_000
        valid = 'message role="' + "a&amp;" * (n // 6) + '"'
        broken = valid[:-1]
        Path("/proc/self/clear_refs").write_text("5")
        base = high_water()
        assert parse_header(valid) is not None and parse_header(broken) is None
        _header_stop(broken)
        print((high_water() - base) / n)
    """)
    assert float(out) < 10


def test_malformed_header_error_is_located_in_the_document() -> None:
    text = ('<|open|>message role="user"<|sep|>hi\n<|close|>message<|sep|><|end_of_msg|>'
            '<|open|>message role="us"er"<|sep|>x<|close|>message<|sep|><|end_of_msg|>')
    with pytest.raises(xtml.ParseError, match="malformed tag header") as e:
        K3.parse(text)
    # Line 2, where the header stops being one: its offset inside the header
    # is added to where the header starts, not taken as a document offset.
    assert (e.value.line, e.value.column) == (2, text.split("\n")[1].index('er"') + 1)


# -- regression: quoted input in errors is capped --------------------------------------------


@pytest.mark.parametrize("lenient", [False, True])
def test_errors_quote_at_most_a_few_dozen_characters(lenient: bool) -> None:
    huge = "a" * 3_000_000
    cases = [
        '<|open|>message role="' + huge + "<|sep|>x<|close|>message<|sep|><|end_of_msg|>",  # malformed header
        "<|open|>" + huge + "<|sep|>x<|close|>b<|sep|><|end_of_msg|>",  # mismatched close
        "<|open|>m<|sep|>x<|close|>" + huge + "<|sep|><|end_of_msg|>",
        huge,  # stray text
        "<|open|>m<|sep|><|close|>m " + huge + '="v"<|sep|><|end_of_msg|>',  # close tag with attributes
    ]
    for text in cases:
        if lenient:
            doc = build(lex_text(text, K3.markers), lenient=True)
            assert doc.diagnostics and all(len(d.message) < SHORT for d in doc.diagnostics), doc.diagnostics
        else:
            with pytest.raises(xtml.ParseError) as e:
                K3.parse(text)
            assert len(str(e.value)) < SHORT


def test_strict_id_parse_errors_are_short_however_long_the_tags() -> None:
    """Ids take the tree builder, not the reference grammar: its errors name
    the open elements' path, which is cut as the quotes are."""
    from tests.helpers.tokenizers import k3_vocab

    huge = "a" * 300_000
    for text in ("<|open|>" + huge + "<|sep|>x<|close|>b<|sep|><|end_of_msg|>",
                 "<|open|>m<|sep|>" + ("<|open|>" + huge + "<|sep|>") * 8 + "<|close|>b<|sep|><|end_of_msg|>"):
        ids = K3.completion_ids(text, k3_vocab())
        with pytest.raises(xtml.ParseError) as e:
            K3.parse(ids, k3_vocab())
        assert len(str(e.value)) < SHORT, str(e.value)[:500]


def test_excerpt() -> None:
    """Quoted input is cut to a bounded length and says how long it was; a
    string is cut before it is quoted (its repr costs as much as it)."""
    assert excerpt("abc") == "'abc'"
    cut = excerpt("x" * 1000)
    assert cut == repr("x" * QUOTE_LIMIT) + "… (1,000 characters)"
    shown = excerpt(list(range(1000)))
    assert shown.startswith(repr(list(range(1000)))[:QUOTE_LIMIT]) and shown.endswith("characters)")
    assert len(shown) < QUOTE_LIMIT + 30
    big = "y" * 50_000_000
    assert len(excerpt(big)) < QUOTE_LIMIT + 30


def test_template_problems_quote_little() -> None:
    key = "k" * 50_000
    text = K3_TEXT.replace("[template]\n", f"[template]\n{key} = 1\n", 1)
    _, problems = check_text(text, "t.toml")
    assert problems and len(problems[0].message) < SHORT and len(problems[0].where("t.toml")) < SHORT


# -- regression: problems located against one line index -------------------------------------


def test_problems_are_located_with_one_index(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []

    class Counting(KeyIndex):
        def __init__(self, text: str) -> None:
            built.append(len(text))
            super().__init__(text)

    monkeypatch.setattr(dialect_mod, "KeyIndex", Counting)
    text = K3_TEXT.replace("[template]\n", "[template]\n" + "".join(f"u{i} = 1\n" for i in range(150)), 1)
    _, problems = check_text(text, "t.toml")
    assert len(problems) == 150 and len(built) == 1
    first = K3_TEXT[: K3_TEXT.index("[template]")].count("\n") + 2
    assert [p.line for p in problems] == list(range(first, first + 150))


def test_key_index_agrees_with_a_plain_search() -> None:
    index = KeyIndex(K3_TEXT)
    lines = K3_TEXT.splitlines()
    assert index.locate("markers.open") == (next(i for i, s in enumerate(lines, 1) if s.startswith("open =")), 1)
    assert index.locate("markers.embed_begin[0]") == index.locate("markers.embed_begin")
    assert index.locate("markers.nope") == index.locate("markers")
    assert index.locate("nope.at.all") is None


# -- media prompts: formats that read one way, never a template's regular expression ---------

K3_PROMPT = "<|media_begin|>image {width}x{height}<|media_content|>{pads}<|media_end|>"
OLD_K3_PROMPT = (r"^<\|media_begin\|>image (?P<width>[0-9]+)x(?P<height>[0-9]+)<\|media_content\|>"
                 r"(?:<\|media_pad\|>)*<\|media_end\|>$")


def _with_image(tmp_path: Path, lines: str) -> Path:
    """K3 with its image prompt and pad lines replaced by ``lines``."""
    text, n = re.subn(r'(?m)^prompt = ".*"\npad = ".*"$', lambda _: lines, K3_TEXT, count=1)
    assert n == 1
    path = tmp_path / "t.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _line_of(path: Path, start: str) -> int:
    return next(i for i, s in enumerate(path.read_text().splitlines(), 1) if s.startswith(start))


def test_a_regex_prompt_is_refused_with_the_format_to_write(tmp_path: Path) -> None:
    path = _with_image(tmp_path, f"prompt = '{OLD_K3_PROMPT}'")
    line = _line_of(path, "prompt =")
    with pytest.raises(xtml.TemplateError) as e:
        xtml.load(path)
    assert f"{path}:{line}:1: plugins.image.prompt" in str(e.value)
    assert "not a regular expression" in e.value.msg
    assert f'prompt = "{K3_PROMPT}" and pad = "<|media_pad|>"' in e.value.msg
    report = validate(path, examples=0)
    assert [(f.line, f.key) for f in report.findings] == [(line, "plugins.image.prompt")]
    # What the message says to write loads, and is what K3 ships.
    fixed = _with_image(tmp_path, f'prompt = "{K3_PROMPT}"\npad = "<|media_pad|>"')
    assert xtml.load(fixed).dialect.image_prompt.pattern == xtml.load().dialect.image_prompt.pattern


def test_a_regex_prompt_with_another_pad_names_the_pad_to_write(tmp_path: Path) -> None:
    path = _with_image(tmp_path, f"prompt = '{OLD_K3_PROMPT}'\npad = \"<|media_content|>\"")
    with pytest.raises(xtml.TemplateError, match=r'pad = "<\|media_pad\|>" \(not "<\|media_content\|>"\)'):
        xtml.load(path)


@pytest.mark.parametrize("pattern", [r"^(a|aa)+$", r"^<\|media_begin\|>image \d+x\d+(?:<\|media_pad\|>)*$",
                                     r"(?P<width>[0-9]+)x(?P<height>[0-9]+)(?:a|b)*"])
def test_a_regex_prompt_without_a_format_equivalent_is_refused(tmp_path: Path, pattern: str) -> None:
    path = _with_image(tmp_path, f"prompt = '{pattern}'\npad = \"<|media_pad|>\"")
    line = _line_of(path, "prompt =")
    with pytest.raises(xtml.TemplateError, match=r"a format, not a regular expression: write the prompt as the "
                       r"processor writes it, with \{width\}, \{height\} and \{pads\}") as e:
        xtml.load(path)
    assert f"{path}:{line}:1: plugins.image.prompt" in str(e.value)


def test_the_former_size_prompt_is_refused_at_its_line(tmp_path: Path) -> None:
    path = _with_image(tmp_path, f'prompt = "{K3_PROMPT}"\npad = "<|media_pad|>"\nsize_prompt = "{K3_PROMPT}"')
    line = _line_of(path, "size_prompt =")
    with pytest.raises(xtml.TemplateError, match="write_prompts = true") as e:
        xtml.load(path)
    assert f"{path}:{line}:1: plugins.image.size_prompt" in str(e.value)


@pytest.mark.parametrize("prompt, pad, key", [
    ("<|media_begin|>{width}{height}{pads}<|media_end|>", "<|media_pad|>", "prompt"),
    ("<|media_begin|>{width}5x{height}{pads}<|media_end|>", "<|media_pad|>", "prompt"),
    ("<|media_begin|>{width}x{height}.{pads}<|media_end|>", "<|media_pad|>", "prompt"),
    ("<|media_begin|>{width}x{height}<|media_content|>{pads}", "1", "pad"),
])
def test_prompt_formats_that_read_two_ways_are_refused(tmp_path: Path, prompt: str, pad: str, key: str) -> None:
    path = _with_image(tmp_path, f'prompt = "{prompt}"\npad = "{pad}"')
    with pytest.raises(xtml.TemplateError, match="digit or a point") as e:
        xtml.load(path)
    assert f"{path}:{_line_of(path, key + ' =')}:1: plugins.image.{key}" in str(e.value)


def test_prompt_patterns_read_hostile_prompts_in_linear_time() -> None:
    import time

    for name in ("kimi-k3", "xtml-base"):
        pattern = xtml.load(name).dialect.image_prompt
        n = 200_000
        # Long numbers, a number where the pads go, pads where the end goes:
        # each fails late, and would backtrack under a pattern that reads
        # the text two ways.
        for text in ("<|media_begin|>image " + "1" * n + "x" + "1" * n + "<|media_content|>" + "<|media_pad|>" * n,
                     "<|x_media|>image " + "9" * n + "x" + "9" * n + "<|x_pad|>" * n + "<|x_media_end|>!",
                     "<|media_begin|>image 2x2<|media_content|>" + "<|media_pad|>" * n + "<|media_pad|"):
            start = time.perf_counter()
            assert pattern.match(text) is None
            assert time.perf_counter() - start < 2.0


# -- internal message bodies: matched without a regular expression ----------------------------


def _reference(source: str, text: str) -> dict[str, str] | None:
    rx, pos = [], 0
    for m in re.finditer(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}", source):
        rx.append(re.escape(source[pos : m.start()]))
        tok = m.group(0)
        rx.append(re.escape(tok[0]) if tok in ("{{", "}}") else f"(?P<{m.group(1)}>.*)")
        pos = m.end()
    rx.append(re.escape(source[pos:]))
    pat = re.compile("".join(rx), re.DOTALL)
    got = pat.fullmatch(text)
    if got is None and text != text.strip():
        got = pat.fullmatch(text.strip())
    return None if got is None else got.groupdict()


piece = st.lists(st.sampled_from(["x", "y", " ", "{{", "}}", "\n"]), max_size=4).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.permutations(["a", "b", "c"]).flatmap(lambda names: st.integers(0, 3).map(lambda k: names[:k])),
       st.lists(piece, min_size=4, max_size=4), st.text(alphabet="xy{} \n", max_size=12), st.booleans(),
       st.lists(st.text(alphabet="xy{} ", max_size=4), min_size=3, max_size=3))
def test_body_match_is_the_regular_expression_match(names: list[str], parts: list[str], text: str, rendered: bool,
                                                    values: list[str]) -> None:
    source = parts[0] + "".join("{" + n + "}" + parts[i + 1] for i, n in enumerate(names))
    body = Body.compile(source, "")
    if rendered:
        text = body.render(**dict(zip(names, values)))
    assert body.match(text) == _reference(source, text)


def test_body_match_of_a_huge_text_is_linear() -> None:
    body = K3.dialect.system["tool-declare"].body
    tools = "[" + ",".join(['{"x": 1}'] * 200_000) + "]"
    assert body.match(body.render(tools=tools)) == {"tools": tools}


# -- the size limit -------------------------------------------------------------------------


def test_request_size_limit() -> None:
    t = fresh()
    req = {"messages": [{"role": "user", "content": "hello world"}]}
    assert t.max_chars == MAX_CHARS == 64 << 20
    with pytest.raises(xtml.RequestError, match=r"at least \d+ characters, more than max_chars=10"):
        t.render(req, max_chars=10)
    t = t.replace(max_chars=10)
    for call in (t.render, t.normalize, t.document):
        with pytest.raises(xtml.RequestError, match="max_chars=10"):
            call(req)
    assert t.render(req, max_chars=1000).text
    t = t.replace(max_chars=None)
    assert t.render(req).text
    # The request cannot set its own limit.
    with pytest.raises(xtml.RequestError):
        t.render({**req, "max_chars": 10**9})
    with pytest.raises(xtml.RequestError):
        t.render({**req, "chat_template_kwargs": {"max_chars": 10**9}})


def test_request_size_counts_every_string() -> None:
    req = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 1000}]}],
           "tools": [{"type": "function", "function": {"name": "f" * 500}}]}
    assert request_size(req, 10**9) > 1500
    assert request_size(req, 100) > 100
    shared = {"role": "user", "content": "y" * 100}
    assert request_size({"messages": [shared] * 1000}, 10**9) > 100_000


def test_request_size_counts_models_as_what_they_dump() -> None:
    """Request and message models (pydantic, as SDKs give them) count as
    the dicts they render from, not as one value each."""
    from pydantic import BaseModel

    class Message(BaseModel):
        role: str
        content: str

    class Request(BaseModel):
        messages: list[Message]

    big = Message(role="user", content="x" * 100_000)
    for req in ({"messages": [big]}, Request(messages=[big]), [big]):
        assert request_size(req, 10**9) > 100_000
        with pytest.raises(xtml.RequestError, match="more than max_chars=1,000"):
            K3.render(req, max_chars=1000)
    assert "x" * 100 in K3.render(Request(messages=[Message(role="user", content="x" * 100)])).text


def test_request_size_of_a_tool_list_seen_before_is_the_same() -> None:
    """The size of a tool list is kept by its marshal bytes: the same list
    again (a new object) counts the same, a changed one is walked anew, and
    a list past the limit is refused whether known or not."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "description": "d" * 300}}}}}]
    req = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    first = request_size(req, 10**9)
    assert first == _walk_size(req, 10**9) > 300
    # Seen again, as a server sees it (decoded anew from the same JSON), the
    # list itself is not walked: only the rest of the request.
    assert request_size(json.loads(json.dumps(req)), 10**9) == first
    walked: list[Any] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(request_size_module, "_walk_size", lambda v, *a: walked.append(v) or _walk_size(v, *a))
        assert request_size(json.loads(json.dumps(req)), 10**9) == first
    assert walked and all(isinstance(v, dict) and "tools" not in v for v in walked)
    longer = json.loads(json.dumps(req))
    longer["tools"][0]["function"]["name"] = "fg"
    assert request_size(longer, 10**9) == first + 1
    for _ in range(2):
        with pytest.raises(xtml.RequestError, match="more than max_chars=200"):
            K3.render(req, max_chars=200)


def test_request_that_contains_itself_ends_in_an_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(xtml.RequestError, match="nested too deeply"):
        request_size(loop, 10**9)
    with pytest.raises(xtml.RequestError):
        K3.render({"messages": [{"role": "user", "content": loop}]})


def test_parse_size_limit() -> None:
    t = fresh()
    text = '<|open|>message role="user"<|sep|>hi\n<|close|>message<|sep|><|end_of_msg|>' * 3
    assert t.parse(text)["messages"]
    with pytest.raises(xtml.ParseError, match=f"{len(text):,} characters long, more than max_chars=100") as e:
        t.parse(text, max_chars=100)
    assert (e.value.offset, e.value.line) == (100, 2)
    with pytest.raises(xtml.ParseError, match="max_chars=100"):
        t.parse(text, max_chars=100, lenient=True)
    t = t.replace(max_chars=5)
    with pytest.raises(xtml.ParseError, match="token ids long"):
        t.parse(list(range(10)), object())
    assert t.parse(text, max_chars=10**6)["messages"]


# -- templates: nesting, sizes, hostile files -------------------------------------------------


def _write(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(K3_TEXT + "\n" + extra, encoding="utf-8")
    return path


HOSTILE = {
    "deep array": ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
    "deep inline table": ("x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n", "nested more than"),
    "deep table": ("[" + ".".join(["a"] * 50_000) + "]\nb = 1\n", "dotted parts"),
    "deep dotted key": (".".join(["a"] * 50_000) + " = 1\n", "dotted parts"),
    "deep numeric key": (".".join(["1"] * 50_000) + " = 1\n", "dotted parts"),
    "huge string": ('x = "' + "a" * (MAX_STRING_CHARS + 10) + '"\n', "string longer than"),
    "huge multi-line string": ('x = """' + "a\n" * MAX_STRING_CHARS + '"""\n', "string longer than"),
    "huge key": ("a" * (MAX_STRING_CHARS + 10) + " = 1\n", "key longer than"),
    "huge file": ("# " + "x" * MAX_TEMPLATE_BYTES + "\n", "characters long, more than"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_a_located_template_error(tmp_path: Path, name: str) -> None:
    extra, message = HOSTILE[name]
    path = _write(tmp_path, extra)
    with pytest.raises(xtml.TemplateError, match=message) as e:
        xtml.load(path)
    assert str(path) in str(e.value) and len(str(e.value)) < SHORT
    if name != "huge file":
        assert f"{path}:{K3_TEXT.count(chr(10)) + 2}:" in str(e.value)


def test_validate_reports_a_deep_template_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from xtml.cli.main import main

    path = _write(tmp_path, "x = " + "[" * 3000 + "]" * 3000 + "\n")
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr()
    problems = [line for line in out.out.splitlines() if line.startswith(str(path) + ":")]
    assert len(problems) == 2 and "nested more than" in problems[0] and "1 problem" in problems[1]
    assert "Traceback" not in out.err and len(out.err.splitlines()) <= 1


def _nested(depth: int, kind: str) -> str:
    if kind == "array":
        return "[" * depth + "1" + "]" * depth
    return "{a = " * depth + "1" + "}" * depth


@pytest.mark.parametrize("kind", ["array", "table"])
def test_nesting_within_the_limit_is_read(kind: str) -> None:
    text = K3_TEXT + "\n[plugins.image.deep]\n"  # read as TOML, then refused as an unknown key
    ok = text + f"x = {_nested(MAX_NESTING - 6, kind)}\n"
    assert dialect_mod._toml_bounds(ok) is None
    tomllib.loads(ok)
    deep = text + f"x = {_nested(MAX_NESTING + 1, kind)}\n"
    bound = dialect_mod._toml_bounds(deep)
    assert bound is not None and "nested more than" in bound.message


toml_scalar = st.one_of(st.integers(-5, 5), st.booleans(), st.text(alphabet='ab"\\\'[]{}#=.,\n ', max_size=6),
                        st.floats(allow_nan=False, allow_infinity=False, width=32))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f'"{k}".x = {_toml_value(x)}' for k, x in v.items()) + "}"
    return repr(v)


def _depth(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 2 + max((_depth(x) for x in v.values()), default=0)
    return 0


toml_values = st.recursive(toml_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b.c", "]"]), inner, max_size=2)),
    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(toml_values)
def test_bounds_scan_agrees_with_the_toml_reader(value: Any) -> None:
    text = f"[t]\nk.v = {_toml_value(value)}\n# [[[ {{{{ \"\n"
    assert tomllib.loads(text)["t"]["k"]["v"] is not None
    bound = dialect_mod._toml_bounds(text)
    depth = 3 + _depth(value)
    if depth <= MAX_NESTING - 1:
        assert bound is None, (text, bound)
    elif depth > MAX_NESTING + 1:
        assert bound is not None


# -- random and mutated template files: only TemplateError ----------------------------------

TOML_BITS = ["[", "]", "[[", "]]", "{", "}", "=", ",", ".", '"', "'", '"""', "'''", "\n", "#", " ", "a", "1",
             "true", "x.y", "[plugins.image]", "prompt = ", "(a|aa)+", "\\", "[markers]", "open = "]


@st.composite
def template_texts(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return "".join(draw(st.lists(st.sampled_from(TOML_BITS), max_size=60)))
    name = draw(st.sampled_from(["kimi-k3", "xtml-base"]))
    text = builtin_files()[name].read_text(encoding="utf-8")
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 40))
        text = text[:at] + "".join(draw(st.lists(st.sampled_from(TOML_BITS), max_size=4))) + text[at + cut:]
    return text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(template_texts())
def test_random_template_files_load_or_raise_template_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "random.toml"
    path.write_text(text, encoding="utf-8")
    try:
        xtml.load(path)
    except xtml.TemplateError as e:
        assert len(str(e)) < 2000
