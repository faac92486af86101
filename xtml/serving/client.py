"""The engine's HTTP client for ``xtml serve``: httpx, read the way a
gateway needs it.

A streamed answer is one server-sent event per generated token. Read line
by line (``aiter_lines``), each event pays httpx's iterators on its own;
here :meth:`Response.read` hands back whatever the connection delivered
since the last read (``aiter_raw``, one network read each), so a gateway
that falls behind reads many events at once, and its work per read, not per
event, is what it pays.

Failures are :class:`TransportError` subclasses: :class:`ConnectError`,
:class:`Timeout` (``timeout`` bounds connecting and each wait for data),
:class:`ConnectionLost`, :class:`ProtocolError` (an answer that is not
HTTP/1.1).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

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


def _mapped(e: httpx.HTTPError) -> TransportError:
    if isinstance(e, httpx.TimeoutException):
        return Timeout(str(e) or type(e).__name__)
    if isinstance(e, httpx.ConnectError):
        return ConnectError(str(e) or type(e).__name__)
    if isinstance(e, httpx.RemoteProtocolError):
        text = str(e)
        # h11 says "peer closed connection" (or "incomplete") for a body cut
        # short, anything else for a malformed answer.
        if "closed" in text or "disconnected" in text or "incomplete" in text.lower():
            return ConnectionLost(text)
        return ProtocolError(text)
    return ConnectionLost(f"{type(e).__name__}: {e}")


class Response:
    """An answer whose status and headers have arrived; its body is read
    with :meth:`read` or :meth:`content`, and :meth:`close` hands the
    connection back (or closes it when the body was not read to its end,
    which an engine takes as the request's cancellation)."""

    __slots__ = ("_chunks", "_resp", "done", "headers", "status")

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.headers = {k.lower(): v for k, v in resp.headers.items()}
        self._chunks: AsyncIterator[bytes] = resp.aiter_raw()
        self.done = False

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read, waiting until
        some have; ``b""`` at the end of the body."""
        if self.done:
            return b""
        try:
            while True:
                piece = await self._chunks.__anext__()
                if piece:
                    return piece
        except StopAsyncIteration:
            self.done = True
            return b""
        except httpx.HTTPError as e:
            raise _mapped(e) from None

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
        await self._resp.aclose()

    def close(self) -> None:
        """Hand the connection back, or close it when the body was not read
        to its end (httpx closes a connection whose answer is unread)."""
        if self._resp.is_closed:
            return
        try:
            asyncio.get_running_loop().create_task(self._resp.aclose())
        except RuntimeError:  # no loop running: nothing is in flight either
            pass


class Client:
    """Requests to the origin of ``url``; ``timeout`` (seconds) bounds
    connecting and each wait for data. At most ``max_idle`` idle
    connections are kept, each for ``idle_expiry`` seconds."""

    def __init__(self, url: str, *, timeout: float = 600.0, max_idle: int = 256, idle_expiry: float = 2.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, not {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        # An engine's keep-alive outlives idle_expiry, so a pooled
        # connection is not closed under a request going out on it.
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=max_idle,
                                keepalive_expiry=idle_expiry),
            headers={"user-agent": "xtml", "accept-encoding": "identity"}, trust_env=False)

    async def send(self, method: str, path: str, body: bytes | None = None,
                   content_type: str = "application/json") -> Response:
        """Send a request; returns once the answer's status and headers
        have arrived."""
        headers = {"content-type": content_type} if body is not None else None
        request = self._http.build_request(method, path.lstrip("/"), content=body, headers=headers)
        try:
            return Response(await self._http.send(request, stream=True))
        except httpx.HTTPError as e:
            raise _mapped(e) from None

    async def request(self, method: str, path: str, body: bytes | None = None, *,
                      limit: int = 256 << 20) -> tuple[int, bytes]:
        """A whole answer: status and body (at most ``limit`` bytes)."""
        resp = await self.send(method, path, body)
        try:
            content = await resp.content(limit)
        finally:
            await resp._resp.aclose()
        return resp.status, content

    async def aclose(self) -> None:
        """Close the pool."""
        await self._http.aclose()
