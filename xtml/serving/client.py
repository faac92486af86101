"""The HTTP/1.1 client ``xtml serve`` talks to its engine with.

A streamed answer is one server-sent event per generated token. Read through
httpx, each event goes through h11, httpcore, anyio and httpx's iterators on
its own: about 25 µs of CPU per event before the gateway sees an id, more
than the whole of xtml's parsing and shaping. Here the socket's data is kept
as it arrives (an :class:`asyncio.Protocol`) and :meth:`Response.read` hands
back everything that has arrived since the last read, decoded from the
chunked framing in one pass: a gateway that falls behind reads many events
at once, and its work per read, not per event, is what it pays. A request
goes out in one write (httpcore writes the head and the body apart, which
wakes the engine twice).

What it does, and no more: one origin (``http://`` or ``https://``, host,
port, an optional path prefix); requests with a body of known length;
responses framed by ``Content-Length``, chunked, or by closing the
connection; keep-alive, with idle connections pooled and dropped after
``idle_expiry`` seconds (before an engine's own keep-alive would close one
as a request goes out on it). No proxies, no redirects, no compression: an
engine is reached directly and answers plainly.

Failures are :class:`TransportError` subclasses: :class:`ConnectError`,
:class:`Timeout` (``timeout`` bounds connecting and each wait for data),
:class:`ConnectionLost`, :class:`ProtocolError` (an answer that is not
HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast
from urllib.parse import urlsplit

__all__ = ["Client", "ConnectError", "ConnectionLost", "ProtocolError", "Response", "Timeout", "TransportError"]

_MAX_HEAD = 64 << 10
"""The largest status line and headers read."""
_HIGH_WATER = 4 << 20
"""Unread bytes past which the socket is not read until they are."""


class TransportError(Exception):
    """The engine could not be talked to."""


class ConnectError(TransportError):
    """No connection could be made."""


class Timeout(TransportError):
    """The engine did not connect or send anything in time."""


class ConnectionLost(TransportError):
    """The connection closed before the answer was complete."""


class ProtocolError(TransportError):
    """The engine's answer is not HTTP/1.1."""


