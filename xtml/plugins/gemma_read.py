"""Reading Gemma 4's call arguments (``{key:VALUE,...}``), whole or as a
stream: strict, every error a :class:`~xtml.errors.ParseError` at the
character it is found at, the schema deciding only what a bare word is
(the word itself where the schema admits only strings)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import MAX_DEPTH, ParseError, RequestError, shown

__all__ = ["KEY_ENDS", "QUOTE", "Parser", "Reader"]

QUOTE = '<|"|>'
"""What opens and closes a string (one special token in Gemma's vocabulary)."""

# Characters that end a bare key in the text.
KEY_ENDS = frozenset(":,{}[]")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
# A bare run: what stands between two of the characters that end a value.
_BARE = re.compile(r"[^,:{}\[\]]*")
# Where the scanner of a stream stops outside strings.
_STRUCTURE = re.compile(r'[,{}\[\]]|<\|"\|>')


def _string_only(schema: Any) -> bool:
    """Whether every value ``schema`` admits is a string (then a bare word
    in its place is that string)."""
    if not isinstance(schema, Mapping):
        return False
    t = schema.get("type")
    if t == "string" or (isinstance(t, list) and t and all(x == "string" for x in t)):
        return True
    if "const" in schema and isinstance(schema["const"], str):
        return True
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(x, str) for x in enum):
        return True
    if any(_string_only(s) for s in schema.get("allOf") or () if isinstance(schema.get("allOf"), list)):
        return True
    for k in ("anyOf", "oneOf"):
        alts = schema.get(k)
        if isinstance(alts, list) and alts and all(_string_only(s) for s in alts):
            return True
    return False


