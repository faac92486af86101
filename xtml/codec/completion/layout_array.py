"""Calls as one JSON array after a token in a layout dialect's completion
grammar: ``[calls] section`` is a token, then ``[`` (after whitespace the
format writes and a model may leave out), the calls, ``]``; ``[calls]
each`` writes a call as a JSON object of fixed keys (the separator between
calls in a ``{!first}…{/}`` part), its values the call's name (as
``tojson`` writes it), its arguments (a JSON object) and maybe its id
(between quotes). No token closes a call: the array's ``]`` ends the calls.

The grammar writes each call's keys in the order ``[calls] each`` writes
them; a given id may be left out (the serving layer makes one where the
model gives none), and where the format writes ids of a length
(``[calls] id_tail``) the id is that many letters and digits, else one or
more. Arguments are JSON of the tool's schema, as the other layout formats
write them. A parse reads string arguments too; the grammar never writes
them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...chat.layout import LayoutDialect
from ...chat.layout_pattern import Cond, Lit, Slot, Tok
from ...errors import OptionError
from .schema import Tool

__all__ = ["ArrayCalls", "ArrayEbnf", "ArrayLark", "array_pattern"]

# One entry of the call's object: a key, then a slot bare or between quotes.
_ENTRY = re.compile(r'"(?P<key>[A-Za-z_][A-Za-z0-9_]*)": (?P<value>\x00|"\x00")\Z')
_SLOTS = (("arguments", "name"), ("arguments", "id", "name"))


@dataclass(frozen=True)
class ArrayCalls:
    """How the calls of an answer are written as one JSON array."""

    token: str
    """The token the array follows."""
    lead: str
    """Whitespace the format writes between the token and the array, which
    an answer may leave out."""
    open: str
    close: str
    separator: str
    """Between two calls."""
    entries: tuple[tuple[str, str, bool], ...]
    """Each key of a call's object in the order written: the key, its slot
    (``name``, ``arguments``, ``id``), whether the value is between quotes."""
    optional: tuple[str, ...]
    """Slots a call may leave out (with their key)."""
    id_length: int
    """An id's length (0: any, one character at least)."""


def array_pattern(d: LayoutDialect) -> ArrayCalls | None:
    """The array the calls of ``d`` are written in, where its section is a
    token then an array (None where it is not); a call that is not an
    object of the keys this grammar writes raises
    :class:`~xtml.OptionError`."""
    section = d.calls_section.items if d.calls_section is not None else ()
    if len(section) != 4 or not isinstance(section[0], Tok) or not isinstance(section[1], Lit) or \
            section[2] != Slot("calls") or not isinstance(section[3], Lit):
        return None
    head, tail = section[1].text, section[3].text
    lead = head[:-1]
    if not head.endswith("[") or lead.strip() or tail != "]":
        return None
    items = list(d.calls_each.items if d.calls_each is not None else ())
    separator = ""
    if items and isinstance(items[0], Cond) and items[0].name == "first" and items[0].negate and \
            all(isinstance(i, Lit) for i in items[0].body):
        separator = "".join(i.text for i in items[0].body if isinstance(i, Lit))
        items = items[1:]
    text, slots = "", []
    for item in items:
        if isinstance(item, Lit) and "\x00" not in item.text:
            text += item.text
        elif isinstance(item, Slot):
            text += "\x00"
            slots.append(item)
        else:
            text = ""
            break
    entries: list[tuple[str, str, bool]] = []
    if text.startswith("{") and text.endswith("}") and separator.strip() == ",":
        for k, entry in enumerate(text[1:-1].split(", ")):
            m = _ENTRY.match(entry)
            if m is None or k >= len(slots):
                entries = []
                break
            entries.append((m.group("key"), slots[k].name, m.group("value") != "\x00"))
    named = {slot: quoted for _, slot, quoted in entries}
    codecs = {s.name: s.codec for s in slots}
    if tuple(sorted(named)) not in _SLOTS or not len(named) == len(entries) == len(slots) or named["name"] or \
            named["arguments"] or \
            codecs["name"] != "tojson" or codecs["arguments"] or not named.get("id", True) or \
            ("id" in named and d.call_ids != "given") or entries[0][1] == "id":
        raise OptionError(f"the completion grammar of the calls of the layout dialect {d.name!r} is not yet "
                          "available (an array's call is read as a JSON object of its name, its arguments and "
                          "maybe an id given between quotes)", option="tool_choice")
    return ArrayCalls(section[0].token, lead, "[", "]", separator, tuple(entries),
                      ("id",) if "id" in named else (), d.id_tail)


class _Array:
    """What every syntax shares: the array after its token."""

    if TYPE_CHECKING:  # the writer's own, which this is mixed into
        lp: Any
        defined: set[str]

        def lit(self, s: str) -> str: ...
        def rule(self, name: str, body: str) -> None: ...
        def repeat(self, expr: str, most: int | None) -> str: ...
        def object_value(self, schema: Any) -> str: ...

    def array_rest(self) -> str:
        """What follows the token: the array of the calls, the rules it
        uses defined."""
        a: ArrayCalls = self.lp.array
        alts = [self.array_call(i, t, a) for i, t in enumerate(self.lp.tools)]
        self.rule("call", alts[0] if len(alts) == 1 else "(" + ") | (".join(alts) + ")")
        most = self.lp.max_calls
        more = "" if most == 1 else " " + self.repeat(f"{self.lit(a.separator)} call",
                                                      None if most is None else most - 1)
        lead = f"{self.lit(a.lead)}? " if a.lead else ""
        return f"{lead}{self.lit(a.open)} call{more} {self.lit(a.close)}"

    def array_call(self, i: int, t: Tool, a: ArrayCalls) -> str:
        """A call to tool ``i``: adjacent literal text as one literal, an
        optional key with its value in a group of its own."""
        params = t.params if isinstance(t.params, Mapping) and t.params else {"type": "object"}
        self.rule(f"args_t{i}", self.object_value(params))
        parts: list[str] = []
        text = "{"
        for k, (key, slot, quoted) in enumerate(a.entries):
            head = f'{", " if k else ""}"{key}": ' + ('"' if quoted else "")
            end = '"' if quoted else ""
            if slot == "name":
                text += head + json.dumps(t.name, ensure_ascii=False) + end
                continue
            value = f"args_t{i}" if slot == "arguments" else self.id_text(a.id_length)
            if slot in a.optional:
                group = " ".join(x for x in (self.lit(head), value, self.lit(end) if end else "") if x)
                parts += [self.lit(text), f"({group})?"] if text else [f"({group})?"]
                text = ""
                continue
            parts += [self.lit(text + head), value]
            text = end
        parts.append(self.lit(text + "}"))
        return " ".join(parts)

    def id_text(self, length: int) -> str:
        raise NotImplementedError  # each syntax spells a class its own way


class ArrayLark(_Array):
    """llguidance: an id is one terminal."""

    if TYPE_CHECKING:
        terminals: dict[str, str]

    def id_text(self, length: int) -> str:
        name = f"CALL_ID_{length or 'N'}"
        self.terminals[name] = f"/[A-Za-z0-9]{{{length}}}/" if length else "/[A-Za-z0-9]+/"
        return name


class ArrayEbnf(_Array):
    """GBNF and xgrammar's EBNF: an id is a rule of classes."""

    def id_text(self, length: int) -> str:
        name = f"call_id_{length or 'n'}"
        if name not in self.defined:
            self.defined.add(name)
            self.rule(name, " ".join(["[A-Za-z0-9]"] * length) if length else "[A-Za-z0-9]+")
        return name
