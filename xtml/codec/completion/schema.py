"""How a tool's JSON schema maps onto typed arguments.

An argument of a call is written ``key="KEY" type="T"`` with T one of the
type attributes (:data:`TEXT_TYPES`); strings are raw text, other values
JSON. From a tool's parameters schema this reads which keys there are, which
are required, and for each the type attributes it may carry and the strings
it may hold (an enum's, a const, any text within lengths). What it cannot
tell apart it over-approximates, and says so in the notes: the grammar may
then admit more than the schema, never less.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ALL_TYPES", "TEXT_TYPES", "Arg", "StringForm", "Tool", "Value", "deref", "has_properties", "json_type",
           "json_types", "restricted", "typed_tool"]

_MAX_LENGTH = 1000
TEXT_TYPES = ("string", "number", "boolean", "null", "object", "array")
"""The ``type`` attributes of an argument, in the order a grammar offers them."""
ALL_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})


@dataclass(frozen=True)
class StringForm:
    """One way to write a string value (raw, as string arguments are)."""

    texts: tuple[str, ...] | None = None
    """Exactly one of these; None: any text within the lengths."""
    min_len: int = 0
    max_len: int | None = None


@dataclass
class Value:
    """How one argument's value may be written: the ``type`` attributes it
    may carry and, for each, what follows."""

    schema: Any
    """The property's schema (for the JSON of non-string values)."""
    root: Any
    """The tool's parameters schema, whose ``$defs`` the schema may use."""
    strings: list[StringForm]
    """Ways to write a string value; empty: no string."""
    others: list[tuple[str, str]]
    """(type attribute, JSON type) of the non-string values it may be:
    ``("number", "integer")`` for a schema of integers."""


@dataclass
class Arg:
    key: str
    required: bool
    value: Value


@dataclass
class Tool:
    name: str
    args: list[Arg]
    """Known keys, required ones first."""
    extra: Value | None
    """Values of keys the schema does not list; None when there may be none."""
    params: Any
    """The parameters schema, for the json block."""


def typed_tool(name: str, fn: Mapping[str, Any], notes: list[str]) -> Tool | None:
    """The arguments a call of function object ``fn`` may carry; None when
    a required argument can have no value (no call is valid). What is not
    enforced goes to ``notes``."""
    params = fn.get("parameters")
    if params is None:
        params = {}
    any_value = _value(True, {}, notes, "")
    if not isinstance(params, Mapping) or not _plain_object(params):
        if params not in ({}, True):
            notes.append(f"tool {name!r}: its parameters are not a plain object schema, so any arguments go")
        return Tool(name, [], any_value, params if isinstance(params, Mapping) else {})
    props = params.get("properties")
    if not isinstance(props, Mapping):
        props = {}
    req = params.get("required")
    required = [k for k in dict.fromkeys(req) if isinstance(k, str)] if isinstance(req, list) else []
    addl = params.get("additionalProperties", True)
    if params.get("patternProperties"):
        notes.append(f"tool {name!r}: patternProperties are not enforced")
        addl = True
    for k in ("minProperties", "maxProperties", "propertyNames", "dependentRequired", "dependencies"):
        if k in params:
            notes.append(f"tool {name!r}: {k} is not enforced")
    extra = _value(addl, params, notes, f"tool {name!r}, other arguments") if addl is not False else None
    args: list[Arg] = []
    keys = list(dict.fromkeys([*required, *props]))
    for key in keys:
        sub = props[key] if key in props else (addl if addl is not False else True)
        v = _value(sub, params, notes, f"tool {name!r}, argument {key!r}")
        if not v.strings and not v.others:
            if key in required:
                notes.append(f"tool {name!r}: required argument {key!r} can have no value, so the tool is left out")
                return None
            continue
        args.append(Arg(key, key in required, v))
    args.sort(key=lambda a: not a.required)
    return Tool(name, args, extra, params)


def _plain_object(s: Mapping[str, Any]) -> bool:
    """Whether a parameters schema is an object schema read key by key (no
    combinators or references at its top)."""
    t = s.get("type", "object")
    if t != "object" and not (isinstance(t, list) and "object" in t):
        return False
    return not any(k in s for k in ("anyOf", "oneOf", "allOf", "$ref", "not", "if"))


def _value(schema: Any, root: Any, notes: list[str], where: str) -> Value:
    types = json_types(schema, root, 0)
    strings = _strings(schema, root, 0, notes, where) if "string" in types else []
    others: list[tuple[str, str]] = []
    for attr in TEXT_TYPES[1:]:
        if attr == "number":
            jt = "number" if "number" in types else "integer" if "integer" in types else ""
        else:
            jt = attr if attr in types else ""
        if jt:
            others.append((attr, jt))
    return Value(schema, root, strings, others)


