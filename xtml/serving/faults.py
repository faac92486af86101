"""What a client of the gateway is told when its request fails: OpenAI
error objects, ``{"error": {"message", "type", "param", "code"}}``, whole
(a 400 naming the field, a backend's 502 or 504) or as the last event of a
stream that had started; a fault of the server's own is told by an id
that the log has with the traceback."""

from __future__ import annotations

import json
import logging
import secrets

from ..errors import OptionError, XtmlError
from .asgi import Refused
from .engines import BackendError
from .openai import SSE_DONE
from .responses import Exchange

__all__ = ["backend_error", "error_body", "error_event", "internal", "refused", "request_error"]

log = logging.getLogger("xtml.serve")

_MESSAGE_LIMIT = 1000
"""Characters of an error message sent: one that quotes a client's value
at length is cut, whatever check wrote it."""


def error_body(message: str, *, type: str, param: str | None = None, code: str | int | None = None) -> bytes:
    if len(message) > _MESSAGE_LIMIT:
        message = f"{message[:_MESSAGE_LIMIT]}… ({len(message):,} characters)"
    if param is not None and len(param) > _MESSAGE_LIMIT // 10:
        param = f"{param[:_MESSAGE_LIMIT // 10]}… ({len(param):,} characters)"
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}},
                      ensure_ascii=False).encode()


def refused(r: Refused) -> tuple[int, bytes]:
    """A body refused before it was read as a request (413, 415: the status
    is the code too)."""
    return r.status, error_body(r.message, type="invalid_request_error", param=r.param,
                                code=r.status if r.status != 400 else None)


def request_error(e: XtmlError, api: Exchange | None = None) -> tuple[int, bytes]:
    # A message's location is its path (messages[2].role); an option's is
    # worded for people ("option 'tool_choice'"), so its name is the param.
    param = e.option if isinstance(e, OptionError) else e.location
    message = str(e)
    if api is not None:
        # A Responses request's messages are its items: say which.
        message = api.where(message)
        param = api.where(param) if param is not None else None
    status = getattr(e, "status", 400)
    return status, error_body(message, type="invalid_request_error", param=param,
                              code="previous_response_not_found" if status == 404 else None)


def backend_error(e: BackendError) -> tuple[int, bytes]:
    kind = "invalid_request_error" if e.status == 400 else "backend_error"
    return e.status, error_body(str(e), type=kind, code=e.code)


def internal(what: str, exc: BaseException) -> str:
    """What a client is told of a fault of the server's own: an id, which
    the log has with the traceback. The exception's text stays in the log
    (it may quote anything the server holds: a path, a key, another
    request's data)."""
    ref = secrets.token_hex(6)
    log.error("%s (error id %s)", what, ref, exc_info=exc)
    return f"internal error, id {ref}: the server's log has the details"


def error_event(message: str, *, type: str, code: str | int | None) -> str:
    """The end of a chat completion's stream that failed: the error object
    as its last event, then ``[DONE]``."""
    return "data: " + error_body(message, type=type, code=code).decode() + "\n\n" + SSE_DONE
