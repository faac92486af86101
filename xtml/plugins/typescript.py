"""harmony's TypeScript namespace of tool schemas, as gpt-oss's chat
template writes it in the developer message (its ``render_tool_namespace``
and ``render_typescript_type`` macros, under the Jinja settings chat
templates run with: blocks trimmed, ``tojson`` with Python's default
separators).

The namespace is prompt text only: a model answers with JSON arguments, so
this syntax has one operation, ``declare``.

What the template does, mirrored as it is: only top-level parameters carry
their descriptions and defaults as ``//`` comments; a nested object is
``{\\n`` then each property on a new line indented by sixteen spaces, with no
comment; an enum is a union of its members only where the type is
``string``; a ``oneOf`` variant's default comes after twenty spaces, and
variants are joined by `` | `` and a newline; properties keep the schema's
order. Where the template raises (a description, a name or, beside an
``enum`` or a ``oneOf``, a default that is not a string; a tool without a
description), :meth:`TypeScriptNamespace.declare` raises a located error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import RequestError, shown
from .api import ValueSyntax

__all__ = ["TypeScriptNamespace", "syntax"]

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


class TypeScriptNamespace(ValueSyntax):
    """Tools as harmony's ``namespace functions { ... }`` (declarations
    only)."""

    name = "typescript"
    operations = frozenset({"declare"})

    def declare(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """``## functions`` and the namespace, as the developer message
        holds them after its ``# Tools`` heading."""
        if not isinstance(tools, list | tuple):
            raise RequestError(f"tools are a list, not {shown(tools)}", location="tools")
        body = "".join(_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
        return f"## {NAMESPACE}\n\nnamespace {NAMESPACE} {{\n\n{body}}} // namespace {NAMESPACE}"


syntax = TypeScriptNamespace()
