"""What the Jinja chat template of a layout dialect writes for tool results
folded into the calling turn and values written by a value syntax (Gemma 4),
as :func:`~xtml.chat.layout_fold.fold` and
:func:`~xtml.chat.layout_fold.declared_by_syntax` write them: each result of
the run after an answer's calls written in its turn under the name of the
call it answers, the pending text of calls without results, a turn left open
and continued by the next message of its role, text cut and trimmed part by
part, reasoning read in the format's order of keys, and the tools and each
object's arguments written by the value syntax.

A value syntax is code: its writer comes as Jinja macros from the syntax
itself (its ``jinja`` operation, :meth:`~xtml.plugins.values.ValueSyntax.
jinja_macros`), named with :data:`PREFIX`; a syntax without it is refused at
the dialect's file. Before the syntax writes, the template refuses, as xtml
does, a tool or an argument whose string or key spells one of the dialect's
tokens, at the same path (the walk of xtml's, depth first, the last child
first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..chat.layout import DROP, EACH, HISTORY, SYNTAX, LayoutDialect
from ..chat.layout_pattern import Pattern
from ..errors import CallerError, TemplateError
from ..plugins.values import load_value_syntax
from .jinja_text import quote as _q

__all__ = ["KNOWN", "PREFIX", "check", "macros", "render", "tools_value"]

KNOWN = frozenset({"tools_syntax", "tools_keywords", "calls_syntax", "call_result", "calls_pending", "results_open",
                   "continues", "content_trim", "content_strip", "reasoning_keys"})
"""The fields of :class:`LayoutDialect` this module writes."""

PREFIX = "x_vs_"
"""The prefix of the value syntax's macros."""

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

Pat = Callable[[Pattern, Any, Mapping[str, str]], str]


def _raise(message: str) -> str:
    return "{{ raise_exception(" + message + ") }}"


def _syntaxes(d: LayoutDialect) -> list[str]:
    return list(dict.fromkeys(s for s in (d.tools_syntax, d.calls_syntax) if s))


def check(d: LayoutDialect) -> None:
    """What of these keys the writers cannot write, refused."""
    if d.tools == SYNTAX and d.system_turn is None:
        raise TemplateError("the Jinja export declares tools by a value syntax in a system turn of the format's "
                            "own only")
    if d.arguments == SYNTAX and d.call_result is None:
        raise TemplateError("the Jinja export writes arguments by a value syntax with tool results folded into the "
                            "calling turn only")
    if d.call_result is not None:
        if d.calls != EACH or d.calls_each is None or d.header_turns is not None:
            raise TemplateError("the Jinja export folds tool results into calls rendered each, without [turns], "
                                "only")
        others = {"flags": bool(d.flags), "a content cut": d.content_cut is not None,
                  "a hoisted system prompt": d.system_hoist is not None,
                  "a default system prompt": d.default_system is not None,
                  "a content suffix": d.content_suffix is not None, "names": d.role_names,
                  "images": d.image is not None, "a calls section": d.calls_section is not None,
                  "arguments as pairs": d.call_pair is not None, "cut ids": bool(d.id_tail),
                  "content left out beside calls": d.calls_content == DROP, "roles written only first":
                      bool(d.first_only), "tools other than in the system turn": d.tools not in (SYNTAX, "drop",
                                                                                                 "refuse")}
        used = [k for k, v in others.items() if v]
        if used:
            raise TemplateError("the Jinja export does not write tool results folded into the calling turn with "
                                + ", ".join(used) + " yet")
    for name in _syntaxes(d):
        try:
            syntax = load_value_syntax(name)
        except CallerError as e:
            raise TemplateError(e.msg) from None
        if "jinja" not in syntax.operations:
            raise TemplateError(f"the Jinja export writes a value syntax with its writer as Jinja macros: value "
                                f"syntax {name!r} has no 'jinja' operation (it has: "
                                f"{', '.join(sorted(syntax.operations)) or 'none'}): render with xtml")


