"""The one error family of xtml.

Every bad input ends in a subclass of :class:`XtmlError` whose message names
where the problem is: a message index, an element path, a token offset or a
line and column. Nothing else is meant to escape the public API.
"""

from __future__ import annotations

__all__ = [
    "MarkupError",
    "MessageError",
    "OptionError",
    "ParseError",
    "RequestError",
    "TemplateError",
    "TokenizerError",
    "XtmlError",
]


class XtmlError(ValueError):
    """Base class of every error xtml raises on bad input.

    Subclasses ``ValueError`` so that code catching the standard error for bad
    values keeps working.
    """

    def __init__(self, msg: str, *, location: str | None = None) -> None:
        self.msg = msg
        self.location = location
        super().__init__(f"{msg} (at {location})" if location else msg)


class RequestError(XtmlError):
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


class MarkupError(XtmlError):
    """A markup tree breaks a rule of the language (a bad tag name, say).

    ``path`` names the element, e.g. ``message[3]/tools/call[1]``.
    """

    def __init__(self, msg: str, *, path: str = "") -> None:
        self.path = path
        super().__init__(msg, location=path or None)


class ParseError(XtmlError):
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


class TokenizerError(XtmlError):
    """A tokenizer cannot be loaded or does not fit the template's markers."""


class TemplateError(XtmlError):
    """A template (dialect) file is invalid."""


class ExportError(XtmlError):
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
