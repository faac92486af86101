"""The completion grammar as Lark text in llguidance's dialect, which
``llguidance.LLMatcher(tokenizer, text)`` takes as it is (so do engines that
pass Lark grammars to it: vLLM, SGLang, llama.cpp).

Text bodies are any text; a text terminal never matches a special token.
Argument keys are tracked in a rule parameter, JSON values are llguidance's
own ``%json`` of the argument's schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...errors import OptionError
from ...markup.header import escape
from .plan import Plan, deep_schemas_refused
from .schema import StringForm, Tool, Value, has_properties, restricted
from .writer import GrammarWriter

__all__ = ["TRACKED", "write"]

TRACKED = 64
"""How many argument keys of a tool the grammar tracks exactly (each key at
most once, required ones present), in a 64-bit rule parameter. With more
keys, only the required ones are tracked when they fit, and the other keys
may repeat."""


def write(plan: Plan) -> str:
    """The plan (made for ``llguidance``) as Lark text."""
    if plan.format != "llguidance":
        raise OptionError(f"this plan's markers are spelled for {plan.format}, not llguidance", option="format")
    with deep_schemas_refused():
        return _Lark(plan).write()


def _id_ranges(ids: list[int]) -> str:
    """Ids as llguidance's token ranges (``1,5-9``)."""
    out: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], -2]:
        if i != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    return ",".join(out)


# Built once: json.dumps with an option builds an encoder per call, and a
# grammar spells hundreds of literals.
_STRING = json.JSONEncoder(ensure_ascii=False)
_SCHEMA = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _lark_str(s: str) -> str:
    return _STRING.encode(s)


def _json_text(schema: Any) -> str:
    """A schema as the text after ``%json``."""
    # Lenient: a keyword or format llguidance does not know is then ignored
    # (a wider grammar), where it would otherwise refuse the whole grammar.
    # Any \uXXXX escape is JSON (llguidance admits only those of control
    # characters unless told).
    body = dict(schema) if isinstance(schema, Mapping) else {}
    body["x-guidance"] = {**(body.get("x-guidance") or {}), "lenient": True,
                          "json_allow_general_unicode_escapes": True}
    return _SCHEMA.encode(body)


