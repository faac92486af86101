"""What the Jinja chat template of a layout dialect writes for a system
turn of the format's own and what comes with it, as
:func:`~xtml.chat.layout_render.render` and
:func:`~xtml.chat.layout_request.read_request` write and read them: the
system turn (``[system] turn``) always written after the head, holding the
first message when it is a system message; text options (a default, or the
day the template renders on, read from the engine's clock); roles written
only first; tools declared before the last user message (and before each
user message equal to it), a tool's function key by key; call ids and tool
results' ``tool_call_id`` cut to their last characters; an answer's content
left out beside its calls; a content list's first part, or its Python
``str()``.

Where the engines cannot do what Python does, the template asks the engine
and raises rather than write other text:

* the clock: ``strftime_now`` (transformers, ``@huggingface/jinja`` and
  llama.cpp's engine each define it, on the local clock), with the
  directives every one of them spells alike (``%Y %m %d %H %M %%``);
  an engine without it raises unless the option is given;
* ``str()`` of a list: Python's jinja2 (transformers) writes it with its
  ``string`` filter, which the template tests for; llama.cpp's filter
  imitates it but escapes nothing and spells floats its own way, and
  ``@huggingface/jinja``'s writes JSON, so there the template spells it
  itself, strings of printable ASCII (and tab, line feed, carriage return)
  only: Python escapes characters it does not print (``\\x85``,
  ``\\u200b``, unassigned ones) by a table of Unicode the template cannot
  read, so another string raises;
* an id's last characters: llama.cpp counts bytes and ``@huggingface/jinja``
  UTF-16 units, so outside jinja2 an id of other than printable ASCII raises.

Numbers in what the template writes as JSON (a tool's values, arguments
through ``tojson``) are spelt as Python's ``json.dumps`` spells them
(:mod:`.layout_jinja_pairs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..chat.layout import DROP, EACH, LAST_USER, SYSTEM, TURN, LayoutDialect
from ..chat.layout_pattern import Pattern
from ..chat.layout_turn import STRING
from ..errors import TemplateError
from .jinja_text import quote as _q

__all__ = ["KNOWN", "PARTS", "check", "content_of", "declaration_before", "declared_tools", "id_tails", "macros",
           "message_checks", "needs_json", "part_policies", "read_text_options", "result_id_tail", "system_turn"]

KNOWN = frozenset({"system_turn", "text_options", "first_only", "tools_pair", "tools_skip", "id_tail",
                   "calls_content", "system_roles"})
"""The fields of :class:`LayoutDialect` this module writes."""

PARTS = ("first", "str")
"""The content policies of a role this module writes."""

_CLOCK = "YmdHM%"
"""The ``strftime`` directives every engine's ``strftime_now`` spells as
Python does (``@huggingface/jinja`` knows ``%Y %m %d %b %B %H %M %%``, its
month names in the process's locale)."""

_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F)) + "\t\n\r"

Pat = Callable[[Pattern, Any, Mapping[str, str]], str]
"""A writer's pattern method: a pattern, its slots' values (expressions, or
the writer's code values), its conditions."""


def _raise(message: str) -> str:
    return "{{ raise_exception(" + message + ") }}"


def _at(path: str) -> str:
    return "' (at messages[' ~ x_i ~ ']." + path + ")'"


