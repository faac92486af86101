"""xtml serve's engine client (xtml.serving.client, on aiohttp) against small
raw servers on the loopback address that answer scripted bytes: every
framing (Content-Length, chunked with extensions and trailers, until close),
split at every byte; keep-alive; answers cut short or not HTTP, each mapped
to the error the gateway turns into a 502; timeouts; closing an unfinished
answer closes the connection (the engine's cancellation)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from xtml.serving.client import Client, ConnectError, ConnectionLost, ProtocolError, Timeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, body) of one request."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


class Server:
    """A raw server; ``handler(reader, writer, k)`` serves connection k."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.gone = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        k = self.connections
        self.connections += 1
        try:
            await self.handler(reader, writer, k)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.gone.set()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[Server, str]]:
    server = Server(handler)
    srv = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        srv.close()


def answer(body: bytes, framing: str) -> bytes:
    if framing == "length":
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    if framing == "close":
        return b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + body
    half = len(body) // 2
    return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x;ext=1\r\n" % half + body[:half] + b"\r\n"
            + b"%X\r\n" % (len(body) - half) + body[half:] + b"\r\n"
            + b"0\r\nx-trailer: yes\r\n\r\n")


BODY = b'data: {"a": 1}\n\ndata: [DONE]\n\n' * 3


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_every_framing_split_at_every_byte(framing: str) -> None:
    wire = answer(BODY, framing)

    async def run() -> None:
        for cut in range(1, len(wire)):
            async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int,
                              cut: int = cut) -> None:
                await read_request(reader)
                writer.write(wire[:cut])
                await writer.drain()
                await asyncio.sleep(0)
                writer.write(wire[cut:])
                await writer.drain()
                if framing == "close":
                    writer.close()
                else:
                    await reader.read()  # until the client closes

            async with serving(handler) as (_, url):
                client = Client(url, timeout=10)
                resp = await client.send("POST", "/x", b"{}")
                assert resp.status == 200
                assert await resp.content(1 << 20) == BODY, cut
                assert resp.done
                resp.close()
                await client.aclose()

    asyncio.run(run())


def test_the_request_goes_out_whole_and_connections_are_kept() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        while True:
            head, body = await read_request(reader)
            server.requests.append((head, body))
            writer.write(answer(b"ok " + body, "chunked" if len(server.requests) % 2 else "length"))
            await writer.drain()

    async def run() -> None:
        nonlocal server
        async with serving(handler) as (srv, url):
            server = srv
            client = Client(url + "/prefix/", timeout=10)
            for k in range(4):
                status, content = await client.request("POST", "/v1/completions", b'{"k": %d}' % k)
                assert (status, content) == (200, b'ok {"k": %d}' % k)
            assert srv.connections == 1
            head = srv.requests[0][0].decode()
            assert head.startswith("POST /prefix/v1/completions HTTP/1.1\r\n")
            lines = head.lower()
            assert f"host: 127.0.0.1:{url.rsplit(':', 1)[1]}\r\n" in lines
            assert "content-length: 8\r\n" in lines and "content-type: application/json\r\n" in lines
            await client.aclose()

    server: Any = None
    asyncio.run(run())


def test_cookies_an_engine_sets_are_never_sent() -> None:
    """One caller's answer must not shape the next caller's request."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        while True:
            head, _ = await read_request(reader)
            server.requests.append((head, b""))
            writer.write(b"HTTP/1.1 200 OK\r\nset-cookie: session=abc; Path=/\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    async def run() -> None:
        nonlocal server
        async with serving(handler) as (srv, url):
            server = srv
            # By name: a cookie jar keeps no cookies of a bare IP address.
            client = Client(url.replace("127.0.0.1", "localhost"), timeout=10)
            for _ in range(3):
                assert await client.request("POST", "/x", b"{}") == (200, b"ok")
            assert len(srv.requests) == 3
            assert not any(b"cookie" in head.lower() for head, _ in srv.requests)
            await client.aclose()

    server: Any = None
    asyncio.run(run())


def test_a_new_connection_closed_without_an_answer_is_not_retried() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)

    async def run() -> None:
        async with serving(handler) as (srv, url):
            client = Client(url, timeout=10)
            with pytest.raises(ConnectionLost, match="disconnected"):
                await client.request("POST", "/", b"{}")
            assert srv.connections == 1
            await client.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("wire, error", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", ConnectionLost),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", ConnectionLost),
    (b"HTTP/1.1 200 OK\r\ncontent-le", ConnectionLost),
    (b"", ConnectionLost),
    (b"<html>not http</html>\r\n\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\ncontent-length: many\r\n\r\n", ProtocolError),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", ProtocolError),
])
def test_answers_cut_short_or_not_http(wire: bytes, error: type[Exception]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(wire)
        await writer.drain()

    async def run() -> None:
        async with serving(handler) as (_, url):
            client = Client(url, timeout=10)
            with pytest.raises(error):
                await client.request("GET", "/")
            await client.aclose()

    asyncio.run(run())


def test_an_interim_answer_is_skipped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"done", "length"))
        await writer.drain()
        await reader.read()

    async def run() -> None:
        async with serving(handler) as (_, url):
            client = Client(url, timeout=10)
            assert await client.request("POST", "/", b"x") == (200, b"done")
            await client.aclose()

    asyncio.run(run())


def test_too_large_an_answer_is_refused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(answer(b"x" * 5000, "length"))
        await writer.drain()
        await reader.read()

    async def run() -> None:
        async with serving(handler) as (_, url):
            client = Client(url, timeout=10)
            with pytest.raises(ProtocolError, match="more than 1,000 bytes"):
                await client.request("GET", "/", limit=1000)
            await client.aclose()

    asyncio.run(run())


def test_no_connection_and_no_answer() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        await reader.read()

    async def run() -> None:
        async with serving(silent) as (_, url):
            client = Client(url, timeout=0.2)
            with pytest.raises(Timeout):
                await client.request("GET", "/")
            await client.aclose()
        refused = Client(url, timeout=10)  # the server is closed now
        with pytest.raises(ConnectError):
            await refused.request("GET", "/")
        await refused.aclose()

    asyncio.run(run())


def test_closing_an_unfinished_answer_closes_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await reader.read()  # returns when the client closes
        server.gone.set()

    async def run() -> None:
        nonlocal server
        async with serving(handler) as (srv, url):
            server = srv
            client = Client(url, timeout=10)
            resp = await client.send("POST", "/", b"{}")
            assert await resp.read() == b"abc"
            resp.close()
            await asyncio.wait_for(srv.gone.wait(), 10)
            await client.aclose()

    server: Any = None
    asyncio.run(run())


def test_only_http_urls() -> None:
    for url in ("ftp://x", "127.0.0.1:8000", "http://"):
        with pytest.raises(ValueError):
            Client(url)
    assert Client("https://engine.example/v1/").url == "https://engine.example/v1"
