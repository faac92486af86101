"""The Jinja export, rendered by three engines' own template engines
(transformers' jinja2, ``@huggingface/jinja``, llama.cpp's): xtml's text, or
a raise.

Each engine changes what it is given before the template sees it (None
keys dropped, numbers rewritten, key order, arguments as strings; the list
is in tests/helpers/jinja_engines.py and docs/exports.md). So the expected
text is xtml's render of what the engine hands over, read back by a probe
template that writes every variable as JSON with the engine's own
``tojson``: the claim is that the exported template renders, in each
engine, what xtml renders from the same input. What xtml refuses, the
template refuses; where xtml renders and the template raises, the reason is
one Jinja cannot get around (a JSON string to parse, a media prompt to
compute) and is counted.
"""

from __future__ import annotations

import collections
import json
import os
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import xtml
from tests.helpers.cli import run
from tests.helpers.docs import run_examples, shown_on_page
from tests.helpers.handover import objects_for_arguments
from tests.helpers.jinja_engines import ENGINES, Rendered, need_engine, render_all
from tests.helpers.jinja_probe import (
    LLAMACPP_PROBE,
    OPTIONS,
    PROBE,
    SAYS,
    SPLIT,
    handed,
    llamacpp_shape,
    numbers_in_range,
    probed,
    strings,
    toml,
    xtml_render,
)
from xtml import testing as xt
from xtml.chat.template_file import builtin_files
from xtml.exports.jinja import jinja_template

pytestmark = pytest.mark.engines

DIALECTS = ("kimi-k3", "xtml-base", "k3-citations")
PER_DIALECT = 300
# Where xtml renders and a Jinja template cannot: what the template says then.
CANNOT = ("which a Jinja template cannot", "a Jinja template cannot: render with xtml")