def check(d: LayoutDialect) -> list[str]:
    """What of these keys the writers cannot write, refused; the names the
    template reads as variables (the text options), to be checked as such."""
    used = (d.system_turn is not None or bool(d.text_options) or bool(d.first_only) or d.tools == LAST_USER
            or bool(d.id_tail) or d.calls_content == DROP or any(p in PARTS for p in d.parts_by_role.values()))
    if used and d.header_turns is not None:
        raise TemplateError("the Jinja export does not write a system turn, text options, roles written only first, "
                            "tools before the last user message, cut ids, content left out beside calls or a list's "
                            "first part or str() with a [turns] section")
    if d.system_turn is not None and (d.tools in (SYSTEM, TURN) or d.default_system is not None
                                      or d.system_hoist is not None):
        raise TemplateError("the Jinja export writes a system turn of the format's own without tools in a system "
                            "turn or a turn of their own, a default system prompt or a hoisted one")
    if d.text_options and d.system_turn is None:
        raise TemplateError("the Jinja export writes text options in a system turn of the format's own only")
    for name, o in d.text_options.items():
        if o.type != STRING:
            raise TemplateError(f"the Jinja export does not write the text option {name!r} of type {o.type!r}")
        if o.default is None:
            spelt = o.clock.replace("%%", "")
            bad = [spelt[k + 1:k + 2] for k, ch in enumerate(spelt) if ch == "%" and spelt[k + 1:k + 2] not in _CLOCK]
            if bad:
                raise TemplateError(f"the Jinja export reads the clock with the strftime directives every engine "
                                    f"spells alike (%Y %m %d %H %M %%), not %{bad[0]} (option {name!r})")
    if d.tools == LAST_USER and (d.tools_each is None or d.tools_block is None):
        raise TemplateError("tools declared before the last user message need tools.each and tools.block")
    if (d.tools_pair is not None or d.tools_skip) and d.tools != LAST_USER:
        raise TemplateError("the Jinja export writes a tool key by key before the last user message only")
    if d.id_tail and d.call_ids != "given":
        raise TemplateError("the Jinja export cuts ids the request gives only (calls.ids = \"given\")")
    if d.calls_content == DROP and d.calls != EACH:
        raise TemplateError("the Jinja export leaves content out beside calls it writes each only")
    for role in d.first_only:
        if role not in d.roles:
            raise TemplateError(f"the Jinja export writes only first a role the format has, not {role!r}")
    return list(d.text_options)


def needs_json(d: LayoutDialect) -> bool:
    """Whether the template spells JSON numbers as Python does (the macros of
    :mod:`.layout_jinja_pairs`)."""
    return (d.call_pair is not None or d.arguments == "tojson" or d.tools_pair is not None
            or "str" in d.parts_by_role.values())


def _ascii_test() -> str:
    """``x_ascii(s)``: 'y' when ``s`` holds printable ASCII, tab, line feed and
    carriage return only (a chain of replaces every engine reads alike:
    none of these characters is a byte of another's UTF-8)."""
    chain = "".join(" | replace(" + _q(ch) + ", '')" for ch in _PRINTABLE)
    return ("{%- macro x_ascii(s) -%}{{ 'y' if (s" + chain + ") == '' else '' }}{%- endmacro -%}")


_PY = str([0.00001, "'\"\n"])
"""What Python's str() writes of a list that llama.cpp's and
``@huggingface/jinja``'s ``string`` filters write otherwise."""