def macros(d: LayoutDialect, have: Mapping[str, bool]) -> str:
    """The macros of the keys the dialect uses: the value syntax's, the
    helpers they call that the template lacks (``have``: which of ``x_py``,
    ``x_ascii`` and ``x_pfloat`` it has), the walk that finds a token's
    spelling and the reading of a message's text."""
    names = _syntaxes(d)
    if not names and d.call_result is None:
        return ""
    out: list[str] = []
    if names:
        if not have.get("x_pfloat"):
            from .layout_jinja_pairs import MACROS

            out.append(MACROS)
        if not have.get("x_ascii"):
            chain = "".join(" | replace(" + _q(ch) + ", '')" for ch in
                            "".join(chr(c) for c in range(0x20, 0x7F)) + "\t\n\r")
            out.append("{%- macro x_ascii(s) -%}{{ 'y' if (s" + chain + ") == '' else '' }}{%- endmacro -%}")
        if not have.get("x_py"):
            py = str([0.00001, "'\"\n"])
            out.append("{%- set x_py = ([0.00001, " + _q("'\"\n") + "] | string) == " + _q(py) + " -%}")
        out.append(load_value_syntax(names[0]).jinja_macros(PREFIX))
        tokens = "[" + ", ".join(_q(t) for t in d.tokens) + "]"
        out += [
            # '' where no string or key of v spells a token, else '@' and
            # the path of the first that does, in xtml's walk.
            "{%- macro x_spelled(v, at) -%}",
            "{%- set n = namespace(hit='') -%}",
            "{%- if v is string -%}",
            "{%- for t in " + tokens + " -%}{%- if t in v -%}{%- set n.hit = '@' ~ at -%}{%- endif -%}{%- endfor -%}",
            "{%- elif v is mapping -%}",
            "{%- set ks = namespace(v=[]) -%}",
            "{%- for k in v -%}{%- set ks.v = ks.v + [k] -%}",
            "{%- if n.hit == '' and k is string -%}{%- for t in " + tokens + " -%}{%- if t in k -%}"
            "{%- set n.hit = '@' ~ at ~ '.' ~ k -%}{%- endif -%}{%- endfor -%}{%- endif -%}",
            "{%- endfor -%}",
            "{%- for j in range(ks.v | length) -%}{%- if n.hit == '' -%}",
            "{%- set k = ks.v[(ks.v | length) - 1 - j] -%}",
            "{%- set g = namespace(v=none) -%}",
            "{%- if v[k] is defined -%}{%- set g.v = v[k] -%}{%- else -%}{%- for k2, v2 in v.items() -%}"
            "{%- if k2 == k -%}{%- set g.v = v2 -%}{%- endif -%}{%- endfor -%}{%- endif -%}",
            "{%- set n.hit = x_spelled(g.v, at ~ '.' ~ k) ~ '' -%}",
            "{%- endif -%}{%- endfor -%}",
            "{%- elif v is iterable -%}",
            "{%- for j in range(v | length) -%}{%- if n.hit == '' -%}",
            "{%- set n.hit = x_spelled(v[(v | length) - 1 - j], at ~ '[' ~ ((v | length) - 1 - j) ~ ']') ~ '' -%}",
            "{%- endif -%}{%- endfor -%}",
            "{%- endif -%}",
            "{{ n.hit }}",
            "{%- endmacro -%}"]
    if d.call_result is not None:
        strip = d.content_strip
        cut = ("{%- set x_s = namespace(v='') -%}{%- for x_q in s.split(" + _q(strip[1]) + ") -%}"
               "{%- set x_s.v = x_s.v ~ x_q.split(" + _q(strip[0]) + ")[0] -%}{%- endfor -%}{%- set s = x_s.v -%}"
               if strip is not None else "")
        out += [
            # A message's content as the format writes it: a string, or each
            # text part's text; each piece cut (``strip``) and trimmed
            # (``trim``) before they are joined.
            "{%- macro x_text(c, at, strip, trim) -%}",
            "{%- set n = namespace(out='') -%}",
            "{%- if c is string -%}{%- set ps = [c] -%}{%- elif c is none -%}{%- set ps = [] -%}"
            "{%- else -%}{%- set ps = c -%}{%- endif -%}",
            "{%- for p in ps -%}",
            "{%- if c is string -%}{%- set s = p -%}",
            "{%- elif p is mapping and 'type' in p and p['type'] == 'text' and 'text' in p and p['text'] is string -%}"
            "{%- set s = p['text'] -%}",
            "{%- else -%}",
            _raise(_q("only text parts ({\"type\": \"text\", \"text\": ...}) are written by this format") + " ~ ' (at '"
                   " ~ at ~ '[' ~ loop.index0 ~ '])'"),
            "{%- set s = '' -%}",
            "{%- endif -%}",
            "{%- if strip -%}" + cut + "{%- endif -%}",
            "{%- if trim -%}{%- set s = x_trim(s) ~ '' -%}{%- endif -%}",
            "{%- set n.out = n.out ~ s -%}",
            "{%- endfor -%}",
            "{{ n.out }}",
            "{%- endmacro -%}"]
    return "".join(out)


