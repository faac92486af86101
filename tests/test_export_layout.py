"""The Jinja export of layout dialects (``xtml export jinja|hf -t smollm2``),
rendered by three engines' own template engines (transformers' jinja2,
``@huggingface/jinja``, llama.cpp's): xtml's text, or a raise with xtml's
message.

As for the XTML export (tests/test_export_jinja.py, whose harness this
reuses), the expected text is xtml's render of what the engine hands the
template, read back by a probe template in the same render: each engine
changes requests before a template sees them (None keys dropped, arguments
parsed or dumped, reasoning aliased), and the claim is that the exported
template renders what xtml renders from the same input.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import pytest

import xtml
from tests.helpers.cli import run
from tests.helpers.families import chatml_requests, smollm2_gguf, spells_marker
from tests.helpers.family_requests import family_requests
from tests.helpers.jinja_engines import ENGINES, need_engine, render_all
from tests.helpers.jinja_probe import SAYS, handed, strings, toml, xtml_render
from tests.helpers.layout_export import HOSTILE_TEXT, INJECT_DQ, INJECT_SQ, braced, hostile_requests, outcomes, probe_of
from xtml.chat.template_file import builtin_files
from xtml.exports.jinja import jinja_template

pytestmark = pytest.mark.engines

PER_DIALECT = 300
ROLES = {"smollm2": ("system", "user", "assistant", "tool", "developer"),
         "qwen3": ("system", "user", "assistant", "tool")}
FAMILY = ("kimi-k2", "kimi-k2-thinking", "llama-3.1", "deepseek-v3.1")
"""Dialects whose requests tests/helpers/family_requests.py generates."""
DIALECTS = (*ROLES, *FAMILY)


@cache
def corpus(name: str) -> list[dict[str, Any]]:
    """The generated requests of the family tests (tools, parallel calls,
    grouped tool results, reasoning under its three names, enable_thinking
    as a keyword, content parts, missing content, marker spellings in text,
    requests ending in an assistant message, with and without a generation
    prompt), without the empty conversations every engine refuses itself;
    for the Kimi dialects, their own generator's (ids given and made, call
    sections, named roles, images, reasoning)."""
    if name in FAMILY:
        return [{**c["request"], **c["options"]} for c in family_requests(name, PER_DIALECT)]
    reqs = chatml_requests(3, PER_DIALECT + PER_DIALECT // 40, roles=ROLES[name], thinking=name == "qwen3")
    return [r for r in reqs if r["messages"]][:PER_DIALECT]


@pytest.mark.parametrize("name", DIALECTS)
@pytest.mark.parametrize("engine", ENGINES)
def test_the_template_renders_what_xtml_renders(engine: str, name: str) -> None:
    need_engine(engine)
    tpl = xtml.load(name)
    got = outcomes(engine, tpl, corpus(name))
    counts = got["counts"]
    print(f"{name} {engine}: {dict(counts)}")
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    assert counts["equal"] >= PER_DIALECT * 2 // 3, dict(counts)
    assert sum(counts[k] for k in ("equal", "both refuse", "both refuse content as parts",
                                   "the engine refuses the request")) == PER_DIALECT, dict(counts)
    # llama-server rebuilds every message (content "" for none, parts
    # joined): what the template would refuse, it refuses itself or mends.
    refuses = ("both refuse",) if engine != "llamacpp" and name in ROLES else ()
    wanted = {"smollm2": ("default system prompt", *refuses),
              "qwen3": ("tools", "calls", "grouped results", "reasoning shown", "reasoning cut before the last query",
                        "enable_thinking", *refuses),
              "kimi-k2": ("tools", "calls"),
              "kimi-k2-thinking": ("tools", "calls", "reasoning cut before the last query"),
              "llama-3.1": ("tools", "calls", "built-in calls", "tools in the user message", "tools in the system turn",
                            "tool results", "keyword arguments", "both refuse"),
              "deepseek-v3.1": ("calls", "system prompts hoisted", "thinking", "tool results", "content cut",
                                "enable_thinking")}[name]
    for feature in wanted:
        # Built-in tools are called in few of Llama's requests (the options must name them).
        assert counts[feature] >= (5 if feature == "built-in calls" else 10), (feature, dict(counts))


def test_refusals_say_what_xtml_says() -> None:
    """Each declared refusal of the two dialects, and the checks of the
    request reader, raise in the template with xtml's message."""
    user = {"role": "user", "content": "hi"}
    call = {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("smollm2", {"messages": [user, {"role": "assistant", "tool_calls": [call]}]}),
        ("smollm2", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
        ("smollm2", {"messages": [{"role": "robot", "content": "x"}]}),
        ("smollm2", {"messages": [{"role": "it's", "content": "x"}]}),
        ("smollm2", {"messages": [{"role": "user", "content": "x", "colour": "red"}]}),
        ("smollm2", {"messages": [{"role": "user", "content": 3}]}),
        ("smollm2", {"messages": [{"content": "x"}]}),
        ("qwen3", {"messages": [user], "enable_thinking": "yes"}),
        ("qwen3", {"messages": [user], "tools": {"type": "function"}}),
        ("qwen3", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": {"a": 1}}]}),
        ("qwen3", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": ["x"]}]}),
        ("qwen3", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [{"function": 3}]}]}),
        ("qwen3", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]}),
        ("qwen3", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": 3}}]}]}),
        ("qwen3", {"messages": [user, {"role": "assistant", "content": "x", "reasoning_content": ["x"]}]}),
        ("qwen3", {"messages": [user, {"role": "tool", "content": [{"type": "text", "text": "x"}]}]}),
        ("qwen3", {"messages": [user], "continue_final_message": False, "add_generation_prompt": "yes"}),
        # A format of turns: one call per turn, built-in calls' arguments,
        # the text options, the user message the tools go into.
        ("llama-3.1", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [call, call]}]}),
        ("llama-3.1", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": []}]}),
        ("llama-3.1", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "brave_search", "arguments": "{}"}}]}], "builtin_tools": ["brave_search"]}),
        ("llama-3.1", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "brave_search", "arguments": {"query": 3}}}]}], "builtin_tools": ["brave_search"]}),
        ("llama-3.1", {"messages": [user], "date_string": 3}),
        ("llama-3.1", {"messages": [user], "builtin_tools": "brave_search"}),
        ("llama-3.1", {"messages": [user], "builtin_tools": ["a", 1]}),
        ("llama-3.1", {"messages": [{"role": "system", "content": "s"}], "tools": [], "tools_in_user_message": True}),
        ("llama-3.1", {"messages": [{"role": "tool", "content": [{"type": "text", "text": "x"}]}], "tools": []}),
        ("llama-3.1", {"messages": [user, {"role": "tool"}]}),
        ("llama-3.1", {"messages": [{"role": "robot", "content": "x"}]}),
        # Hoisted system prompts, message flags, string arguments, an alias.
        ("deepseek-v3.1", {"messages": [user, {"role": "assistant", "content": "x", "prefix": "yes"}]}),
        ("deepseek-v3.1", {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [call]}]}),
        ("deepseek-v3.1", {"messages": [user], "enable_thinking": "yes"}),
        ("deepseek-v3.1", {"messages": [user], "thinking": "yes", "enable_thinking": True}),
        ("deepseek-v3.1", {"messages": [{"role": "system"}, user]}),
    ]
    checked = 0
    for engine in SAYS:
        need_engine(engine)
        for name in DIALECTS:
            tpl = xtml.load(name)
            requests = [r for n, r in cases if n == name]
            got = render_all(engine, jinja_template(tpl.dialect), requests)
            probes = render_all(engine, probe_of(name), requests)
            for request, out, probe in zip(requests, got, probes, strict=True):
                with pytest.raises(xtml.XtmlError):
                    tpl.render(request)
                seen = handed(probe)
                if seen is None:
                    continue  # the engine refuses it before any template runs
                want, why = xtml_render(tpl, seen)
                if want is not None:  # the engine made it one xtml renders
                    assert out.text == want, (engine, request, seen, out)
                    continue
                checked += 1
                assert out.text is None and out.error is not None, (engine, request, out)
                assert out.error.endswith(why or "?"), (engine, request, out.error, why)
    # transformers refuses a tools object itself, and makes add_generation_prompt a boolean.
    assert checked >= 2 * len(cases) - 3, checked


