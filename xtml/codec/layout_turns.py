"""The stream of an answer of a ``[turns]`` layout dialect, token by token:
its content goes out as it comes, as the batch parse reads it (trimmed; a
call, or text that may turn out to be one, held until the end), and the
end makes up what was held from the batch parse itself, so the two cannot
disagree."""

from __future__ import annotations

from typing import Any

from ..chat.layout import LayoutDialect
from ..chat.layout_pattern import Lit, Tok
from .stream import StreamEvent

__all__ = ["TurnsLive"]


class TurnsLive:
    """What :class:`~xtml.codec.layout.LayoutStream` asks of a live reader:
    ``text``, ``token``, ``finish`` and ``state``."""

    __slots__ = ("buf", "builtin", "emitted", "first", "lead", "state")

    def __init__(self, d: LayoutDialect) -> None:
        t = d.header_turns
        assert t is not None
        chars = d.chars()
        b = t.calls.builtin
        self.builtin = chars[b.items[0].token] if b is not None and isinstance(b.items[0], Tok) else None
        each = d.calls_each
        self.lead = each.items[0].text if each is not None and isinstance(each.items[0], Lit) else ""
        self.state = "begin"  # begin, content, held (to the end)
        self.first = True
        self.buf = ""  # text read but not sent: leading or trailing whitespace, a call's possible start
        self.emitted: list[str] = []  # joined at the end: adding to one string copies it each time

    def plain(self, s: str) -> bool:
        """Whether ``s`` goes out as content as it is (then it is taken):
        most pieces of content, with nothing held and nothing to hold."""
        if self.state == "content" and not self.buf and (not self.lead or self.lead[0] not in s) \
                and s.rstrip() is s:
            self.emitted.append(s)
            return True
        return False

    def text(self, s: str, at: int, out: list[StreamEvent]) -> None:
        if self.plain(s):
            out.append(StreamEvent("text", at, "response", s))
            return
        self.first = False
        if self.state == "held":
            return
        self.buf += s
        if self.state == "begin":
            self.buf = self.buf.lstrip()
            if not self.buf:
                return
            if self.buf[0] == "{":
                # A call, or one spaced otherwise: only the end tells.
                self.state = "held"
                return
            self.state = "content"
            out.append(StreamEvent("channel_start", at, "response"))
        self._send(at, out)

    def _send(self, at: int, out: list[StreamEvent]) -> None:
        buf = self.buf
        lead = self.lead
        if not lead or lead[0] not in buf:
            # Most pieces: no call can start in what is held.
            body = buf.rstrip()
            if body:
                out.append(StreamEvent("text", at, "response", body))
                self.emitted.append(body)
                self.buf = buf[len(body):]
            return
        k = buf.find(lead)
        if k >= 0:
            # A call after text reads the text before it only: nothing more
            # goes out before the end.
            self.state = "held"
        else:
            k = len(buf)
            # The start of a call may be cut between two pieces: the tail
            # from a place of the lead's first character that begins it.
            j = buf.find(lead[0], max(0, len(buf) - len(lead) + 1))
            while j >= 0:
                if lead.startswith(buf[j:]):
                    k = j
                    break
                j = buf.find(lead[0], j + 1)
        body = buf[:k].rstrip()
        if body:
            out.append(StreamEvent("text", at, "response", body))
            self.emitted.append(body)
        self.buf = buf[len(body):]

    def token(self, c: str, at: int, out: list[StreamEvent]) -> None:
        # A built-in call, first or after text: what follows is the call's.
        # Any other token is left out of the content (the parse says so).
        if c == self.builtin:
            self.state = "held"
        self.first = False

    def finish(self, at: int, out: list[StreamEvent], message: Any = None) -> None:
        content = message.get("content", "") if isinstance(message, dict) else ""
        if self.state != "content":
            out.append(StreamEvent("channel_start", at, "response"))
            self.state = "content"
        emitted = "".join(self.emitted)
        if content.startswith(emitted) and len(content) > len(emitted):
            out.append(StreamEvent("text", at, "response", content[len(emitted):]))
        self.buf = ""