class _Lark(GrammarWriter):
    comment = "//"

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.terminals: dict[str, str] = {}
        self.nested = False
        self.uses_json = False

    def rule(self, name: str, body: str) -> None:
        self.rules.append(f"{name}: {body}")

    def lit(self, s: str) -> str:
        return _lark_str(s)

    def text(self) -> str:
        """Text that is not empty: ordinary tokens, and the added tokens the
        tokenizer makes of their spelling in text (llguidance takes every
        added token for a special one, which a text terminal never matches)."""
        self.terminals["TEXT"] = "/(?s:.+)/"
        if not self.p.text_ids:
            return "TEXT"
        if "text" not in self.defined:
            self.defined.add("text")
            self.rule("text", f"(TEXT | <[{_id_ranges(self.p.text_ids)}]>)+")
        return "text"

    def text_opt(self) -> str:
        return self.text() + "?"

    def json_response(self) -> str:
        self.terminals["WS"] = "/[ \\t\\r\\n]+/"
        return f"WS? {self.json_ref(self.p.response_schema)} WS?"

    def fragment_support(self) -> None:
        self.rule("m_open", self.o)
        self.rule("m_close", self.c)
        self.rule("m_sep", self.s)
        self.rule("body_text", self.text_opt())
        self.terminals["ATTR"] = '/([^"&]|&amp;|&quot;)+/'
        self.rule("attr_value", "ATTR?")
        self.rule("attr_value1", "ATTR")

    def calls(self) -> str:
        p = self.p
        bits = max(1, (p.max_calls - 1).bit_length())
        if p.max_calls == 1:
            self.rule("calls::_", "call::_")
        else:
            self.rule("calls::_", f"call::_ | call::_ calls::incr([0:{bits}]) %if lt([0:{bits}], {p.max_calls - 1})")
        self.rule("idx::_", " | ".join(f'"{k + 1}" %if eq([0:{bits}], {k})' for k in range(p.max_calls)))
        alts = []
        for i, t in enumerate(p.tools):
            self.tool(i, t)
            alts.append(f'{self.name_then_index(t)} idx::_ "\\"" {self.s} body_t{i}')
        self.rule("call::_", f"{self.call_open()} (" + " | ".join(alts) + ")")
        return "calls::0x0"

    def tool(self, i: int, t: Tool) -> None:
        tracked = self.tracked(t, TRACKED)
        bit = {k: b for b, k in enumerate(tracked)}
        required = sum(1 for k in tracked if t.args[k].required)
        # The keys given so far are the bits of the rule's parameter.
        param = "::_" if tracked else ""
        done = f"{self.call_close()}" + (f" %if is_ones([0:{required}])" if required else "")
        alts = [done]
        for k, a in enumerate(t.args):
            rule = f"arg_t{i}_{k}"
            self.argument(rule, self.key_literal(a.key), a.value)
            if k in bit:
                alts.append(f"{rule} args_t{i}::set_bit({bit[k]}) %if bit_clear({bit[k]})")
            else:
                alts.append(f"{rule} args_t{i}{param}")
        if t.extra is not None:
            free = f"KEY_T{i}"
            known = " | ".join(_lark_str(escape(a.key)) for a in t.args)
            self.terminals[free] = '/([^"&]|&amp;|&quot;)*/' + (f" & ~({known})" if known else "")
            self.argument(f"arg_t{i}_x", f'{free} {self.lit(chr(34) + " " + self.n["type"] + "=" + chr(34))}',
                          t.extra)
            alts.append(f"arg_t{i}_x args_t{i}{param}")
            self.notes.append(f"tool {t.name!r}: keys the schema does not list may repeat")
        self.rule(f"args_t{i}{param}", " | ".join(alts))
        self.tool_body(i, t, f"args_t{i}" + ("::0x0" if tracked else ""))

    def strings(self, alts: list[StringForm]) -> str:
        parts: list[str] = []
        empty = False
        for a in alts:
            if a.texts is not None:
                lits = [t for t in a.texts if t]
                empty = empty or len(lits) < len(a.texts)
                parts += [_lark_str(t) for t in lits]
            elif a.max_len is None and a.min_len <= 1:
                parts.append(self.text())
                empty = empty or a.min_len == 0
            else:
                hi = "" if a.max_len is None else str(a.max_len)
                name = f"TEXT_{max(1, a.min_len)}_{hi or 'N'}"
                self.terminals[name] = f"/(?s:.){{{max(1, a.min_len)},{hi}}}/"
                parts.append(name)
                empty = empty or a.min_len == 0
        if not parts:
            return ""
        expr = parts[0] if len(parts) == 1 else "(" + " | ".join(dict.fromkeys(parts)) + ")"
        return f"{expr}?" if empty else expr

    def json_value(self, v: Value, jtype: str) -> str:
        return self.json_ref(restricted(v, jtype))

    def json_object_value(self, schema: Any) -> str:
        return self.json_ref(schema)

    def json_ref(self, schema: Any) -> str:
        self.uses_json = True
        self.nested = self.nested or has_properties(schema)
        return f"%json {_json_text(schema)}"

    def write(self) -> str:
        start = self.channels()
        extra = ["// Load: llguidance.LLMatcher(tokenizer, this text) (or grammar_from(\"lark\", this text))."]
        if self.uses_json:
            self.notes.append("inside JSON strings llguidance refuses a raw DEL (U+007F), which JSON allows")
        if self.p.text_ids:
            self.notes.append("text that the tokenizer turns into added tokens (its spelling of one that is not "
                              "special) is admitted in text bodies only, not in JSON values or fixed strings")
        if self.nested:
            self.notes.append("JSON objects (nested argument values, json blocks, JSON answers) take their "
                              "properties in the schema's order (llguidance's JSON)")
        head = self.header("llguidance", extra)
        terms = [f"{k}: {v}" for k, v in self.terminals.items()]
        return "%llguidance {}\n" + head + "\n".join([f"start: {start}", *self.rules, *terms]) + "\n"