_EQ = "".join((
    # Python's == of two values as JSON gives them: objects key by key,
    # lists item by item, strings as strings.
    "{%- macro x_eq(a, b) -%}",
    "{%- if a is mapping or b is mapping -%}",
    "{%- set n = namespace(ok=(a is mapping and b is mapping and (a | length) == (b | length))) -%}",
    "{%- if n.ok -%}{%- for k, y in a.items() -%}",
    "{%- if n.ok and not (k in b and x_eq(y, b[k]) == 'y') -%}{%- set n.ok = false -%}{%- endif -%}",
    "{%- endfor -%}{%- endif -%}",
    "{{ 'y' if n.ok else '' }}",
    "{%- elif a is string or b is string -%}{{ 'y' if a is string and b is string and a == b else '' }}",
    "{%- elif a is iterable and b is iterable -%}",
    "{%- set n = namespace(ok=((a | length) == (b | length))) -%}",
    "{%- if n.ok -%}{%- for y in a -%}",
    "{%- if n.ok and x_eq(y, b[loop.index0]) != 'y' -%}{%- set n.ok = false -%}{%- endif -%}",
    "{%- endfor -%}{%- endif -%}",
    "{{ 'y' if n.ok else '' }}",
    "{%- elif a is iterable or b is iterable -%}{{ '' }}",
    "{%- else -%}{{ 'y' if a == b else '' }}",
    "{%- endif -%}",
    "{%- endmacro -%}",
    # Two messages as read (keys whose value is none left out) equal.
    "{%- macro x_eqm(a, b) -%}",
    "{%- set n = namespace(ok=true, na=0, nb=0) -%}",
    "{%- for k, y in b.items() -%}{%- if y is not none -%}{%- set n.nb = n.nb + 1 -%}{%- endif -%}{%- endfor -%}",
    "{%- for k, y in a.items() -%}{%- if y is not none -%}{%- set n.na = n.na + 1 -%}",
    "{%- if n.ok and not (k in b and b[k] is not none and x_eq(y, b[k]) == 'y') -%}{%- set n.ok = false -%}"
    "{%- endif -%}",
    "{%- endif -%}{%- endfor -%}",
    "{{ 'y' if n.ok and n.na == n.nb else '' }}",
    "{%- endmacro -%}",
))

_REPR = "".join((
    # Python's repr of a JSON value where the engine's string filter is not
    # Python's; ``at``: where, for the raise.
    "{%- macro x_pyrepr(v, at) -%}",
    "{%- if v is none -%}{{ 'None' }}",
    "{%- elif v is boolean -%}{{ 'True' if v else 'False' }}",
    "{%- elif v is number and v != v -%}{{ 'nan' }}",
    "{%- elif v is number and v * 0 != 0 -%}{{ 'inf' if v > 0 else '-inf' }}",
    "{%- elif v is integer -%}{{ v | tojson }}",
    "{%- elif v is number -%}{{ x_pfloat(v) }}",
    "{%- elif v is string -%}",
    "{%- if x_ascii(v) != 'y' -%}",
    _raise(_q("this engine's Jinja cannot write Python's str() of a string of other than printable ASCII "
              "(Python escapes the characters it does not print by a table the template cannot read): "
              "render with xtml, or give the content as a string") + " ~ at"),
    "{%- endif -%}",
    "{%- set t = v | replace('\\\\', '\\\\\\\\') | replace('\\n', '\\\\n') | replace('\\r', '\\\\r') "
    "| replace('\\t', '\\\\t') -%}",
    "{%- if \"'\" in t and '\"' not in t -%}{{ '\"' ~ t ~ '\"' }}",
    "{%- else -%}{{ \"'\" ~ (t | replace(\"'\", \"\\\\'\")) ~ \"'\" }}{%- endif -%}",
    "{%- elif v is mapping -%}",
    "{{ '{' }}{%- for k, y in v.items() -%}{{ x_pyrepr(k, at) }}{{ ': ' }}{{ x_pyrepr(y, at) }}",
    "{%- if not loop.last -%}{{ ', ' }}{%- endif -%}{%- endfor -%}{{ '}' }}",
    "{%- else -%}",
    "{{ '[' }}{%- for y in v -%}{{ x_pyrepr(y, at) }}{%- if not loop.last -%}{{ ', ' }}{%- endif -%}{%- endfor -%}"
    "{{ ']' }}",
    "{%- endif -%}",
    "{%- endmacro -%}",
))


def macros(d: LayoutDialect) -> str:
    """The macros of the keys the dialect uses, and ``x_py``: whether the
    engine's ``string`` filter writes Python's str() (jinja2's)."""
    strs = "str" in d.parts_by_role.values()
    out = []
    if strs or d.id_tail:
        out += [_ascii_test(), "{%- set x_py = ([0.00001, " + _q("'\"\n") + "] | string) == " + _q(_PY) + " -%}"]
    if strs:
        out.append(_REPR)
    if d.tools == LAST_USER:
        out.append(_EQ)
    return "".join(out)