def test_what_the_engines_pass_as_kwargs_is_read() -> None:
    """enable_thinking as a template keyword (transformers passes keyword
    arguments through, llama.cpp takes chat_template_kwargs): false closes
    the reasoning block of the generation prompt, as xtml's render."""
    tpl = xtml.load("qwen3")
    user = {"role": "user", "content": "hi"}
    requests = [{"messages": [user], "add_generation_prompt": True, "enable_thinking": v} for v in (True, False)]
    got = render_all("transformers", jinja_template(tpl.dialect), requests)
    assert [g.text for g in got] == [tpl.render(r).text for r in requests]
    assert got[1].text is not None and got[1].text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_message_conditions_and_flags_are_read() -> None:
    """deepseek-v3.1's frames ask of each message what came before it, its
    calls and its prefix flag, and its content is cut at the first </think>
    unless it follows a tool result or has calls: each combination renders
    as xtml's, thinking given as itself or by its alias."""
    tpl = xtml.load("deepseek-v3.1")
    user = {"role": "user", "content": "q"}
    call = {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}
    requests = []
    for prefix in (True, False):
        for calls in ([], [call]):
            for before in ([user], [user, {"role": "assistant", "content": "", "tool_calls": [call]},
                                    {"role": "tool", "content": "r"}]):
                for kw in ({"thinking": True}, {"enable_thinking": True}, {"thinking": False, "enable_thinking": True}):
                    answer: dict[str, Any] = {"role": "assistant", "content": "r</think>a</think>b", "prefix": prefix}
                    if calls:
                        answer["tool_calls"] = calls
                    requests.append({"messages": [*before, answer], "add_generation_prompt": False, **kw})
    want = [tpl.render(r).text for r in requests]
    assert len(set(want)) >= 5 and any("<think>r</think>" not in w and w.endswith("a</think>b<｜end▁of▁sentence｜>")
                                       for w in want)
    for engine in SAYS:
        need_engine(engine)
        got = render_all(engine, jinja_template(tpl.dialect), requests)
        assert [g.text for g in got] == want, engine