class _Connection(asyncio.Protocol):
    """One connection: what has arrived and not been read, and the read
    waiting for more."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.closed = False
        self.error: BaseException | None = None
        self.paused = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        # One timer per connection, pushed back as data arrives, rather
        # than a timer made and cancelled for every read.
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but
        # have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._wake()

    # -- reads -------------------------------------------------------------------------

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def _expire(self) -> None:
        self._timer = None
        w = self._waiter
        if w is None or w.done():
            return
        if self.loop.time() >= self._deadline:
            self._waiter = None
            w.set_exception(Timeout("no data in time"))
        else:
            self._timer = self.loop.call_at(self._deadline, self._expire)

    async def wait(self, timeout: float) -> None:
        """Until more data arrives or the connection closes; :class:`Timeout`
        after ``timeout`` seconds of nothing."""
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        w = self._waiter = self.loop.create_future()
        self._deadline = self.loop.time() + timeout
        if self._timer is None:
            self._timer = self.loop.call_at(self._deadline, self._expire)
        try:
            await w
        finally:
            self._waiter = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once: the engine takes it as the request's cancellation."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.abort()

    def usable(self, now: float, expiry: float) -> bool:
        return (not self.closed and not self.buf and self.transport is not None
                and not self.transport.is_closing() and now - self.idle_since < expiry)


# Body decoding states: inside data (a chunk's, or a length-framed body's),
# the CRLF after a chunk, a chunk's size line, trailer lines, the end; and a
# body that ends when the connection closes.
_DATA, _CRLF, _SIZE, _TRAILER, _DONE, _UNTIL_CLOSE = range(6)


class Response:
    """An answer whose status and headers have arrived; its body is read
    with :meth:`read` or :meth:`content`, and :meth:`close` hands the
    connection back (or closes it when the body was not read to its end)."""

    __slots__ = ("_chunked", "_client", "_conn", "_keep", "_left", "_state", "headers", "status")

    def __init__(self, client: Client, conn: _Connection, status: int, headers: dict[str, str], keep: bool,
                 framing: str, length: int) -> None:
        self._client = client
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        self._keep = keep
        self._left = length
        self._chunked = framing == "chunked"
        self._state = {"none": _DONE, "length": _DATA if length else _DONE, "chunked": _SIZE,
                       "close": _UNTIL_CLOSE}[framing]

    @property
    def done(self) -> bool:
        """Whether the whole body has been read."""
        return self._state == _DONE

    def _decode(self, conn: _Connection) -> bytes:
        buf = conn.buf
        state = self._state
        if not buf or state == _DONE:
            return b""
        if state == _UNTIL_CLOSE or (state == _DATA and not self._chunked and self._left >= len(buf)):
            out = bytes(buf)
            buf.clear()
            if state == _DATA:
                self._left -= len(out)
                if not self._left:
                    self._state = _DONE
            return out
        parts: list[bytes] = []
        pos, n, left = 0, len(buf), self._left
        while pos < n and state != _DONE:
            if state == _DATA:
                take = min(left, n - pos)
                parts.append(bytes(buf[pos : pos + take]))
                pos += take
                left -= take
                if not left:
                    state = _CRLF if self._chunked else _DONE
            elif state == _CRLF:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("a chunk does not end with CRLF")
                pos += 2
                state = _SIZE
            else:  # a chunk's size line, or a trailer line
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > 4096:
                        raise ProtocolError("a chunk size or trailer line of more than 4096 bytes")
                    break
                line = bytes(buf[pos:end])
                pos = end + 2
                if state == _TRAILER:
                    if not line:
                        state = _DONE
                    continue
                size = line.split(b";", 1)[0].strip()
                if not size or size.strip(b"0123456789abcdefABCDEF"):
                    raise ProtocolError(f"a chunk size that is not hexadecimal: {line[:40]!r}")
                left = int(size, 16)
                state = _DATA if left else _TRAILER
        del buf[:pos]
        self._state, self._left = state, left
        return b"".join(parts)

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read, waiting until
        some have; ``b""`` at the end of the body."""
        conn = self._conn
        if conn is None:
            return b""
        while True:
            out = self._decode(conn)
            if out or self._state == _DONE:
                return out
            if conn.closed:
                if self._state == _UNTIL_CLOSE:
                    self._state = _DONE
                    return b""
                raise ConnectionLost(f"the connection closed before the end of the answer"
                                     f"{f' ({conn.error})' if conn.error else ''}")
            await conn.wait(self._client.timeout)

    async def content(self, limit: int) -> bytes:
        """The rest of the body; :class:`ProtocolError` past ``limit`` bytes."""
        out = bytearray()
        while True:
            piece = await self.read()
            if not piece:
                return bytes(out)
            out += piece
            if len(out) > limit:
                raise ProtocolError(f"an answer of more than {limit:,} bytes")

    async def finish(self, timeout: float, limit: int = 65536) -> None:
        """Read what is left of a body whose meaning has been read (the
        engine's closing events) within ``timeout`` seconds and ``limit``
        bytes, so that the connection can be used again; else close it.
        Hands the connection back either way."""
        conn = self._conn
        if conn is None:
            return
        try:
            if not self.done:
                seen = 0
                deadline = conn.loop.time() + timeout
                while not self.done:
                    seen += len(self._decode(conn))
                    if self.done:
                        break
                    left = deadline - conn.loop.time()
                    if seen > limit or conn.closed or left <= 0:
                        break
                    await conn.wait(left)
        except TransportError:
            pass
        except BaseException:
            self.close()
            raise
        self.close()

    def close(self) -> None:
        """Hand the connection back when the body was read to its end and
        the engine keeps connections open; else close it, which an engine
        takes as the request's cancellation."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._state == _DONE and self._keep and not conn.buf and not conn.closed:
            self._client._release(conn)
        elif self._state == _DONE:
            conn.close()
        else:
            conn.abort()


class Client:
    """Requests to the origin of ``url``; ``timeout`` (seconds) bounds
    connecting and each wait for data. At most ``max_idle`` idle
    connections are kept, each for ``idle_expiry`` seconds."""

    def __init__(self, url: str, *, timeout: float = 600.0, max_idle: int = 256, idle_expiry: float = 2.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, not {url!r}")
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = host if parts.port is None else f"{host}:{self.port}"
        self.timeout = timeout
        self.max_idle = max_idle
        self.idle_expiry = idle_expiry
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop), self.host, self.port,
                                                       ssl=self._ssl if self.tls else None)
        except TimeoutError:
            raise Timeout(f"no connection in {self.timeout:g} s") from None
        except OSError as e:
            raise ConnectError(str(e) or type(e).__name__) from None
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.idle_since = conn.loop.time()
        self._idle.append(conn)
        if len(self._idle) > self.max_idle:
            self._idle.pop(0).close()

    def _pooled(self) -> _Connection | None:
        idle = self._idle
        if not idle:
            return None
        now = idle[-1].loop.time()
        while idle:
            conn = idle.pop()
            if conn.usable(now, self.idle_expiry):
                return conn
            conn.close()
        return None

    async def send(self, method: str, path: str, body: bytes | None = None,
                   content_type: str = "application/json") -> Response:
        """Send a request; returns once the answer's status and headers
        have arrived. A pooled connection the engine closed as the request
        went out (nothing came back on it) is replaced by a new one, once."""
        head = (f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\nUser-Agent: xtml\r\n"
                "Accept: */*\r\nAccept-Encoding: identity\r\n")
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        data = (head + "\r\n").encode("latin-1") + (body or b"")
        while True:
            conn = self._pooled()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            assert conn.transport is not None
            conn.transport.write(data)
            try:
                return await self._head(conn, method)
            except ConnectionLost:
                conn.abort()
                if reused and not conn.buf:
                    continue
                raise
            except BaseException:
                conn.abort()
                raise

    async def _head(self, conn: _Connection, method: str) -> Response:
        while True:
            buf = conn.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise ProtocolError(f"no end of the headers in {_MAX_HEAD:,} bytes")
                if conn.closed:
                    if buf:
                        raise ConnectionLost("the connection closed inside the answer's headers")
                    raise ConnectionLost("the connection closed before an answer"
                                         + (f" ({conn.error})" if conn.error else ""))
                await conn.wait(self.timeout)
                continue
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            del buf[: end + 4]
            status_line = lines[0].split(" ", 2)
            if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
                raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:100]!r}")
            status = int(status_line[1])
            if 100 <= status < 200:
                continue  # an interim answer: the real one follows
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    raise ProtocolError(f"a header line without a colon: {line[:100]!r}")
                name = name.strip().lower()
                value = value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            keep = status_line[0] == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
            length = 0
            if method == "HEAD" or status in (204, 304):
                framing = "none"
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                framing = "chunked"
            elif "content-length" in headers:
                try:
                    length = int(headers["content-length"])
                except ValueError:
                    raise ProtocolError(f"a Content-Length that is not a number: "
                                        f"{headers['content-length'][:40]!r}") from None
                if length < 0:
                    raise ProtocolError("a negative Content-Length")
                framing = "length"
            else:
                framing = "close"
                keep = False
            return Response(self, conn, status, headers, keep, framing, length)

    async def request(self, method: str, path: str, body: bytes | None = None, *,
                      limit: int = 256 << 20) -> tuple[int, bytes]:
        """A whole answer: status and body (at most ``limit`` bytes)."""
        resp = await self.send(method, path, body)
        try:
            content = await resp.content(limit)
        finally:
            resp.close()
        return resp.status, content

    async def aclose(self) -> None:
        """Close the idle connections (those in use close with their
        answers)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
