"""``xtml serve`` against hostile HTTP: what a client can make the gateway
hold, and how it is told no.

* the body: collected in linear work (counted, not timed), refused with a 413
  at once past ``max_body``, when Content-Length says so before a byte of it
  is read, when chunked as soon as the running total passes it;
* the HTTP layer (xtml.serving.limits, on uvicorn's httptools protocol): a
  head too large or with too many lines is a 431, a head or a body sent too
  slowly a 408, a connection past the limit a 503, each closing the
  connection; raw sockets on 127.0.0.1, small limits so that each test is
  quick, and one real ``xtml serve`` process whose memory is read while it is
  sent a stream of header bytes;
* the body's content: not UTF-8, not JSON, nested too deep, not an object,
  not declared JSON, each a 4xx saying which; long values quoted short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.helpers.engines import StandIn, running
from tests.helpers.serve import K3, REQUEST, answer_of
from tests.helpers.tokenizers import deepseek_path
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml.cli import serve as serve_cli
from xtml.serving import gateway as gateway_module
from xtml.serving.asgi import read_body
from xtml.serving.gateway import Gateway, create_app
from xtml.serving.limits import Limits, protocol

ROOT = Path(__file__).resolve().parent.parent
LIMITS = Limits(header_bytes=4096, header_lines=20, header_timeout=1.0, body_idle=1.0, connections=40)
MAX_BODY = 1 << 20
# The longest a refused client waits for its answer: the limit and scheduling slack.
SLACK = 5.0


class Server:
    """The gateway under uvicorn with :data:`LIMITS`, in a thread, on 127.0.0.1."""

    def __init__(self, backend: str, limits: Limits = LIMITS) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(K3, vocab(), backend, max_body=MAX_BODY)
        config = uvicorn.Config(app, log_level="critical", access_log=False, lifespan="on", http=protocol(limits),
                                timeout_keep_alive=gateway_module.KEEP_ALIVE)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def post(self, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(self.url + "/v1/chat/completions", content=content,
                          headers={"content-type": "application/json", **(headers or {})}, timeout=20)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    """The URL of a stand-in vLLM that answers "Four."."""
    b = K3.bind(vocab())
    e = StandIn("vllm", eog=b.stop_ids, vocab_size=vocab().size)
    e.answer = answer_of({"role": "assistant", "content": "Four."})
    with running(e) as r:
        yield r.url


@pytest.fixture(scope="module")
def server(engine: str) -> Iterator[Server]:
    s = Server(engine)
    yield s
    s.stop()


def answer(s: socket.socket, timeout: float = SLACK + 2) -> tuple[int | None, bytes, float]:
    """What the server says on ``s`` until it closes it: the status (None if
    nothing), the bytes, and the seconds it took."""
    t0 = time.monotonic()
    s.settimeout(timeout)
    got = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while piece := s.recv(65536):
            got += piece
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else None
    return status, bytes(got), time.monotonic() - t0


def flood(s: socket.socket, piece: bytes, most: int) -> tuple[int | None, int]:
    """Send ``piece`` again and again, up to ``most`` bytes, reading between
    sends, until the server answers: its status, and the bytes sent."""
    s.setblocking(False)
    sent = 0
    got = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(BlockingIOError):
            got = s.recv(65536)
            break
        if sent < most:
            with contextlib.suppress(BlockingIOError):
                sent += s.send(piece)
        else:
            time.sleep(0.01)
    s.setblocking(True)
    return (int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else None), sent


def head(path: str = "/v1/chat/completions", method: str = "POST", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", *(f"{k.replace('_', '-')}: {v}" for k, v in
                                                               headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- 1. the body ------------------------------------------------------------------------------

class Counted(bytes):
    """Bytes that count what joining them with ``+`` copies."""

    copied = 0

    def __add__(self, other: bytes) -> Counted:  # type: ignore[override]
        Counted.copied += len(self) + len(other)
        return Counted(bytes(self) + other)

    def __radd__(self, other: bytes) -> Counted:
        Counted.copied += len(self) + len(other)
        return Counted(other + bytes(self))


def test_the_body_is_collected_in_linear_work() -> None:
    # 20,000 pieces of 1 KiB: joining each to what came before copies 200 GB
    # (it was 156 s of CPU for 128 MiB); joined once, the body is copied once.
    n, piece = 20_000, Counted(b"x" * 1024)
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        return {"type": "http.request", "body": piece, "more_body": received < n}

    Counted.copied = 0
    body = asyncio.run(read_body({"headers": []}, receive, 64 << 20))
    assert isinstance(body, bytes) and len(body) == n * 1024 and received == n
    assert Counted.copied <= 2 * len(body)


def test_a_declared_body_past_the_limit_is_refused_before_it_is_read(server: Server) -> None:
    with server.connect() as s:
        # The headers only: the answer comes without a byte of the body.
        s.sendall(head(content_type="application/json", content_length=str(MAX_BODY + 1)))
        status, got, took = answer(s)
    assert status == 413 and took < SLACK
    assert b"connection: close" in got.lower()
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["message"] == (
        f"the request body is larger than {MAX_BODY:,} bytes, the largest this server reads")


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(server: Server) -> None:
    chunk = b"x" * (16 << 10)
    with server.connect() as s:
        s.sendall(head(content_type="application/json", transfer_encoding="chunked"))
        status, sent = flood(s, b"%x\r\n%s\r\n" % (len(chunk), chunk), 64 * MAX_BODY)
    assert status == 413
    # Refused when the total passed the limit: what was sent past it is what
    # the kernel's socket buffers hold on the way (a few MB on the loopback),
    # not the 64 MiB on offer.
    assert sent < 16 * MAX_BODY


def test_a_body_within_the_limit_is_served(server: Server) -> None:
    r = server.post(json.dumps({**REQUEST, "user": "x" * (MAX_BODY - 10_000)}).encode())
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Four."


def test_the_body_limit_is_an_option() -> None:
    assert gateway_module.MAX_BODY == 32 << 20
    assert Gateway(K3, vocab(), "http://127.0.0.1:1").max_body == 32 << 20
    bad: Any
    for bad in (0, -1, 1.5, "1M"):
        with pytest.raises(Exception, match="max_body must be a positive number of bytes"):
            Gateway(K3, vocab(), "http://127.0.0.1:1", max_body=bad)
    parser = argparse.ArgumentParser()
    serve_cli.add_commands(parser.add_subparsers())
    args = parser.parse_args(["serve", "--backend", "http://x", "--tokenizer", "t", "--max-body", "2MiB",
                              "--max-header-size", "8k", "--max-header-lines", "7", "--header-timeout", "2.5",
                              "--body-timeout", "4", "--max-connections", "9"])
    assert (args.max_body, args.max_header_size, args.max_header_lines, args.header_timeout, args.body_timeout,
            args.max_connections) == (2 << 20, 8192, 7, 2.5, 4.0, 9)
    defaults = parser.parse_args(["serve", "--backend", "http://x", "--tokenizer", "t"])
    assert (defaults.max_body, defaults.max_header_size, defaults.max_header_lines, defaults.header_timeout,
            defaults.body_timeout, defaults.max_connections) == (32 << 20, 64 << 10, 100, 10.0, 30.0, 1000)
    assert [serve_cli._size(s) for s in ("1", "1k", "1KiB", "1kB", "1.5M", "2GB", "3g")] == [
        1, 1024, 1024, 1000, 3 << 19, 2 * 10 ** 9, 3 << 30]
    for bad in ("", "0", "-1", "1x", "MiB", "nan", "inf", "1e30G"):
        with pytest.raises(argparse.ArgumentTypeError):
            serve_cli._size(bad)


# -- 2. the HTTP layer ------------------------------------------------------------------------

def test_a_head_too_large_is_a_431(server: Server) -> None:
    # One header line that never ends: httptools holds a line until it is
    # whole, so it is counted as it arrives.
    with server.connect() as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nx-big: ")
        status, sent = flood(s, b"a" * (64 << 10), 256 << 20)
    assert status == 431
    assert sent < 32 << 20
    # Whole lines past the size, and too many lines.
    for headers in ({f"x-{i}": "v" * 100 for i in range(39)}, {f"x-{i}": "v" for i in range(21)}):
        with server.connect() as s:
            s.sendall(head("/v1/models", "GET", **headers))
            status, got, _ = answer(s)
        assert status == 431, got[:300]
        assert b"header" in got
    # At the limits: served.
    with server.connect() as s:
        s.sendall(head("/v1/models", "GET", connection="close", **{f"x-{i}": "v" * 100 for i in range(18)}))
        assert answer(s)[0] == 200


def test_slow_heads_and_bodies_are_let_go(server: Server) -> None:
    def slow_head(s: socket.socket) -> None:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        for _ in range(3):
            time.sleep(0.4)
            s.sendall(b"x-a: b\r\n")  # each byte in time, the whole too late

    def silent(s: socket.socket) -> None:
        pass

    def slow_body(s: socket.socket) -> None:
        s.sendall(head(content_type="application/json", content_length="1000") + b'{"messages": ')

    for start, status in ((slow_head, 408), (silent, None), (slow_body, 408)):
        with server.connect() as s:
            t0 = time.monotonic()
            start(s)
            got, text, _ = answer(s)
            took = time.monotonic() - t0
        assert got == status, (start.__name__, text[:300])
        assert 0.9 < took < 1 + SLACK, start.__name__


def test_a_body_sent_in_time_is_not_cut(server: Server) -> None:
    body = json.dumps({**REQUEST, "stream": False}).encode()
    with server.connect() as s:
        s.sendall(head(content_type="application/json", content_length=str(len(body)), connection="close"))
        for k in range(0, len(body), 40):
            time.sleep(0.6 / (len(body) / 40))  # the body spread over 0.6 s, never idle for long
            s.sendall(body[k:k + 40])
        status, got, _ = answer(s)
    assert status == 200, got[-300:]


def test_a_kept_connection_idles_under_the_keep_alive_not_the_header_limit(server: Server) -> None:
    with server.connect() as s:
        for _ in range(2):
            s.sendall(head("/v1/models", "GET"))
            s.settimeout(5)
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(LIMITS.header_timeout + 0.5)


def test_connections_past_the_limit_are_refused_and_slow_ones_dropped(server: Server) -> None:
    held = [server.connect() for _ in range(LIMITS.connections)]
    try:
        for s in held:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")  # and then nothing
        time.sleep(0.2)
        with server.connect() as extra:
            status, got, took = answer(extra)
        assert status == 503 and took < SLACK, got[:300]
        t0 = time.monotonic()
        statuses = [answer(s)[0] for s in held]
        assert statuses == [408] * len(held)
        assert time.monotonic() - t0 < LIMITS.header_timeout + SLACK
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert httpx.get(server.url + "/v1/models", timeout=5).status_code == 200


def _rss_peak(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("VmHWM:"))) * 1024


def test_xtml_serve_holds_little_under_a_flood_of_headers_and_drops_slow_clients(engine: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "xtml", "serve", "--backend", engine,
         "--tokenizer", deepseek_path(), "--add-markers", "--port", str(port), "--log-level", "critical",
         "--max-header-size", "16KiB", "--header-timeout", "1", "--body-timeout", "1", "--max-connections", "60",
         "--max-body", "1MiB"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert "xtml serve: http://" in proc.stderr.readline()
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "xtml serve did not start"
            time.sleep(0.1)
        before = _rss_peak(proc.pid)
        # 8 connections, each sending up to 64 MiB of one header line: all
        # held, they would be 512 MiB (and more: the line is joined piece by piece).
        sent = 0
        statuses = []
        for _ in range(8):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /v1/models HTTP/1.1\r\nx-big: ")
                status, n = flood(s, b"a" * (64 << 10), 64 << 20)
                statuses.append(status)
                sent += n
        grown = _rss_peak(proc.pid) - before
        assert statuses == [431] * 8
        assert sent < 64 << 20, sent
        assert grown < 32 << 20, grown
        # 50 clients dribbling headers, 50 dribbling bodies: all let go.
        slow = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(50)]
        try:
            for k, s in enumerate(slow):
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n" if k % 2 else
                          head(content_type="application/json", content_length="100") + b"{")
            t0 = time.monotonic()
            assert [answer(s)[0] for s in slow] == [408] * 50
            assert time.monotonic() - t0 < 1 + SLACK
        finally:
            for s in slow:
                s.close()
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# -- 3. the body's content --------------------------------------------------------------------

@pytest.mark.parametrize(("content", "said"), [
    (b"{'messages': []}", "the request body is not JSON: Expecting property name enclosed in double quotes"),
    (b"", "the request body is not JSON: Expecting value"),
    (b'{"messages": [{"role": "user", "content": "\xff"}]}', "the request body is not UTF-8: byte 0xff at offset"),
    ('{"a": "é"}'.encode("utf-16"), "the request body is not UTF-8: byte 0xff at offset 0"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply: more than 64 levels of arrays and objects"),
    (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
     "nested too deeply: more than 64 levels of arrays and objects (at a)"),
    (b"[1, 2]", "the request body must be a JSON object, not an array"),
    (b'"messages"', "the request body must be a JSON object, not a string"),
    (b"null", "the request body must be a JSON object, not null"),
])
def test_a_body_that_is_no_json_object_says_why(server: Server, content: bytes, said: str) -> None:
    r = server.post(content)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith(said), error["message"]
    assert error["type"] == "invalid_request_error"


def test_a_body_declared_otherwise_than_json_is_a_415(server: Server) -> None:
    body = json.dumps(REQUEST).encode()
    for refused in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                    "application/json; charset=latin-1"):
        r = server.post(body, {"content-type": refused})
        assert r.status_code == 415, refused
        assert r.json()["error"]["message"].startswith("the request body must be")
    declared: list[str | None] = ["application/json", "Application/JSON; charset=UTF-8", "application/vnd.api+json",
                                  None]
    for ctype in declared:
        with httpx.Client() as c:
            req = c.build_request("POST", server.url + "/v1/chat/completions", content=body)
            if ctype is None:
                assert "content-type" not in req.headers
            else:
                req.headers["content-type"] = ctype
            r = c.send(req)
        assert r.status_code == 200, (ctype, r.text)


def test_long_values_are_quoted_short(server: Server) -> None:
    key = "9" * 5000
    r = server.post(json.dumps({**REQUEST, "logit_bias": {key: 1}}).encode())
    assert r.status_code == 400
    assert len(r.content) < 1500 and key not in r.text
    r = httpx.get(server.url + "/v1/models/" + "m" * 3000, timeout=10)
    assert r.status_code == 404 and len(r.content) < 400, r.text
