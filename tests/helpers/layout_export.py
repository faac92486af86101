"""What the Jinja export tests of the layout dialects share: the probe
that reads back what an engine handed a template, the outcomes of a corpus
rendered by an engine beside xtml's render of it, and the hostile text and
requests that check a dialect's text stays text in the exported source."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xtml
from tests.helpers.jinja_engines import Rendered, render_all
from tests.helpers.jinja_probe import (
    LLAMACPP_PROBE,
    OPTIONS,
    PROBE,
    SAYS,
    SPLIT,
    UNDEFINED,
    handed,
    llamacpp_shape,
    numbers_in_range,
    probed,
    xtml_render,
)
from xtml.exports.jinja import jinja_template

__all__ = [
    "HOSTILE_TEXT",
    "INJECT_DQ",
    "INJECT_SQ",
    "KWARGS",
    "ROUTE",
    "braced",
    "features",
    "hostile_requests",
    "outcomes",
    "probe_of",
    "probed_as",
    "refuses_as_parts",
]

ROUTE = LLAMACPP_PROBE[:LLAMACPP_PROBE.index("-#}") + 3]
KWARGS = {"llama-3.1": ("date_string", "tools_in_user_message", "builtin_tools"), "mistral-small-3.1": ("date",),
          "gpt-oss": ("date", "model_identity", "reasoning_effort", "builtin_tools")}
"""A dialect's own keyword arguments (its official template's), which the
probe reads beside the shared ones."""


def probe_of(name: str) -> str:
    """:data:`PROBE` reading the dialect's own keyword arguments too."""
    extra = KWARGS.get(name, ())
    if not extra:
        return PROBE
    names = ("messages", "tools", "add_generation_prompt", *OPTIONS, *extra)
    return "{{- {" + ", ".join(f"'{v}': ({v} if {v} is defined else '{UNDEFINED}')" for v in names) + "} | tojson -}}"


def probed_as(name: str, template: str) -> str:
    """:func:`probed` with :func:`probe_of`'s probe."""
    return probed(template).replace(PROBE, probe_of(name))


def features(name: str, request: dict[str, Any], text: str) -> set[str]:
    """What a request rendered exercised (so that the counts say it)."""
    msgs = request["messages"]
    out = set()
    if request.get("tools"):
        out.add("tools")
    if any(m.get("tool_calls") for m in msgs):
        out.add("calls")
    if "</tool_response>\n<tool_response>" in text:
        out.add("grouped results")
    if name == "qwen3" and "<think>\n" in text.replace("<think>\n\n</think>", ""):
        out.add("reasoning shown")
    if "enable_thinking" in request:
        out.add("enable_thinking")
    if name == "smollm2" and msgs[0].get("role") != "system":
        out.add("default system prompt")
    if name == "llama-3.1":
        if "<|python_tag|>" in text:
            out.add("built-in calls")
        if "<|begin_of_text|><|start_header_id|>system<|end_header_id|>" in text and "Given the following" in text:
            out.add("tools in the user message")
        if "Environment: ipython\n" in text and "You have access to the following functions" in text:
            out.add("tools in the system turn")
        if "<|start_header_id|>ipython<|end_header_id|>" in text:
            out.add("tool results")
        if any(k in request for k in KWARGS[name]):
            out.add("keyword arguments")
    if name == "deepseek-v3.1":
        roles = [m.get("role") for m in msgs]
        if roles.count("system") > 1 or ("system" in roles and roles[0] != "system"):
            out.add("system prompts hoisted")
        if any(m.get("prefix") for m in msgs):
            out.add("prefix")
        if text.endswith("<｜Assistant｜><think>"):
            out.add("thinking")
        if any(m.get("role") == "tool" for m in msgs):
            out.add("tool results")
    return out


