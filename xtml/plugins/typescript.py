"""harmony's TypeScript namespace of tool schemas, as gpt-oss's chat
template writes it in the developer message (its ``render_tool_namespace``
and ``render_typescript_type`` macros, under the Jinja settings chat
templates run with: blocks trimmed, ``tojson`` with Python's default
separators).

The namespace is prompt text only: a model answers with JSON arguments, so
this syntax declares tools, reads a declaration back (``declared``) and
writes its declarations as Jinja macros for the Jinja export (``jinja``,
:mod:`.typescript_jinja`).

What the template does, mirrored as it is: only top-level parameters carry
their descriptions and defaults as ``//`` comments; a nested object is
``{\\n`` then each property on a new line indented by sixteen spaces, with no
comment; an enum is a union of its members only where the type is
``string``; a ``oneOf`` variant's default comes after twenty spaces, and
variants are joined by `` | `` and a newline; properties keep the schema's
order. Where the template raises (a description, a name or, beside an
``enum`` or a ``oneOf``, a default that is not a string; a tool without a
description), :meth:`TypeScriptNamespace.declare` raises a located error.

Read back (:meth:`TypeScriptNamespace.declared`): the namespace does not
write everything a schema says (``integer`` is ``number``, a nested
property has no description, a list of types is a union), so a
declaration reads back as the tools it spells: each type as
the plainest schema written so (``string``, ``number``, ``boolean``,
``object``, a string ``enum``, ``nullable``, ``array`` with its ``items``,
an ``object`` with ``properties`` and ``required``, a ``oneOf`` of
variants, a list of types), top-level descriptions and defaults from their
comments. Text it does not spell raises a :class:`~xtml.errors.ParseError`
at its character offset.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ParseError, RequestError, shown
from .api import ValueSyntax

__all__ = ["TypeScriptNamespace", "read_namespace", "syntax"]

NAMESPACE = "functions"
_PROPERTY_INDENT = " " * 16
_DEFAULT_INDENT = " " * 20
_MISSING = object()


def _get(obj: Any, key: str) -> Any:
    """``obj.key`` as the template's Jinja reads it from JSON shapes: a
    missing key, or a key of anything but an object, is undefined
    (``_MISSING`` here, apart from a JSON null)."""
    if isinstance(obj, Mapping):
        return obj.get(key, _MISSING)
    return _MISSING


def _truthy(x: Any) -> bool:
    return x is not _MISSING and bool(x)


def _cat(x: Any, where: str) -> str:
    """A value the template adds to text with ``+``: a string, or the
    template raises."""
    if x is _MISSING:
        raise RequestError("missing: the template adds it to text (it raises without it)", location=where)
    if not isinstance(x, str):
        raise RequestError(f"{shown(x)} is not a string: the template adds it to text (it raises)", location=where)
    return x


def _required(name: Any, required: Any, where: str) -> bool:
    """``name in (required or [])`` as Jinja (that is, Python) tests it."""
    if not _truthy(required):
        return False
    try:
        return bool(name in required)
    except TypeError:
        raise RequestError(f"required is {shown(required)}: the template tests names' membership in it",
                           location=where) from None


def _iterate(x: Any, where: str) -> list[Any]:
    if isinstance(x, Mapping | str | list | tuple):
        return list(x)
    raise RequestError(f"{shown(x)} is not a list (the template iterates it)", location=where)


def _tojson(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


def _properties(props: Any, where: str) -> list[tuple[Any, Any]]:
    if not isinstance(props, Mapping):
        raise RequestError(f"properties are an object, not {shown(props)}", location=where)
    return list(props.items())


def _type(spec: Any, where: str) -> str:
    """The template's ``render_typescript_type``."""
    t = _get(spec, "type")
    if t == "array":
        items = _get(spec, "items")
        if _truthy(items):
            it = _get(items, "type")
            if it == "string":
                out = "string[]"
            elif it in ("number", "integer"):
                out = "number[]"
            elif it == "boolean":
                out = "boolean[]"
            else:
                inner = _type(items, f"{where}.items")
                out = "any[]" if inner == "object | object" or len(inner) > 50 else inner + "[]"
        else:
            out = "any[]"
        return out + (" | null" if _truthy(_get(spec, "nullable")) else "")
    if isinstance(t, list | tuple) and t:
        return " | ".join(str(x) for x in t) if len(t) > 1 else str(t[0])
    variants = _get(spec, "oneOf")
    if _truthy(variants):
        # The template's test for object variants sets a variable inside its
        # loop, which Jinja scopes to the loop: every variant is written.
        parts = []
        seq = _iterate(variants, f"{where}.oneOf")
        for j, v in enumerate(seq):
            at = f"{where}.oneOf[{j}]"
            part = _type(v, at)
            if _truthy(_get(v, "description")):
                part += "// " + _cat(v["description"], f"{at}.description")
            if isinstance(v, Mapping) and "default" in v:
                part += _DEFAULT_INDENT + "// default: " + _tojson(v["default"])
            parts.append(part)
        return " | \n".join(parts)
    if t == "string":
        enum = _get(spec, "enum")
        if _truthy(enum):
            return '"' + '" | "'.join(str(x) for x in _iterate(enum, f"{where}.enum")) + '"'
        return "string" + (" | null" if _truthy(_get(spec, "nullable")) else "")
    if t in ("number", "integer"):
        return "number"
    if t == "boolean":
        return "boolean"
    if t == "object":
        props = _get(spec, "properties")
        if not _truthy(props):
            return "object"
        required = _get(spec, "required")
        members = []
        for name, sub in _properties(props, f"{where}.properties"):
            at = f"{where}.properties.{name}"
            opt = "" if _required(name, required, f"{where}.required") else "?"
            members.append(f"{name}{opt}: \n{_PROPERTY_INDENT}{_type(sub, at)}")
        return "{\n" + ", ".join(members) + "}"
    return "any"


