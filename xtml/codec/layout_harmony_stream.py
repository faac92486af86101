"""The live reader of an answer written as several messages (harmony's):
the stream's events as each id comes, read as
:func:`~xtml.chat.layout_harmony.parse_completion_harmony` reads the whole
answer."""

from __future__ import annotations

from typing import Any

from ..chat.layout import LayoutDialect
from ..chat.layout_harmony import JOIN, authored, harmony, read_header
from .stream import StreamEvent

__all__ = ["HarmonyLive"]


class HarmonyLive:
    """What :class:`~xtml.codec.layout.LayoutStream` asks of a live reader
    (``text``, ``token``, ``finish``, ``state``), reading messages as
    :func:`parse_completion_harmony` does: the text of a reasoning message
    on the think channel, of a final one or a preamble on the response
    channel, as it comes; headers and calls are read whole."""

    __slots__ = ("body", "h", "head", "open", "seen", "state")

    def __init__(self, d: LayoutDialect) -> None:
        self.h = harmony(d)
        self.state = "header"  # header, author, body, between, done
        self.head: list[str] = []
        self.body = ""  # the channel the body's text goes to ("" when it is not sent)
        self.open = ""  # the stream channel open now
        self.seen: set[str] = set()  # channels that have had a text (the next one is joined)

    def _switch(self, channel: str, at: int, out: list[Any]) -> None:
        if self.open == channel:
            return
        if self.open:
            out.append(StreamEvent("channel_end", at, self.open))
        if channel:
            out.append(StreamEvent("channel_start", at, channel))
        self.open = channel

    def text(self, s: str, at: int, out: list[Any]) -> None:
        if self.state in ("header", "author"):
            self.head.append(s)
        elif self.state == "body" and self.body and s:
            out.append(StreamEvent("text", at, self.body, s))

    def token(self, c: str, at: int, out: list[Any]) -> None:
        h = self.h
        if self.state == "done":
            return
        if self.state == "author":
            head = "".join(self.head)
            if not authored(h, head + c, 0):
                self.state = "done"  # another author: not read
                return
            self.head = [head[len(h.author):]]
            self.state = "header"
        if self.state == "header":
            if c == h.message:
                kind = read_header(h, "".join(self.head)).kind
                self.head = []
                self.state = "body"
                self.body = "think" if kind == "reasoning" else "response" if kind == "content" else ""
                if self.body:
                    self._switch(self.body, at, out)
                    if self.body in self.seen:
                        out.append(StreamEvent("text", at, self.body, JOIN))
                    self.seen.add(self.body)
            elif c == h.start or c in h.closes:
                self.head = []
                self.state = "author" if c == h.start else "between"
            else:
                self.head.append(c)
            return
        if self.state == "body":
            if c == h.start:
                self.state, self.head = "author", []
            elif c in h.closes:
                self.state = "between"
            return
        if c == h.start:  # between messages
            self.state, self.head = "author", []

    def finish(self, at: int, out: list[Any], message: Any = None) -> None:
        self._switch("", at, out)