def outcomes(engine: str, tpl: xtml.Template, requests: list[dict[str, Any]], *,
             route: bool = False, limits: tuple[str, ...] = ()) -> dict[str, Any]:
    """Each request rendered with the exported template by ``engine``,
    beside xtml's render of what the engine handed over. With ``route``,
    llama-server is pointed at a hand-written parser of answers (by the K3
    markers in a comment) rather than the one it derives from the template
    at start-up, which fails on tokens it cannot tell from JSON: its parser
    of answers is no part of this claim. ``limits``: the template's own
    messages where it raises on what the engine cannot write as xtml does,
    counted apart (never as equal)."""
    requests = [numbers_in_range(engine, r) for r in requests]
    if engine == "llamacpp":
        # llama-server refuses a name of null (a client leaves it out).
        requests = [llamacpp_shape({**r, "messages": [{k: v for k, v in m.items() if v is not None or k == "content"}
                                                      for m in r["messages"]]}) for r in requests]
    template = jinja_template(tpl.dialect)
    if route and engine == "llamacpp":
        template = ROUTE + template
    reader = probe_of(tpl.name)
    got = render_all(engine, probed_as(tpl.name, template), [{**r, "xtml_probe": True} for r in requests])
    # Where the template raised, the probe alone says what was handed over.
    alone = render_all(engine, ROUTE + reader if engine == "llamacpp" else reader, requests, chat_parsing=False)
    counts: collections.Counter[str] = collections.Counter()
    bad: list[str] = []
    for request, out, probe in zip(requests, got, alone, strict=True):
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
            for f in features(tpl.name, seen, want):
                counts[f] += 1
            dropped = tpl.render(seen).dropped
            if any(d.why.startswith("reasoning before the last query") for d in dropped):
                counts["reasoning cut before the last query"] += 1
            if any(d.why.startswith("text before the first") for d in dropped):
                counts["content cut"] += 1
        elif want is None and text is None and (engine not in SAYS or (out.error or "").endswith(why or "?")):
            counts["both refuse"] += 1
        elif engine == "llamacpp" and text is None and refuses_as_parts(tpl, seen, request, out.error or ""):
            # llama-server hands content parts as parts to a template that
            # reads parts (its capabilities, from trial renders), and joined
            # to the probe alone: xtml refuses the parts as sent too.
            counts["both refuse content as parts"] += 1
        elif text is None and want is not None and any(s in (out.error or "") for s in limits):
            counts["the engine cannot write it: the template raises"] += 1
        else:
            bad.append(f"request: {json.dumps(request, ensure_ascii=False)[:1500]}\n"
                       f"handed over: {json.dumps(seen, ensure_ascii=False)[:1500]}\n"
                       f"xtml: {want!r:.1500} {why or ''}\ntemplate: {text!r:.1500} {out.error or ''}")
    return {"counts": counts, "bad": bad}


def refuses_as_parts(tpl: xtml.Template, seen: dict[str, Any], sent: dict[str, Any], error: str) -> bool:
    """Whether xtml refuses ``seen`` with the content parts of ``sent`` (the
    request as sent) as they were sent, with the message the template
    raised."""
    if len(seen["messages"]) != len(sent["messages"]):
        return False
    msgs = [{**m, "content": s["content"]} if isinstance(s.get("content"), list) else m
            for m, s in zip(seen["messages"], sent["messages"], strict=True)]
    want, why = xtml_render(tpl, {**seen, "messages": msgs})
    return want is None and why is not None and why in error


INJECT_SQ = "' ~ ('INJECTED-' ~ messages[0].content) ~ '"
INJECT_DQ = '" ~ ("INJECTED-" ~ messages[0].content) ~ "'


def braced(s: str) -> str:
    """``s`` as pattern text: its braces literal."""
    return s.replace("{", "{{").replace("}", "}}")



HOSTILE_TEXT = ("{{ 7 * 7 }} {% if true %}IF{% endif %} {# c #} #} -#} {%- generation -%} «END» "
                + INJECT_SQ + " " + INJECT_DQ + " \\' \\ {%- raw -%}")