# -- the codecs the engines' string methods do not agree on ------------------------------------

SMOLLM2 = builtin_files(layout=True)["smollm2"].read_text(encoding="utf-8")
QWEN3 = builtin_files(layout=True)["qwen3"].read_text(encoding="utf-8")
LLAMA = builtin_files(layout=True)["llama-3.1"].read_text(encoding="utf-8")
DEEPSEEK = builtin_files(layout=True)["deepseek-v3.1"].read_text(encoding="utf-8")


def test_every_codec_renders_as_python_strips(tmp_path: Path) -> None:
    """``strip_nl``, ``lstrip_nl``, ``rstrip_nl`` and ``trim`` in each
    engine as Python's str methods: @huggingface/jinja's strip methods take
    no characters and strip JavaScript's white space, so the template
    strips by its own macros."""
    body = "[{content|trim}|{content|strip_nl}|{content|lstrip_nl}|{content|rstrip_nl}]"
    path = tmp_path / "codecs.toml"
    path.write_text(SMOLLM2 + f"\n[roles.body]\nuser = {toml(body)}\n", encoding="utf-8")
    tpl = xtml.load(str(path))
    contents = ["", "\n", "\n\n", " x ", "\n\n a \n b\n\n", "\u3000\u00a0x\u2028\u0085 ", "\t\r\nx\r\n\t",
                "\x1c\x1dx\x1e\x1f", "\ufeffx\ufeff", "a\n\nb", "\n \n",
                # Past ASCII, whose bytes llama.cpp's engine reads one by one.
                "naïve café — 日本語 🙂", "\u3000🙂\u3000", " \u205f\u2002x\u2002 ", "\u2028é\u0085"]
    requests = [{"messages": [{"role": "user", "content": c}], "add_generation_prompt": True} for c in contents]
    want = [tpl.render(r).text for r in requests]
    assert "[x|\u3000\u00a0x\u2028\u0085 |" in "".join(want)
    for engine in ("transformers", "hfjs", "llamacpp"):
        need_engine(engine)
        got = render_all(engine, jinja_template(tpl.dialect), requests, chat_parsing=False)
        assert [g.text for g in got] == want, (engine, got)


# -- hostile dialect text ----------------------------------------------------------------------
#
# A dialect file's text is data (SECURITY.md): the export spells each string
# of it as a string literal cut at braces, so no name, token, role, prose of
# a pattern or default system prompt makes the template run anything or
# render other text than xtml's. Each dialect below is qwen3 (or smollm2)
# with text that would close a comment, a string or a block, or match what
# an engine rewrites in a template's source before it reads it.

def _set(text: str, key: str, value: str, nth: int = 0) -> str:
    lines = list(re.finditer(rf"(?m)^{re.escape(key)} = .*$", text))
    at = lines[nth]
    return text[:at.start()] + f"{key} = {toml(value)}" + text[at.end():]