def _tool(tool: Any, where: str) -> str:
    fn = _get(tool, "function")
    if not isinstance(fn, Mapping):
        raise RequestError("a tool is {\"type\": \"function\", \"function\": {...}}", location=where)
    where += ".function"
    out = ["// " + _cat(_get(fn, "description"), f"{where}.description") + "\n",
           "type " + _cat(_get(fn, "name"), f"{where}.name") + " = "]
    params = _get(fn, "parameters")
    if not (_truthy(params) and _truthy(_get(params, "properties"))):
        out.append("() => any;\n\n")
        return "".join(out)
    at = f"{where}.parameters"
    required = _get(params, "required")
    out.append("(_: {\n")
    for name, spec in _properties(params["properties"], f"{at}.properties"):
        p = f"{at}.properties.{name}"
        if _truthy(_get(spec, "description")):
            out.append("// " + _cat(spec["description"], f"{p}.description") + "\n")
        opt = "" if _required(name, required, f"{at}.required") else "?"
        out.append(f"{name}{opt}: {_type(spec, p)}")
        if isinstance(spec, Mapping) and "default" in spec:
            if _truthy(spec.get("enum", _MISSING)):
                out.append(", // default: " + _cat(spec["default"], f"{p}.default"))
            elif _truthy(spec.get("oneOf", _MISSING)):
                out.append("// default: " + _cat(spec["default"], f"{p}.default"))
            else:
                out.append(", // default: " + _tojson(spec["default"]))
        out.append(",\n")
    out.append("}) => any;\n\n")
    return "".join(out)


# The reading of a namespace: the plainest schema each spelling writes.

_HEAD = f"## {NAMESPACE}\n\nnamespace {NAMESPACE} {{\n\n"
_TAIL = f"}} // namespace {NAMESPACE}"
_TOOL = re.compile(r"// (?P<desc>.*?)\ntype (?P<name>[^\n]*?) = ", re.S)
_PROP = re.compile(r"(?:// (?P<desc>[^\n]*)\n)?(?P<name>[^\n:]*?)(?P<opt>\??): ")
_WORDS = {"string": "string", "number": "number", "boolean": "boolean", "object": "object", "null": "null"}


def read_namespace(text: str) -> list[dict[str, Any]]:
    """The tools a namespace declares, each ``{"type": "function",
    "function": {"name", "description"[, "parameters"]}}``."""
    if not text.startswith(_HEAD) or not text.endswith(_TAIL):
        raise ParseError("not a namespace of functions", offset=0)
    pos, end = len(_HEAD), len(text) - len(_TAIL)
    tools: list[dict[str, Any]] = []
    while pos < end:
        m = _TOOL.match(text, pos)
        if m is None:
            raise ParseError("expected a tool's description and type", offset=pos)
        fn: dict[str, Any] = {"name": m.group("name"), "description": m.group("desc")}
        pos = m.end()
        if text.startswith("() => any;\n\n", pos):
            pos += len("() => any;\n\n")
        elif text.startswith("(_: {\n", pos):
            fn["parameters"], pos = _read_parameters(text, pos + len("(_: {\n"))
        else:
            raise ParseError("expected a tool's parameters", offset=pos)
        tools.append({"type": "function", "function": fn})
    return tools


def _read_parameters(text: str, pos: int) -> tuple[dict[str, Any], int]:
    props: dict[str, Any] = {}
    required: list[str] = []
    close = "}) => any;\n\n"
    while not text.startswith(close, pos):
        m = _PROP.match(text, pos)
        if m is None or not m.group("name"):
            raise ParseError("expected a parameter", offset=pos)
        spec, pos = _read_type(text, m.end())
        if m.group("desc") is not None:
            spec = {**spec, "description": m.group("desc")}
        if text.startswith(", // default: ", pos) or text.startswith("// default: ", pos):
            pos = text.index("// default: ", pos) + len("// default: ")
            nl = text.find(",\n", pos)
            if nl < 0:
                raise ParseError("a default that does not end", offset=pos)
            raw = text[pos:nl]
            if "enum" in spec or "oneOf" in spec:
                spec["default"] = raw
            else:
                try:
                    spec["default"] = json.loads(raw)
                except ValueError:
                    raise ParseError("a default that is not JSON", offset=pos) from None
            pos = nl
        if not text.startswith(",\n", pos):
            raise ParseError("expected the end of a parameter", offset=pos)
        pos += 2
        props[m.group("name")] = spec
        if not m.group("opt"):
            required.append(m.group("name"))
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out, pos + len(close)