def read_text_options(d: LayoutDialect) -> str:
    """Each text option into ``x_to.tK``: as given (a string), else its
    default, else the engine's clock."""
    if not d.text_options:
        return ""
    out = ["{%- set x_to = namespace(" + ", ".join(f"t{k}=''" for k in range(len(d.text_options))) + ") -%}"]
    for k, (name, o) in enumerate(d.text_options.items()):
        var = f"x_to.t{k}"
        out += ["{%- if " + name + " is defined and " + name + " is not none -%}",
                "{%- if " + name + " is not string -%}",
                _raise(_q(f"{name} must be a string (at option {name!r})")),
                "{%- endif -%}",
                "{%- set " + var + " = " + name + " -%}",
                "{%- else -%}"]
        if o.default is not None:
            out.append("{%- set " + var + " = " + _q(o.default) + " -%}")
        else:
            # The day the template renders on, as xtml's render reads it.
            out += ["{%- if strftime_now is not defined -%}",
                    _raise(_q(f"this engine gives the template no clock (strftime_now): give {name} (at option "
                              f"{name!r})")),
                    "{%- endif -%}",
                    "{%- set " + var + " = strftime_now(" + _q(o.clock) + ") ~ '' -%}"]
        out.append("{%- endif -%}")
    return "".join(out)


def _beside_calls(d: LayoutDialect) -> str:
    return "x_r == 'assistant' and 'tool_calls' in x_m and x_m.tool_calls"


def message_checks(d: LayoutDialect) -> str:
    """Message ``x_m`` (role ``x_r``, index ``x_i``) refused where the format
    raises before its content is read: a role written only first, later; an
    empty list of calls where content beside calls is left out."""
    out = []
    if d.first_only:
        out += ["{%- if x_i > 0 and x_r in [" + ", ".join(_q(r) for r in d.first_only) + "] -%}",
                _raise(_q(f"the {d.name} format writes a ") + " ~ x_r ~ "
                       + _q(" message only first (the template raises on a later one)") + " ~ " + _at("role")),
                "{%- endif -%}"]
    if d.calls_content == DROP:
        out += ["{%- if x_r == 'assistant' and 'tool_calls' in x_m and x_m.tool_calls is not none and x_m.tool_calls "
                "is not string and x_m.tool_calls is not mapping and x_m.tool_calls is iterable and x_m.tool_calls "
                "| length == 0 -%}",
                _raise(_q(f"the {d.name} format writes an assistant message with tool_calls as its calls: give at "
                          "least one, or no tool_calls") + " ~ " + _at("tool_calls")),
                "{%- endif -%}"]
    return "".join(out)


def content_of(d: LayoutDialect) -> str:
    """Message ``x_m``'s content as read (``''`` beside calls where the format
    leaves it out, whatever it holds)."""
    given = "x_m.content if 'content' in x_m else none"
    if d.calls_content != DROP:
        return given
    return "('' if " + _beside_calls(d) + " else (" + given + "))"


def part_policies(d: LayoutDialect, policy: str) -> str:
    """The branches of a content list's policy (``policy``: its expression)
    that this module writes: the first part's text, or Python's str()."""
    used = set(d.parts_by_role.values())
    out = []
    if "first" in used:
        out += ["{%- elif " + policy + " == 'first' -%}",
                "{%- set x_f0 = x_c[0] if x_c | length > 0 else none -%}",
                "{%- if x_f0 is not mapping or 'text' not in x_f0 or x_f0.text is not string -%}",
                _raise(_q(f"the {d.name} format writes the first part's text: give it a text part first") + " ~ "
                       + _at("content[0]")),
                "{%- endif -%}",
                "{%- set x_y.content = x_f0.text -%}"]
    if "str" in used:
        out += ["{%- elif " + policy + " == 'str' -%}",
                "{%- set x_y.content = (x_c | list | string) if x_py else x_pyrepr(x_c, " + _at("content") + ") ~ '' "
                "-%}"]
    return "".join(out)