def hostile_requests(tpl: xtml.Template) -> list[dict[str, Any]]:
    """Requests in the shapes every engine takes: each role, calls, tools,
    reasoning, with and without a generation prompt."""
    tool = {"type": "function", "function": {"name": "get", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}
    user = {"role": "user", "content": "hi"}
    args: Any = {"a": "x", "n": 2}
    if tpl.dialect.arguments == "string":  # type: ignore[attr-defined]
        args = json.dumps(args)  # the format takes arguments as JSON text only
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": args}}
    turn = [user, {"role": "assistant", "content": "ok", "reasoning_content": "hm", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    out: list[dict[str, Any]] = [
        {"messages": [user], "add_generation_prompt": True},
        {"messages": [{"role": "system", "content": "s"}, user], "add_generation_prompt": False},
    ]
    if "tool" in tpl.dialect.roles and tpl.dialect.calls == "each":  # type: ignore[attr-defined]
        out += [{"messages": turn, "tools": [tool], "add_generation_prompt": True},
                {"messages": [*turn, {"role": "assistant", "content": "done", "reasoning_content": "r"}],
                 "add_generation_prompt": False, "enable_thinking": False}]
    out += [{"messages": [{"role": r, "content": "x"}, user], "add_generation_prompt": True}
            for r in tpl.dialect.roles if r != "tool"]
    d: Any = tpl.dialect
    if d.header_turns is not None:
        builtin = {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "q"}}}
        out += [{"messages": [user, {"role": "assistant", "content": "", "tool_calls": [builtin]},
                              *({"role": r, "content": "r"} for r in d.role_aliases)],
                 "builtin_tools": ["brave_search", INJECT_DQ, "wolfram_alpha"], "add_generation_prompt": True},
                {"messages": [user], "tools": [tool], "tools_in_user_message": False, "builtin_tools": []}]
    if d.system_hoist is not None:
        cut = d.content_cut[0]
        out += [{"messages": [{"role": "system", "content": "s1"}, user, {"role": "system", "content": "s2"},
                              {"role": "assistant", "content": "a" + cut + "b" + cut + "c"}, user],
                 "add_generation_prompt": True, "thinking": True}]
    return out


def hf_export(tpl: xtml.Template, source: str, folder: Path) -> tuple[dict[str, Any], Any]:
    """``xtml export jinja -t SOURCE`` prints the dialect's template, and
    ``xtml export hf`` writes ``folder`` (over a byte vocabulary of the
    dialect's tokens) whose config holds it: the config, and the folder as
    transformers alone loads it."""
    from transformers import AutoTokenizer

    from tests.helpers.cli import run
    from xtml.vocab.vocabulary import byte_vocabulary

    code, out, err = run(["export", "jinja", "-t", source])
    assert code == 0 and err == "" and out == jinja_template(tpl.dialect), err
    tok_file = folder.parent / f"{folder.name}-tokenizer.json"
    byte_vocabulary(tpl.dialect.tokens).tokenizer.save(str(tok_file))  # type: ignore[attr-defined]
    code, out, err = run(["export", "hf", str(folder), "-t", source, "--tokenizer", str(tok_file)])
    assert code == 0 and err == "", err
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == jinja_template(tpl.dialect)
    return config, AutoTokenizer.from_pretrained(str(folder))


def hf_renders(tpl: xtml.Template, hf: Any, requests: Iterable[dict[str, Any]]) -> int:
    """How many of ``requests`` the loaded folder renders, each asserted to be
    xtml's text (None-valued keys dropped, as transformers drops them); the
    requests xtml refuses are passed over."""
    texts = 0
    for request in requests:
        msgs = [{k: v for k, v in m.items() if v is not None} for m in request["messages"]]
        kw = {k: v for k, v in request.items() if k not in ("messages", "tools", "add_generation_prompt")}
        want, _ = xtml_render(tpl, {**request, "messages": msgs})
        if want is None:
            continue
        assert hf.apply_chat_template(msgs, tools=request.get("tools"), tokenize=False,
                                      add_generation_prompt=request["add_generation_prompt"], **kw) == want, request
        texts += 1
    return texts


SETTLED = ("equal", "both refuse", "both refuse content as parts", "the engine refuses the request",
           "the engine cannot write it: the template raises")
"""The outcomes an engine's render may end in (any other is a difference)."""


def load_dialect(path: Path) -> xtml.Template:
    """A built-in dialect's file; every built-in one reads what it writes
    (no readers' gate: its export and its parse cover the same requests)."""
    t = xtml.load(str(path))
    assert t.layout.render_only == ()  # type: ignore[attr-defined]
    return t
