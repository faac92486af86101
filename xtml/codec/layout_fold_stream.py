"""The stream of an answer of a format that folds tool results into the
calling turn (:mod:`~xtml.chat.layout_fold_answer`), token by token: the
reasoning block without its label and the newline before its close, the
content trimmed, and each call as it comes — its name, then each argument
as the value syntax's stream reader completes it, then the whole call at
its closing token. The end carries the batch parse of every id fed."""

from __future__ import annotations

import json
from typing import Any

from ..chat.layout import LayoutDialect
from ..chat.layout_fold_answer import call_schemas, fold_reader
from ..chat.layout_pattern import TOKEN_BASE
from ..errors import ParseError, RequestError
from ..plugins.values import ValueReader
from .stream import StreamEvent

__all__ = ["FoldLive"]


class FoldLive:
    """What :class:`~xtml.codec.layout.LayoutStream` asks of a live reader:
    ``text``, ``token``, ``finish`` and ``state``."""

    __slots__ = ("args", "call", "call_at", "d", "f", "failed", "held", "index", "keep", "labelled", "name",
                 "pairs", "quotes", "reader", "schemas", "skip", "state")

    def __init__(self, d: LayoutDialect, tools: Any) -> None:
        self.d = d
        self.f = fold_reader(d)
        self.quotes = {c: d.tokens[ord(c) - TOKEN_BASE] for c in self.f.quotes}
        self.keep = max((len(t) - 1 for t in self.quotes.values()), default=0)
        self.schemas = call_schemas(tools)
        self.state = "begin"  # begin, think, content, calls
        self.held = ""  # think: the label not yet told, the text that may be the close's; content: trailing space
        self.labelled = False
        self.skip = True  # content's leading whitespace
        self.index = 0  # calls ended
        self.call = ""  # the call read so far: its head and name (lexed)
        self.call_at = -1  # -1: between calls
        self.args = ""  # the end of the arguments read so far (lexed)
        self.name = ""
        self.reader: ValueReader | None = None
        self.pairs: list[tuple[str, Any]] = []
        self.failed = False

    # -- text and tokens ---------------------------------------------------------------------

    def text(self, s: str, at: int, out: list[StreamEvent]) -> None:
        if self.state == "begin":
            self._content(at, out)
        if self.state == "think":
            self._think(s, at, out)
        elif self.state == "content" or (self.state == "calls" and self.call_at < 0):
            if self.skip:
                s = s.lstrip()
                if not s:
                    return
                self.skip = False
            s = self.held + s
            body = s.rstrip()
            self.held = s[len(body):]
            if body:
                out.append(StreamEvent("text", at, "response", body))
        elif self.call_at >= 0 and not self.failed:
            self._call_text(s, at, out)

    def token(self, c: str, at: int, out: list[StreamEvent]) -> None:
        f = self.f
        if self.state == "begin":
            if f.think is not None and c == f.think[0][:1]:
                self.state = "think"
                out.append(StreamEvent("channel_start", at, "think"))
                return
            self._content(at, out)
        if self.state == "think":
            if f.think is not None and c == f.think[1][-1:]:
                self._think_end(True, at, out)
                out.append(StreamEvent("channel_end", at, "think"))
                self.state, self.skip, self.held = "content", True, ""
                out.append(StreamEvent("channel_start", at, "response"))
            return  # a stray token: the parse leaves it out
        if c == f.call[0][:1]:
            self.state = "calls"
            self._open_call(at)
        elif self.state == "calls" and self.call_at >= 0:
            if c == f.call[1][-1:]:
                self._close_call(at, out)
            elif self.failed:
                return
            elif c in self.quotes:
                self._call_text(c, at, out)
            else:
                self.failed = True  # a token that does not belong in a call: withheld

    def finish(self, at: int, out: list[StreamEvent], message: Any = None) -> None:
        if self.state == "think":
            self._think_end(False, at, out)
            out.append(StreamEvent("channel_end", at, "think"))
        self.held = ""

    # -- reasoning and content ---------------------------------------------------------------

    def _content(self, at: int, out: list[StreamEvent]) -> None:
        self.state = "content"
        out.append(StreamEvent("channel_start", at, "response"))

    def _think(self, s: str, at: int, out: list[StreamEvent]) -> None:
        f = self.f
        assert f.think is not None
        label, tail = f.think[0][1:], f.think[1][:-1]
        s = self.held + s
        if not self.labelled:
            if len(s) < len(label) and label.startswith(s):
                self.held = s
                return
            self.labelled = True
            if s.startswith(label):
                s = s[len(label):]
        # The last characters may be the newline the close takes.
        keep = min(len(tail), len(s))
        body, self.held = s[:len(s) - keep], s[len(s) - keep:]
        if body:
            out.append(StreamEvent("text", at, "think", body))

    def _think_end(self, closed: bool, at: int, out: list[StreamEvent]) -> None:
        f = self.f
        assert f.think is not None
        tail = f.think[1][:-1]
        s = self.held
        if closed and tail and s.endswith(tail) and (self.labelled or len(s) >= len(tail)):
            s = s[:-len(tail)]
        if s:
            out.append(StreamEvent("text", at, "think", s))
        self.held = ""

    # -- calls -------------------------------------------------------------------------------

    def _open_call(self, at: int) -> None:
        self.call_at, self.call, self.args, self.name = at, "", "", ""
        self.reader, self.pairs, self.failed = None, [], False

    def _call_text(self, s: str, at: int, out: list[StreamEvent]) -> None:
        f = self.f
        head = f.call[0][1:]
        if self.reader is None:
            if s in self.quotes:
                self.failed = True  # a quote in a name: the parse withholds the call
                return
            seen = len(self.call)
            self.call += s  # the head and the name: until the arguments open
            if not self.call.startswith(head[:len(self.call)]):
                self.failed = True
                return
            k = self.call.find(f.args_open, max(len(head), seen))
            if k < 0:
                return
            self.name = self.call[len(head):k]
            if not self.name:
                self.failed = True
                return
            try:
                self.reader = f.syntax.reader(self.schemas.get(self.name))
            except (ParseError, RequestError):
                self.failed = True
                return
            out.append(StreamEvent("tool_call_start", at, index=self.index + 1, name=self.name))
            s = self.call[k:]
        # Only the last characters are kept: enough to find the syntax's
        # token spelled across two pieces of text.
        seen_text = self.args + s
        for t in self.quotes.values():
            # Text that spells the syntax's token is not it: the call is withheld.
            if seen_text.find(t) >= 0:
                self.failed = True
                return
        self.args = seen_text[-self.keep:] if self.keep else ""
        try:
            pairs = self.reader.feed("".join(self.quotes.get(c, c) for c in s))
        except (ParseError, RequestError):
            self.failed = True
            return
        self._pairs(pairs, at, out)

    def _pairs(self, pairs: list[tuple[str, Any]], at: int, out: list[StreamEvent]) -> None:
        for key, value in pairs:
            self.pairs.append((key, value))
            out.append(StreamEvent("argument_start", at, index=self.index + 1, key=key, value_type="json"))
            out.append(StreamEvent("argument_delta", at, index=self.index + 1, key=key,
                                   text=json.dumps(value, ensure_ascii=False)))
            out.append(StreamEvent("argument_end", at, index=self.index + 1, key=key))

    def _close_call(self, at: int, out: list[StreamEvent]) -> None:
        reader, self.call_at = self.reader, -1
        if reader is None or self.failed or self.f.call[1][:-1]:
            return  # no arguments read (the parse withholds it), or a close this reader does not know
        try:
            rest = reader.close()
        except (ParseError, RequestError):
            return
        self._pairs(rest, at, out)
        self.index += 1
        call = {"type": "function", "function": {"name": self.name,
                                                 "arguments": json.dumps(dict(self.pairs), ensure_ascii=False)}}
        out.append(StreamEvent("tool_call_end", at, index=self.index, call=call))