def _read_type(text: str, pos: int) -> tuple[dict[str, Any], int]:
    """A type at ``pos``: the schema it spells and where it ends."""
    first, pos = _read_one(text, pos)
    if text.startswith(" | \n", pos):
        variants = [first]
        while text.startswith(" | \n", pos):
            v, pos = _read_one(text, pos + 4)
            variants.append(v)
        return {"oneOf": variants}, pos
    if text.startswith(" | ", pos) and "type" in first and not first.get("enum"):
        types = [first["type"]]
        while text.startswith(" | ", pos):
            m = re.compile(r"[a-z]+").match(text, pos + 3)
            if m is None:
                raise ParseError("expected a type", offset=pos + 3)
            types.append(m.group())
            pos = m.end()
        if len(types) == 2 and types[1] == "null" and types[0] in ("string", "array"):
            return {**first, "nullable": True}, pos
        return {"type": types}, pos
    return first, pos


def _read_one(text: str, pos: int) -> tuple[dict[str, Any], int]:
    if text.startswith('"', pos):
        members: list[str] = []
        while True:
            q = text.find('"', pos + 1)
            if q < 0:
                raise ParseError("an enum member that does not end", offset=pos)
            members.append(text[pos + 1:q])
            pos = q + 1
            if not text.startswith(' | "', pos):
                return {"type": "string", "enum": members}, pos
            pos += 3
    if text.startswith("{\n", pos):
        pos += 2
        props: dict[str, Any] = {}
        required: list[str] = []
        while not text.startswith("}", pos):
            m = re.compile(r"(?P<name>[^\n:]*?)(?P<opt>\??): \n" + _PROPERTY_INDENT).match(text, pos)
            if m is None:
                raise ParseError("expected a property", offset=pos)
            spec, pos = _read_type(text, m.end())
            props[m.group("name")] = spec
            if not m.group("opt"):
                required.append(m.group("name"))
            if text.startswith(", ", pos) and not text.startswith(", //", pos):
                pos += 2
            elif not text.startswith("}", pos):
                raise ParseError("expected the end of a property", offset=pos)
        out: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            out["required"] = required
        return _read_array(text, pos + 1, out)
    m = re.compile(r"[a-z]+").match(text, pos)
    if m is None:
        raise ParseError("expected a type", offset=pos)
    word = m.group()
    if word == "any":
        return _read_array(text, m.end(), {})
    if word not in _WORDS:
        raise ParseError(f"{word!r} is not a type the namespace writes", offset=pos)
    return _read_array(text, m.end(), {"type": _WORDS[word]})


def _read_array(text: str, pos: int, spec: dict[str, Any]) -> tuple[dict[str, Any], int]:
    while text.startswith("[]", pos):
        spec = {"type": "array", "items": spec} if spec else {"type": "array"}
        pos += 2
    return spec, pos


class TypeScriptNamespace(ValueSyntax):
    """Tools as harmony's ``namespace functions { ... }`` (declarations
    only)."""

    name = "typescript"
    operations = frozenset({"declare", "declared", "jinja"})

    def declare(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """``## functions`` and the namespace, as the developer message
        holds them after its ``# Tools`` heading."""
        if not isinstance(tools, list | tuple):
            raise RequestError(f"tools are a list, not {shown(tools)}", location="tools")
        body = "".join(_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
        return f"## {NAMESPACE}\n\nnamespace {NAMESPACE} {{\n\n{body}}} // namespace {NAMESPACE}"

    def declared(self, text: str) -> list[dict[str, Any]]:
        """The tools a namespace :meth:`declare` wrote reads back as, each
        call its own."""
        if len(text) > _KEPT_TEXT:
            return read_namespace(text)
        return json.loads(_declared_json(text))  # type: ignore[no-any-return]

    def jinja_macros(self, prefix: str) -> str:
        """:meth:`declare` as Jinja macros (:mod:`.typescript_jinja`)."""
        from .typescript_jinja import macros

        return macros(prefix)


@functools.lru_cache(maxsize=32)
def _declared_json(text: str) -> str:
    """A namespace's reading, kept by its text as JSON (which each reading
    loads afresh): render reads back the declaration it writes, and a
    client sends the same tools with every request."""
    return json.dumps(read_namespace(text))


_KEPT_TEXT = 65_536
"""The longest namespace kept: the few tool sets clients send, not one
request's of any size."""


syntax = TypeScriptNamespace()
