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


def _below(digits: str) -> str:
    """A regex of the digit strings that, read as a fraction, are at most
    ``0.digits...`` followed by anything: below at some place, or its prefix."""
    alts = [digits[:i] + (f"[0-{int(digits[i]) - 1}]" if digits[i] != "1" else "0") + "[0-9]*"
            for i in range(len(digits)) if digits[i] != "0"]
    alts += [digits[:i] for i in range(1, len(digits))]
    return "(" + "|".join([*alts, digits + "[0-9]*"]) + ")"


# A mantissa whose value times 1e308 stays finite: at most
# 1.7976931348623157 (the largest float's), any digits after.
_MAX_308 = "1(\\." + _below("7976931348623157") + ")?[eE]\\+?308"
# JSON numbers Python reads back exactly as JSON says, finite: an integer
# of at most 4300 digits (Python's limit on converting digits); a fraction
# whose integer part has at most 308 digits (below 1e308); one digit, maybe
# a fraction, then an exponent of at most three digits, at most 307 (below
# 1e308), or 308 after a mantissa of at most the largest float's. Every
# float Python's JSON writes is one of these.
_DIGITS = "(0|[1-9][0-9]{0,4299})"
_INTEGER = f"/-?{_DIGITS}/"
_NUMBER = ("/-?" + _DIGITS + "|-?(0|[1-9][0-9]{0,307})\\.[0-9]+"
           "|-?[0-9](\\.[0-9]+)?[eE](-[0-9]{1,3}|\\+?(0{0,2}[0-9]|0?[1-9][0-9]|[12][0-9][0-9]|30[0-7]))"
           "|-?" + _MAX_308 + "/")
# A JSON string Python reads back as text: \\u escapes of surrogates only
# in pairs.
_JSON_STRING = ('/"([^"\\\\\\x00-\\x1f]|\\\\["\\\\\\/bfnrt]|\\\\u([0-9a-ce-fA-CE-F][0-9a-fA-F]{3}'
                '|[dD][0-7][0-9a-fA-F]{2}|[dD][89aAbB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2}))*"/')
_PLAIN = ("number", "integer", "object", "array")
# Keywords that say nothing about a value.
_ANNOTATIONS = frozenset({"type", "title", "description", "default", "examples", "$comment", "$defs", "definitions",
                          "deprecated", "readOnly", "writeOnly", "format"})


# Keywords that, with these values, allow every value.
_VACUOUS: dict[str, tuple[Any, ...]] = {"properties": ({},), "required": ([],), "additionalProperties": (True, {}),
                                        "items": (True, {}), "patternProperties": ({},)}


def _plain(schema: Any) -> bool:
    """Whether a schema is one JSON type with no other constraint."""
    return isinstance(schema, Mapping) and schema.get("type") in _PLAIN and all(
        k in _ANNOTATIONS or (k in _VACUOUS and any(v == x for x in _VACUOUS[k])) for k, v in schema.items())


