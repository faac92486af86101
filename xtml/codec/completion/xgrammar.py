"""The completion grammar as EBNF for ``xgrammar.Grammar.from_ebnf``
(root rule ``root``). xgrammar's EBNF cannot express everything the
llguidance export does: what this grammar leaves out is listed in its
header comment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...plugins.api import ebnf_literal
from .plan import Plan
from .schema import ALL_TYPES, StringForm, Tool, Value, deref, json_type, json_types
from .writer import GrammarWriter

__all__ = ["TRACKED", "write"]

TRACKED = 6
"""How many argument keys of a tool the grammar tracks exactly (each key at
most once, required ones present): one rule per subset of them, so 2**6
rules at most. With more keys, only the required ones are tracked when they
fit, and the other keys may repeat."""


def write(plan: Plan) -> str:
    """The plan (made for ``xgrammar``, with a tokenizer) as EBNF."""
    return _Ebnf.grammar(plan)


def _below(digits: str) -> str:
    """EBNF of the digit strings that, read as a fraction, are at most
    ``0.digits...`` followed by anything: below at some place, or its prefix."""
    alts = [" ".join([*([f'"{digits[:i]}"'] if i else []), f"[0-{int(digits[i]) - 1}]", "[0-9]*"])
            for i in range(len(digits)) if digits[i] != "0"]
    alts += [f'"{digits[:i]}"' for i in range(1, len(digits))]
    return "(" + " | ".join([*alts, f'"{digits}" [0-9]*']) + ")"


# JSON numbers Python's JSON reads back finite, as the llguidance export
# writes them (see there): an integer of at most 4300 digits; a fraction
# whose integer part has at most 308 digits; one digit, maybe a fraction,
# and an exponent up to 307, or 308 after a mantissa of at most the largest
# float's. A \u escape of a surrogate only in a pair: Python's JSON reads a
# lone one into text no UTF encodes.
_JSON_RULES = {
    "json_ws": "[ \\n\\t\\r]*",
    "json_hex": "[0-9a-fA-F]",
    "json_u": '"\\\\u" ([0-9a-ce-fA-CE-F] json_hex json_hex json_hex | [dD] [0-7] json_hex json_hex'
              ' | [dD] [89abAB] json_hex json_hex "\\\\u" [dD] [c-fC-F] json_hex json_hex)',
    "json_char": '[^"\\\\\\x00-\\x1f] | "\\\\" ["\\\\/bfnrt] | json_u',
    "json_string": '"\\"" json_char* "\\""',
    "json_digits": '"0" | [1-9] [0-9]{0,4299}',
    "json_integer": '"-"? json_digits',
    "json_number": '"-"? (json_digits | ("0" | [1-9] [0-9]{0,307}) "." [0-9]+ | [0-9] ("." [0-9]+)? [eE] json_exp'
                   ' | "1" ("." ' + _below("7976931348623157") + ')? [eE] "+"? "308")',
    "json_exp": '"-" [0-9] [0-9]? [0-9]? | "+"? ("0"? "0"? [0-9] | "0"? [1-9] [0-9] | [12] [0-9] [0-9] | "30" [0-7])',
    "json_boolean": '"true" | "false"',
    "json_null": '"null"',
    "json_array": '"[" json_ws (json_any (json_ws "," json_ws json_any)*)? json_ws "]"',
    "json_member": 'json_string json_ws ":" json_ws json_any',
    "json_object": '"{" json_ws (json_member (json_ws "," json_ws json_member)*)? json_ws "}"',
    "json_any": "json_string | json_number | json_boolean | json_null | json_array | json_object",
}


ATTR_TEXT = '([^"&] | "&amp;" | "&quot;")'
"""One character of an attribute's value (escaped as a header escapes it)."""


