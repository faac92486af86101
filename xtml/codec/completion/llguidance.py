"""The completion grammar as Lark text in llguidance's dialect, which
``llguidance.LLMatcher(tokenizer, text)`` takes as it is (so do engines that
pass Lark grammars to it: vLLM, SGLang, llama.cpp).

Text bodies are any text; a text terminal never matches a special token.
Argument keys are tracked in a rule parameter, JSON values are llguidance's
own ``%json`` of the argument's schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ...markup.header import escape
from .plan import Plan
from .schema import StringForm, Tool, Value, has_properties, resolve_ref, restricted
from .writer import GrammarWriter

__all__ = ["TRACKED", "write"]

TRACKED = 64
"""How many argument keys of a tool the grammar tracks exactly (each key at
most once, required ones present), in a 64-bit rule parameter. With more
keys, only the required ones are tracked when they fit, and the other keys
may repeat."""


def write(plan: Plan) -> str:
    """The plan (made for ``llguidance``) as Lark text."""
    return _Lark.grammar(plan)


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
# Keywords that say nothing about a value.
_ANNOTATIONS = frozenset({"type", "title", "description", "default", "examples", "$comment", "$defs", "definitions",
                          "deprecated", "readOnly", "writeOnly", "format"})


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


_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
_STRING_KEYS = frozenset({"minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType"})
# Keywords a JSON value's structure is written by here; a part of a schema
# with any other goes to llguidance's JSON whole.
_STRUCTURE = frozenset({"properties", "required", "additionalProperties", "items", "minItems", "maxItems", "anyOf",
                        "$ref", "enum", "const", *_BOUNDS, *_STRING_KEYS})
_MAX_ITEMS = 64
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""Array lengths up to this are spelled out as repetition counts."""
# llguidance writes a number between bounds as digits, and refuses to for
# bounds much past 1e17: with one bound given, the other is 1e17, and the
# digits from there on are these (Python reads them back finite).
_CAP = 10**17
_BIG_INTEGER = "[1-9][0-9]{17,4299}"
_BIG_NUMBER = "([1-9][0-9]{17,4299}|[1-9][0-9]{17,307}\\.[0-9]+)"
# An object key as Python's JSON writes it: each key has this one spelling,
# so a key excluded by its spelling cannot come back escaped another way.
_JSON_KEY = '/"([^"\\\\\\x00-\\x1f]|\\\\["\\\\bfnrt]|\\\\u00(0[0-7bef]|1[0-9a-f]))*"/'


def _may_hold_numbers(s: Any) -> bool:
    return not (isinstance(s, Mapping) and s.get("type") in ("string", "boolean", "null"))