# Python's JSON writes a float with an exponent when it is below 1e-4 or
# from 1e16 on: one digit, maybe a fraction, then the exponent.
_TINY = "[1-9](\\.[0-9]+)?[eE]-(0?[5-9]|[1-9][0-9]|[12][0-9][0-9]|3[01][0-9]|32[0-3])"
_HUGE = "([1-9](\\.[0-9]+)?[eE]\\+?(1[6-9]|[2-9][0-9]|[12][0-9][0-9]|30[0-7])|" + _MAX_308 + ")"
_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def _exponent_forms(schema: Mapping[str, Any]) -> list[str]:
    """Regexes of the numbers in exponent form (as Python's JSON writes
    them) that a bounded number schema allows, each form whole: positive
    and negative values below 1e-4 (down to 1e-323, which stays above
    zero), and, without an upper or lower bound, from 1e16 on."""
    if schema.get("type") != "number" or not all(k in _ANNOTATIONS or k in _BOUNDS for k in schema):
        return []
    b = {k: schema[k] for k in _BOUNDS if k in schema}
    if not b or any(type(x) not in (int, float) for x in b.values()):
        return []
    lo = max([b[k] for k in ("minimum", "exclusiveMinimum") if k in b], default=None)
    hi = min([b[k] for k in ("maximum", "exclusiveMaximum") if k in b], default=None)
    strict_lo = "exclusiveMinimum" in b and b["exclusiveMinimum"] == lo
    strict_hi = "exclusiveMaximum" in b and b["exclusiveMaximum"] == hi
    out = []
    if (lo is None or lo <= 0) and (hi is None or hi >= 1e-4):
        out.append(_TINY)
    if (lo is None or lo <= -1e-4) and (hi is None or hi >= 0):
        out.append("-" + _TINY)
    if hi is None and (lo is None or lo < 1e16 or (lo == 1e16 and not strict_lo)):
        out.append(_HUGE)
    if lo is None and (hi is None or hi > -1e16 or (hi == -1e16 and not strict_hi)):
        out.append("-" + _HUGE)
    return out


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
            elif a.max_len == 0:
                empty = True
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
            # Only the empty string (maxLength 0): nothing after the separator.
            return ""
        expr = parts[0] if len(parts) == 1 else "(" + " | ".join(dict.fromkeys(parts)) + ")"
        return f"{expr}?" if empty else expr

    def json_value(self, v: Value, jtype: str) -> str:
        return self.json_ref(restricted(v, jtype))

    def json_object_value(self, schema: Any) -> str:
        return self.json_ref(schema)

    def json_ref(self, schema: Any) -> str:
        if _plain(schema):
            return self.plain_json(schema["type"])
        self.uses_json = True
        self.nested = self.nested or has_properties(schema)
        forms = _exponent_forms(schema)
        if forms:
            # llguidance writes a bounded number without an exponent, where
            # Python's JSON writes the floats below 1e-4 and from 1e16 with one.
            name = f"EXP_{len(self.terminals)}"
            self.terminals[name] = "/" + "|".join(forms) + "/"
            return f"(%json {_json_text(schema)} | {name})"
        return f"%json {_json_text(schema)}"

    def plain_json(self, jtype: str) -> str:
        """JSON of one type and no other constraint, written here rather than
        by llguidance's ``%json``, whose numbers have no bound on digits or
        exponent (1e400, an integer of 5000 digits: Python's JSON does not
        read them back)."""
        if jtype == "integer":
            self.terminals["INTEGER"] = _INTEGER
            return "INTEGER"
        self.terminals["NUMBER"] = _NUMBER
        if jtype == "number":
            return "NUMBER"
        if "j_value" not in self.defined:
            self.defined.add("j_value")
            self.terminals["JWS"] = "/[ \\t\\r\\n]+/"
            self.terminals["JSTRING"] = _JSON_STRING
            member = 'JSTRING JWS? ":" JWS? j_value JWS?'
            self.rule("j_value", 'j_object | j_array | JSTRING | NUMBER | "true" | "false" | "null"')
            self.rule("j_object", f'"{{" JWS? ({member} ("," JWS? {member})*)? "}}"')
            self.rule("j_array", '"[" JWS? (j_value JWS? ("," JWS? j_value JWS?)*)? "]"')
        return f"j_{jtype}"

    def write(self) -> str:
        start = self.channels()
        extra = ["// Load: llguidance.LLMatcher(tokenizer, this text) (or grammar_from(\"lark\", this text))."]
        if self.uses_json:
            self.notes.append("inside JSON strings llguidance refuses a raw DEL (U+007F), which JSON allows")
            self.notes.append("numbers inside JSON values of a schema with constraints of its own (properties, "
                              "items, bounds, enums: llguidance's JSON) have no bound on digits or exponent (1e400, "
                              "an integer of more than 4300 digits), which a strict parse refuses")
        if "NUMBER" in self.terminals or any(k.startswith("EXP_") for k in self.terminals):
            self.notes.append("numbers in exponent form take one digit before the point; under bounds, floats "
                              "below 1e-323 are refused though JSON holds them")
        if self.p.text_ids:
            self.notes.append("text that the tokenizer turns into added tokens (its spelling of one that is not "
                              "special) is admitted in text bodies only, not in JSON values or fixed strings")
        if self.nested:
            self.notes.append("JSON objects (nested argument values, json blocks, JSON answers) take their "
                              "properties in the schema's order (llguidance's JSON)")
        head = self.header("llguidance", extra)
        terms = [f"{k}: {v}" for k, v in self.terminals.items()]
        return "%llguidance {}\n" + head + "\n".join([f"start: {start}", *self.rules, *terms]) + "\n"
