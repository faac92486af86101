"""What a client can make ``xtml serve``'s HTTP server hold: the size and
number of a request's header lines, the time it takes to send them, how long
it may go quiet while sending a body, and how many connections are open.

uvicorn bounds none of these (its httptools parser buffers a header line of
any length, and a connection that sends one byte a second is kept for ever),
so :func:`protocol` gives uvicorn an HTTP protocol, its httptools one with
the limits added: a head too large is a 431, a head or body too slow a 408,
a connection past the limit a 503, each closing the connection. The bodies
are OpenAI error objects. Pass it as ``uvicorn.Config(app, http=protocol(limits))``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

__all__ = ["Limits", "protocol"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The HTTP server's limits; each is checked per connection."""

    header_bytes: int = 64 << 10
    """The request line and header lines of one request, in bytes."""
    header_lines: int = 100
    """Header lines in one request."""
    header_timeout: float = 10.0
    """Seconds to receive a request's line and headers: from the connection's
    start for its first request, from the request's first byte after that."""
    body_idle: float = 30.0
    """Seconds a request body may go without a byte arriving (while the
    server waits for it: not while it holds back reading)."""
    connections: int = 1000
    """Connections open at once; one more is answered 503 and closed."""


LINGER = 2.0
"""Seconds a refused connection is read from (and what comes discarded)
after its answer, before it is closed: closed at once with a request still
arriving, the system would reset it, and the client could lose the answer."""


class _Refused(Exception):
    """Raised in a parser callback to stop the parse of a request refused."""


def _answer(status: int, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": status}}).encode()
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\n",
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body])


class _Limited(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`Limits`."""

    limits: Limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = True
        self._head_bytes = 0
        self._head_lines = 0
        self._began = 0
        self._refusal: tuple[int, str] | None = None
        self._lingering = False
        self._in_body = False

    # -- the connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.connections:
            self._refuse(503, f"the server has {self.limits.connections:,} connections open, its limit: try again")
            return
        # The first request's head is timed from here: a connection that
        # sends nothing is let go as one that sends slowly.
        self._arm(self.limits.header_timeout, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        began = self._began
        super().data_received(data)
        # httptools hands a header line over only once it has all of it, so
        # a line still arriving is counted here: every byte fed while the
        # same head is still incomplete belongs to it.
        if self._in_head and began == self._began and self._refusal is None and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.header_bytes:
                self._refuse(431, self._too_large())

    def send_400_response(self, msg: str) -> None:
        # Reached from data_received when a callback below raised _Refused.
        if self._refusal is not None:
            self._refuse(*self._refusal)
        else:
            super().send_400_response(msg)

    # -- the parser's callbacks --------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._began += 1
        self._in_head = True
        self._head_bytes = 0
        self._head_lines = 0
        if self._timer is None:
            self._arm(self.limits.header_timeout, self._head_too_slow)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines += 1
        if self._head_lines > self.limits.header_lines:
            self._refusal = (431, f"the request has more than {self.limits.header_lines:,} header lines")
            raise _Refused
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_body = True
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = cast(asyncio.Transport, _Lingering(self))
        self._arm(self.limits.body_idle, self._body_too_slow)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm(self.limits.body_idle, self._body_too_slow)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()

    # -- the limits --------------------------------------------------------------------

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.limits.header_bytes:
            self._refusal = (431, self._too_large())
            raise _Refused

    def _too_large(self) -> str:
        return f"the request's line and headers are larger than {self.limits.header_bytes:,} bytes"

    def _arm(self, seconds: float, then: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _answering(self) -> bool:
        return self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete

    def _head_too_slow(self) -> None:
        self._timer = None
        if self._answering():
            # A pipelined request waits on the answer before it: not the
            # client's delay.
            self._arm(self.limits.header_timeout, self._head_too_slow)
            return
        if not self._began:
            self.transport.close()  # nothing sent, nobody to answer
            return
        self._refuse(408, f"the request's line and headers took longer than {self.limits.header_timeout:g} s")

    def _body_too_slow(self) -> None:
        self._timer = None
        if self.flow.read_paused:
            # The app has not taken what came yet: the wait is the server's.
            self._arm(self.limits.body_idle, self._body_too_slow)
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
            return
        self._refuse(408, f"the request body sent nothing for {self.limits.body_idle:g} s")

    def _refuse(self, status: int, message: str) -> None:
        self._disarm()
        if self._lingering or self.transport.is_closing():
            return
        where = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        self.logger.warning("refused a request from %s: %s", where, message)
        self.transport.write(_answer(status, message))
        self._linger()

    def _close(self) -> None:
        """Close as the app's answer asks: lingering if the request is still
        arriving (the app refused it before reading it all: a 413)."""
        if self._in_body or (self._in_head and self._head_bytes):
            self._linger()
        else:
            self.transport.close()

    def _linger(self) -> None:
        self._disarm()
        if self._lingering or self.transport.is_closing():
            return
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = True
        self.flow.resume_reading()
        self._timer = self.loop.call_later(LINGER, self.transport.close)


class _Lingering:
    """The transport as a request's cycle holds it: its ``close`` is the
    protocol's, which lingers while the request is still arriving."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: _Limited) -> None:
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol.transport, name)

    def close(self) -> None:
        self._protocol._close()


def protocol(limits: Limits) -> type[asyncio.Protocol]:
    """A uvicorn HTTP protocol class (``uvicorn.Config(http=...)``) that
    keeps ``limits``."""
    return type("LimitedHttpToolsProtocol", (_Limited,), {"limits": limits})