def _cut(d: LayoutDialect, at: str) -> str:
    """``x_g`` (an id or none) refused where xtml refuses it; ``at``: where."""
    n = d.id_tail
    return "".join([
        "{%- if x_g is none or ((x_py or x_ascii(x_g) == 'y') and (x_g | length) < " + str(n) + ") -%}",
        _raise(_q(f"the {d.name} format writes an id's last {n} characters: ")
               + " ~ ('no id' if x_g is none else 'the id ' ~ x_repr(x_g)) ~ "
               + _q(" has fewer (the template raises on it)") + " ~ " + at),
        "{%- elif not x_py and x_ascii(x_g) != 'y' -%}",
        _raise(_q("this engine counts an id's characters otherwise than Python (bytes or UTF-16 units) and the id "
                  "holds other than printable ASCII: render with xtml") + " ~ " + at),
        "{%- endif -%}"])


def _tail(d: LayoutDialect) -> str:
    return "x_g[(x_g | length) - " + str(d.id_tail) + ":]"


def id_tails(d: LayoutDialect) -> str:
    """Message ``x_m``'s calls (``x_y.calls``) with each id cut to its last
    characters, or refused."""
    if not d.id_tail:
        return ""
    return "".join([
        "{%- set x_w = namespace(calls=[]) -%}",
        "{%- for x_call in x_m.tool_calls -%}",
        "{%- set x_g = x_call.id if 'id' in x_call and x_call.id is not none else none -%}",
        _cut(d, "' (at messages[' ~ x_i ~ '].tool_calls[' ~ loop.index0 ~ '].id)'"),
        "{%- set x_w.calls = x_w.calls + [[x_y.calls[loop.index0][0], x_y.calls[loop.index0][1], " + _tail(d)
        + "]] -%}",
        "{%- endfor -%}",
        "{%- set x_y.calls = x_w.calls -%}"])


def result_id_tail(d: LayoutDialect, reading: list[str]) -> str:
    """A tool result's ``tool_call_id`` cut to its last characters, or
    refused (``reading``: the roles whose body writes it)."""
    if not d.id_tail or not reading:
        return ""
    return "".join([
        "{%- if x_r in [" + ", ".join(_q(r) for r in reading) + "] -%}",
        "{%- set x_g = x_m.tool_call_id if 'tool_call_id' in x_m and x_m.tool_call_id is not none else none -%}",
        _cut(d, _at("tool_call_id")),
        "{%- set x_y.call_id = " + _tail(d) + " -%}",
        "{%- endif -%}"])


def system_turn(d: LayoutDialect, pattern: Pat, options: Mapping[str, str], tools: object = "''") -> str:
    """The system turn, holding the first message when it has one of the
    system roles; ``x.start`` past it. ``tools``: its ``{tools}`` slot's value."""
    turn = d.system_turn
    if turn is None:
        return ""
    out = ["{%- set x.has_system = x.entries[0][0] in [" + ", ".join(_q(r) for r in d.system_roles) + "] -%}"]
    listed = [r for r in d.system_roles if d.parts_by_role.get(r) not in PARTS]
    if listed:
        # The turn holds the message as a string: the official template would
        # print a list as Python's str() of it.
        out += ["{%- set x_c = messages[0].content if 'content' in messages[0] else none -%}",
                "{%- if x.has_system and x_c is not none and x_c is not string and x_c is not mapping and x_c is "
                "iterable -%}",
                _raise(_q(f"the {d.name} format writes the first ") + " ~ x.entries[0][0] ~ "
                       + _q(" message's content as a string: a list of parts is not read there (at messages[0]."
                            "content)")),
                "{%- endif -%}"]
    given = "tools is defined and tools is not none"
    values: dict[str, object] = {"system": "x.entries[0][1] if x.has_system else ''", "tools": tools}
    values.update({name: f"x_to.t{k}" for k, name in enumerate(d.text_options)})
    out += [pattern(turn, values, {**options, "has_system": "x.has_system", "has_tools": given,
                                   "some_tools": given + " and x_given(tools) == 'y'"}),
            "{%- set x.start = 1 if x.has_system else 0 -%}"]
    return "".join(out)