class _Ebnf(GrammarWriter):
    syntax = "xgrammar"
    comment = "#"
    start = "root"
    load = (
        "# Load: xgrammar.Grammar.from_ebnf(this text) (root rule: root).",
        "# xgrammar's EBNF cannot express, so this grammar admits more than the llguidance export:",
        "#   keys an argument schema does not list are not told apart from listed ones;",
        f"#   more than {TRACKED} arguments of one tool are not all tracked (each key once, required ones present);",
        "#   string lengths, patterns and formats, number bounds and allOf/not/if in JSON values;",
        "#   free text excludes the vocabulary's special tokens at the token level, but attribute values",
        "#   and JSON are character-level: whether a special token's text can match them depends on",
        "#   how the engine's TokenizerInfo lists special tokens.",
    )

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.specials = plan.specials
        self.used: set[str] = set()
        self.schemas: dict[str, str] = {}

    def spell(self, name: str, body: str) -> str:
        return f"{name} ::= {body}"

    def lit(self, s: str) -> str:
        return ebnf_literal(s)

    def text_opt(self) -> str:
        if "text" not in self.used:
            self.used.add("text")
            ids = ", ".join(map(str, self.specials))
            # Free text at the token level: any token but the vocabulary's
            # special ones (whose text a character class might otherwise match).
            self.rules.append(f"text ::= (ExcludeToken({ids}))*")
        return "text"

    def json_response(self) -> str:
        return f"json_ws {self.json_schema(self.p.response_schema, self.p.response_schema, None)} json_ws"

    def attr_values(self) -> tuple[str, str]:
        return f"{ATTR_TEXT}*", f"{ATTR_TEXT}+"

    def calls(self) -> str:
        p = self.p
        for i, t in enumerate(p.tools):
            self.tool(i, t)
        for k in range(1, p.max_calls + 1):
            alts = [f"{self.indexed(t, k)} {self.s} body_t{i}" for i, t in enumerate(p.tools)]
            self.rule(f"call_{k}", f"{self.call_open()} (" + " | ".join(alts) + ")")
            self.rule(f"calls_{k}", f"call_{k} calls_{k + 1}?" if k < p.max_calls else f"call_{k}")
        return "calls_1"

    def tool(self, i: int, t: Tool) -> None:
        tracked = self.tracked(t, TRACKED)
        bit = {k: b for b, k in enumerate(tracked)}
        need = sum(1 << bit[k] for k in tracked if t.args[k].required)
        free_alts = []
        for k, a in enumerate(t.args):
            self.argument(f"arg_t{i}_{k}", self.key_literal(a.key), a.value)
            if k not in bit:
                free_alts.append(f"arg_t{i}_{k} args_t{i}_S")
        if t.extra is not None:
            key = f"{ATTR_TEXT}* " + self.lit('" ' + self.n["type"] + '="')
            self.argument(f"arg_t{i}_x", key, t.extra)
            free_alts.append(f"arg_t{i}_x args_t{i}_S")
            self.notes.append(f"tool {t.name!r}: keys the schema does not list may repeat or spell a listed key")
        for mask in range(1 << len(tracked)):
            alts = [self.call_close()] if mask & need == need else []
            for k, b in bit.items():
                if not mask & (1 << b):
                    alts.append(f"arg_t{i}_{k} args_t{i}_{mask | (1 << b)}")
            alts += [x.replace("_S", f"_{mask}") for x in free_alts]
            self.rule(f"args_t{i}_{mask}", " | ".join(alts))
        self.tool_body(i, t, f"args_t{i}_0")

    def strings(self, alts: list[StringForm]) -> str:
        parts: list[str] = []
        for a in alts:
            if a.texts is not None:
                parts += [self.lit(t) for t in a.texts]
            else:
                if a.min_len or a.max_len is not None:
                    self.notes.append("string lengths are not enforced (free text is matched by tokens)")
                parts.append(self.text_opt())
        if not parts:
            return ""
        return parts[0] if len(parts) == 1 else "(" + " | ".join(dict.fromkeys(parts)) + ")"

    def json_value(self, v: Value, jtype: str) -> str:
        return self.json_schema(v.schema, v.root, jtype)

    # -- JSON schema → rules -------------------------------------------------------------

    def json_object_value(self, schema: Any) -> str:
        return self.json_schema(schema, schema, "object")

    def json_schema(self, s: Any, root: Any, only: str | None) -> str:
        """A rule for the JSON values of ``s`` (restricted to JSON type
        ``only``): exact for types, enums, consts, objects (properties in the
        schema's order), arrays and combinations of them; other keywords are
        listed as not enforced."""
        key = json.dumps([s, only], sort_keys=True, default=str)
        name = self.schemas.get(key)
        if name is not None:
            return name
        name = self.schemas[key] = f"js{len(self.schemas)}"
        self.json_base()
        self.rule(name, self.json_expr(s, root, only, 0))
        return name

    def json_base(self) -> None:
        if "json" not in self.used:
            self.used.add("json")
            for k, v in _JSON_RULES.items():
                self.rule(k, v)

    def json_expr(self, s: Any, root: Any, only: str | None, depth: int) -> str:
        types = json_types(s, root, 0)
        if only is not None:
            types &= {only} | ({"integer"} if only == "number" else set())
        if not types:
            return '"\\x00" "\\x00"'  # nothing: no JSON starts with NUL
        if not isinstance(s, Mapping) or depth > 16:
            return self.json_any(types)
        if "$ref" in s:
            ref = s["$ref"]
            target = deref(s, root)
            return self.json_schema(target, root, only) if isinstance(ref, str) else self.json_any(types)
        for k in ("anyOf", "oneOf"):
            if isinstance(s.get(k), list):
                sib = {x: y for x, y in s.items() if x not in ("anyOf", "oneOf")}
                alts = [self.json_expr({**sib, **b} if isinstance(b, Mapping) else b, root, only, depth + 1)
                        for b in s[k]]
                return "(" + " | ".join(alts) + ")" if alts else '"\\x00" "\\x00"'
        if "allOf" in s or "not" in s or "if" in s:
            self.notes.append("allOf, not and if/then in JSON values are not enforced beyond their types")
            return self.json_any(types)
        values = s["enum"] if isinstance(s.get("enum"), list) else [s["const"]] if "const" in s else None
        if values is not None:
            ok = [v for v in values if json_type(v) in types or (json_type(v) == "integer" and "number" in types)]
            return "(" + " | ".join(self.lit(json.dumps(v, ensure_ascii=False)) for v in ok) + ")" if ok \
                else '"\\x00" "\\x00"'
        alts = []
        for t in ("string", "number", "boolean", "null", "object", "array"):
            if t == "number" and "number" not in types and "integer" in types:
                alts.append("json_integer")
            elif t not in types:
                continue
            elif t == "object":
                alts.append(self.json_object(s, root, depth))
            elif t == "array":
                alts.append(self.json_array(s, root, depth))
            else:
                alts.append(f"json_{t}")
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern",
                  "format", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems"):
            if k in s:
                self.notes.append(f"{k} in JSON values is not enforced")
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def json_any(self, types: frozenset[str]) -> str:
        names = [f"json_{t}" for t in ("string", "number", "boolean", "null", "object", "array") if t in types]
        if "number" not in types and "integer" in types:
            names.insert(1, "json_integer")
        return names[0] if len(names) == 1 else "(" + " | ".join(names) + ")"

    def json_array(self, s: Mapping[str, Any], root: Any, depth: int) -> str:
        items = s.get("items", True)
        if "prefixItems" in s:
            self.notes.append("prefixItems in JSON values are not enforced")
            items = True
        item = self.json_any(ALL_TYPES) if items is True or items == {} else self.json_schema(items, root, None)
        return f'("[" json_ws ({item} (json_ws "," json_ws {item})*)? json_ws "]")'

    def json_object(self, s: Mapping[str, Any], root: Any, depth: int) -> str:
        got = s.get("properties")
        props: Mapping[str, Any] = got if isinstance(got, Mapping) else {}
        required = [k for k in dict.fromkeys(s.get("required") or ()) if isinstance(k, str)]
        addl = s.get("additionalProperties", True)
        if "patternProperties" in s:
            addl = True
        if props:
            self.notes.append("JSON objects take their properties in the schema's order")
        members = [(k, f'{self.lit(json.dumps(k, ensure_ascii=False))} json_ws ":" json_ws '
                       f'{self.json_schema(v, root, None)}', k in required) for k, v in props.items()]
        members += [(k, f'{self.lit(json.dumps(k, ensure_ascii=False))} json_ws ":" json_ws json_any', True)
                    for k in required if k not in props]
        extra = None
        if addl is not False:
            value = "json_any" if addl is True or addl == {} else self.json_schema(addl, root, None)
            extra = f'json_string json_ws ":" json_ws {value}'
            if props:
                self.notes.append("keys JSON objects do not list may spell a listed key")
        base = f"jo{len(self.schemas)}_{depth}_{len(self.rules)}"
        sep = 'json_ws "," json_ws'
        n = len(members)
        # after_k: members k.. once something was written (each needs a comma);
        # first_k: members k.. before anything was written.
        tail = f"({sep} {extra})*" if extra else '""'
        for k in range(n, -1, -1):
            if k == n:
                self.rule(f"{base}_after{k}", tail)
                self.rule(f"{base}_first{k}", f"({extra} {base}_after{k})?" if extra else '""')
                continue
            _, m, req = members[k]
            if req:
                self.rule(f"{base}_after{k}", f"{sep} {m} {base}_after{k + 1}")
                self.rule(f"{base}_first{k}", f"{m} {base}_after{k + 1}")
            else:
                self.rule(f"{base}_after{k}", f"({sep} {m})? {base}_after{k + 1}")
                self.rule(f"{base}_first{k}", f"{m} {base}_after{k + 1} | {base}_first{k + 1}")
        return f'("{{" json_ws {base}_first0 json_ws "}}")'