class _Lark(GrammarWriter):
    syntax = "llguidance"
    start = "start"
    preamble = "%llguidance {}\n"
    load = ("// Load: llguidance.LLMatcher(tokenizer, this text) (or grammar_from(\"lark\", this text)).",)

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.terminals: dict[str, str] = {}
        self.nested = False
        self.uses_json = False
        self.json_rules: dict[str, str] = {}

    def spell(self, name: str, body: str) -> str:
        return f"{name}: {body}"

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

    def attr_values(self) -> tuple[str, str]:
        self.terminals["ATTR"] = '/([^"&]|&amp;|&quot;)+/'
        return "ATTR?", "ATTR"

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
        return self.json_schema(v.schema, v.root, 0, jtype)

    def json_object_value(self, schema: Any) -> str:
        return self.json_ref(schema)

    def json_ref(self, schema: Any) -> str:
        """JSON of ``schema``. Its structure (types, properties, items,
        ``anyOf``, ``$ref``) is written here, with numbers as Python's JSON
        reads them back; what only llguidance's JSON enforces (string
        lengths, patterns and formats, bounds, enums, other keywords) is its
        ``%json`` of that part alone: llguidance's JSON numbers have no bound
        on digits or exponent (1e400 reads as an infinity, which a strict
        parse refuses)."""
        return self.json_schema(schema, schema, 0)

    def json_schema(self, s: Any, root: Any, depth: int, only: str | None = None) -> str:
        """JSON of ``s`` (of JSON type ``only`` when given), ``root``
        holding what its references point at."""
        got = self.json_part(s, root, depth, only)
        # None: nothing of type ``only``, which llguidance's JSON says.
        return self.llg_json(s, root, only=only) if got is None else got

    def json_part(self, s: Any, root: Any, depth: int, only: str | None) -> str | None:
        self.terminals["JWS"] = "/[ \\t\\r\\n]+/"
        if s is True or (isinstance(s, Mapping) and all(k in _ANNOTATIONS and k != "type" for k in s)):
            return self.plain_json(only or "value")
        if not isinstance(s, Mapping) or depth > 32 or any(k not in _ANNOTATIONS and k not in _STRUCTURE
                                                               for k in s):
            return self.llg_json(s, root, whole=True, only=only)
        own = [k for k in s if k not in _ANNOTATIONS]
        if "$ref" in s:
            target = resolve_ref(s["$ref"], root)
            ref = s["$ref"]
            if not (isinstance(ref, str) and ref.startswith("#")):
                return self.plain_json(only or "value")  # not of this schema: any value, as everywhere
            if target is None:
                # A reference that points nowhere: llguidance's JSON refuses
                # it, and the grammar with it, as an engine would.
                self.uses_json = True
                return f"%json {_json_text(s)}"
            if own != ["$ref"] or "type" in s:
                return self.llg_json(s, root, whole=True, only=only)
            return self.json_rule(target, root, depth, only)
        if "anyOf" in s:
            branches = s["anyOf"]
            if own != ["anyOf"] or "type" in s or not isinstance(branches, list) or not branches:
                return self.llg_json(s, root, whole=True, only=only)
            found = [x for x in (self.json_part(b, root, depth + 1, only) for b in branches) if x is not None]
            return "(" + " | ".join(found) + ")" if found else None
        if "enum" in s or "const" in s:
            # Values the schema spells: numbers among them are finite.
            return self.llg_json(s, root, only=only)
        t = s.get("type")
        types = [t] if isinstance(t, str) else t if isinstance(t, list) else list(_TYPES)
        if not types or any(x not in _TYPES for x in types):
            return self.llg_json(s, root, whole=True, only=only)
        if only is not None:
            # "number" admits integers; "integer" under "number" is a whole number.
            types = [only] if only in types or (only == "integer" and "number" in types) else \
                ["integer"] if only == "number" and "integer" in types else []
        alts: list[str] = []
        for jt in _TYPES:
            if jt not in types or (jt == "integer" and "number" in types):
                continue
            if jt == "string":
                limits = {k: s[k] for k in s if k in _STRING_KEYS}
                alts.append(self.llg_json({"type": "string", **limits}, root) if limits else self.plain_json("string"))
            elif jt in ("number", "integer"):
                alts.append(self.number(jt, {k: s[k] for k in _BOUNDS if k in s}, root))
            elif jt == "boolean":
                alts.append('("true" | "false")')
            elif jt == "null":
                alts.append('"null"')
            elif jt == "object":
                alts.append(self.json_object(s, root, depth))
            else:
                alts.append(self.json_array(s, root, depth))
        if not alts:
            return None
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def named(self, expr: str, stem: str) -> str:
        """``expr`` as a rule's name: an expression written twice (an array's
        first and further items, an object member in the rules before and
        after a comma) would double at every level of nesting, a grammar
        exponential in the schema's depth."""
        if _NAME.fullmatch(expr):
            return expr
        name = f"j_{stem}{len(self.rules)}"
        self.rule(name, expr)
        return name

    def json_rule(self, s: Any, root: Any, depth: int, only: str | None) -> str:
        """A named rule for the target of a ``$ref``, made once: references
        may be recursive."""
        key = f"{id(root)} {only} {json.dumps(s, sort_keys=True, default=str)}"
        name = self.json_rules.get(key)
        if name is None:
            name = self.json_rules[key] = f"j_ref{len(self.json_rules)}"
            self.rule(name, self.json_schema(s, root, depth + 1, only))
        return name

    def number(self, jtype: str, bounds: dict[str, Any], root: Any) -> str:
        """A number or integer within ``bounds``. llguidance writes a bounded
        number without an exponent and bounds only the sides given; the
        other side is bounded here, by llguidance up to 1e17 and by digits
        from there on, and the exponent forms Python writes are added."""
        if not bounds:
            return self.plain_json(jtype)
        if any(type(x) not in (int, float) for x in bounds.values()):
            return self.llg_json({"type": jtype, **bounds}, root)
        lo = max([bounds[k] for k in ("minimum", "exclusiveMinimum") if k in bounds], default=None)
        hi = min([bounds[k] for k in ("maximum", "exclusiveMaximum") if k in bounds], default=None)
        alts: list[str] = []
        if lo is not None and hi is not None:
            alts.append(self.llg_json({"type": jtype, **bounds}, root))
        elif hi is None and lo is not None and lo < _CAP:
            alts += [self.llg_json({"type": jtype, **bounds, "maximum": _CAP}, root), self.big(jtype, "")]
        elif lo is None and hi is not None and hi > -_CAP:
            alts += [self.llg_json({"type": jtype, **bounds, "minimum": -_CAP}, root), self.big(jtype, "-")]
        else:
            self.notes.append("a number bound of 1e17 or more on one side only leaves the other side's digits "
                              "unbounded (llguidance's JSON)")
            alts.append(self.llg_json({"type": jtype, **bounds}, root))
        forms = _exponent_forms({"type": jtype, **bounds})
        if forms:
            # llguidance writes a bounded number without an exponent, where
            # Python's JSON writes the floats below 1e-4 and from 1e16 with one.
            name = f"EXP_{len(self.terminals)}"
            self.terminals[name] = "/" + "|".join(forms) + "/"
            alts.append(name)
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def big(self, jtype: str, sign: str) -> str:
        """Numbers from 1e17 on (``-``: down from -1e17) without an exponent,
        as far as Python's JSON reads them back."""
        name = f"BIG_{jtype.upper()}" + ("_NEG" if sign else "")
        self.terminals[name] = "/" + sign + (_BIG_INTEGER if jtype == "integer" else _BIG_NUMBER) + "/"
        return name

    def json_object(self, s: Mapping[str, Any], root: Any, depth: int) -> str:
        props = s.get("properties", {})
        req = s.get("required", [])
        addl = s.get("additionalProperties", True)
        if not isinstance(props, Mapping) or not isinstance(req, list) or not isinstance(addl, bool | Mapping):
            return self.llg_json(s, root, whole=True)
        required = [k for k in dict.fromkeys(req) if isinstance(k, str)]
        if not props and not required and addl in (True, {}):
            return self.plain_json("object")
        self.nested = self.nested or bool(props)
        more = [k for k in required if k not in props]
        if more and addl is False:
            return self.llg_json(s, root, whole=True)  # no object fits: llguidance says so
        # llguidance's order: the listed properties, the required keys not
        # listed, then any other keys.
        members = [(k, props[k], k in required) for k in props]
        members += [(k, addl, True) for k in more]
        ws = 'JWS? ":" JWS?'
        spelled = [(_lark_str(_STRING.encode(k)), sub, need) for k, sub, need in members]
        exprs = [(f"{lit} {ws} {self.named(self.json_schema(sub, root, depth + 1), 'val')} JWS?", need)
                 for lit, sub, need in spelled]
        extra = None
        if addl is not False:
            key = f"JKEY_{len(self.terminals)}"
            known = " | ".join(dict.fromkeys(lit for lit, _, _ in spelled))
            # One spelling per key (Python's), so that no listed key comes
            # again spelled another way: the parse would keep the later value.
            self.terminals[key] = _JSON_KEY + (f" & ~({known})" if known else "")
            extra = f"{key} {ws} {self.named(self.json_schema(addl, root, depth + 1), 'val')} JWS?"
        base = f"j_obj{len(self.rules)}"
        sep = '"," JWS?'
        n = len(exprs)
        # after_k: members k.. once one was written (each after a comma);
        # first_k: members k.. before any was.
        for k in range(n, -1, -1):
            if k == n:
                self.rule(f"{base}_after{k}", f"({sep} {extra})*" if extra else '""')
                self.rule(f"{base}_first{k}", f"({extra} {base}_after{k})?" if extra else '""')
                continue
            m, need = exprs[k]
            if need:
                self.rule(f"{base}_after{k}", f"{sep} {m} {base}_after{k + 1}")
                self.rule(f"{base}_first{k}", f"{m} {base}_after{k + 1}")
            else:
                self.rule(f"{base}_after{k}", f"({sep} {m})? {base}_after{k + 1}")
                self.rule(f"{base}_first{k}", f"{m} {base}_after{k + 1} | {base}_first{k + 1}")
        return f'"{{" JWS? {base}_first0 "}}"'

    def json_array(self, s: Mapping[str, Any], root: Any, depth: int) -> str:
        items = s.get("items", True)
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        if isinstance(items, list) or type(lo) is not int or not (hi is None or type(hi) is int) or \
                lo > _MAX_ITEMS or (hi is not None and not lo <= hi <= _MAX_ITEMS):
            return self.llg_json(s, root, whole=True)
        if lo == 0 and hi is None and items in (True, {}):
            return self.plain_json("array")
        if hi == 0:
            return '"[" JWS? "]"'
        item = f"{self.named(self.json_schema(items, root, depth + 1), 'item')} JWS?"
        count = "*" if hi is None and lo <= 1 else f"{{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}"
        rest = f'("," JWS? {item}){count}'
        body = f"{item} {rest}"
        return '"[" JWS? ' + (f"({body})?" if lo == 0 else body) + ' "]"'

    def llg_json(self, s: Any, root: Any, whole: bool = False, only: str | None = None) -> str:
        """llguidance's ``%json`` of ``s`` (of JSON type ``only`` when
        given), standing alone (what it refers to in ``root`` copied along).
        ``whole``: a part with keywords written nowhere else, whose numbers
        llguidance does not bound."""
        self.uses_json = True
        self.nested = self.nested or has_properties(s)
        if whole and _may_hold_numbers(s):
            self.notes.append("numbers inside a JSON value whose schema has keywords only llguidance's JSON knows "
                              "(allOf, oneOf, not, if, patternProperties, min/maxProperties, prefixItems, "
                              "multipleOf, ...) have no bound on digits or exponent (1e400), which a strict parse "
                              "refuses")
        return f"%json {_json_text(restricted(Value(s, root, [], []), only))}"

    def plain_json(self, jtype: str) -> str:
        """JSON of one type and no other constraint, written here rather than
        by llguidance's ``%json``, whose numbers have no bound on digits or
        exponent (1e400, an integer of 5000 digits: Python's JSON does not
        read them back)."""
        self.terminals["JWS"] = "/[ \\t\\r\\n]+/"
        if jtype == "integer":
            self.terminals["INTEGER"] = _INTEGER
            return "INTEGER"
        if jtype == "string":
            self.terminals["JSTRING"] = _JSON_STRING
            return "JSTRING"
        if jtype in ("boolean", "null"):
            return '("true" | "false")' if jtype == "boolean" else '"null"'
        self.terminals["NUMBER"] = _NUMBER
        if jtype == "number":
            return "NUMBER"
        if "j_value" not in self.defined:
            self.defined.add("j_value")
            self.terminals["JSTRING"] = _JSON_STRING
            member = 'JSTRING JWS? ":" JWS? j_value JWS?'
            self.rule("j_value", 'j_object | j_array | JSTRING | NUMBER | "true" | "false" | "null"')
            self.rule("j_object", f'"{{" JWS? ({member} ("," JWS? {member})*)? "}}"')
            self.rule("j_array", '"[" JWS? (j_value JWS? ("," JWS? j_value JWS?)*)? "]"')
        return f"j_{jtype}"

    def finish(self) -> list[str]:
        if self.uses_json:
            self.notes.append("inside JSON strings llguidance refuses a raw DEL (U+007F), which JSON allows")
        if "NUMBER" in self.terminals or any(k.startswith("EXP_") for k in self.terminals):
            self.notes.append("numbers in exponent form take one digit before the point; under bounds, floats "
                              "below 1e-323 are refused though JSON holds them")
        if self.p.text_ids:
            self.notes.append("text that the tokenizer turns into added tokens (its spelling of one that is not "
                              "special) is admitted in text bodies only, not in JSON values or fixed strings")
        if self.nested:
            self.notes.append("JSON objects (nested argument values, json blocks, JSON answers) take their "
                              "properties in the schema's order (as llguidance's JSON does); keys a schema does not "
                              "list are spelled as Python's JSON writes them (\\u escapes of control characters only)")
        return [f"{k}: {v}" for k, v in self.terminals.items()]
