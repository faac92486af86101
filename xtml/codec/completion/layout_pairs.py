"""A call's arguments as key/value pairs (``[calls] arguments = "pairs"``,
GLM's ``<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n``) in a layout
dialect's completion grammar.

A pair's value is untyped text: the parse reads it by the declared tool's
schema (:mod:`xtml.chat.layout_open`): as the text where the property says
it is a string (its ``type`` is or lists ``string``, or its ``enum`` holds
strings only), as JSON where it says another type, and where it says
nothing (no ``type`` nor ``enum``, or a key not listed) as JSON when the
text is JSON of another kind than a string, else as the text. So the
grammar writes each value so that it reads back as a value of the
property's schema: raw text of the schema's strings, JSON of its other
types, JSON strings where the property is typed otherwise; and where the
schema says nothing, JSON of its types but string (raw text only where any
value goes). Keys are the schema's: each at most once (a parse refuses a
key twice), the required ones present, in any order while the grammar can
track them (then in the schema's order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...chat.layout import LayoutDialect
from ...chat.layout_open import string_typed
from ...chat.layout_pattern import Item, Lit, Slot, Tok
from ...errors import OptionError
from .schema import Arg, StringForm, Tool, Value

__all__ = ["PairsEbnf", "PairsLark", "pair_tool", "pairs_pattern", "string_typed"]

LARK_TRACKED = 64
"""Keys of one tool llguidance's grammar tracks in any order (the bits of
a rule parameter); with more, they come in the schema's order."""
EBNF_TRACKED = 6
"""Keys of one tool the EBNF grammars track in any order (one rule per
subset of them); with more, they come in the schema's order."""

# Keywords that say nothing of a value: a schema of these alone takes any.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                          "writeOnly"})


def pairs_pattern(d: LayoutDialect) -> tuple[Item, ...]:
    """The pair's pattern, as the parse reads it: the key and the value
    once each, each ended by a token (text runs up to it)."""
    each = d.calls_each.items if d.calls_each is not None else ()
    at = next((k for k, i in enumerate(each) if i == Slot("arguments")), len(each))
    p = d.call_pair
    items = p.items if p is not None and at + 1 < len(each) and isinstance(each[at + 1], Tok) else ()
    slots = [i.name for i in items if isinstance(i, Slot)]
    ended = all(isinstance(items[k + 1], Tok) for k, i in enumerate(items[:-1]) if isinstance(i, Slot)) and \
        not isinstance(items[-1] if items else None, Slot)
    if sorted(slots) != ["key", "value"] or not ended or any(not isinstance(i, Lit | Tok | Slot) for i in items) \
            or not isinstance(items[0], Tok):
        raise OptionError(f"the completion grammar of the arguments of the layout dialect {d.name!r} is not yet "
                          "available (a pair is read from a token, its key and its value each up to a token, and the "
                          "pairs up to the token that closes the call)",
                          option="tool_choice")
    return items


def _any_value(s: Any) -> bool:
    return s is True or (isinstance(s, Mapping) and all(k in _ANNOTATIONS for k in s))


def pair_tool(t: Tool, notes: list[str]) -> Tool | None:
    """``t`` with each argument's value as a pair writes it: ``strings``
    raw text, ``others`` the JSON types written as JSON (a string among
    them). Keys the schema does not list are not written; an argument with
    no value the parse reads back is left out, and the tool with it when it
    is required (None)."""
    params = t.params if isinstance(t.params, Mapping) else {}
    props = params.get("properties")
    props = props if isinstance(props, Mapping) else {}
    if t.extra is not None and (props or not t.args):
        notes.append(f"tool {t.name!r}: its arguments are the keys its schema lists")
    args: list[Arg] = []
    for a in t.args:
        v = a.value
        kind = string_typed(props.get(a.key)) if a.key in props else None
        jsons = [jt for _, jt in v.others]
        if kind is True:
            value = Value(v.schema, v.root, v.strings, [])
        elif kind is False:
            value = Value(v.schema, v.root, [], [(jt, jt) for jt in (["string"] if v.strings else []) + jsons])
        else:
            raw = [StringForm()] if _any_value(v.schema) else []
            if v.strings and not raw:
                notes.append(f"tool {t.name!r}, argument {a.key!r}: a string is not written (its schema gives no "
                             "type, so text that reads as JSON would be read as JSON)")
            value = Value(v.schema, v.root, raw, [(jt, jt) for jt in jsons])
        if not value.strings and not value.others:
            if a.required:
                notes.append(f"tool {t.name!r}: required argument {a.key!r} has no value a pair reads back, so "
                             "the tool is left out")
                return None
            continue
        args.append(Arg(a.key, a.required, value))
    return Tool(t.name, args, None, t.params)


