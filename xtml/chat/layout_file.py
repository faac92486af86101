"""Reading a layout dialect file (``[template] engine = "layout"``) into a
:class:`~.layout.LayoutDialect`, every problem with its dotted key path, and
loading a dialect file of either kind.

The checker it fills, the TOML reading and the locating of problems are the
ones XTML files use (:mod:`.template_file`), which knows nothing of layout
files but how to tell one (:func:`~.template_file.is_layout`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from ..errors import TemplateError
from ..plugins.values import load_value_syntax
from .dialect import Dialect
from .layout import (
    DROP,
    EACH,
    HISTORY,
    LAST_USER,
    MESSAGE_CONDS,
    REFUSE,
    STOP_MEANINGS,
    SYNTAX,
    SYSTEM,
    TURN,
    LayoutDialect,
    RoleFrame,
    RoleLayout,
    fold_kind,
    system_turn_kind,
)
from .layout_pattern import MAX_TOKENS, Cond, Item, Pattern
from .layout_split import build_split, split_names
from .layout_turn import KEEP, STRING, STRINGS, TURNS, TextOption
from .layout_turns_file import CALL_KEYS, build_turns
from .template_file import Problem, check, check_toml, first_or, is_layout, read_template, run_checks

__all__ = ["SECTIONS", "build_layout", "check_any", "check_any_text", "load_any_dialect"]

SECTIONS = ("template", "tokens", "stop", "roles", "frame", "system", "content", "calls", "tools", "reasoning",
            "prompt", "options", "turns")
_TEMPLATE_KEYS = ("name", "description", "engine", "reference")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Checker(Protocol):
    """What this reader needs of the file checker (``template_file._Check``)."""

    problems: list[Any]

    def add(self, message: str, key: str, hint: str = "") -> None: ...

    def keys(self, d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None: ...


def _table(c: Checker, data: dict[str, Any], key: str, where: str = "", required: bool = False) -> dict[str, Any]:
    here = f"{where}.{key}" if where else key
    v = data.get(key)
    if v is None:
        if required:
            c.add(f"missing [{here}] table", here, f"add a [{here}] table")
        return {}
    if not isinstance(v, dict):
        c.add(f"{key!r} must be a table", here)
        return {}
    return v


def _str(c: Checker, d: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    v = d.get(key, default)
    if v is None:
        if default is None and key not in d:
            c.add(f"missing key {key!r}", f"{where}.{key}", f"add {key} = <a string>")
        return None
    if not isinstance(v, str):
        c.add(f"{key!r} must be a string", f"{where}.{key}")
        return None
    return v


def _choice(c: Checker, d: dict[str, Any], key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    v = d.get(key, default)
    if v not in choices:
        c.add(f"{key!r} must be one of {', '.join(map(repr, choices))}", f"{where}.{key}")
        return default
    assert isinstance(v, str)
    return v


def _strings(c: Checker, d: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        c.add(f"{key!r} must be a list of non-empty strings", f"{where}.{key}")
        return ()
    return tuple(v)


def _pattern(c: Checker, source: str | None, tokens: tuple[str, ...], slots: frozenset[str],
             conds: frozenset[str], where: str, needs: tuple[str, ...] = ()) -> Pattern | None:
    if source is None:
        return None
    try:
        p = Pattern.compile(source, tokens, slots, conds, where)
    except TemplateError as e:
        c.add(e.msg, where)
        return None
    found = p.slots()
    for s in needs:
        if s not in found:
            c.add(f"the pattern must hold {{{s}}}", where)
    return p


def build_layout(c: Checker, data: dict[str, Any], path: str) -> LayoutDialect | None:
    """The dialect of a layout file's parsed TOML, or None with its problems
    added to ``c``."""
    c.keys(data, SECTIONS, "")
    tpl = _table(c, data, "template", required=True)
    c.keys(tpl, _TEMPLATE_KEYS, "template")
    name = _str(c, tpl, "name", "template")
    description = _str(c, tpl, "description", "template", "") or ""
    ref = _table(c, tpl, "reference", "template")
    c.keys(ref, ("template", "sha256"), "template.reference")
    reference: dict[str, str] = {}
    for k in ("template", "sha256"):
        v = ref.get(k)
        if v is not None:
            if not isinstance(v, str) or (k == "sha256" and not _SHA256.fullmatch(v)):
                c.add(f"{k!r} must be a string" + (" of 64 lowercase hex digits" if k == "sha256" else ""),
                      f"template.reference.{k}")
            else:
                reference[k] = v

    tk = _table(c, data, "tokens", required=True)
    c.keys(tk, ("special", "added"), "tokens")
    special = _strings(c, tk, "special", "tokens")
    added = _strings(c, tk, "added", "tokens")
    tokens = special + added
    seen: set[str] = set()
    for t in tokens:
        if t in seen:
            c.add(f"token {t!r} is listed twice", "tokens", "list each token once, as special or as added")
        seen.add(t)
    if len(tokens) > MAX_TOKENS:
        c.add(f"more than {MAX_TOKENS} tokens", "tokens")

    st = _table(c, data, "stop", required=True)
    stops: dict[str, str] = {}
    for t, meaning in st.items():
        if t not in seen:
            c.add(f"stop token {t!r} is not one of [tokens]", f"stop.{t}")
        elif meaning not in STOP_MEANINGS:
            c.add(f"the meaning of a stop token is one of {', '.join(map(repr, STOP_MEANINGS))}", f"stop.{t}")
        else:
            stops[t] = meaning
    if not st:
        c.add("a format needs at least one stop token", "stop")

    op = _table(c, data, "options")
    options: dict[str, bool] = {}
    aliases: dict[str, str] = {}
    for k, v in op.items():
        if isinstance(v, dict) and v.get("type") in (STRING, STRINGS):
            continue  # read with [turns]
        if not isinstance(v, dict) or v.get("type") != "bool" or not isinstance(v.get("default"), bool) \
                or set(v) - {"type", "default", "alias"} or not isinstance(v.get("alias", ""), str):
            c.add("an option is { type = \"bool\", default = true|false } (other types are not yet available), "
                  "maybe with alias = \"another name it is read under\"", f"options.{k}")
        else:
            options[k] = v["default"]
            if v.get("alias"):
                aliases[k] = v["alias"]
    conds = frozenset(options)
    text_options = {} if "turns" in data else _text_options(c, op)

    fr = _table(c, data, "frame", required=True)
    c.keys(fr, ("open", "close"), "frame")
    frame_open = _pattern(c, _str(c, fr, "open", "frame"), tokens, frozenset({"role"}), conds, "frame.open",
                          ("role",))
    frame_close = _pattern(c, _str(c, fr, "close", "frame"), tokens, frozenset(), conds, "frame.close")

    ro = _table(c, data, "roles", required=True)
    c.keys(ro, ("accepted", "text", "body", "frame", "name", "flags", "alias", "first_only", "continue", "drop_later"),
           "roles")
    # What a format that writes a message as several adds (none elsewhere).
    split_turn, split_body, split_frame = split_names(data)
    role_names = _choice(c, ro, "name", "roles", (DROP, "text"), DROP) == "text"
    flags = _strings(c, ro, "flags", "roles")
    # What a message's frame and body may ask of it.
    mconds = conds | frozenset(MESSAGE_CONDS) | frozenset(flags) | split_body
    accepted = _strings(c, ro, "accepted", "roles")
    for r in ("system", "user", "assistant"):
        if r not in accepted:
            c.add(f"roles.accepted must include {r!r}", "roles.accepted")
    texts = _table(c, ro, "text", "roles")
    bodies = _table(c, ro, "body", "roles")
    roles: dict[str, RoleLayout] = {}
    by_text: dict[str, str] = {}
    first_only = _strings(c, ro, "first_only", "roles")
    if any(r not in accepted for r in first_only):
        c.add("first_only lists accepted roles, written only as the first message", "roles.first_only")
    continues = _strings(c, ro, "continue", "roles")
    if any(r not in accepted for r in continues):
        c.add("continue lists accepted roles whose message after another of the role continues its turn",
              "roles.continue")
    for key, tab in (("text", texts), ("body", bodies)):
        for r in tab:
            if r not in accepted:
                c.add(f"{r!r} is not an accepted role", f"roles.{key}.{r}")
    for r in accepted:
        text = texts.get(r, r)
        if not isinstance(text, str) or not text:
            c.add("a role text is a non-empty string", f"roles.text.{r}")
            continue
        if text in by_text:
            c.add(f"roles {by_text[text]!r} and {r!r} are both written {text!r}: parse could not tell them apart",
                  f"roles.text.{r}")
        by_text[text] = r
        body_src = bodies.get(r, "{content}")
        assistant = r == "assistant"
        body = _pattern(c, body_src if isinstance(body_src, str) else None, tokens,
                        frozenset({"content", "reasoning", "calls", "results"} if assistant
                                  else {"content", "tool_call_id"}),
                        mconds | {"show_reasoning", "has_text"} if assistant else mconds, f"roles.body.{r}",
                        ("content",))
        if not isinstance(body_src, str):
            c.add("a body is a pattern (a string)", f"roles.body.{r}")
        if body is not None:
            roles[r] = RoleLayout(r, text, body)

    role_aliases: dict[str, str] = {}
    for r, v in _table(c, ro, "alias", "roles").items():
        if r in accepted or v not in accepted:
            c.add("an alias is a role that is not accepted, read as one that is", f"roles.alias.{r}")
        else:
            role_aliases[r] = v
    frames: dict[str, RoleFrame] = {}
    for r, tab in _table(c, ro, "frame", "roles").items():
        here = f"roles.frame.{r}"
        if r not in accepted or not isinstance(tab, dict):
            c.add(f"{r!r} is not an accepted role" if r not in accepted else "a role's frame is a table", here)
            continue
        c.keys(tab, ("open", "close", "group"), here)
        group = tab.get("group", "none")
        if group not in ("none", "run"):
            c.add("group is \"run\" (messages of the role in a row share one frame) or \"none\"", f"{here}.group")
        fo = _pattern(c, _str(c, tab, "open", here), tokens, frozenset({"role"}) | split_frame, mconds,
                      f"{here}.open")
        fc = _pattern(c, _str(c, tab, "close", here), tokens, split_frame, mconds, f"{here}.close")
        if fo is not None and fc is not None:
            frames[r] = RoleFrame(fo, fc, group == "run")

    sy = _table(c, data, "system")
    c.keys(sy, ("default", "with_tools", "hoist", "join", "head", "turn", "roles"), "system")
    # The system turn, always written: the first system message, the text
    # options, whether tools are given (some_tools: at least one), the
    # declaration a value syntax writes.
    system_turn = _pattern(c, _str(c, sy, "turn", "system", "") or None, tokens,
                           frozenset({"system", "tools", *text_options}),
                           conds | {"has_system", "has_tools", "some_tools"} | split_turn, "system.turn")
    system_roles = _strings(c, sy, "roles", "system") or ("system",)
    if "roles" in sy and ("system" not in system_roles or any(r not in accepted for r in system_roles)):
        c.add("roles lists accepted roles a first message the system turn holds may have, system among them",
              "system.roles")
    if system_turn is None and "turn" not in sy:
        # Nothing else writes a text option: it is never silently ignored.
        for k in text_options:
            c.add("a string option is read by a format with a [turns] section or a [system] turn", f"options.{k}")
    hoist = _pattern(c, _str(c, sy, "hoist", "system", "") or None, tokens, frozenset({"system"}), conds,
                     "system.hoist", ("system",))
    head = _pattern(c, _str(c, sy, "head", "system", "") or None, tokens, frozenset(), conds, "system.head")
    join = _str(c, sy, "join", "system", "\n\n") or ""
    default_system = sy.get("default")
    if default_system is not None and not isinstance(default_system, str):
        c.add("'default' must be a string", "system.default")
        default_system = None

    co = _table(c, data, "content")
    c.keys(co, ("parts", "missing", "image", "cut", "suffix", "trim", "strip", "forbid"), "content")
    content_trim = _strings(c, co, "trim", "content")
    if any(r not in accepted for r in content_trim):
        c.add("trim lists accepted roles whose text is trimmed part by part", "content.trim")
    strip = co.get("strip")
    if strip is not None and not (isinstance(strip, list) and len(strip) == 2
                                  and all(isinstance(x, str) and x for x in strip)):
        c.add("strip is two non-empty strings: an assistant's text loses what lies between them", "content.strip")
        strip = None
    suffix = _suffix(c, co.get("suffix"), accepted, tokens, conds)
    cut = None
    cut_tab = co.get("cut")
    if cut_tab is not None:
        after, unless = (cut_tab.get("after"), cut_tab.get("unless", "")) if isinstance(cut_tab, dict) else (None, "")
        if not isinstance(after, str) or not after or not isinstance(unless, str) \
                or set(cut_tab) - {"after", "unless"}:
            c.add("cut is { after = \"text\", unless = \"a condition\" }: content is written after the first "
                  "occurrence of the text", "content.cut")
        else:
            try:
                if unless:
                    Pattern.compile(f"{{?{unless}}}{{/}}", tokens, frozenset(), mconds, "content.cut.unless")
                cut = (after, unless)
            except TemplateError as e:
                c.add(e.msg, "content.cut.unless")
    parts_by_role: dict[str, str] = {}
    given_parts = co.get("parts", REFUSE)
    if isinstance(given_parts, dict):
        # By role: { default = "join", tool = "refuse", with_calls = "refuse" };
        # "keep": the body writes the list itself.
        for r, v in given_parts.items():
            if v not in (REFUSE, "join", KEEP, "first", "str") or (r not in ("default", "with_calls")
                                                                    and r not in accepted):
                c.add("parts is \"refuse\", \"join\", \"keep\", \"first\" (the first part's text) or \"str\" "
                      "(Python's str() of the list), for default, with_calls and accepted roles",
                      f"content.parts.{r}")
            elif r != "default":
                parts_by_role[r] = v
        parts = given_parts.get("default", REFUSE)
        if parts not in (REFUSE, "join"):
            parts = REFUSE
    else:
        parts = _choice(c, co, "parts", "content", (REFUSE, "join"), REFUSE)
    image = _pattern(c, _str(c, co, "image", "content", "") or None, tokens, frozenset(), conds, "content.image")
    missing_by_role: dict[str, str] = {}
    given_missing = co.get("missing", REFUSE)
    if isinstance(given_missing, dict):
        # By role: { default = "refuse", tool = "empty" }.
        for r, v in given_missing.items():
            if v not in (REFUSE, "empty", "with_calls") or (r != "default" and r not in accepted):
                c.add("missing is \"refuse\", \"empty\" or \"with_calls\" (empty beside calls, else refused), for "
                      "default and for accepted roles", f"content.missing.{r}")
            elif r != "default":
                missing_by_role[r] = v
        missing = given_missing.get("default", REFUSE)
        if missing not in (REFUSE, "empty"):
            missing = REFUSE
    else:
        missing = _choice(c, co, "missing", "content", (REFUSE, "empty"), REFUSE)
    policies: dict[str, str] = {}
    kinds = {"calls": (DROP, REFUSE, EACH), "tools": (DROP, REFUSE, SYSTEM, TURN, TURNS, LAST_USER, SYNTAX),
             "reasoning": (DROP, HISTORY)}
    extra = {"calls": ("each", "section", "ids", "id", "pair", "id_tail", "syntax", "result", "pending", "leave_open",
                       "keep", *CALL_KEYS),
             "tools": ("each", "block", "turn", "pair", "skip", "syntax", "keywords"),
             "reasoning": ("show", "query_excludes", "last", "split", "block", "opened", "ending", "keys")}
    tabs: dict[str, dict[str, Any]] = {}
    for section, allowed in kinds.items():
        tab = tabs[section] = _table(c, data, section)
        c.keys(tab, ("render", *extra[section]), section)
        if "render" not in tab:
            c.add(f"[{section}] render is required: one of {', '.join(map(repr, allowed))}", section)
        policies[section] = _choice(c, tab, "render", section, allowed, DROP)
    calls_each = tools_each = tools_block = with_tools = tools_turn = call_section = call_id = None
    ct = tabs["calls"]
    call_ids = _choice(c, ct, "ids", "calls", ("absent", "given", "generated"), "absent")
    arguments = _choice(c, ct, "arguments", "calls", ("as_given", "tojson", "string", "pairs", SYNTAX), "as_given")
    calls_syntax = _syntax(c, ct, "calls", "write") if arguments == SYNTAX else ""
    tools_syntax = _syntax(c, tabs["tools"], "tools", "declare") if policies["tools"] == SYNTAX else ""
    for section, named in (("calls", calls_syntax), ("tools", tools_syntax)):
        if "syntax" in tabs[section] and not named:
            c.add("a value syntax is read with " + ("arguments" if section == "calls" else "render") + " = \"syntax\"",
                  f"{section}.syntax")
    tools_keywords = _strings(c, tabs["tools"], "keywords", "tools")
    if tools_keywords and not tools_syntax:
        c.add("keywords are read with render = \"syntax\"", "tools.keywords")
    # Tool results folded into the calling turn, right after its calls.
    call_result = _pattern(c, _str(c, ct, "result", "calls", "") or None, tokens, frozenset({"name", "content"}),
                           conds, "calls.result", ("content",))
    calls_pending = _pattern(c, _str(c, ct, "pending", "calls", "") or None, tokens, frozenset(), conds,
                             "calls.pending")
    leave_open = ct.get("leave_open", False)
    if not isinstance(leave_open, bool):
        c.add("'leave_open' must be true or false", "calls.leave_open")
        leave_open = False
    if call_result is None:
        for key, used in (("calls.pending", calls_pending is not None), ("calls.leave_open", leave_open),
                          ("roles.continue", bool(continues)), ("content.trim", bool(content_trim)),
                          ("content.strip", strip is not None)):
            if used:
                c.add("read where tool results are folded into the calling turn ([calls] result)", key)
    elif policies["calls"] != EACH:
        c.add("results are folded after calls: [calls] render = \"each\"", "calls.result")
    call_pair = None
    if arguments == "pairs":
        # Each argument written by a pattern of its key and its value (a
        # string as it is, anything else as tojson writes it).
        call_pair = _pattern(c, _str(c, ct, "pair", "calls"), tokens, frozenset({"key", "value"}), conds,
                             "calls.pair", ("key", "value"))
    elif "pair" in ct:
        c.add("a pair pattern is read with arguments = \"pairs\"", "calls.pair")
    if policies["calls"] == EACH:
        call_slots = {"name", "arguments"} | ({"id"} if call_ids != "absent" else set())
        calls_each = _pattern(c, _str(c, ct, "each", "calls"), tokens, frozenset(call_slots),
                              conds | {"first", "has_content", "string"}, "calls.each",
                              ("arguments", "id") if call_ids != "absent" else ("name", "arguments"))
        call_section = _pattern(c, _str(c, ct, "section", "calls", "") or None, tokens, frozenset({"calls"}), conds,
                           "calls.section", ("calls",))
        call_id = _pattern(c, _str(c, ct, "id", "calls", "") or None, tokens, frozenset({"name", "index"}),
                           frozenset(), "calls.id", ("name",))
        if call_ids == "generated" and call_id is None:
            c.add("generated ids need their spelling: id = \"…{name}…\"", "calls.id")
        if calls_each is not None and "name" not in calls_each.slots() and call_id is None:
            c.add("a call that writes no {name} needs an id that spells it: id = \"…{name}…\"", "calls.each")
    if policies["tools"] == SYSTEM:
        tools_each = _pattern(c, _str(c, tabs["tools"], "each", "tools"), tokens, frozenset({"tool"}), conds,
                              "tools.each", ("tool",))
        tools_block = _pattern(c, _str(c, tabs["tools"], "block", "tools"), tokens, frozenset({"tools"}), conds,
                               "tools.block", ("tools",))
        with_tools = _pattern(c, _str(c, sy, "with_tools", "system"), tokens, frozenset({"system", "tools"}),
                              conds | {"has_system"}, "system.with_tools", ("tools",))
    tools_pair = None
    tools_skip: tuple[str, ...] = ()
    if policies["tools"] == LAST_USER:
        tt = tabs["tools"]
        tools_each = _pattern(c, _str(c, tt, "each", "tools"), tokens, frozenset({"tool"}), conds | {"first", "last"},
                              "tools.each", ("tool",))
        tools_block = _pattern(c, _str(c, tt, "block", "tools"), tokens, frozenset({"tools"}), conds, "tools.block",
                               ("tools",))
        # A tool's function key by key (slot tool: every key so written),
        # else its JSON.
        tools_pair = _pattern(c, _str(c, tt, "pair", "tools", "") or None, tokens, frozenset({"key", "value"}),
                              conds | {"first", "last", "string"}, "tools.pair", ("key", "value"))
        tools_skip = _strings(c, tt, "skip", "tools")
    elif "pair" in tabs["tools"] or "skip" in tabs["tools"]:
        c.add("pair and skip are read with render = \"last_user\"", "tools")
    id_tail = ct.get("id_tail", 0)
    if type(id_tail) is not int or not 0 <= id_tail <= 256 or (id_tail and call_ids != "given"):
        c.add("id_tail is an integer from 1 to 256, read with ids = \"given\"", "calls.id_tail")
        id_tail = 0
    calls_content = "keep" if "turns" in data else _choice(c, ct, "content", "calls",
                                                           ("keep", DROP, "reasoning"), "keep")
    tools_turn_each = None
    if policies["tools"] == TURN:
        tools_turn = _pattern(c, _str(c, tabs["tools"], "turn", "tools"), tokens, frozenset({"tools"}), conds,
                              "tools.turn", ("tools",))
        if "each" in tabs["tools"]:
            # The declaration tool by tool (slot tool: one tool's JSON), not
            # the list's JSON.
            tools_turn_each = _pattern(c, _str(c, tabs["tools"], "each", "tools"), tokens, frozenset({"tool"}),
                                       conds, "tools.each", ("tool",))
    rt = tabs["reasoning"]
    show = _choice(c, rt, "show", "reasoning", ("never", "after_last_query", "after_last_answer", "after_last_user"),
                   "never")
    last = rt.get("last", False)
    if not isinstance(last, bool):
        c.add("'last' must be true or false", "reasoning.last")
        last = False
    pairs: dict[str, tuple[str, str] | None] = {}
    for key in ("query_excludes", "split", "block", "opened"):
        v = rt.get(key)
        if v is not None and not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) and x for x in v)):
            c.add(f"{key!r} is two non-empty strings: where it opens and where it closes", f"reasoning.{key}")
            v = None
        pairs[key] = (v[0], v[1]) if v is not None else None

    pr = _table(c, data, "prompt", required=True)
    c.keys(pr, ("body",), "prompt")
    prompt = _pattern(c, _str(c, pr, "body", "prompt"), tokens, frozenset(), conds | {"after_user", "after_calls"},
                      "prompt.body")

    turns = build_turns(c, data, tokens, options, _pattern)
    if (turns is None) != (policies["tools"] != TURNS) and not c.problems:
        c.add("[tools] render = \"turns\" and a [turns] section go together", "turns")
    if system_turn is not None and ("tools" in system_turn.slots()) != (policies["tools"] == SYNTAX):
        c.add("the system turn's {tools} slot and [tools] render = \"syntax\" go together", "system.turn")
    reasoning_keys = _strings(c, rt, "keys", "reasoning")
    if reasoning_keys and (call_result is None or set(reasoning_keys) - {"reasoning", "reasoning_content", "thinking"}):
        c.add("keys lists reasoning, reasoning_content and thinking in the order the template reads them, where "
              "tool results are folded", "reasoning.keys")
    if call_result is not None and policies["reasoning"] == HISTORY and show != "after_last_user":
        c.add("where results are folded, reasoning is shown by show = \"after_last_user\"", "reasoning.show")
    if call_result is None:
        # Only the writer of folded results asks these.
        for key, p, names in (("prompt.body", prompt, {"after_calls"}), ("calls.each", calls_each, {"string"})):
            if p is not None and _asks(p.items, frozenset(names)):
                c.add(f"{' and '.join(sorted(names))} is asked where tool results are folded ([calls] result)", key)
    if "assistant" in roles and "results" in roles["assistant"].body.slots() and call_result is None:
        c.add("the {results} slot is read where tool results are folded ([calls] result)", "roles.body.assistant")
    split = build_split(c, data, accepted, [*(r.body for r in roles.values()), *(f.open for f in frames.values()),
                                            *(f.close for f in frames.values())])
    if c.problems or name is None or frame_open is None or frame_close is None or prompt is None:
        return None
    patterns = [frame_open, frame_close, prompt, *(r.body for r in roles.values())]
    asked = frozenset(MESSAGE_CONDS) | frozenset(flags)
    message_conds = any(_asks(p.items, asked) for p in
                        [prompt, *(r.body for r in roles.values()), *(f.open for f in frames.values()),
                         *(f.close for f in frames.values())])
    # What render writes and no reader reads yet: the readers refuse the
    # dialect by these names.
    asks_text = "assistant" in roles and _asks(roles["assistant"].body.items, frozenset({"has_text"}))
    # Turns that no marker closes, with calls as pairs, have a reader of
    # their own (.layout_open) that reads these five.
    unread = not (call_pair is not None and not frame_close.items and set(frames) >= set(roles)
                  and not any(f.close.items for f in frames.values()))
    # A system turn, framed messages and calls as one JSON array: the
    # reader of that kind (.layout_system_turn) reads the nine it names.
    unread_turn = not system_turn_kind(
        system_turn is not None, policies["tools"], policies["calls"], call_section is not None, arguments,
        set(frames) >= set(roles) - set(first_only),
        bool(tools_syntax or calls_syntax or call_result is not None or continues or content_trim
             or strip is not None or split is not None or turns is not None or call_pair is not None))
    # Results folded into the calling turn, calls and tools by a value
    # syntax: the reader of that kind (.layout_fold_read) reads the eight
    # it names.
    unread_fold = not fold_kind(
        call_result is not None, policies["calls"], arguments, policies["tools"], system_turn is not None,
        call_section is not None,
        bool(split is not None or turns is not None or call_pair is not None or frames or text_options or first_only
             or id_tail or hoist is not None or call_ids != "absent"))
    render_only = tuple(what for what, used in (
        ("a head", head is not None and unread and unread_turn and unread_fold),
        ("tools declared one by one in their own turn", tools_turn_each is not None and unread),
        ("a suffix added to content", suffix is not None and unread),
        ("arguments as key/value pairs", call_pair is not None and unread),
        ("content written where it holds more than whitespace", asks_text and unread),
        ("a system turn of its own", system_turn is not None and unread_turn and unread_fold),
        ("text options", bool(text_options) and unread_turn),
        ("a role written only first", bool(first_only) and unread_turn),
        ("tools declared before the last user message", policies["tools"] == LAST_USER and unread_turn),
        ("call ids cut to their last characters", bool(id_tail) and unread_turn),
        ("the content beside calls left out", calls_content == DROP and unread_turn),
        ("the first part of a content list", "first" in parts_by_role.values() and unread_turn),
        ("a content list as Python's str()", "str" in parts_by_role.values() and unread_turn),
        ("tools declared by a value syntax", bool(tools_syntax) and unread_fold),
        ("arguments written by a value syntax", bool(calls_syntax) and unread_fold),
        ("tool results folded into the calling turn", call_result is not None and unread_fold),
        ("a turn continued by the next message of its role", bool(continues) and unread_fold),
        ("content trimmed part by part", bool(content_trim) and unread_fold),
        ("text cut out of an answer's content", strip is not None and unread_fold))
        # A format that writes a message as several is read by its own
        # reader (.layout_harmony), which reads each of these it may write.
        if used and split is None)
    if turns is not None:
        # The writer of [turns] formats writes none of these.
        for what, key, used in (("a head", "system.head", head is not None),
                                ("a content suffix", "content.suffix", suffix is not None),
                                ("arguments as pairs", "calls.pair", call_pair is not None)):
            if used:
                c.add(f"{what} is not written with [turns]", key)
    parseable = (all(p.parseable() for p in patterns) and not frames and policies["calls"] != EACH
                 and policies["tools"] not in (SYSTEM, TURN) and policies["reasoning"] != HISTORY and not role_names
                 and image is None and hoist is None and not message_conds)
    return LayoutDialect(
        name=name, description=description, path=path, reference=reference, special=special, added=added,
        stops=stops, roles=roles, frame_open=frame_open, frame_close=frame_close, prompt=prompt,
        default_system=default_system, content_parts=parts, content_missing=missing, missing_by_role=missing_by_role,
        calls=policies["calls"],
        tools=policies["tools"], reasoning=policies["reasoning"], options=options, role_frames=frames,
        tools_each=tools_each, tools_block=tools_block, system_with_tools=with_tools, reasoning_show=show,
        query_excludes=pairs["query_excludes"], reasoning_last=last, reasoning_split=pairs["split"],
        calls_each=calls_each, header_turns=turns, role_aliases=role_aliases,
        role_names=role_names, tools_turn=tools_turn, calls_section=call_section,
        call_ids=call_ids, call_id=call_id, arguments=arguments, parts_by_role=parts_by_role, image=image,
        reasoning_block=pairs["block"], system_hoist=hoist, system_join=join, flags=flags,
        message_conds=message_conds, content_cut=cut, reasoning_opened=pairs["opened"], option_aliases=aliases,
        parseable=parseable, head=head, tools_turn_each=tools_turn_each, content_suffix=suffix, call_pair=call_pair,
        render_only=render_only, system_turn=system_turn, text_options=text_options, first_only=first_only,
        tools_pair=tools_pair, tools_skip=tools_skip, id_tail=id_tail, calls_content=calls_content,
        system_roles=system_roles, tools_syntax=tools_syntax, tools_keywords=tools_keywords, calls_syntax=calls_syntax,
        call_result=call_result, calls_pending=calls_pending, results_open=leave_open, continues=continues,
        content_trim=content_trim, content_strip=(strip[0], strip[1]) if strip is not None else None,
        reasoning_keys=reasoning_keys, split=split)


def _syntax(c: Checker, tab: dict[str, Any], where: str, operation: str) -> str:
    """The name of the value syntax ``[where] syntax`` names, checked to be
    installed and to have ``operation``; "" with a problem otherwise."""
    name = _str(c, tab, "syntax", where)
    if name is None:
        return ""
    try:
        syntax = load_value_syntax(name)
    except TemplateError as e:
        c.add(e.msg, f"{where}.syntax")
        return ""
    if operation not in syntax.operations:
        c.add(f"value syntax {name!r} has no {operation!r} operation", f"{where}.syntax")
        return ""
    return name


def _suffix(c: Checker, tab: Any, accepted: Sequence[str], tokens: Sequence[str],
            conds: frozenset[str]) -> tuple[str, str, str] | None:
    """``{ role = "user", text = "/nothink", when = "a condition" }``: the
    text added to the content of the role's messages where the condition
    holds, unless the content already ends with it."""
    if tab is None:
        return None
    role, text, when = (tab.get("role"), tab.get("text"), tab.get("when", "")) if isinstance(tab, dict) else \
        (None, None, "")
    if not isinstance(role, str) or role not in accepted or not isinstance(text, str) or not text or \
            not isinstance(when, str) or set(tab) - {"role", "text", "when"}:
        c.add("suffix is { role = \"an accepted role\", text = \"text\", when = \"a condition\" }", "content.suffix")
        return None
    try:
        if when:
            Pattern.compile(f"{{?{when}}}{{/}}", tokens, frozenset(), conds, "content.suffix.when")
    except TemplateError as e:
        c.add(e.msg, "content.suffix.when")
        return None
    return role, text, when


def _text_options(c: Checker, op: dict[str, Any]) -> dict[str, TextOption]:
    """The ``string`` options of a format without ``[turns]``: ``{ type =
    "string", default = "text" }``, or ``clock = "%Y-%m-%d"`` for the day of
    the render (a template that reads the clock)."""
    out: dict[str, TextOption] = {}
    for k, v in op.items():
        if not isinstance(v, dict) or v.get("type") != STRING:
            continue
        c.keys(v, ("type", "default", "clock"), f"options.{k}")
        default, clock = v.get("default"), v.get("clock", "")
        if (default is None) == (not clock) or not isinstance(default, str | None) or not isinstance(clock, str) \
                or (clock and "%" not in clock):
            c.add("a string option is { type = \"string\", default = \"text\" } or { type = \"string\", clock = "
                  "\"%Y-%m-%d\" } (the day of the render)", f"options.{k}")
        else:
            out[k] = TextOption(k, STRING, default, clock=clock)
    return out


def _asks(items: tuple[Item, ...], names: frozenset[str]) -> bool:
    """Whether a pattern's conditions name any of ``names``."""
    for i in items:
        if isinstance(i, Cond) and (any(w in names for w in i.name.split(" ")) or _asks(i.body, names)):
            return True
    return False


def check_any(data: Any, path: str = "") -> tuple[Dialect | LayoutDialect | None, list[Problem]]:
    """The dialect, XTML or layout, of parsed TOML and every problem found in it."""
    if is_layout(data):
        return run_checks(data, path, build_layout)
    return check(data, path)


def check_any_text(text: str, where: str) -> tuple[Dialect | LayoutDialect | None, list[Problem]]:
    """:func:`~.template_file.check_text` for either kind of dialect."""
    return check_toml(text, where, check_any)


def load_any_dialect(name_or_path: str | Path) -> Dialect | LayoutDialect:
    """A built-in dialect by name, or a dialect file by path, of either kind."""
    text, where = read_template(name_or_path)
    d, problems = check_any_text(text, where)
    if isinstance(d, LayoutDialect):
        return d
    return first_or(d, problems, where)
