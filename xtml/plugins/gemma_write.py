"""Gemma 4's key:value syntax written out: the template's macros as
Python (declarations and arguments) and the Lark grammar of what they
write, which :mod:`.gemma_ebnf` spells again in GBNF and EBNF and
:mod:`.gemma_values` offers as the ``gemma`` value syntax."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import RequestError, shown
from .gemma_read import KEY_ENDS, QUOTE

__all__ = ["BOUNDS", "LarkGrammar", "argument", "declaration", "holds"]



class _Undefined:
    """Jinja's undefined: falsy, written as nothing."""

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return ""


_UNDEF = _Undefined()


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` as the template's Jinja reads it from JSON shapes: a
    missing key (or any key of a non-object) is undefined."""
    if isinstance(obj, Mapping) and key in obj:
        return obj[key]
    return _UNDEF


def _upper(x: Any) -> str:
    return str(x).upper()


def _dictsort(d: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """Jinja's ``dictsort``: by key, strings compared lowercased, ties in
    the mapping's order."""
    return sorted(d.items(), key=lambda kv: kv[0].lower() if isinstance(kv[0], str) else kv[0])


def _iterate(x: Any, where: str) -> list[Any]:
    """What a Jinja ``for`` runs over: a mapping's keys, a string's
    characters, a list's items."""
    if isinstance(x, Mapping | str | list | tuple):
        return list(x)
    raise RequestError(f"{shown(x)} is not a list (the template iterates it)", location=where)


def _quoted(s: str, where: str) -> str:
    if QUOTE in s:
        raise RequestError(f"a string holding {QUOTE} cannot be written: the format has no escape for it, so "
                           "it would end the string", location=where)
    return QUOTE + s + QUOTE


def _key(k: Any, where: str) -> str:
    if not isinstance(k, str):
        raise RequestError(f"key {shown(k)} is not a string", location=where)
    if QUOTE in k or any(c in KEY_ENDS for c in k):
        raise RequestError(f"key {shown(k)} cannot be written bare: it holds one of : , {{ }} [ ] or {QUOTE}, "
                           "which end a key", location=where)
    return k


def _path(where: str, key: Any) -> str:
    return f"{where}.{key}" if isinstance(key, str) and key.isidentifier() else f"{where}[{json.dumps(key)}]"


def _number(x: int | float, where: str) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        raise RequestError(f"{x} is not a JSON number", location=where)
    try:
        return str(x)
    except ValueError:  # more digits than Python converts
        raise RequestError(f"{shown(x)} has too many digits to write", location=where) from None


def argument(x: Any, where: str, quote_keys: bool) -> str:
    """The template's ``format_argument`` (``escape_keys`` is ``quote_keys``),
    refusing what would not read back."""
    if isinstance(x, str):
        return _quoted(x, where)
    if x is True or x is False:
        return "true" if x else "false"
    if isinstance(x, Mapping):
        parts = []
        for k, v in _dictsort(x):
            at = _path(where, k)
            key = _quoted(k, at) if quote_keys and isinstance(k, str) else _key(k, at)
            parts.append(f"{key}:{argument(v, at, quote_keys)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(x, list | tuple):
        return "[" + ",".join(argument(v, f"{where}[{i}]", quote_keys) for i, v in enumerate(x)) + "]"
    if x is None:
        return "None"
    if isinstance(x, int | float):
        return _number(x, where)
    raise RequestError(f"{shown(x)} is not a JSON value", location=where)


def _text(x: Any, where: str) -> str:
    """``{{ x }}`` of a value the template writes inside a string."""
    s = str(x)
    if QUOTE in s:
        raise RequestError(f"a text holding {QUOTE} cannot be written: the format has no escape for it",
                           location=where)
    return s


# -- declarations --------------------------------------------------------------------------------

_STANDARD = ("description", "type", "properties", "required", "nullable")


def _quoted_list(items: Any, where: str) -> str:
    return ",".join(QUOTE + _text(x, where) + QUOTE for x in _iterate(items, where))


def _parameters(properties: Mapping[str, Any], where: str) -> str:
    """The template's ``format_parameters``."""
    out: list[str] = []
    for key, value in _dictsort(properties):
        if key in _STANDARD:
            continue
        at = _path(where, key)
        parts: list[str] = []
        if _get(value, "description"):
            parts.append(f"description:{QUOTE}{_text(value['description'], at)}{QUOTE}")
        typ = _upper(_get(value, "type"))
        if typ == "STRING":
            if _get(value, "enum"):
                parts.append(f"enum:{argument(value['enum'], at + '.enum', True)}")
        elif typ == "ARRAY":
            items = _get(value, "items")
            if isinstance(items, Mapping) and items:
                parts.append(f"items:{{{_items(items, at + '.items')}}}")
        if _get(value, "nullable"):
            parts.append("nullable:true")
        if typ == "OBJECT":
            props = _get(value, "properties")
            if isinstance(props, Mapping):
                parts.append(f"properties:{{{_parameters(props, at + '.properties')}}}")
            elif isinstance(value, Mapping):
                parts.append(f"properties:{{{_parameters(value, at)}}}")
            if _get(value, "required"):
                parts.append(f"required:[{_quoted_list(value['required'], at + '.required')}]")
        parts.append(f"type:{QUOTE}{_text(typ, at)}{QUOTE}")
        out.append(f"{_text(key, at)}:{{{','.join(parts)}}}")
    return ",".join(out)


def _items(items: Mapping[str, Any], where: str) -> str:
    out: list[str] = []
    for k, v in _dictsort(items):
        if v is None:
            continue
        at = _path(where, k)
        if k == "properties":
            out.append("properties:{" + (_parameters(v, at) if isinstance(v, Mapping) else "") + "}")
        elif k == "required":
            out.append(f"required:[{_quoted_list(v, at)}]")
        elif k == "type":
            out.append("type:" + argument(v.upper() if isinstance(v, str) else
                                           [_upper(x) for x in _iterate(v, at)], at, True))
        else:
            out.append(f"{_text(k, at)}:{argument(v, at, True)}")
    return ",".join(out)


def declaration(tool: Mapping[str, Any], where: str) -> str:
    """The template's ``format_function_declaration``."""
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(fn, Mapping):
        raise RequestError("a tool is {\"type\": \"function\", \"function\": {...}}", location=where)
    where += ".function"
    out = [f"declaration:{_text(_get(fn, 'name'), where + '.name')}{{description:{QUOTE}"
           f"{_text(_get(fn, 'description'), where + '.description')}{QUOTE}"]
    params = _get(fn, "parameters")
    at = where + ".parameters"
    if params:
        out.append(",parameters:{")
        if _get(params, "properties"):
            props = params["properties"]
            if not isinstance(props, Mapping):
                raise RequestError(f"properties must be an object, not {shown(props)}", location=at + ".properties")
            out.append(f"properties:{{{_parameters(props, at + '.properties')}}},")
        if _get(params, "required"):
            out.append(f"required:[{_quoted_list(params['required'], at + '.required')}],")
        if _get(params, "type"):
            # Without a type the template leaves the parameters' brace open.
            out.append(f"type:{QUOTE}{_text(_upper(params['type']), at + '.type')}{QUOTE}}}")
    if "response" in fn:
        resp = fn["response"]
        out.append(",response:{")
        if _get(resp, "description"):
            out.append(f"description:{QUOTE}{_text(resp['description'], where + '.response.description')}{QUOTE},")
        if _upper(_get(resp, "type")) == "OBJECT":
            out.append(f"type:{QUOTE}OBJECT{QUOTE}}}")
    out.append("}")
    return "".join(out)


_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                          "writeOnly", "nullable", "format", "$schema", "$id"})



# -- the grammar ---------------------------------------------------------------------------------

_LARK = json.JSONEncoder(ensure_ascii=False)
_Q = re.escape(QUOTE).replace('"', '\\"')
# One string, its delimiters included (so that the lexer never has to
# give back characters it took), holding no delimiter inside.
_NOT_INSIDE = f'~/{_Q}(?s:.*){_Q}(?s:.*){_Q}/'
def _at_most(digits: str) -> str:
    """A regex of the fraction digits that, after "0.", are at most
    ``0.digits`` followed by any digits: below it at some place, or a
    prefix of it, or it."""
    alts = [digits[:i] + f"[0-{int(digits[i]) - 1}][0-9]*" for i in range(len(digits)) if digits[i] != "0"]
    alts += [digits[:i] for i in range(1, len(digits))]
    return "(" + "|".join([*alts, digits + "[0-9]*"]) + ")"


# A mantissa times 1e308 that stays finite: at most the largest float's,
# 1.7976931348623157, whatever digits follow.
_MAX_308 = "1(\\." + _at_most("7976931348623157") + ")?[eE]\\+?308"
_FREE_NUMBER = ("/-?(0|[1-9][0-9]{0,4299})|-?(0|[1-9][0-9]{0,307})\\.[0-9]+"
                "|-?[1-9](\\.[0-9]+)?[eE](-[0-9]{1,3}|\\+?(0{0,2}[0-9]|0?[1-9][0-9]|[12][0-9][0-9]|30[0-7]))"
                "|-?" + _MAX_308 + "/")
_FREE_INTEGER = "/-?(0|[1-9][0-9]{0,4299})/"
# Python writes a float below 1e-4 with an exponent, and from 1e16 on; an
# exponent past -323 could round to zero.
_TINY = "[1-9](\\.[0-9]+)?[eE]-(0?[5-9]|[1-9][0-9]|[12][0-9][0-9]|3[01][0-9]|32[0-3])"
_HUGE = "([1-9](\\.[0-9]+)?[eE]\\+?(1[6-9]|[2-9][0-9]|[12][0-9][0-9]|30[0-7])|" + _MAX_308 + ")"
# Past -323 the number may round to zero (5e-324 is the least float above it).
_DEEP = "[1-9](\\.[0-9]+)?[eE]-(32[4-9]|3[3-9][0-9])"
_EXPONENT_FORMS = ((_TINY, 1e-323, 1e-4), ("-" + _TINY, -1e-4, -1e-323), (_DEEP, 0.0, 1e-323),
                   ("-" + _DEEP, -1e-323, 0.0), (_HUGE, 1e16, math.inf), ("-" + _HUGE, -math.inf, -1e16),
                   ("-0\\.0", 0.0, 0.0))
"""Number forms %json leaves out, each with the range of what it spells."""
_KEYWORDS = frozenset({"type", "enum", "const", "properties", "required", "additionalProperties", "items",
                       "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
                       "exclusiveMaximum", "allOf", "anyOf"})
_TYPES = ("string", "number", "integer", "boolean", "null", "array", "object")
BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def holds(bounds: Mapping[str, float], lo: float, hi: float) -> bool:
    """Whether every number from ``lo`` to ``hi`` is within ``bounds``."""
    return all({"minimum": lo >= v, "exclusiveMinimum": lo > v, "maximum": hi <= v,
                "exclusiveMaximum": hi < v}[k] for k, v in bounds.items())


def _lit(s: str) -> str:
    return _LARK.encode(s)


def _merge(a: dict[str, Any], b: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``allOf`` of two schemas of the supported keywords, as one."""
    out = dict(a)
    for k, v in b.items():
        if k not in out or k in _ANNOTATIONS:
            out[k] = v
        elif k in ("minimum", "exclusiveMinimum", "minLength", "minItems"):
            out[k] = max(out[k], v)
        elif k in ("maximum", "exclusiveMaximum", "maxLength", "maxItems"):
            out[k] = min(out[k], v)
        elif k == "type":
            have = {out[k]} if isinstance(out[k], str) else set(out[k])
            more = {v} if isinstance(v, str) else set(v)
            both = have & more
            if ("integer" in have and "number" in more) or ("number" in have and "integer" in more):
                both.add("integer")
            out[k] = sorted(both)
        elif k == "allOf":
            out[k] = [*out[k], *v]
        elif out[k] != v:
            raise RequestError(f"allOf with two different {k!r} is not written by the gemma value grammar",
                               location=where)
    return out


class LarkGrammar:
    """Lark rules for llguidance of the values a schema admits, as written."""

    def __init__(self, rule: str, quote: str | None = None) -> None:
        self.rule = rule
        self.quote = quote
        """How the delimiter token is referenced (None: it is text)."""
        self.rules: dict[str, str] = {}
        self.terminals: dict[str, str] = {}
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{self.rule}_{hint}{self.count}"

    def define(self, hint: str, body: str) -> str:
        name = self.fresh(hint)
        self.rules[name] = body
        return name

    def terminal(self, name: str, body: str) -> str:
        name = f"{self.rule}_{name}".upper()
        self.terminals[name] = body
        return name

    def string(self, lo: int = 0, hi: int | None = None) -> str:
        q = self.quote
        if q is not None:
            # The delimiters are tokens, the text between them never spells one.
            if hi == 0:
                return f"({q} {q})"
            inner = self.terminal(f"inner_{max(lo, 1)}_{'' if hi is None else hi}",
                                  f"/(?s:.{{{max(lo, 1)},{'' if hi is None else hi}}})/ & ~/(?s:.*){_Q}(?s:.*)/")
            return f"({q} {inner}{'?' if lo == 0 else ''} {q})"
        span = f"{{{lo},{'' if hi is None else hi}}}" if lo or hi is not None else "*"
        return self.terminal(f"str_{lo}_{'' if hi is None else hi}",
                             f"/{_Q}(?s:.{span}){_Q}/ & {_NOT_INSIDE}")

    def literal(self, text: str) -> str:
        """``text`` as written, its delimiters the token's reference."""
        if self.quote is None or QUOTE not in text:
            return _lit(text)
        parts = text.split(QUOTE)
        out = [_lit(parts[0])] if parts[0] else []
        for part in parts[1:]:
            out.append(self.quote)
            if part:
                out.append(_lit(part))
        return "(" + " ".join(out) + ")"

    def any(self) -> str:
        name = f"{self.rule}_any"
        if name not in self.rules:
            key = self.terminal("key", "/[^:,{}\\[\\]<]+/")
            self.rules[name] = " | ".join([
                self.string(), self.terminal("number", _FREE_NUMBER), '"true"', '"false"', '"None"',
                f'"[" ({name} ("," {name})*)? "]"', f'"{{" ({key} ":" {name} ("," {key} ":" {name})*)? "}}"'])
        return name

    def value(self, s: Any, where: str) -> str | None:
        """An expression of the values ``s`` admits; None when there is none."""
        if s is True or s is None:
            return self.any()
        if s is False:
            return None
        if not isinstance(s, Mapping):
            raise RequestError(f"a schema is an object or a boolean, not {shown(s)}", location=where)
        for k in s:
            if k not in _KEYWORDS and k not in _ANNOTATIONS:
                raise RequestError(f"the gemma value grammar does not write the keyword {k!r}", location=where)
        merged = dict(s)
        while "allOf" in merged:
            parts = merged.pop("allOf")
            if not isinstance(parts, list):
                raise RequestError("allOf is a list of schemas", location=where)
            for j, part in enumerate(parts):
                if part is False:
                    return None
                if isinstance(part, Mapping):
                    for k in part:
                        if k not in _KEYWORDS and k not in _ANNOTATIONS:
                            raise RequestError(f"the gemma value grammar does not write the keyword {k!r}",
                                               location=f"{where}.allOf[{j}]")
                    merged = _merge(merged, part, f"{where}.allOf[{j}]")
        s = merged
        if "anyOf" in s:
            if any(k not in _ANNOTATIONS for k in s if k != "anyOf"):
                raise RequestError("anyOf beside other keywords is not written by the gemma value grammar",
                                   location=where)
            found = [x for j, b in enumerate(s["anyOf"]) if (x := self.value(b, f"{where}.anyOf[{j}]"))]
            return "(" + " | ".join(found) + ")" if found else None
        if "enum" in s or "const" in s:
            values = list(s["enum"]) if "enum" in s else [s["const"]]
            if "const" in s:
                values = [v for v in values if _same(v, s["const"])]
            rest = {k: v for k, v in s.items() if k not in ("enum", "const")}
            lits = []
            for v in values:
                if not _admits(rest, v):
                    continue
                try:
                    lits.append(self.literal(argument(v, where, False)))
                except RequestError:
                    continue  # what cannot be written cannot be generated
            return "(" + " | ".join(dict.fromkeys(lits)) + ")" if lits else None
        t = s.get("type")
        types = [t] if isinstance(t, str) else list(t) if isinstance(t, list) else list(_TYPES)
        alts: list[str] = []
        for jt in _TYPES:
            if jt not in types or (jt == "integer" and "number" in types):
                continue
            x = self.typed(jt, s, where)
            if x:
                alts.append(x)
        return "(" + " | ".join(alts) + ")" if alts else None

    def typed(self, jt: str, s: Mapping[str, Any], where: str) -> str | None:
        if jt == "string":
            lo, hi = s.get("minLength", 0), s.get("maxLength")
            if hi is not None and hi < lo:
                return None
            return self.string(lo, hi)
        if jt == "boolean":
            return '("true" | "false")'
        if jt == "null":
            return '"None"'
        if jt in ("integer", "number"):
            return self.number(jt, s, where)
        if jt == "array":
            return self.array(s, where)
        return self.object(s, where)

    def number(self, jt: str, s: Mapping[str, Any], where: str) -> str:
        b = {k: s[k] for k in BOUNDS if k in s}
        for k, v in b.items():
            if type(v) not in (int, float) or not math.isfinite(v):
                raise RequestError(f"{k} is a finite number, not {shown(v)}", location=f"{where}.{k}")
        if not b:
            return self.terminal(jt, _FREE_NUMBER if jt == "number" else _FREE_INTEGER)
        alts = [f"%json {json.dumps({'type': jt, **b}, separators=(',', ':'))}"]
        if jt == "number":
            # llguidance's bounded JSON numbers have no exponent form, which
            # Python writes below 1e-4 and from 1e16 on: such forms are added
            # where every number they spell is within the bounds.
            forms = [form for form, lo, hi in _EXPONENT_FORMS if holds(b, lo, hi)]
            if forms:
                alts.append(self.terminal(f"num{len(self.terminals)}", "/" + "|".join(forms) + "/"))
        return "(" + " | ".join(alts) + ")"

    def array(self, s: Mapping[str, Any], where: str) -> str | None:
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        if hi is not None and hi < lo:
            return None
        items = s.get("items", True)
        item = self.value(items, f"{where}.items")
        if item is None or hi == 0:
            return '"[" "]"' if lo == 0 else None
        name = self.define("item", item)
        count = "*" if hi is None and lo <= 1 else f"{{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}"
        body = name if hi == 1 else f'{name} ("," {name}){count}'
        return '"[" ' + (f"({body})?" if lo == 0 else body) + ' "]"'

    def object(self, s: Mapping[str, Any], where: str) -> str | None:
        props = s.get("properties") or {}
        if not isinstance(props, Mapping):
            raise RequestError("properties is an object of schemas", location=f"{where}.properties")
        required = s.get("required") or []
        declared: dict[str, Any] = dict(props)
        extra = s.get("additionalProperties", True)
        for k in required:
            declared.setdefault(k, extra)
        # Keys in the order the template writes them.
        order: list[tuple[str, str, bool]] = []
        for k, sub in _dictsort(declared):
            try:
                key = self.literal(_key(k, f"{where}.properties") + ":")
            except RequestError:
                if k in required:
                    return None
                continue
            v = self.value(sub, _path(f"{where}.properties", k))
            if v is None:
                if k in required:
                    return None
                continue
            order.append((key, self.define("v", v), k in required))
        pair = None
        xv = self.value(extra, f"{where}.additionalProperties")
        if xv is not None:
            xk = self.other_key(declared)
            pair = self.define("x", f'{xk} ":" {self.define("xv", xv)}')
        memo: dict[tuple[int, bool], str | None] = {}

        def rest(i: int, first: bool) -> str | None:
            """What may follow once the declared keys before ``i`` are
            settled (``first``: nothing written yet); None: nothing."""
            if (i, first) in memo:
                return memo[(i, first)]
            comma = "" if first else '"," '
            if i == len(order):
                if pair is None:
                    memo[(i, first)] = None
                    return None
                body = f"({pair} (\",\" {pair})*)?" if first else f'("," {pair})*'
                memo[(i, first)] = name = self.define("r", body)
                return name
            name = self.fresh("r")
            memo[(i, first)] = name
            alts = []
            optional = False
            if pair is not None:
                alts.append(f"{comma}{pair} {rest(i, False)}")
            key, v, req = order[i]
            after = rest(i + 1, False)
            alts.append(f"{comma}{key} {v}" + (f" {after}" if after else ""))
            if not req:
                skip = rest(i + 1, first)
                if skip is None:
                    optional = True
                else:
                    alts.append(skip)
            body = " | ".join(alts)
            self.rules[name] = f"({body})?" if optional else body
            return name

        inner = rest(0, True)
        return '"{" ' + (f"{inner} " if inner else "") + '"}"'

    def other_key(self, declared: Iterable[str]) -> str:
        """A bare key that is none of ``declared``."""
        ex = "|".join(re.escape(k) for k in declared).replace("/", "\\/")
        body = "/[^:,{}\\[\\]<]+/" + (f" & ~/({ex})/" if ex else "")
        return self.terminal(f"xkey{self.count}", body)

    def text(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.rules.items()]
        lines += [f"{k}: {v}" for k, v in self.terminals.items()]
        return "\n".join(lines) + "\n"


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _admits(s: Mapping[str, Any], v: Any) -> bool:
    """Whether ``v`` satisfies the keywords of ``s`` the grammar writes
    (the check of an enum's or a const's members against the rest)."""
    t = s.get("type")
    if t is not None:
        types = [t] if isinstance(t, str) else list(t)
        if not any(_is(jt, v) for jt in types):
            return False
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or ("maxLength" in s and len(v) > s["maxLength"]):
            return False
    if isinstance(v, int | float) and not isinstance(v, bool):
        checks: dict[str, Callable[[float, float], bool]] = {
            "minimum": lambda x, b: x >= b, "exclusiveMinimum": lambda x, b: x > b,
            "maximum": lambda x, b: x <= b, "exclusiveMaximum": lambda x, b: x < b}
        if any(k in s and not f(v, s[k]) for k, f in checks.items()):
            return False
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or ("maxItems" in s and len(v) > s["maxItems"]):
            return False
    return not any(k in s for k in ("properties", "required", "items", "additionalProperties", "anyOf"))


def _is(jt: str, v: Any) -> bool:
    if jt == "null":
        return v is None
    if jt == "boolean":
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if jt == "integer":
        return isinstance(v, int) or (isinstance(v, float) and v.is_integer())
    if jt == "number":
        return isinstance(v, int | float)
    return isinstance(v, {"string": str, "array": list, "object": Mapping}[jt])