def _hostile() -> dict[str, str]:
    q = QWEN3
    patterns = _set(q, "open", "<|im_start|>{role}" + braced(HOSTILE_TEXT) + "\n", nth=1)
    patterns = _set(patterns, "open", "<|im_start|>user" + braced(INJECT_SQ), nth=0)
    patterns = _set(patterns, "assistant", "{?show_reasoning}<think>\n{reasoning|strip_nl}\n</think>"
                    + braced(HOSTILE_TEXT) + "{content|lstrip_nl}{/}{!show_reasoning}{content}{/}{calls}")
    patterns = _set(patterns, "each", "\n" + braced(INJECT_DQ) + "{tool}")
    patterns = _set(patterns, "body", "<|im_start|>assistant\n" + braced(HOSTILE_TEXT)
                    + "{!enable_thinking}<think>\n\n</think>\n\n{/}")
    # Tokens spelt with what closes a block or a comment: the token list
    # holds them as they are, the patterns with their braces doubled.
    head, _, rest = q.partition("\nadded = ")
    line, _, rest = rest.partition("\n")
    tokens = (head + "\nadded = " + line.replace("<tool_call>", "<tool_call{%-x-%}>").replace(
        "</tool_call>", "</tool_call#}>") + "\n"
              + rest.replace("<tool_call>", "<tool_call{{%-x-%}}>").replace("</tool_call>", "</tool_call#}}>"))
    return {
        "comment": _set(_set(q, "name", 'evil #}{{ "INJECTED" }}{# -#}'), "description",
                        "x -#}{{- 'INJECTED' -}}{#- {% raw %} #"),
        "patterns": patterns,
        "tokens": tokens,
        "system": _set(SMOLLM2, "default", HOSTILE_TEXT),
        # A format of turns: the text options' default, join and omitted
        # names, a role alias, the built-in call's separator.
        "turns": LLAMA.replace('default = "26 Jul 2024"', f"default = {toml(HOSTILE_TEXT)}")
                      .replace('join = ", ", omit = ["code_interpreter"]',
                               f"join = {toml(INJECT_SQ)}, omit = [{toml(INJECT_DQ)}]")
                      .replace('alias = { ipython = "tool" }', 'alias = { "ip{%y%}\'" = "tool" }')
                      .replace('builtin_separator = ", "', f"builtin_separator = {toml(HOSTILE_TEXT)}"),
        # Hoisted system prompts joined by, and content cut at, such text.
        "hoist": DEEPSEEK.replace('join = "\\n\\n"', f"join = {toml(HOSTILE_TEXT)}")
                         .replace('after = "</think>"', f"after = {toml(INJECT_SQ)}"),
        "roles": SMOLLM2.replace('accepted = ["system", "user", "assistant", "tool", "developer"]',
                                 'accepted = ["system", "user", "assistant", "tool", "de{{v}}#}\'"]\n'
                                 'text = { user = "us{% er %}\'\\"" }'),
    }


HOSTILE = _hostile()


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_hostile_dialect_renders_xtml_s_text(engine: str, name: str, tmp_path: Path) -> None:
    """Each engine renders xtml's text from the exported template of a
    hostile dialect: nothing of the dialect's text is read as Jinja."""
    need_engine(engine)
    path = tmp_path / "hostile.toml"
    path.write_text(HOSTILE[name], encoding="utf-8")
    tpl = xtml.load(str(path))
    requests = hostile_requests(tpl)
    got = outcomes(engine, tpl, requests, route=True)
    assert not got["bad"], got["bad"][0]
    assert got["counts"]["equal"] == len(requests), dict(got["counts"])


def test_hostile_dialect_text_stays_text_in_the_template(tmp_path: Path) -> None:
    """In the exported source: the header comment ends where the writer
    ends it, and no string literal holds what would open or close a block."""
    base = set(strings(jinja_template(xtml.load("qwen3").dialect)))
    for name, text in HOSTILE.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        source = jinja_template(xtml.load(str(path)).dialect)
        head = source[:source.index("-#}") + 3]
        assert head.count("#}") == 1 and head.startswith("{#- A Jinja chat template"), (name, head)
        own = set(strings(source)) - base
        assert name == "comment" or len(own) >= 3, (name, own)
        for literal in own:
            assert not re.search(r"\{[{%#]|[}%#]\}", literal), (name, literal)
        jinja2.Environment().parse(source)  # one template, whatever the text