def tools_value(d: LayoutDialect, code: Callable[[str], object]) -> object:
    """The system turn's ``{tools}``: the tools declared by the value syntax
    (tools given and true to Python), each refused first where it spells a
    token; ``''`` for a dialect without."""
    if d.tools != SYNTAX:
        return "''"
    spelled = _q(f"a tool's text spells one of the {d.name} format's tokens, which its declaration writes as tokens")
    return code("".join([
        "{%- if tools is defined and tools is not none and x_given(tools) == 'y' and not (tools is boolean and not "
        "tools) and not (tools is number and tools == 0) -%}",
        "{%- if tools is string or tools is mapping or tools is not iterable -%}",
        _raise(_q("tools must be a list of tool schemas (at option 'tools')")),
        "{%- endif -%}",
        "{%- for x_t in tools -%}",
        "{%- set x_at = x_spelled(x_t, '') ~ '' -%}",
        "{%- if x_at != '' -%}",
        _raise(spelled + " ~ ' (at tools[' ~ loop.index0 ~ ']' ~ x_at[1:] ~ ')'"),
        "{%- endif -%}",
        "{%- endfor -%}",
        "{{ " + PREFIX + "declare(tools) }}",
        "{%- endif -%}"]))


def render(d: LayoutDialect, pattern: Pat, options: Mapping[str, str], code: Callable[[str], object]) -> str:
    """The messages after the system turn (from ``x.start``) and the
    generation prompt, results folded into the calling turn (see the
    module's doc)."""
    each, result = d.calls_each, d.call_result
    assert each is not None and result is not None
    roles = d.roles
    cont = "[" + ", ".join(_q(r) for r in d.continues) + "]"
    trim = "[" + ", ".join(_q(r) for r in d.content_trim) + "]"
    conds = {**options, "after_user": "x_y.au",
             "after_tool": "(x_k > 0 and x.entries[x_k - 1][0] == 'tool')", "has_calls": "x_e[3] | length > 0"}
    # The body's reasoning: the first key holding text, in the format's order.
    keys = d.reasoning_keys or _REASONING_KEYS
    first = "''"
    for k in reversed(keys):
        first = (f"(x_m[{_q(k)}] if {_q(k)} in x_m and x_m[{_q(k)}] is string and x_m[{_q(k)}] != '' "
                 f"else {first})")
    at_args = "'messages[' ~ x_k ~ '].tool_calls[' ~ x_j ~ '].function.arguments'"
    args_spelled = _q(f"an argument spells one of the {d.name} format's tokens, which its value syntax writes as "
                      "tokens")
    calls_code = "".join([
        "{%- for x_call in x_e[3] -%}",
        "{%- set x_j = loop.index0 -%}",
        "{%- set x_rc = x_m.tool_calls[x_j] -%}",
        "{%- set x_fn = x_rc['function'] if 'function' in x_rc else x_rc -%}",
        "{%- set x_g = x_fn['arguments'] if 'arguments' in x_fn else none -%}",
        "{%- set x_w = namespace(first=loop.first, isstr=x_g is string, args=x_call[1]) -%}",
        *(["{%- if x_g is mapping -%}",
           "{%- set x_at = x_spelled(x_g, '') ~ '' -%}",
           "{%- if x_at != '' -%}",
           _raise(args_spelled + " ~ ' (at ' ~ " + at_args + " ~ x_at[1:] ~ ')'"),
           "{%- endif -%}",
           "{%- set x_w.args = " + PREFIX + "write(x_g, " + at_args + ") ~ '' -%}",
           "{%- endif -%}"] if d.calls_syntax else []),
        pattern(each, {"name": "x_call[0]", "arguments": "x_w.args", "id": "''"},
                {**conds, "first": "x_w.first", "has_content": "x_y.text != ''", "string": "x_w.isstr"}),
        "{%- endfor -%}"])
    results_code = "".join([
        "{%- for x_res in x_rs.got -%}",
        pattern(result, {"name": "x_res[0]", "content": "x_res[1]"}, conds),
        "{%- endfor -%}"])
    body = roles["assistant"].body if "assistant" in roles else None
    out = [
        "{%- set x_f = namespace(last=-1, prev='', before=false) -%}",
        "{%- for x_e in x.entries -%}{%- if loop.index0 >= x.start and x_e[0] == 'user' -%}"
        "{%- set x_f.last = loop.index0 -%}{%- endif -%}{%- endfor -%}",
        "{%- for x_e in x.entries -%}",
        "{%- set x_k = loop.index0 -%}",
        "{%- set x_m = messages[x_k] -%}",
        "{%- if x_k >= x.start and x_e[0] != 'tool' -%}",
        "{%- set x_f.before = x_e[3] | length > 0 -%}",
        "{%- set x_y = namespace(text='', show=false, r='', au=x_f.prev == 'user') -%}",
        # The run of results after the calls, each under the name of the
        # last call whose id is its tool_call_id (absent equal to absent),
        # else its own.
        "{%- set x_rs = namespace(got=[], stop=false) -%}",
        "{%- if x_e[3] | length > 0 -%}",
        "{%- for x_i2 in range(x_k + 1, x.entries | length) -%}",
        "{%- if not x_rs.stop and x.entries[x_i2][0] != 'tool' -%}{%- set x_rs.stop = true -%}{%- endif -%}",
        "{%- if not x_rs.stop -%}",
        "{%- set x_tm = messages[x_i2] -%}",
        "{%- set x_key = x_tm.tool_call_id if 'tool_call_id' in x_tm and x_tm.tool_call_id is not none else none -%}",
        "{%- set x_nm = namespace(v=(x_tm.name if 'name' in x_tm and x_tm.name is not none else none)) -%}",
        "{%- if x_key is none or x_key is string -%}",
        "{%- for x_c in x_m.tool_calls -%}",
        "{%- set x_cid = x_c.id if 'id' in x_c and x_c.id is not none else none -%}",
        "{%- if (x_cid is none and x_key is none) or (x_cid is string and x_key is string and x_cid == x_key) -%}"
        "{%- set x_nm.v = x_e[3][loop.index0][0] -%}{%- endif -%}",
        "{%- endfor -%}",
        "{%- endif -%}",
        "{%- if x_nm.v is not string -%}",
        _raise(_q(f"the {d.name} format writes a tool result under the name of the call it answers: no call before "
                  "it has this tool_call_id and the result has no name (the template raises)")
               + " ~ ' (at messages[' ~ x_i2 ~ '].tool_call_id)'"),
        "{%- endif -%}",
        "{%- if 'content' not in x_tm or x_tm.content is none -%}",
        _raise(_q(f"the {d.name} format writes a tool result's content as text: the template would print None")
               + " ~ ' (at messages[' ~ x_i2 ~ '].content)'"),
        "{%- endif -%}",
        "{%- set x_rs.got = x_rs.got + [[x_nm.v, x_text(x_tm.content, 'messages[' ~ x_i2 ~ '].content', false, "
        "false) ~ '']] -%}",
        "{%- endif -%}",
        "{%- endfor -%}",
        "{%- endif -%}",
    ]
    # The opening, unless the message continues the turn of its role.
    opening = []
    for n, role in enumerate(r for r in roles if r != "tool"):
        frame = d.role_frames.get(role)
        open_ = d.frame_open if frame is None else frame.open
        opening.append(("{%- if " if n == 0 else "{%- elif ") + f"x_e[0] == {_q(role)} -%}}"
                       + pattern(open_, {"role": _q(roles[role].text)}, conds))
    if opening:
        opening.append("{%- endif -%}")
    out += ["{%- if not (x_e[0] in " + cont + " and x_f.prev == x_e[0]) -%}", *opening, "{%- endif -%}",
            "{%- set x_y.text = x_text(x_m.content if 'content' in x_m else none, 'messages[' ~ x_k ~ '].content', "
            "x_e[0] == 'assistant', x_e[0] in " + trim + ") ~ '' -%}",
            "{%- set x_f.prev = x_e[0] -%}"]
    for n, role in enumerate(r for r in roles if r != "tool"):
        out.append(("{%- if " if n == 0 else "{%- elif ") + f"x_e[0] == {_q(role)} -%}}")
        if role == "assistant" and body is not None:
            if d.reasoning == HISTORY:
                for k in _REASONING_KEYS:
                    out += ["{%- if " + _q(k) + " in x_m and x_m[" + _q(k) + "] is not none and x_m[" + _q(k)
                            + "] is not string -%}",
                            _raise(_q("reasoning must be a string") + " ~ ' (at messages[' ~ x_k ~ ']." + k + ")'"),
                            "{%- endif -%}"]
                out += ["{%- set x_y.r = " + first + " -%}",
                        "{%- set x_y.show = x_k > x_f.last and x_y.r != '' -%}"]
            out.append(pattern(body, {"content": "x_y.text", "reasoning": "x_y.r", "calls": code(calls_code),
                                      "results": code(results_code)},
                               {**conds, "show_reasoning": "x_y.show",
                                "has_text": "(x_trim(x_y.text) ~ '') != ''"}))
        else:
            out.append(pattern(roles[role].body, {"content": "x_y.text", "tool_call_id": "''"}, conds))
    out.append("{%- endif -%}")
    # What ends the turn: the pending text of calls without results, else the
    # close, but for a turn with results and no content the format leaves open.
    pending = d.calls_pending
    closes = []
    for n, role in enumerate(r for r in roles if r != "tool"):
        frame = d.role_frames.get(role)
        close = d.frame_close if frame is None else frame.close
        closes.append(("{%- if " if n == 0 else "{%- elif ") + f"x_e[0] == {_q(role)} -%}}"
                      + pattern(close, {}, conds))
    closes.append("{%- endif -%}")
    left_open = ("x_rs.got | length > 0 and not ('content' in x_m and x_m.content is not none and "
                 "x_given(x_m.content) == 'y')") if d.results_open else "false"
    if pending is not None:
        out += ["{%- if x_e[3] | length > 0 and x_rs.got | length == 0 -%}", pattern(pending, {}, conds),
                "{%- elif not (" + left_open + ") -%}", *closes, "{%- endif -%}"]
    else:
        out += ["{%- if not (" + left_open + ") -%}", *closes, "{%- endif -%}"]
    out += ["{%- endif -%}", "{%- endfor -%}",
            "{%- if x.agp -%}",
            pattern(d.prompt, {}, {**options, "after_user": "x_f.prev == 'user'", "after_calls": "x_f.before"}),
            "{%- endif -%}"]
    return "".join(out)