def collect(tpl: xtml.Template, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(xt.requests(tpl))
    def draw(r: dict[str, Any]) -> None:
        out.append(r)

    draw()
    return out


def engine_request(body: dict[str, Any]) -> dict[str, Any]:
    """A generated body as a caller hands it to an engine: the options flat
    (the body's, then ``chat_template_kwargs``'), API keys left out,
    ``add_generation_prompt`` as xtml resolves it, and tool-call arguments
    that are JSON objects given as objects (as llama.cpp and vLLM parse
    them, and as docs/exports.md tells transformers' callers to)."""
    opts = {k: v for k, v in body.items() if k in OPTIONS or k == "tools"}
    opts.update(body.get("chat_template_kwargs") or {})
    agp = opts.pop("add_generation_prompt", body.get("add_generation_prompt", True))
    msgs = objects_for_arguments(body["messages"])
    return {"messages": msgs, "add_generation_prompt": agp, **opts}


@cache
def corpus(name: str) -> list[dict[str, Any]]:
    return [engine_request(b) for b in collect(template(name), PER_DIALECT)]


@cache
def template(name: str) -> xtml.Template:
    """A built-in template, or ``k3-citations``: K3 with the example
    citation plugin, whose parts the plugin's own Jinja form renders."""
    if name != "k3-citations":
        return xtml.load(name)
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"xtml-k3-citations-{os.getpid()}.toml"
    path.write_text(CITATIONS, encoding="utf-8")
    try:
        return xtml.load(str(path))
    finally:
        path.unlink()


CITATIONS = builtin_files()["kimi-k3"].read_text(encoding="utf-8").replace(
    'name = "kimi-k3"', 'name = "k3-citations"') + '\n[plugins.citation]\nelement = "cite"\n'


@cache
def outcomes(engine: str, name: str) -> dict[str, Any]:
    tpl = template(name)
    requests = [numbers_in_range(engine, r) for r in corpus(name)]
    if engine == "llamacpp":
        requests = [llamacpp_shape(r) for r in requests]
    got = render_all(engine, probed(jinja_template(tpl.dialect)), [{**r, "xtml_probe": True} for r in requests])
    # Where the template raised, the probe alone says what was handed over.
    alone = render_all(engine, LLAMACPP_PROBE if engine == "llamacpp" else PROBE, requests, chat_parsing=False)
    counts: collections.Counter[str] = collections.Counter()
    bad: list[str] = []
    for out, probe in zip(got, alone, strict=True):
        if out.text is not None:
            text, _, seen_text = out.text.partition(SPLIT)
            seen = handed(Rendered(seen_text, None))
        else:
            text, seen = None, handed(probe)
        if seen is None:
            counts["the engine refuses the request"] += 1
            continue
        want, why = xtml_render(tpl, seen)
        if want is not None and text == want:
            counts["equal"] += 1
        elif want is None and text is None:
            counts["both refuse"] += 1
        elif want is not None and out.error is not None and any(c in out.error for c in CANNOT):
            counts["the template cannot"] += 1
        else:
            bad.append(f"request handed over: {json.dumps(seen, ensure_ascii=False)[:2000]}\n"
                       f"xtml: {want!r:.2000}{why or ''}\ntemplate: {text!r:.2000} {out.error or ''}")
    return {"counts": counts, "bad": bad}


@pytest.mark.parametrize("name", DIALECTS)
@pytest.mark.parametrize("engine", ENGINES)
def test_the_template_renders_what_xtml_renders(engine: str, name: str) -> None:
    need_engine(engine)
    got = outcomes(engine, name)
    counts = got["counts"]
    assert not got["bad"], f"{len(got['bad'])} differ ({dict(counts)}); the first:\n{got['bad'][0]}"
    # Many generated requests render; the rest are refused by both, or need
    # what Jinja cannot do, or the engine's own refusal. The draws depend on
    # the modules the process has imported (hypothesis seeds its generation
    # with the constants of local code, derandomized or not): 88 to 110 of
    # 300 render for xtml-base, by the order the suite imports modules in.
    assert counts["equal"] >= PER_DIALECT // 4, dict(counts)

REFUSED = [c for c in tomllib.loads((Path(__file__).parent / "data" / "cases" / "render-refused.toml").read_text(
    encoding="utf-8"))["case"] if "messages" in c]


@pytest.mark.parametrize("engine", ENGINES)
def test_what_xtml_refuses_the_template_refuses(engine: str) -> None:
    """The refusal cases of tests/data/cases/render-refused.toml that reach
    a template (messages and options; a body that is not one is the
    engine's to refuse): each raises in the template too."""
    need_engine(engine)
    k3 = xtml.load("kimi-k3")
    cases = REFUSED if engine == "transformers" else [c for c in REFUSED if json_text(c)]
    requests = [{"messages": c["messages"], "add_generation_prompt": True, **c.get("options", {})} for c in cases]
    probes = render_all(engine, LLAMACPP_PROBE if engine == "llamacpp" else PROBE, requests, chat_parsing=False)
    got = render_all(engine, jinja_template(k3.dialect), requests)
    checked = 0
    for case, probe, out in zip(cases, probes, got, strict=True):
        seen = handed(probe)
        if seen is None:
            continue
        want, why = xtml_render(k3, seen)
        if want is None:
            checked += 1
            assert out.text is None and out.error is not None, (case, seen)
            if engine in SAYS:
                # raise_exception's message comes through as it is: xtml's.
                assert why is not None and out.error.endswith(why), (out.error, why)
        else:
            # The engine changed the request into one xtml renders.
            assert out.text == want, (case, seen)
    # llama-server refuses most of these itself, before any template runs.
    assert checked >= (len(cases) // 2 if engine in SAYS else 5), checked


def json_text(case: dict[str, Any]) -> bool:
    """Whether a case can be sent as JSON (NaN cannot: only transformers,
    called in Python, can be handed one)."""
    try:
        json.dumps(case, allow_nan=False)
    except ValueError:
        return False
    return True


def test_arguments_given_as_a_json_string_raise() -> None:
    """Jinja cannot parse JSON: handed a JSON string, the template raises
    rather than render what xtml would not (a json block for typed
    arguments)."""
    k3 = xtml.load("kimi-k3")
    call = {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    req = {"messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "", "tool_calls": [call]}], "add_generation_prompt": False}
    (out,) = render_all("transformers", jinja_template(k3.dialect), [req])
    assert out.text is None and "pass them as an object" in (out.error or "")
    obj = json.loads(json.dumps(req))
    obj["messages"][1]["tool_calls"][0]["function"]["arguments"] = {"a": 1}
    (out,) = render_all("transformers", jinja_template(k3.dialect), [obj])
    assert out.text == k3.render(req).text


def test_the_export_refuses_a_plugin_with_no_jinja_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin that gives no Jinja form (the citation plugin, its form
    taken away): the export refuses the template at the plugin, in one
    line."""
    from xtml_citation import CitationExtension

    monkeypatch.setattr(CitationExtension, "jinja", lambda self: None)
    path = tmp_path / "cite.toml"
    path.write_text(CITATIONS, encoding="utf-8")
    code, out, err = run(["export", "jinja", "-t", str(path)])
    assert code == 1 and out == "" and "plugin 'citation' has no Jinja form" in err and "plugins.citation" in err, err
    assert err.count("\n") == 1


def test_the_page_s_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    text, _ = run_examples("docs/exports.md", at_least=2)
    shown_on_page(text, capsys.readouterr().out, at_least=2)


# -- hostile dialects ---------------------------------------------------------------------------
#
# A dialect file's text is data: the export spells each string as a string
# (promise 1 of SECURITY.md), so no name, marker, effort, role or prose makes
# the template run anything or render other text than xtml's. Each dialect
# below is xtml-base with text that would close a comment, a string or a
# block, spell a placeholder of the export's skeleton, or match what an
# engine rewrites in a template's source before it reads it.

INJECT_DQ = '" ~ ("INJECTED-" ~ messages[0].content) ~ "'
INJECT_SQ = "' ~ ('INJECTED-' ~ messages[0].content) ~ '"
BASE = builtin_files()["xtml-base"].read_text(encoding="utf-8")


def with_values(text: str, values: dict[str, Any]) -> str:
    """``text`` with the first ``key = ...`` line of each key set to the
    value; a key ``body:N`` sets the body of the N-th system message (its
    ``{{`` and ``}}`` are literal braces)."""
    for key, value in values.items():
        name, _, nth = key.partition(":")
        lines = list(re.finditer(rf"(?m)^{re.escape(name)} = .*$", text))
        at = lines[int(nth or 0)]
        text = text[:at.start()] + f"{name} = {toml(value)}" + text[at.end():]
    return text


HOSTILE: dict[str, str] = {
    # The name and description go into the header comment.
    "comment": with_values(BASE, {
        "name": 'evil #}{{ "INJECTED " }}{# «DESCRIPTION» -#}',
        "description": "x -#}{{- 'INJECTED' -}}{#- «NAME» {% raw %} #",
    }),
    # Markers: quotes that would close a literal, braces, the skeleton's
    # placeholders, what @huggingface/jinja and llama.cpp rewrite.
    "markers": with_values(BASE, {
        "open": "<|«END»{{|>",
        "close": "<|}}«MSG_CLOSE»\\'|>",
        "sep": "<|-%} {%- generation -%}\t|>",
        "end": INJECT_DQ,
        "stop": [INJECT_DQ],
    }),
    # Efforts, roles and aliases, the prose of the internal messages.
    "options": with_values(BASE, {
        "accepted": ["system", "user", "assistant", "tool", "«ALIASES»", "r{{'x'}}"],
        "aliases": {"developer": "system", "dev}}{{'x'": "system", "«ROLES»": "user"},
        "efforts": ["low", "medium", "high", "«EFFORTS»", INJECT_SQ, "x}}{{y -%}"],
        "default_effort": INJECT_SQ,
        "off": ["{%- generation -%}", "none"],
        # tool-declare, thinking-effort, tool-choice-none
        "body:0": INJECT_SQ.replace("{", "{{").replace("}", "}}") + " «TOOL_DECLARE» {tools} #}}",
        "body:2": "«EFFORT» {{{{- '{effort}' -}}}} «END» \\'",
        "body:4": "«END» {{{{ 7 * 7 }}}} #}} ' \\ \" ~ messages ~ \" -%}} {{%- generation -%}} «MSG_CLOSE»",
    }),
}


def hostile_requests(tpl: xtml.Template) -> list[dict[str, Any]]:
    """Requests in the shapes every engine takes (llama-server's among
    them): each option, role and effort of the dialect, calls and tools."""
    d = tpl.dialect
    tool = {"type": "function", "function": {"name": "get", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}
    user = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"a": "x", "n": 2}}}
    turn = [user, {"role": "assistant", "content": "ok", "reasoning_content": "hm", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    schema = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    out: list[dict[str, Any]] = [
        {"messages": [user], "add_generation_prompt": True},
        {"messages": [user], "add_generation_prompt": True, "thinking": True},
        {"messages": turn, "tools": [tool], "add_generation_prompt": True, "thinking": True},
        {"messages": [user], "tools": [tool], "tool_choice": "required", "response_format": schema,
         "add_generation_prompt": True},
        {"messages": [user], "tool_choice": "none", "response_format": {"type": "json_object"},
         "add_generation_prompt": False},
        {"messages": [user], "reasoning_effort": "not an effort", "add_generation_prompt": True},
    ]
    out += [{"messages": [user], "thinking_effort": e, "thinking": True, "add_generation_prompt": True}
            for e in d.efforts]
    out += [{"messages": [user], "reasoning_effort": e, "add_generation_prompt": True} for e in d.thinking_off]
    out += [{"messages": [{"role": r, "content": "x"}, user], "add_generation_prompt": True}
            for r in [*d.roles, *d.role_aliases] if r != "tool"]
    return out


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_hostile_dialect_renders_xtml_s_text(engine: str, name: str, tmp_path: Path) -> None:
    """Each engine renders xtml's text from the exported template of a
    hostile dialect (or both refuse, with xtml's message where the engine
    passes it through): nothing of the dialect's text is read as Jinja."""
    need_engine(engine)
    path = tmp_path / "hostile.toml"
    path.write_text(HOSTILE[name], encoding="utf-8")
    tpl = xtml.load(str(path))
    requests = hostile_requests(tpl)
    assert renders_as_xtml(engine, tpl, requests) >= len(requests) // 2


def renders_as_xtml(engine: str, tpl: xtml.Template, requests: list[dict[str, Any]]) -> int:
    """Asserts that ``engine`` renders each request with the exported
    template as xtml renders what the engine handed over, or that both
    refuse (with xtml's message, where the engine passes it through);
    returns how many rendered."""
    if engine == "llamacpp":
        requests = [llamacpp_shape(r) for r in requests]
    # llama-server's own parser of answers is no part of this claim.
    got = render_all(engine, probed(jinja_template(tpl.dialect)), [{**r, "xtml_probe": True} for r in requests],
                     chat_parsing=False)
    alone = render_all(engine, LLAMACPP_PROBE if engine == "llamacpp" else PROBE, requests, chat_parsing=False)
    equal = 0
    for request, out, probe in zip(requests, got, alone, strict=True):
        if out.text is not None:
            text, _, seen_text = out.text.partition(SPLIT)
            seen = handed(Rendered(seen_text, None))
        else:
            text, seen = None, handed(probe)
        assert seen is not None, (request, out, probe)
        want, why = xtml_render(tpl, seen)
        assert text == want, (seen, out.error, why)
        if want is None and engine in SAYS:
            assert why is not None and out.error is not None and out.error.endswith(why), (out.error, why)
        equal += want is not None
    return equal


@pytest.mark.parametrize("engine", ENGINES)
def test_response_schema_none_is_the_schema_null(engine: str) -> None:
    """As xtml (and K3's reference encoder): response_schema given as None
    beside a json_schema response format writes the schema null; absent, the
    format's own schema."""
    need_engine(engine)
    k3 = xtml.load("kimi-k3")
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}
    base = {"messages": [{"role": "user", "content": "hi"}], "response_format": rf, "add_generation_prompt": True}
    requests = [base, {**base, "response_schema": None}, {**base, "response_schema": {"type": "number"}},
                {**base, "response_format": {"type": "json_object"}, "response_schema": None}]
    assert renders_as_xtml(engine, k3, requests) == len(requests)
    assert "```json\nnull\n```" in k3.render(requests[1]).text


def test_hostile_dialect_text_stays_text_in_the_template() -> None:
    """In the exported source: the header comment ends where the skeleton
    ends it, and no literal holds what would open or close a block."""
    for name, text in HOSTILE.items():
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"xtml-hostile-{name}-{os.getpid()}.toml"
        path.write_text(text, encoding="utf-8")
        try:
            source = jinja_template(xtml.load(str(path)).dialect)
        finally:
            path.unlink()
        head = source[:source.index("-#}") + 3]
        assert head.count("#}") == 1 and head.startswith("{#- A Jinja chat template"), (name, head)
        if name == "comment":  # the name and description spell each other's placeholder: kept as text
            assert head.count("«DESCRIPTION»") == 1 and head.count("«NAME»") == 1, head
        # The string tokens as Jinja2 reads them (its lexer knows strings)
        # that the skeleton alone does not hold: made from the dialect's text.
        own = set(strings(source)) - set(strings(jinja_template(xtml.load("xtml-base").dialect)))
        assert name == "comment" or len(own) >= 3, own
        for literal in own:
            assert not re.search(r"\{[{%#]|[}%#]\}", literal), (name, literal)


def test_keys_that_are_not_strings_render_as_xtml_or_raise() -> None:
    """A caller in Python can hand over an object whose keys are not strings
    (JSON has none, so only transformers sees them). In a call's arguments
    xtml writes them as json.dumps does ("10", "true", "null", "1.5"); as
    argument names, or in tools and schemas, it refuses them: the template
    does the same, with xtml's message."""
    k3 = xtml.load("kimi-k3")
    user = {"role": "user", "content": "hi"}

    def called(args: dict[Any, Any]) -> dict[str, Any]:
        call = {"type": "function", "function": {"name": "f", "arguments": args}}
        return {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [call]}],
                "add_generation_prompt": False}

    def tool(properties: dict[Any, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                "properties": properties}}}

    rendered = [called({"a": {10: 1}}), called({"a": [{True: 1, None: 2, 1.5: 3, -0.0: 4, 2**70: 5, "s": 6}]}),
                called({"a": {False: {1e20: [1]}}, "b": 2})]
    refused = [called({10: 1}), called({"a": 1, None: 2}), {"messages": [user], "tools": [tool({10: {}})]},
               {"messages": [{"role": "system", "tools": [tool({True: {}})]}, user]},
               {"messages": [user], "response_format": {"type": "json_schema", "json_schema": {"schema": {
                   "type": "object", "properties": {None: {}}}}}}]
    got = render_all("transformers", jinja_template(k3.dialect), rendered + refused)
    for request, out in zip(rendered, got[:len(rendered)], strict=True):
        want = k3.render(request).text
        assert '"10": 1' in want or '"true": 1' in want or '"false": {"1e+20": [1]}' in want, want
        assert out == Rendered(want, None), (request, out)
    for request, out in zip(refused, got[len(rendered):], strict=True):
        with pytest.raises(xtml.XtmlError) as info:
            k3.render(request)
        assert out.text is None and out.error is not None and out.error.endswith(str(info.value)), (out, info)


def test_text_no_engine_reads_alike_is_refused_at_the_file(tmp_path: Path) -> None:
    """A control character (other than tab and line ends) has no string
    spelling all three engines read: the export refuses the dialect, in one
    line naming its file, and writes nothing."""
    path = tmp_path / "bell.toml"
    path.write_text(with_values(BASE, {"body:3": "Call a tool.\u0007"}), encoding="utf-8")
    xtml.load(str(path))  # a valid dialect: only the export cannot spell it
    code, out, err = run(["export", "jinja", "-t", str(path)])
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert "U+0007" in err and str(path) in err, err