class _Pairs:
    """What both kinds of writer share: one pair's rule."""

    if TYPE_CHECKING:  # the writer's own, which this is mixed into
        lp: Any
        notes: list[str]

        def lit(self, s: str) -> str: ...
        def tok(self, t: str) -> str: ...
        def rule(self, name: str, body: str) -> None: ...
        def strings(self, alts: list[StringForm]) -> str: ...
        def json_value(self, v: Value, jtype: str) -> str: ...

    def pair_value(self, v: Value) -> str:
        """The value's expression: raw text or JSON, maybe empty."""
        raw = self.strings(v.strings) if v.strings else ""
        empty = bool(v.strings) and (not raw or raw.endswith("?"))
        alts = [raw.removesuffix("?")] if raw else []
        alts += [self.json_value(v, jt) for _, jt in v.others]
        if not alts:
            return ""
        expr = alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
        return f"{expr}?" if empty and self.optional_mark else expr

    optional_mark = True
    """Whether the syntax's text of a string may not be empty (then ``?``
    marks the empty value)."""

    def pair_rule(self, name: str, a: Arg) -> None:
        parts = []
        for item in self.lp.pair_items:
            if isinstance(item, Tok):
                parts.append(self.tok(item.token))
            elif isinstance(item, Lit):
                parts.append(self.lit(item.text))
            elif isinstance(item, Slot) and item.name == "key":
                parts.append(self.lit(a.key))
            else:
                value = self.pair_value(a.value)
                if value:
                    parts.append(value)
        self.rule(name, " ".join(parts))

    def in_order(self, i: int, t: Tool, close: str, limit: int) -> str:
        self.notes.append(f"tool {t.name!r}: {len(t.args)} arguments are more than {limit}; they come in the "
                          "schema's order, the required ones first")
        return " ".join([*(f"pair_t{i}_{k}" + ("" if a.required else "?") for k, a in enumerate(t.args)), close])


class PairsLark(_Pairs):
    """llguidance: the keys given so far are the bits of a rule parameter."""

    def pairs(self, i: int, t: Tool, close: str) -> str:
        """The pairs of a call to tool ``i``, then ``close``; the rules they
        use are defined."""
        for k, a in enumerate(t.args):
            self.pair_rule(f"pair_t{i}_{k}", a)
        if not t.args:
            return close
        if len(t.args) > LARK_TRACKED:
            return self.in_order(i, t, close, LARK_TRACKED)
        required = sum(1 for a in t.args if a.required)  # the first ones
        alts = [close + (f" %if is_ones([0:{required}])" if required else "")]
        alts += [f"pair_t{i}_{k} pairs_t{i}::set_bit({k}) %if bit_clear({k})" for k in range(len(t.args))]
        self.rule(f"pairs_t{i}::_", " | ".join(alts))
        return f"pairs_t{i}::0x0"


class PairsEbnf(_Pairs):
    """GBNF and xgrammar: one rule per subset of the keys given so far."""

    optional_mark = False

    def pairs(self, i: int, t: Tool, close: str) -> str:
        for k, a in enumerate(t.args):
            self.pair_rule(f"pair_t{i}_{k}", a)
        n = len(t.args)
        if not n:
            return close
        if n > EBNF_TRACKED:
            return self.in_order(i, t, close, EBNF_TRACKED)
        need = sum(1 << k for k, a in enumerate(t.args) if a.required)
        for mask in range(1 << n):
            alts = [close] if mask & need == need else []
            alts += [f"pair_t{i}_{k} pairs_t{i}_{mask | 1 << k}" for k in range(n) if not mask & 1 << k]
            self.rule(f"pairs_t{i}_{mask}", " | ".join(alts))
        return f"pairs_t{i}_0"
