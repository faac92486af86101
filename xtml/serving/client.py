"""The engine's HTTP client for ``xtml serve``: aiohttp, read the way a
gateway needs it.

A streamed answer is one server-sent event per generated token, so what the
client costs per network read is what the gateway pays per token. aiohttp
parses HTTP/1.1 (headers and chunked framing) in C, and
:meth:`Response.read` hands back everything buffered since the last read
(``readany``), so a gateway that falls behind reads many events at once and
pays per read, not per event. (httpx, measured in the same benchmark, spent
about 40 µs of pure-Python framing per event.)

Failures are :class:`TransportError` subclasses: :class:`ConnectError`,
:class:`Timeout` (``timeout`` bounds connecting and each wait for data),
:class:`ConnectionLost`, :class:`ProtocolError` (an answer that is not
HTTP/1.1).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp

__all__ = ["Client", "ConnectError", "ConnectionLost", "ProtocolError", "Response", "Timeout", "TransportError"]


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


def _cause(e: BaseException) -> str:
    return str(e) or type(e).__name__


def _mapped(e: Exception) -> TransportError:
    # Order matters: aiohttp's timeout errors are also connection errors.
    if isinstance(e, TimeoutError):
        return Timeout(_cause(e))
    if isinstance(e, aiohttp.ClientConnectorError):
        return ConnectError(_cause(e))
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return ConnectionLost(f"the engine disconnected: {_cause(e)}")
    if isinstance(e, aiohttp.ClientPayloadError):
        # A body cut short is "not fully read" / "not completed"; a framing
        # error (a bad chunk size, bytes after a chunk) names what was wrong.
        text = _cause(e)
        if "not fully read" in text or "not completed" in text or "ContentLengthError" in text:
            return ConnectionLost(text)
        return ProtocolError(text)
    if isinstance(e, aiohttp.ClientResponseError):  # the status line or a header is malformed
        return ProtocolError(e.message or _cause(e))
    return ConnectionLost(f"{type(e).__name__}: {e}")


_ERRORS = (aiohttp.ClientError, TimeoutError)


class Response:
    """An answer whose status and headers have arrived; its body is read
    with :meth:`read` or :meth:`content`, and :meth:`close` hands the
    connection back (or closes it when the body was not read to its end,
    which an engine takes as the request's cancellation)."""

    __slots__ = ("_resp", "done", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.headers.items()}
        self.done = False

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read, waiting until
        some have; ``b""`` at the end of the body."""
        if self.done:
            return b""
        try:
            piece = await self._resp.content.readany()
        except _ERRORS as e:
            raise _mapped(e) from None
        if not piece:
            self.done = True
        return piece

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
        bytes, so that the connection can be used again; else close it."""
        async def drain() -> None:
            seen = 0
            while seen <= limit:
                piece = await self.read()
                if not piece:
                    return
                seen += len(piece)

        try:
            await asyncio.wait_for(drain(), timeout)
        except (TimeoutError, TransportError):
            pass
        self.close()

    def close(self) -> None:
        """Hand the connection back when the body was read to its end, else
        close it (the engine sees the request cancelled)."""
        if self.done:
            self._resp.release()
        else:
            self._resp.close()


class Client:
    """Requests to the origin of ``url``; ``timeout`` (seconds) bounds
    connecting and each wait for data. Idle connections are kept for
    ``idle_expiry`` seconds."""

    def __init__(self, url: str, *, timeout: float = 600.0, idle_expiry: float = 2.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, not {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._idle_expiry = idle_expiry
        # Made on first use: an aiohttp session belongs to the running loop.
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # An engine's keep-alive outlives idle_expiry, so a pooled
            # connection is not closed under a request going out on it.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._idle_expiry,
                                             enable_cleanup_closed=False)
            # No cookie jar: cookies an engine set on one caller's request
            # must not go out with everyone else's.
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=self.timeout),
                headers={"user-agent": "xtml", "accept-encoding": "identity"})
        return self._session

    async def send(self, method: str, path: str, body: bytes | None = None,
                   content_type: str = "application/json") -> Response:
        """Send a request; returns once the answer's status and headers
        have arrived."""
        headers = {"content-type": content_type} if body is not None else None
        url = self.url + "/" + path.lstrip("/")
        try:
            resp = await self._open().request(method, url, data=body, headers=headers,
                                              allow_redirects=False)
        except _ERRORS as e:
            raise _mapped(e) from None
        return Response(resp)

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
        """Close the pool."""
        if self._session is not None:
            await self._session.close()