def resolve_ref(ref: Any, root: Any) -> Any:
    """What the local reference ``ref`` (``#/$defs/x``, JSON-pointer
    escapes read) points at in ``root``; None when it is not local or
    points nowhere."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def deref(s: Mapping[str, Any], root: Any) -> Any:
    """The schema ``s``'s ``$ref`` points at; any value (True) when it
    points nowhere this schema holds."""
    node = resolve_ref(s.get("$ref"), root)
    return True if node is None else node


def json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def json_types(s: Any, root: Any, depth: int) -> frozenset[str]:
    """JSON types a schema admits, over-approximated (``number`` means
    non-integers too)."""
    if s is False:
        return frozenset()
    if not isinstance(s, Mapping) or depth > 32:
        return ALL_TYPES
    out = set(ALL_TYPES)
    t = s.get("type")
    if isinstance(t, str | list):
        want = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)}
        if "number" in want:
            want.add("integer")
        out &= want
    if isinstance(s.get("enum"), list):
        # An integer value is a number too; "number" stands for the others.
        values = {json_type(v) for v in s["enum"]}
        out &= values | ({"integer"} if "number" in values else set())
    if "const" in s:
        out &= {json_type(s["const"])}
    if "$ref" in s:
        out &= json_types(deref(s, root), root, depth + 1)
    for k in ("anyOf", "oneOf"):
        if isinstance(s.get(k), list):
            out &= set().union(*[json_types(b, root, depth + 1) for b in s[k]]) if s[k] else set()
    if isinstance(s.get("allOf"), list):
        for b in s["allOf"]:
            out &= json_types(b, root, depth + 1)
    return frozenset(out)


def _strings(s: Any, root: Any, depth: int, notes: list[str], where: str) -> list[StringForm]:
    """Ways a schema's strings may be written, over-approximated."""
    if not isinstance(s, Mapping) or depth > 32:
        return [StringForm()]
    if "$ref" in s:
        return _strings(deref(s, root), root, depth + 1, notes, where)
    siblings = {k: v for k, v in s.items() if k not in ("anyOf", "oneOf", "allOf")}
    for k in ("anyOf", "oneOf"):
        if isinstance(s.get(k), list):
            out: list[StringForm] = []
            for b in s[k]:
                merged = {**siblings, **b} if isinstance(b, Mapping) else b
                if "string" in json_types(merged, root, depth + 1):
                    out += _strings(merged, root, depth + 1, notes, where)
            return out
    if isinstance(s.get("allOf"), list):
        # Every part applies: fixed texts must be in every part that fixes
        # them and fit every part's lengths; lengths meet.
        parts = [siblings, *s["allOf"]]
        found = [_strings(p, root, depth + 1, notes, where) for p in parts]
        if any(not f for f in found):
            return []
        plain = [f[0] for f in found if len(f) == 1 and f[0].texts is None]
        lo = max((x.min_len for x in plain), default=0)
        caps = [x.max_len for x in plain if x.max_len is not None]
        hi = min(caps) if caps else None
        if any(len(f) > 1 for f in found):
            notes.append(f"{where}: string alternatives inside allOf are not enforced")
        exact = [{t for x in f for t in (x.texts or ())} for f in found if all(x.texts is not None for x in f)]
        if exact:
            first = [t for x in next(f for f in found if all(y.texts is not None for y in f)) for t in (x.texts or ())]
            kept = [t for t in dict.fromkeys(first)
                    if all(t in e for e in exact) and lo <= len(t) and (hi is None or len(t) <= hi)]
            return [StringForm(tuple(kept))] if kept else []
        if hi is not None and hi < lo:
            return []
        return [StringForm(None, lo, hi)]
    texts: list[str] | None = None
    if isinstance(s.get("enum"), list):
        texts = [v for v in s["enum"] if isinstance(v, str)]
    if "const" in s:
        c = s["const"]
        texts = [c] if isinstance(c, str) and (texts is None or c in texts) else []
    if texts is not None:
        return [StringForm(tuple(dict.fromkeys(texts)))] if texts else []
    for k in ("pattern", "format", "contentEncoding"):
        if k in s:
            notes.append(f"{where}: string {k} is not enforced")
    lo = s.get("minLength", 0)
    hi = s.get("maxLength")
    lo = lo if type(lo) is int and lo > 0 else 0
    hi = hi if type(hi) is int and hi >= lo else None
    if lo > _MAX_LENGTH or (hi is not None and hi > _MAX_LENGTH):
        # A bounded repetition is unrolled by the libraries' regex engines.
        notes.append(f"{where}: string lengths above {_MAX_LENGTH} are not enforced")
        lo, hi = min(lo, _MAX_LENGTH), None
    return [StringForm(None, lo, hi)]


def has_properties(s: Any) -> bool:
    """Whether a schema describes object properties anywhere in it."""
    if isinstance(s, Mapping):
        return "properties" in s or any(has_properties(v) for v in s.values())
    if isinstance(s, list):
        return any(has_properties(v) for v in s)
    return False


def _inline(s: Any, root: Any, depth: int = 0) -> Any:
    """``s`` with every local ``$ref`` but those into ``$defs`` and
    ``definitions`` replaced by what it points at, so that ``s`` can stand as
    a schema of its own beside a copy of those."""
    if isinstance(s, list):
        return [_inline(x, root, depth) for x in s]
    if not isinstance(s, Mapping):
        return s
    ref = s.get("$ref")
    if isinstance(ref, str) and not ref.startswith(("#/$defs/", "#/definitions/")):
        if depth > 16:
            return {}  # a reference cycle: any value (a wider grammar)
        rest = {k: v for k, v in s.items() if k != "$ref"}
        target = _inline(deref(s, root), root, depth + 1)
        return {"allOf": [target, _inline(rest, root, depth)]} if rest else target
    return {k: _inline(v, root, depth) for k, v in s.items()}


def restricted(v: Value, jtype: str | None) -> dict[str, Any]:
    """The value's schema narrowed to one JSON type (None: as it is), as a
    schema of its own (the ``$defs`` it refers to copied along)."""
    s = _inline(v.schema, v.root)
    base: dict[str, Any] = dict(s) if isinstance(s, Mapping) else {} if s is not False else {"not": {}}
    defs = {k: v.root[k] for k in ("$defs", "definitions")
            if isinstance(v.root, Mapping) and k in v.root and k not in base and v.root is not s}
    if jtype is None:
        return {**defs, **base}
    if "type" in base and not any(k in base for k in ("anyOf", "oneOf", "allOf", "$ref", "not", "if")):
        out = {**base, "type": jtype}
    elif base:
        out = {"allOf": [base, {"type": jtype}]}
    else:
        out = {"type": jtype}
    return {**defs, **out}

