"""A bearer key in front of an ASGI app: ``--api-key`` of ``xtml serve`` and
``xtml playground``.

Clients send ``Authorization: Bearer KEY`` (the openai SDK does so with its
``api_key``); a request to a guarded path without it is answered 401 before
the app sees it, with an OpenAI error object, as vLLM's and llama-server's
``--api-key`` do. The key is compared in constant time
(:func:`hmac.compare_digest`), so the answer's timing tells nothing of how
much of a guess was right.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["API_KEY_ENV", "BearerGuard", "api_key_from", "check_api_key"]

API_KEY_ENV = "XTML_API_KEY"
"""The environment variable ``--api-key`` falls back to (a key on the command
line is visible to every user of the machine in the process list)."""

_UNAUTHORIZED = json.dumps({"error": {
    "message": "a valid API key is required: send 'Authorization: Bearer KEY'",
    "type": "authentication_error", "param": None, "code": "invalid_api_key"}}).encode()


def check_api_key(key: str) -> None:
    """Raise ValueError unless ``key`` can be sent as a bearer token: one
    or more visible ASCII characters. A space, a control character or a
    non-ASCII one would make a key that no client's header carries as
    given (header values are trimmed, and encoded as each client likes), so
    the server would answer 401 to everyone."""
    if not key:
        raise ValueError("an API key must not be empty")
    bad = next((c for c in key if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(f"an API key is visible ASCII characters only, without spaces: it holds {bad!r}")


def api_key_from(given: str | None) -> str | None:
    """The key in force: ``given`` (the command line's), else
    :data:`API_KEY_ENV`'s value; an empty value is no key."""
    key = given if given is not None else os.environ.get(API_KEY_ENV)
    return key or None


class BearerGuard:
    """``app``, answering 401 to every HTTP request whose path ``guarded``
    says is guarded and that lacks ``Authorization: Bearer KEY``."""

    __slots__ = ("_want", "app", "guarded")

    def __init__(self, app: ASGIApp, key: str, guarded: Callable[[str], bool]) -> None:
        check_api_key(key)
        self.app = app
        self.guarded = guarded
        # Compared as bytes: compare_digest takes str only when it is ASCII.
        self._want = b"Bearer " + key.encode()

    def allowed(self, scope: Scope) -> bool:
        """Whether the request of ``scope`` carries the key."""
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        # The scheme's name is case-insensitive (RFC 9110, section 11.1).
        if given[:7].lower() == b"bearer ":
            given = b"Bearer " + given[7:].strip()
        return hmac.compare_digest(given, self._want)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.guarded(scope["path"]) and not self.allowed(scope):
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(_UNAUTHORIZED)).encode()),
                (b"www-authenticate", b'Bearer realm="xtml"')]})
            await send({"type": "http.response.body", "body": _UNAUTHORIZED})
            return
        await self.app(scope, receive, send)