def _member(schema: Any, key: str) -> Any:
    """The schema of property ``key`` of an object ``schema`` describes."""
    if not isinstance(schema, Mapping):
        return None
    props = schema.get("properties")
    if isinstance(props, Mapping) and key in props:
        return props[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def _item(schema: Any) -> Any:
    items = schema.get("items") if isinstance(schema, Mapping) else None
    return items if isinstance(items, Mapping) else None


class Parser:
    """Reads arguments text: strict, every error a :class:`ParseError` at
    the character it is found at."""

    __slots__ = ("depth", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.depth = 0

    def fail(self, msg: str, at: int) -> ParseError:
        return ParseError(msg, offset=at, source=self.text)

    def expect(self, i: int, what: str) -> str:
        if i >= len(self.text):
            raise self.fail(f"the arguments end where {what} should come", i)
        return self.text[i]

    def key(self, i: int) -> tuple[str, int]:
        j = i
        text = self.text
        while j < len(text) and text[j] not in KEY_ENDS:
            j += 1
        k = text[i:j]
        q = k.find(QUOTE)
        if q >= 0:
            raise self.fail(f"a key cannot hold {QUOTE}: keys are bare", i + q)
        if self.expect(j, "':' after a key") != ":":
            raise self.fail(f"expected ':' after the key {shown(k)}, not {text[j]!r}", j)
        return k, j + 1

    def pair(self, i: int, schema: Any) -> tuple[str, Any, int]:
        k, j = self.key(i)
        v, j = self.value(j, _member(schema, k))
        return k, v, j

    def object(self, i: int, schema: Any) -> tuple[dict[str, Any], int]:
        """The object whose '{' is at ``i``."""
        out: dict[str, Any] = {}
        j = i + 1
        if self.expect(j, "a key or '}'") == "}":
            return out, j + 1
        while True:
            k, v, j = self.pair(j, schema)
            out[k] = v
            c = self.expect(j, "',' or '}'")
            if c == "}":
                return out, j + 1
            if c != ",":
                raise self.fail(f"expected ',' or '}}' after a value, not {c!r}", j)
            j += 1

    def list(self, i: int, schema: Any) -> tuple[list[Any], int]:
        out: list[Any] = []
        j = i + 1
        item = _item(schema)
        if self.expect(j, "a value or ']'") == "]":
            return out, j + 1
        while True:
            v, j = self.value(j, item)
            out.append(v)
            c = self.expect(j, "',' or ']'")
            if c == "]":
                return out, j + 1
            if c != ",":
                raise self.fail(f"expected ',' or ']' after a list item, not {c!r}", j)
            j += 1

    def value(self, i: int, schema: Any) -> tuple[Any, int]:
        text = self.text
        c = self.expect(i, "a value")
        if text.startswith(QUOTE, i):
            end = text.find(QUOTE, i + len(QUOTE))
            if end < 0:
                raise self.fail(f"a string that is never closed (no {QUOTE} after it)", i)
            return text[i + len(QUOTE):end], end + len(QUOTE)
        if c in "{[":
            # Bounded as a request's JSON is: past it, a located error,
            # never Python's recursion limit.
            if self.depth >= MAX_DEPTH:
                raise self.fail(f"values nested more than {MAX_DEPTH} levels deep", i)
            self.depth += 1
            try:
                return self.object(i, schema) if c == "{" else self.list(i, schema)
            finally:
                self.depth -= 1
        m = _BARE.match(text, i)
        assert m is not None
        word = m.group()
        q = word.find(QUOTE)
        if q >= 0:
            word = word[:q]
        end = i + len(word)
        if not word:
            raise self.fail(f"expected a value, not {c!r}", i)
        if _string_only(schema):
            # A bare word where the schema admits only strings is that word.
            return word, end
        if word in ("true", "false"):
            return word == "true", end
        if word == "None":
            return None, end
        num = _NUMBER.fullmatch(word)
        if num is None:
            raise self.fail(f"{shown(word)} is not a value: a string is written between two {QUOTE}", i)
        if num.group(1) is None and num.group(2) is None:
            try:
                return int(word), end
            except ValueError:
                raise self.fail(f"the integer {shown(word)} has too many digits", i) from None
        f = float(word)
        if not math.isfinite(f):
            raise self.fail(f"the number {shown(word)} is beyond a float's range", i)
        return f, end

    def arguments(self, schema: Any) -> dict[str, Any]:
        if not self.text.startswith("{"):
            raise self.fail("arguments start with '{'", 0) if self.text else \
                self.fail("the arguments end where '{' should come", 0)
        out, j = self.object(0, schema)
        if j != len(self.text):
            raise self.fail(f"text after the arguments' closing '}}': {shown(self.text[j:])}", j)
        return out


class Reader:
    """The stream reader: a scanner finds where each top-level pair ends
    (each character looked at once), then the parser reads that pair."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.text = ""
        self.start = 1  # where the pair being read starts
        self.scan = 1  # how far the scanner has looked
        self.depth = 0
        self.in_string = False
        self.done = False
        self.first = True

    def feed(self, chunk: str) -> list[tuple[str, Any]]:
        if not isinstance(chunk, str):
            raise RequestError(f"a chunk is text, not {shown(chunk)}", location="reader.feed")
        self.text += chunk
        return self._pairs(final=False)

    def close(self) -> list[tuple[str, Any]]:
        out = self._pairs(final=True)
        p = Parser(self.text)
        if not self.done:
            if not self.text.startswith("{"):
                p.arguments(self.schema)  # raises where the text goes wrong
            # The rest holds no whole pair: reading it raises where it goes wrong.
            if self.first:
                p.object(self.start - 1, self.schema)
            else:
                j = p.pair(self.start, self.schema)[2]
                c = p.expect(j, "',' or '}'")
                raise p.fail(f"expected ',' or '}}' after a value, not {c!r}", j)
            raise p.fail("the arguments end where ',' or '}' should come", len(self.text))
        return out

    def _pairs(self, final: bool) -> list[tuple[str, Any]]:
        text = self.text
        out: list[tuple[str, Any]] = []
        if not text:
            return out
        p = Parser(text)
        if text[0] != "{":
            p.arguments(self.schema)
        if self.done:
            if len(text) > self.scan:
                raise p.fail(f"text after the arguments' closing '}}': {shown(text[self.scan:])}", self.scan)
            return out
        i = self.scan
        n = len(text)
        while i < n:
            if self.in_string:
                end = text.find(QUOTE, i)
                if end < 0:
                    # Keep a partial delimiter at the end for the next chunk.
                    i = max(i, n - len(QUOTE) + 1)
                    break
                self.in_string = False
                i = end + len(QUOTE)
                continue
            m = _STRUCTURE.search(text, i)
            if m is None:
                i = n
                # A '<' near the end may start a delimiter: look at it again.
                back = text.rfind("<", max(0, n - len(QUOTE) + 1))
                if back >= 0 and QUOTE.startswith(text[back:]) and not final:
                    i = back
                break
            c = m.group()
            i = m.end()
            if c == QUOTE:
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif self.depth > 0 and c in "}]":
                self.depth -= 1
            elif self.depth == 0:
                at = m.start()
                if self.first and c == "}" and at == self.start:
                    self.done = True
                else:
                    k, v, j = p.pair(self.start, self.schema)
                    if j != at:
                        p.expect(j, "',' or '}'")
                        raise p.fail(f"expected ',' or '}}' after a value, not {text[j]!r}", j)
                    if c == "]":
                        raise p.fail("expected ',' or '}' after a value, not ']'", at)
                    out.append((k, v))
                    self.done = c == "}"
                self.first = False
                self.start = i
                if self.done:
                    if i < n:
                        raise p.fail(f"text after the arguments' closing '}}': {shown(text[i:])}", i)
                    break
        self.scan = i
        return out
