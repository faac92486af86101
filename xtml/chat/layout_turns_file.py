"""Reading the ``[turns]`` section of a layout dialect's file
(:mod:`.layout_turn`), with the text options of ``[options]`` and the keys
of ``[calls]`` only such a format reads; render and parse of the format are
:mod:`.layout_turns`'."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .layout_pattern import Lit, Pattern, Slot, Tok
from .layout_turn import STRING, STRINGS, CallTurn, TextOption, TurnLayout

__all__ = ["CALL_KEYS", "build_turns"]

_TURNS_KEYS = ("head", "system", "tool", "tool_indent", "tools_system", "tools_user", "tools_user_when")
CALL_KEYS = ("max", "content", "arguments", "builtin", "builtin_when", "builtin_argument", "builtin_separator",
             "close")
"""The keys of ``[calls]`` a ``[turns]`` format reads."""


def build_turns(c: Any, data: Mapping[str, Any], tokens: tuple[str, ...], bools: Mapping[str, bool],
                compile_pattern: Callable[..., Pattern | None]) -> TurnLayout | None:
    """The ``[turns]`` section and the text options of ``[options]``, or None
    with problems added to ``c`` (the file checker); ``compile_pattern`` is
    the file reader's (problems located at the key)."""
    tab = data.get("turns")
    if tab is None:
        # What only a [turns] format reads is never silently ignored.
        for name, v in (data.get("options") or {}).items():
            # (A string option is read by every format; a list of values,
            # each a condition, by a format that writes a message as several.)
            if isinstance(v, dict) and v.get("type") == STRINGS and "values" not in v:
                c.add(f"a {v['type']} option is read by a format with a [turns] section", f"options.{name}")
        calls = data.get("calls")
        for key in CALL_KEYS:
            # (arguments and content are read by every format with calls.)
            if isinstance(calls, dict) and key in calls and key not in ("arguments", "content"):
                c.add(f"{key!r} is read by a format with a [turns] section", f"calls.{key}")
        return None
    if not isinstance(tab, dict):
        c.add("'turns' must be a table", "turns")
        return None
    c.keys(tab, _TURNS_KEYS, "turns")
    text: dict[str, TextOption] = {}
    for name, v in (data.get("options") or {}).items():
        if not isinstance(v, dict) or v.get("type") not in (STRING, STRINGS):
            continue
        c.keys(v, ("type", "default", "join", "omit"), f"options.{name}")
        default = v.get("default")
        join = v.get("join", ", ")
        omit = v.get("omit", [])
        if v["type"] == STRING and not isinstance(default, str):
            c.add("a string option needs a default (a string)", f"options.{name}.default")
        elif v["type"] == STRINGS and default is not None:
            c.add("a strings option has no default: it is absent unless given", f"options.{name}.default")
        elif not isinstance(join, str) or not isinstance(omit, list) or not all(isinstance(x, str) for x in omit):
            c.add("join is a string and omit a list of strings", f"options.{name}")
        else:
            text[name] = TextOption(name, v["type"], default, join, tuple(omit))
    bool_conds = frozenset(bools)
    lists = frozenset(k for k, o in text.items() if o.type == STRINGS)
    slots = frozenset(text)

    def pat(key: str, where: Mapping[str, Any], here: str, slot_names: frozenset[str], conds: frozenset[str],
            needs: tuple[str, ...] = ()) -> Pattern | None:
        v = where.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            c.add(f"{key!r} must be a string", f"{here}.{key}")
            return None
        return compile_pattern(c, v, tokens, slot_names, conds, f"{here}.{key}", needs)

    head = pat("head", tab, "turns", frozenset(), frozenset())
    system = pat("system", tab, "turns", slots | {"system", "tools"}, bool_conds | lists | {"has_tools", "has_system"},
                 ("system", "tools"))
    tool = pat("tool", tab, "turns", frozenset({"tool"}), frozenset(), ("tool",))
    tools_system = pat("tools_system", tab, "turns", frozenset({"tools"}), bool_conds | lists, ("tools",))
    tools_user = pat("tools_user", tab, "turns", frozenset({"tools", "content"}), bool_conds | lists,
                     ("tools", "content"))
    for key, p in (("head", head), ("system", system), ("tool", tool)):
        if p is None and key not in tab:
            c.add(f"missing key {key!r}", f"turns.{key}")
    when = tab.get("tools_user_when", "")
    if tools_user is not None and when not in bools:
        c.add("tools_user_when names the bool option that puts the tools in the first user message",
              "turns.tools_user_when")
    indent = tab.get("tool_indent")
    if indent is not None and (type(indent) is not int or not 0 <= indent <= 16):
        c.add("tool_indent is an integer from 0 to 16", "turns.tool_indent")
    ct = data.get("calls") or {}
    mx = ct.get("max", 0)
    if type(mx) is not int or mx < 0:
        c.add("max is a non-negative integer (0: no bound)", "calls.max")
    content = ct.get("content", "keep")
    if content not in ("keep", "drop"):
        c.add("content is \"keep\" or \"drop\"", "calls.content")
    arguments = ct.get("arguments", "text")
    if arguments not in ("text", "tojson"):
        c.add("arguments is \"text\" or \"tojson\"", "calls.arguments")
    builtin = pat("builtin", ct, "calls", frozenset({"name", "arguments"}), bool_conds | lists, ("name", "arguments"))
    argument = pat("builtin_argument", ct, "calls", frozenset({"key", "value"}), frozenset(), ("key", "value"))
    builtin_when = ct.get("builtin_when", "")
    if builtin is not None:
        if builtin_when not in lists:
            c.add("builtin_when names the strings option that lists the built-in tools", "calls.builtin_when")
        if not builtin.items or not isinstance(builtin.items[0], Tok):
            c.add("a built-in call opens with a token (parse tells it by that token)", "calls.builtin")
        if argument is None or [type(i) for i in argument.items] != [Slot, Lit, Slot, Lit]:
            c.add("builtin_argument is {key}, text, {value}, text", "calls.builtin_argument")
    sep = ct.get("builtin_separator", ", ")
    if not isinstance(sep, str):
        c.add("builtin_separator is a string", "calls.builtin_separator")
    close = pat("close", ct, "calls", frozenset(), bool_conds | lists)
    if tool is not None and [type(i) for i in tool.items if not isinstance(i, Lit)] != [Slot]:
        c.add("a tool is {tool} with text around it", "turns.tool")
    if head is None or system is None or tool is None or c.problems:
        return None
    return TurnLayout(head=head, system=system, tool=tool, tool_indent=indent, tools_system=tools_system,
                      tools_user=tools_user, tools_user_when=when or "",
                      calls=CallTurn(mx, content, arguments, builtin, builtin_when, argument, sep, close),
                      options=text)