def test_what_the_export_cannot_write_is_refused_at_the_file(tmp_path: Path) -> None:
    """An option whose name cannot be a Jinja variable, and text no engine
    reads alike (a control character): refused in one line at the file."""
    bad_option = QWEN3.replace("enable_thinking = {", '"x}}{{y" = { type = "bool", default = false }\n'
                               "enable_thinking = {", 1)
    bell = _set(SMOLLM2, "default", "ring\u0007")
    # A text option of [turns], and an option's alias: variables too.
    bad_text = LLAMA.replace("date_string = {", '"x}}{{y" = { type = "string", default = "a" }\ndate_string = {', 1)
    bad_alias = DEEPSEEK.replace('alias = "enable_thinking"', 'alias = "x}}{{y"')
    says_bad = "option 'x}}{{y' cannot be a Jinja template's variable"
    for text, says in ((bad_option, says_bad), (bell, "U+0007"), (bad_text, says_bad), (bad_alias, says_bad)):
        path = tmp_path / "bad.toml"
        path.write_text(text, encoding="utf-8")
        xtml.load(str(path))  # a valid dialect: only the export cannot write it
        code, out, err = run(["export", "jinja", "-t", str(path)])
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert says in err and str(path) in err, err


# -- the CLI and the Hugging Face folder -------------------------------------------------------

def test_export_jinja_prints_the_template() -> None:
    for name in DIALECTS:
        code, out, err = run(["export", "jinja", "-t", name])
        assert code == 0 and err == "", err
        assert out == jinja_template(xtml.load(name).dialect)


@cache
def hf_folder(name: str) -> Path:
    """The folder of ``xtml export hf -t NAME --tokenizer`` SmolLM2's GGUF
    (qwen3 over it spells its added tokens as text, as SmolLM2 does)."""
    where = Path(os.environ.get("TMPDIR", "/tmp")) / f"xtml-hf-layout-{name}-{os.getpid()}"
    code, out, err = run(["export", "hf", str(where), "-t", name, "--tokenizer", smollm2_gguf(), "--force"])
    assert code == 0 and err == "" and out.startswith("wrote tokenizer.json, tokenizer_config.json, XTML.md"), err
    return where


@pytest.mark.parametrize("name", tuple(ROLES))
def test_the_hf_folder_renders_and_tokenizes_as_xtml(name: str) -> None:
    """transformers, loading the folder alone: the chat template renders
    xtml's text on the generated requests, and the ids are xtml's wherever
    no content spells a token of the format."""
    from transformers import AutoTokenizer

    tpl = xtml.load(name)
    folder = hf_folder(name)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["eos_token"] == "<|im_end|>" and config["chat_template"] == jinja_template(tpl.dialect)
    note = (folder / "XTML.md").read_text(encoding="utf-8")
    assert "`<|im_start|>` = 1" in note, note
    assert ("Spelt as text" in note) == (name == "qwen3"), note
    tok = AutoTokenizer.from_pretrained(str(folder))
    vocab = xtml.load_tokenizer(smollm2_gguf())
    texts = ids = 0
    for request in corpus(name):
        msgs = [{k: v for k, v in m.items() if v is not None} for m in request["messages"]]
        kw = {k: v for k, v in request.items() if k not in ("messages", "tools", "add_generation_prompt")}
        body = {**request, "messages": msgs}
        try:
            want = tpl.render(body)
        except xtml.XtmlError:
            continue
        agp, tools = request["add_generation_prompt"], request.get("tools")
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=agp, **kw)
        assert text == want.text, request
        texts += 1
        if name == "smollm2" and not spells_marker(body, tpl.dialect.tokens):  # type: ignore[attr-defined]
            got: Any = tok.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=agp, **kw)
            got = got["input_ids"] if hasattr(got, "keys") else got
            assert got == tpl.encode(body, vocab), request
            ids += 1
    print(f"{name}: {texts} texts, {ids} id lists equal")
    assert texts >= 200 and (ids >= 150 or name != "smollm2"), (texts, ids)


def test_what_the_writer_has_not_learnt_is_refused() -> None:
    """The layout language grows: a field the writer does not know, set
    otherwise than its default, or a policy value it cannot write, is
    refused at the file rather than written half-right."""
    import dataclasses

    from xtml.chat.layout import LayoutDialect
    from xtml.template import LayoutTemplate

    @dataclasses.dataclass(frozen=True, slots=True)
    class Grown(LayoutDialect):
        fancy: str = "off"

    tpl = xtml.load("qwen3")
    assert isinstance(tpl, LayoutTemplate)
    qwen3 = tpl.layout
    fields = {f.name: getattr(qwen3, f.name) for f in dataclasses.fields(qwen3)}
    assert jinja_template(Grown(**fields)) == jinja_template(qwen3)  # at its default: nothing to write
    for d, says in ((Grown(**fields, fancy="on"), "the layout field 'fancy'"),
                    (dataclasses.replace(qwen3, reasoning_show="sometimes"), "reasoning_show = 'sometimes'")):
        with pytest.raises(xtml.TemplateError) as info:
            jinja_template(d)
        assert says in str(info.value) and str(info.value).endswith("(at qwen3.toml)"), info.value
