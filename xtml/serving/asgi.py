"""The HTTP plumbing of the apps in front of xtml (the gateway, the
playground): plain ASGI, no framework.

A request body is read within a limit (:func:`read_body`: a declared
length past it is refused before a byte is read), its content type checked
(:func:`content_type`) and its JSON read (:func:`read_json`); each refusal is
a :class:`Refused`, which the app words in its own error shape. A whole
answer goes out with :func:`respond`; :class:`Watch` cancels the task
serving a request when its client disconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive, Scope, Send

from ..errors import MAX_DEPTH, shown, too_deep
from ..plugins import jsonfmt

__all__ = ["SSE_HEADERS", "Refused", "Watch", "content_type", "read_body", "read_json", "respond", "too_large"]

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]
"""The head of a stream of server-sent events (no proxy may hold it back)."""

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "true or false", type(None): "null"}


@dataclass(frozen=True, slots=True)
class Refused:
    """A request refused before it was read as one: the status (400, 413,
    415), what to tell the client, and where in the body (``param``)."""

    status: int
    message: str
    param: str | None = None


def too_large(limit: int) -> Refused:
    return Refused(413, f"the request body is larger than {limit:,} bytes, the largest this server reads")


def content_type(headers: Iterable[tuple[bytes, bytes]], *, required: bool = False) -> Refused | None:
    """A 415 unless the body is declared UTF-8 JSON, or, unless
    ``required``, not declared at all (a page of another site can send a
    body without asking only as text or a form: an app that a browser can
    reach requires the declaration)."""
    for name, value in headers:
        if name != b"content-type":
            continue
        kind, _, params = value.decode("latin-1").partition(";")
        kind = kind.strip().lower()
        charset = next((v.strip().strip('"').lower() for k, _, v in (p.partition("=") for p in params.split(";"))
                        if k.strip().lower() == "charset"), "utf-8")
        if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
            if charset in ("utf-8", "utf8"):
                return None
            return Refused(415, f"the request body must be UTF-8 JSON, not charset {shown(charset)}")
        return Refused(415, f"the request body must be JSON (content-type: application/json), not {shown(kind)}")
    if required:
        return Refused(415, "the request body must be JSON sent with 'Content-Type: application/json' (this "
                            "request declares none)")
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | Refused | None:
    """The request body, a 413 past ``limit`` bytes, or None when the client
    left. The pieces are joined once: adding each to what came before
    copies it all again, quadratic in the body's size."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            # Said before it is sent: refused before a byte of it is read.
            return too_large(limit)
    pieces: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # the client left
        piece = message.get("body", b"")
        if piece:
            size += len(piece)
            if size > limit:
                return too_large(limit)
            pieces.append(piece)
        if not message.get("more_body"):
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def read_json(raw: bytes) -> dict[str, Any] | Refused:
    """The body as a JSON object, or the 400 that says what it is instead."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Refused(400, f"the request body is not UTF-8: byte {e.object[e.start]:#04x} at offset {e.start:,} "
                            f"({e.reason})")
    try:
        body = jsonfmt.read(text)
    except jsonfmt.TooDeep:
        # Deeper than the reader goes, so far past MAX_DEPTH: refused as
        # the request's check refuses a body that could be read.
        path = jsonfmt.deep_path_in_text(text, MAX_DEPTH) or []
        # A body that is an array has no message to name: it is no request.
        deep = too_deep(path if path and type(path[0]) is str else ())
        return Refused(400, str(deep), deep.location)
    except ValueError as e:
        return Refused(400, f"the request body is not JSON: {e}")
    if type(body) is not dict:
        return Refused(400, f"the request body must be a JSON object, not {_JSON_TYPES.get(type(body), 'a value')}")
    return body


async def respond(send: Send, status: int, body: bytes, *, close: bool = False) -> None:
    """A whole JSON answer, straight to the server; ``close``: the
    connection cannot serve another request (a body left unread)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Watch:
    """Cancels the task serving a request when its client disconnects, so
    that what it waits on (the engine) is given up at once, not at the next
    write. One task per request watches."""

    __slots__ = ("_task", "_watcher", "gone")

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._task: asyncio.Task[Any] | None = asyncio.current_task()
        self._watcher = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        task = self._task
        if task is not None:
            self.gone = True
            task.cancel()

    def stop(self) -> None:
        """No cancelling from now on: the answer is being written to its end."""
        self._task = None
        self._watcher.cancel()

    def forgive(self) -> bool:
        """Take back the cancel of a client that left; false for any other
        cancel (the server stopping), which goes on."""
        task = asyncio.current_task()
        if not self.gone or task is None:
            return False
        task.uncancel()
        return True
