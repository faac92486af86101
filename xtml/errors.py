"""The one error family of xtml.

Every error xtml raises is an :class:`XtmlError` whose message names where
the problem is: a message index, an element path, a token offset or a line
and column. Nothing else is meant to escape the public API. The family has
two branches, by whose fault it is:

* :class:`CallerError`, the caller's: a request, markup, ids, a template or
  a tokenizer that is not what it should be (:class:`RequestError`,
  :class:`ParseError`, :class:`MarkupError`, :class:`TemplateError`,
  :class:`TokenizerError` ...). These are ``ValueError`` too, the standard
  error for a bad value: fixing the input fixes the call.
* :class:`PeerError`, a peer's: a program xtml talks to on the caller's
  behalf (the engine behind ``xtml serve``) failed, timed out or answered
  what it should not. Nothing in the input is wrong, so it is no
  ``ValueError``; a server answers it with a 5xx, not a 400.

Arrays and objects nest at most :data:`MAX_DEPTH` deep in a request; past
that, :func:`too_deep` is the one error, wherever the request is read.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "MAX_DEPTH",
    "CallerError",
    "MarkupError",
    "MessageError",
    "OptionError",
    "ParseError",
    "PeerError",
    "RequestError",
    "TemplateError",
    "TokenizerError",
    "XtmlError",
    "too_deep",
]


class XtmlError(Exception):
    """Base class of every error xtml raises: ``msg`` says what is wrong,
    ``location`` (when there is one) where. Catch :class:`CallerError` for
    bad input only, :class:`PeerError` for a peer's failure only."""

    def __init__(self, msg: str, *, location: str | None = None) -> None:
        self.msg = msg
        self.location = location
        super().__init__(f"{msg} (at {location})" if location else msg)


class CallerError(XtmlError, ValueError):
    """The caller's input is wrong (the branch of every bad-input error).

    Subclasses ``ValueError`` so that code catching the standard error for bad
    values keeps working.
    """


class PeerError(XtmlError):
    """A peer xtml talks to for the caller (an engine) failed: a timeout, a
    refused connection, an answer that is not in its format. Not a
    ``ValueError``: the caller's input is not at fault."""


class RequestError(CallerError):
    """The request as a whole is malformed (wrong type, missing ``messages``)."""


class OptionError(RequestError):
    """A render option has a value the template does not support."""

    def __init__(self, msg: str, *, option: str) -> None:
        self.option = option
        super().__init__(msg, location=f"option {option!r}")


class MessageError(RequestError):
    """A message (or a part of one) cannot be rendered.

    ``index`` is the position of the message in the request's ``messages`` and
    ``path`` the field inside it, e.g. ``tool_calls[0].function.arguments``.
    """

    def __init__(self, msg: str, *, index: int, path: str = "") -> None:
        self.index = index
        self.path = path
        where = f"messages[{index}]" + (f".{path}" if path else "")
        super().__init__(msg, location=where)


MAX_DEPTH = 64
"""How deep arrays and objects may nest in a request: ``{"a": [1]}`` is two
deep, a chat request five before its tools' schemas start
(``tools[0].function.parameters``), which leaves a schema some 25 nested
objects. Deeper requests are refused where they are read (the gateway's
body, :func:`xtml.chat.request.prepare`), before any step that recurses per
level (a copy, JSON writing, a grammar writer, the Responses store's JSON
writer, which stops at 255) can reach Python's recursion limit."""


def too_deep(path: Sequence[str | int]) -> RequestError:
    """The one error for a request nested past :data:`MAX_DEPTH`; ``path``
    leads from the request to the value that goes too deep. A message is
    named as every message error names it (``messages[2].content``), any
    other field by its name."""
    msg = f"nested too deeply: more than {MAX_DEPTH} levels of arrays and objects"
    index, rest = None, path
    if len(path) > 1 and path[0] == "messages" and type(path[1]) is int:
        index, rest = path[1], path[2:]
    elif path and type(path[0]) is int:  # a bare list of messages
        index, rest = path[0], path[1:]
    if index is not None:
        return MessageError(msg, index=index, path=rest[0] if rest and type(rest[0]) is str else "")
    return RequestError(msg, location=str(path[0]) if path else None)


class MarkupError(CallerError):
    """A markup tree breaks a rule of the language (a bad tag name, say).

    ``path`` names the element, e.g. ``message[3]/tools/call[1]``.
    """

    def __init__(self, msg: str, *, path: str = "") -> None:
        self.path = path
        super().__init__(msg, location=path or None)


class ParseError(CallerError):
    """Token ids or text that are not well-formed XTML, or not of the dialect.

    For ids, ``offset`` is the index of the offending token; for text,
    ``line`` and ``column`` (1-based) locate it and ``offset`` is the character
    index. Given the text as ``source``, the error finds its line and column
    itself.
    """

    def __init__(
        self,
        msg: str,
        *,
        offset: int,
        line: int | None = None,
        column: int | None = None,
        path: str = "",
        source: str | None = None,
    ) -> None:
        if source is not None:
            line, column = line_column(source, offset)
        self.offset = offset
        self.line = line
        self.column = column
        self.path = path
        if line is not None:
            where = f"line {line}, column {column}"
        else:
            where = f"token {offset}"
        if path:
            where += f", in {path}"
        super().__init__(msg, location=where)

    def moved(self, shift: int, source: str | None = None) -> ParseError:
        """The same error counted from ``shift`` on: a parser that read a
        prefix (the generation prompt) before the caller's input reports where
        the caller's input went wrong; ``source``, the whole text read, gives
        the line and column within the caller's part."""
        off = max(0, self.offset - shift)
        if source is not None:
            return ParseError(self.msg, offset=off, source=source[shift:], path=self.path)
        if not shift:
            return self
        return ParseError(self.msg, offset=off, path=self.path)


def line_column(source: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of character ``offset`` in ``source``."""
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


class TokenizerError(CallerError):
    """A tokenizer cannot be loaded or does not fit the template's markers."""


class TemplateError(CallerError):
    """A template (dialect) file is invalid."""


class ExportError(CallerError):
    """An export cannot be written where it was asked to go."""


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` for a message, bounded: a bad input can be an integer
    with more digits than ``repr`` converts (it raises) or a string of
    megabytes, and the message must still be one short line. A long string
    or bytes value is cut before it is quoted (its repr would cost as much as
    the value); anything else is cut after."""
    if type(value) is int:
        if value.bit_length() > 128:
            return f"an integer of {value.bit_length():,} bits"
        return repr(value)
    if isinstance(value, str | bytes) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}… ({len(value):,} {unit})"
    try:
        text = repr(value)
    except ValueError:  # an int subclass, or a container holding a huge int
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"
