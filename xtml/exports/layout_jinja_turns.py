"""The render of a layout format of ``[turns]`` (Llama 3.1 style) as Jinja,
as :func:`~xtml.chat.layout_turns.render_turns` writes it: its head, the
system turn it always writes, the tools in it or in the first message after
it, one call turn per assistant message with calls, options that are text
or lists of names. Such a format reads its messages as a framed one does
(:mod:`.layout_jinja_base`) but writes them by other steps, and its tools
as indented JSON, so its render is a writer of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..chat.layout_turn import KEEP, STRING, STRINGS, TurnLayout
from .jinja_text import quote as _q
from .layout_jinja_base import (
    _at_message,
    _Code,
    _dict,
    _Kept,
    _list,
    _message_error,
    _option_error,
    _out,
    _raise,
    _Value,
    _Writer,
)


def _json_indented(indent: int | None) -> str:
    """``x_jsoni(v, pad)``: JSON as ``json.dumps(v, ensure_ascii=False,
    indent=indent)`` writes it, ``pad`` the indentation it stands at."""
    if indent is None:
        return "{%- macro x_jsoni(v, pad) -%}{{ x_json(v) }}{%- endmacro -%}"
    step = _q(" " * indent)
    return "".join((
        "{%- macro x_jsoni(v, pad) -%}",
        "{%- if v is mapping and v | length > 0 -%}",
        "{{ '{' }}",
        "{%- for k, y in v.items() -%}",
        "{{ '\\n' ~ pad ~ " + step + " }}",
        "{%- if k is string -%}{{ k | tojson }}",
        "{%- elif k is none -%}{{ '\"null\"' }}",
        "{%- elif k is boolean -%}{{ '\"true\"' if k else '\"false\"' }}",
        "{%- else -%}{{ '\"' ~ k ~ '\"' }}",
        "{%- endif -%}",
        "{{ ': ' }}{{ x_jsoni(y, pad ~ " + step + ") }}{%- if not loop.last -%}{{ ',' }}{%- endif -%}",
        "{%- endfor -%}",
        "{{ '\\n' ~ pad ~ '}' }}",
        "{%- elif v is iterable and v is not string and v is not mapping and v | length > 0 -%}",
        "{{ '[' }}",
        "{%- for y in v -%}{{ '\\n' ~ pad ~ " + step + " }}{{ x_jsoni(y, pad ~ " + step + ") }}"
        "{%- if not loop.last -%}{{ ',' }}{%- endif -%}{%- endfor -%}",
        "{{ '\\n' ~ pad ~ ']' }}",
        "{%- else -%}{{ x_json(v) }}",
        "{%- endif -%}",
        "{%- endmacro -%}",
    ))


class _TurnsWriter(_Writer):
    """The writer of a format of ``[turns]``."""

    def format_macros(self) -> str:
        assert self.d.header_turns is not None
        return _json_indented(self.d.header_turns.tool_indent)

    def render(self) -> str:
        assert self.d.header_turns is not None
        return self.render_turns(self.d.header_turns)

    def render_turns(self, t: TurnLayout) -> str:
        """The render of :func:`~xtml.chat.layout_turns.render_turns`: the
        head, the system turn the format always writes (with the tools, or
        them in the first message after it), each message in its frame, a
        call turn for an assistant's calls."""
        d = self.d
        # Entries here: [role, content, …, kept parts or none, tool_calls as given or none].
        texts = {name: f"x.t{k}" for k, name in enumerate(t.options)}
        conds = {**self.options, **{name: texts[name] + " is not none" for name, o in t.options.items()
                                    if o.type == STRINGS}}
        out = [self.text_options(t, texts),
               "{%- set x.has_system = x.entries[0][0] == 'system' -%}",
               "{%- set x.start = 1 if x.has_system else 0 -%}",
               self.pattern(t.head, {}, conds)]
        each_tool = _Code("{%- for x_t in tools -%}" + self.pattern(t.tool, {"tool": "x_jsoni(x_t, '')"}, conds)
                          + "{%- endfor -%}")
        values: dict[str, _Value] = {name: texts[name] if o.type == STRING else texts[name] + "j"
                                     for name, o in t.options.items()}
        values["system"] = "x.entries[0][1] if x.has_system else ''"
        values["tools"] = _Code(self.pattern(t.tools_system, {"tools": each_tool}, conds)
                                if t.tools_system is not None else "")
        out.append(self.pattern(t.system, values, {**conds, "has_tools": "x.tools", "has_system": "x.has_system"}))
        if t.tools_user is not None:
            out += ["{%- if x.tools and " + self.options[t.tools_user_when] + " -%}",
                    "{%- if x.entries | length <= x.start -%}",
                    _raise(_q(f"the tools go into the first user message ({t.tools_user_when}), and there is no "
                              "message after the system message (at messages)")),
                    "{%- endif -%}",
                    "{%- set x_i = x.start -%}",
                    "{%- set x_e = x.entries[x.start] -%}",
                    "{%- set x_c = messages[x_i].content if 'content' in messages[x_i] else none -%}",
                    "{%- if x_c is not none and x_c is not string -%}",
                    _message_error("the first user message holds the tools and writes its content as one string: "
                                   "a list of parts is not read", "content"),
                    "{%- endif -%}",
                    self.pattern(t.tools_user, {"tools": each_tool, "content": "x_e[1]"}, conds),
                    "{%- set x.start = x.start + 1 -%}",
                    "{%- endif -%}"]
        role_text = _dict({r: layout.text for r, layout in d.roles.items()}) + "[x_e[0]]"
        out += ["{%- for x_e in x.entries -%}",
                "{%- set x_i = loop.index0 -%}",
                "{%- if x_i >= x.start -%}",
                self.pattern(d.frame_open, {"role": role_text}, conds)]
        if "assistant" in d.roles and d.calls_each is not None:
            out += ["{%- if x_e[0] == 'assistant' and x_e[8] is not none -%}", self.call_turn(t, texts, conds),
                    "{%- else -%}"]
        for n, (role, layout) in enumerate(d.roles.items()):
            content: _Value = _Kept("x_e[7]", "x_e[1]") if d.parts_by_role.get(role) == KEEP else "x_e[1]"
            out.append(("{%- if " if n == 0 else "{%- elif ") + f"x_e[0] == {_q(role)} -%}}"
                       + self.pattern(layout.body, {"content": content}, conds))
        out += ["{%- endif -%}", self.pattern(d.frame_close, {}, conds)]
        if "assistant" in d.roles and d.calls_each is not None:
            out.append("{%- endif -%}")
        out += ["{%- endif -%}", "{%- endfor -%}",
                "{%- if x.agp -%}", self.pattern(d.prompt, {}, conds), "{%- endif -%}"]
        return "".join(out)

    def text_options(self, t: TurnLayout, texts: Mapping[str, str]) -> str:
        """The text options read and checked (after the messages, as xtml
        reads them), into ``x.tK`` (and a list's written form into
        ``x.tKj``); then the tools."""
        out = []
        for name, o in t.options.items():
            var = texts[name]
            default = "none" if o.default is None else _q(o.default)
            out += ["{%- set " + var + " = " + default + " -%}",
                    "{%- if " + name + " is defined and " + name + " is not none -%}"]
            if o.type == STRING:
                out += ["{%- if " + name + " is not string -%}", _option_error(f"{name} must be a string", name),
                        "{%- endif -%}"]
            else:
                out += ["{%- if " + name + " is string or " + name + " is mapping or " + name + " is not iterable -%}",
                        _option_error(f"{name} must be a list of strings", name),
                        "{%- endif -%}",
                        "{%- for x_b in " + name + " -%}{%- if x_b is not string -%}",
                        _option_error(f"{name} must be a list of strings", name),
                        "{%- endif -%}{%- endfor -%}"]
            out += ["{%- set " + var + " = " + name + " -%}", "{%- endif -%}"]
            if o.type == STRINGS:
                # Joined, but the names the format leaves out of what it writes.
                out += ["{%- set x_s = namespace(v='', n=0) -%}",
                        "{%- for x_b in (" + var + " if " + var + " is not none else []) -%}",
                        "{%- if x_b not in " + _list(o.omit) + " -%}",
                        "{%- set x_s.v = x_s.v ~ (" + _q(o.join) + " if x_s.n > 0 else '') ~ x_b -%}",
                        "{%- set x_s.n = x_s.n + 1 -%}",
                        "{%- endif -%}{%- endfor -%}",
                        "{%- set " + var + "j = x_s.v -%}"]
        # Tools given (an empty list too: the format tests whether they were).
        out += ["{%- if tools is defined and tools is not none -%}",
                "{%- if tools is string or tools is mapping or tools is not iterable -%}",
                _option_error("tools must be a list of tool schemas", "tools"),
                "{%- endif -%}",
                "{%- set x.tools = true -%}",
                "{%- endif -%}"]
        return "".join(out)

    def call_turn(self, t: TurnLayout, texts: Mapping[str, str], conds: Mapping[str, str]) -> str:
        """An assistant's calls (``x_e[8]``), each as JSON or as a built-in
        tool's call, then the call turn's close."""
        d, c = self.d, t.calls
        assert d.calls_each is not None
        at = "' (at messages[' ~ x_i ~ '].tool_calls[' ~ loop.index0 ~ '].function.arguments'"
        out = ["{%- set x_cs = x_e[8] -%}",
               "{%- if x_cs is string or x_cs is mapping or x_cs is not iterable -%}",
               _message_error("tool_calls must be a list", "tool_calls"),
               "{%- endif -%}"]
        if c.max:
            plural = "s" if c.max > 1 else ""
            out += ["{%- if x_cs | length < 1 or x_cs | length > " + str(c.max) + " -%}",
                    _raise(_q(f"the {d.name} format writes {c.max} tool call{plural} per assistant message at most "
                              "and at least one, not ") + " ~ (x_cs | length) ~ " + _q(" (its template raises)")
                           + " ~ " + _at_message("tool_calls")),
                    "{%- endif -%}"]
        arguments = ("x_json(x_f.arguments)" if c.arguments == "tojson"
                     else "(x_f.arguments if x_f.arguments is string else x_json(x_f.arguments))")
        json_call = self.pattern(d.calls_each, {"name": "x_f.name", "arguments": arguments},
                                 {**conds, "first": "loop.first", "has_content": "x_e[1] != ''"})
        out += ["{%- for x_call in x_cs -%}",
                "{%- set x_f = x_call.function if 'function' in x_call else x_call -%}"]
        if c.builtin is not None:
            assert c.builtin_argument is not None
            names = texts[c.builtin_when]
            pairs = _Code("{%- for x_ak, x_av in x_f.arguments.items() -%}"
                          "{%- if not loop.first -%}" + _out(_q(c.builtin_separator)) + "{%- endif -%}"
                          + self.pattern(c.builtin_argument, {"key": "x_ak", "value": "x_av"}, conds)
                          + "{%- endfor -%}")
            out += ["{%- if " + names + " is not none and x_f.name in " + names + " -%}",
                    "{%- if x_f.arguments is not mapping -%}",
                    _raise("'a call to the built-in tool ' ~ x_repr(x_f.name) ~ "
                           + _q(" needs its arguments as an object (the template reads them as pairs)")
                           + " ~ " + at + " ~ ')'"),
                    "{%- endif -%}",
                    "{%- set x_at = " + at + " -%}",
                    "{%- for x_ak, x_av in x_f.arguments.items() -%}{%- if x_av is not string -%}",
                    _raise(_q("a built-in tool's argument values are strings (the template adds them to text), not ")
                           + " ~ x_pytype(x_av) ~ x_at ~ '.' ~ x_ak ~ ')'"),
                    "{%- endif -%}{%- endfor -%}",
                    self.pattern(c.builtin, {"name": "x_f.name", "arguments": pairs}, conds),
                    "{%- else -%}", json_call, "{%- endif -%}"]
        else:
            out.append(json_call)
        out += ["{%- endfor -%}", self.pattern(c.close or d.frame_close, {}, conds)]
        return "".join(out)
