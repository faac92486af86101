"""Gemma 4's key:value syntax, as its chat template writes it.

Tool declarations are ``declaration:NAME{description:<|"|>…<|"|>,
parameters:{…}}`` (the template's ``format_function_declaration`` and
``format_parameters`` macros) and call arguments ``{key:VALUE,…}`` (its
``format_argument`` with bare keys): keys bare and sorted as Jinja's
``dictsort`` sorts them (case-insensitively, ties in the given order),
strings between two ``<|"|>``, booleans ``true``/``false`` and everything
else (numbers, ``None``) as Python's ``str()`` writes it. The format has no
escape: a string holding ``<|"|>``, or a key holding a character that ends
a key, cannot be written so that it reads back, and is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import RequestError, shown
from .api import ValueReader, ValueSyntax
from .gemma_ebnf import EbnfGrammar
from .gemma_read import QUOTE, Parser, Reader
from .gemma_write import LarkGrammar, argument, declaration


class GemmaValues(ValueSyntax):
    """Gemma 4's key:value syntax (every operation)."""

    name = "gemma"
    operations = frozenset({"declare", "write", "read", "grammar", "reader", "jinja"})
    quote = QUOTE

    def declare(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """Each tool as ``<|tool>declaration:…<tool|>``, as the template
        writes them one after another in its system turn."""
        if not isinstance(tools, list | tuple):
            raise RequestError(f"tools are a list, not {shown(tools)}", location="tools")
        return "".join(f"<|tool>{declaration(t, f'tools[{i}]')}<tool|>" for i, t in enumerate(tools))

    def write(self, arguments: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> str:
        if not isinstance(arguments, Mapping):
            raise RequestError(f"arguments are an object, not {shown(arguments)}", location="arguments")
        return argument(arguments, "arguments", False)

    def read(self, text: str, schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if not isinstance(text, str):
            raise RequestError(f"arguments text is a string, not {shown(text)}", location="arguments")
        return Parser(text).arguments(schema)

    def jinja_macros(self, prefix: str) -> str:
        from .gemma_jinja import macros

        return macros(prefix)

    def reader(self, schema: Mapping[str, Any] | None = None) -> ValueReader:
        return Reader(schema)

    def grammar(self, schema: Mapping[str, Any], syntax: str = "llguidance", rule: str = "arguments",
                tokens: Mapping[str, str] | None = None) -> str:
        if syntax in ("gbnf", "xgrammar"):
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", rule):
                raise RequestError(f"{shown(rule)} is not a {syntax} rule name (letters, digits, -)",
                                   location="grammar(rule=...)")
            return _written(EbnfGrammar(syntax, rule, (tokens or {}).get(QUOTE), tokens or ()), schema, rule)
        if syntax != "llguidance":
            raise self.no_grammar(syntax, ("llguidance", "gbnf", "xgrammar"))
        if not re.fullmatch(r"[a-z][a-z0-9_]*", rule):
            raise RequestError(f"{shown(rule)} is not a Lark rule name (lowercase letters, digits, _)",
                               location="grammar(rule=...)")
        return _written(LarkGrammar(rule, (tokens or {}).get(QUOTE)), schema, rule)


def _written(g: LarkGrammar, schema: Mapping[str, Any], rule: str) -> str:
    """The rules ``g`` writes of arguments of ``schema``, rule ``rule`` first."""
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        raise RequestError("arguments' schema is an object schema", location="parameters")
    body = g.object(schema, "parameters")
    if body is None:
        raise RequestError("no arguments satisfy the schema", location="parameters")
    g.rules = {rule: body, **g.rules}
    return g.text()


syntax = GemmaValues()