def declared_tools(d: LayoutDialect, pattern: Pat, options: Mapping[str, str],
                   code: Callable[[str], object]) -> tuple[str, str]:
    """(The tools checked and the last user message found, into ``x_d``; the
    declaration's code), where the format declares tools before the last
    user message; ``code`` makes a slot's value of Jinja code."""
    if d.tools != LAST_USER:
        return "", ""
    each, block = d.tools_each, d.tools_block
    assert each is not None and block is not None
    shape = ("the {name} format writes each tool's function: a tool is {\"type\": \"function\", \"function\": "
             "{...}} (at option 'tools')").replace("{name}", d.name)
    prepare = "".join([
        "{%- set x_d = namespace(on=false, last=-1) -%}",
        "{%- if tools is defined and tools is not none -%}",
        "{%- if tools is string or tools is mapping or tools is not iterable -%}",
        _raise(_q("tools must be a list of tool schemas (at option 'tools')")),
        "{%- endif -%}",
        "{%- for x_e in x.entries -%}{%- if x_e[0] == 'user' -%}{%- set x_d.last = loop.index0 -%}{%- endif -%}"
        "{%- endfor -%}",
        "{%- if x_d.last >= 0 -%}",
        "{%- for x_t in tools -%}",
        "{%- if x_t is not mapping or 'function' not in x_t or x_t.function is not mapping -%}",
        _raise(_q(shape)),
        "{%- endif -%}",
        "{%- endfor -%}",
        "{%- set x_d.on = true -%}",
        "{%- endif -%}",
        "{%- endif -%}"])
    tool: object = "x_pjson(x_t.function, false)"
    if d.tools_pair is not None:
        skip = "[" + ", ".join(_q(k) for k in d.tools_skip) + "]"
        one = pattern(d.tools_pair, {"key": "(x_tk if x_tk is string else x_tk | string)",
                                     "value": "(x_tv if x_tv is string else x_pjson(x_tv, false) ~ '')"},
                      {**options, "first": "x_tn.j == 0", "last": "x_tn.j == x_tn.n - 1", "string": "x_tv is string"})
        tool = code("".join([
            "{%- set x_tn = namespace(n=0, j=0) -%}",
            "{%- for x_tk in x_t.function -%}{%- if x_tk not in " + skip + " -%}{%- set x_tn.n = x_tn.n + 1 -%}"
            "{%- endif -%}{%- endfor -%}",
            "{%- for x_tk, x_tv in x_t.function.items() -%}{%- if x_tk not in " + skip + " -%}",
            one,
            "{%- set x_tn.j = x_tn.j + 1 -%}",
            "{%- endif -%}{%- endfor -%}"]))
    each_tool = code("{%- for x_t in tools -%}{%- set x_tw = namespace(first=loop.first, last=loop.last) -%}"
                      + pattern(each, {"tool": tool}, {**options, "first": "x_tw.first", "last": "x_tw.last"})
                      + "{%- endfor -%}")
    return prepare, pattern(block, {"tools": each_tool}, options)


def declaration_before(declaration: str) -> str:
    """The declaration before user message ``x_e`` (index ``x_k``) where it
    is the last user message or equal to it."""
    if not declaration:
        return ""
    return ("{%- if x_d.on and x_e[0] == 'user' and (x_k == x_d.last or x_eqm(messages[x_k], messages[x_d.last]) "
            "== 'y') -%}" + declaration + "{%- endif -%}")
