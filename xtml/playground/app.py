"""The playground's HTTP side: one page (``static/``, shipped in the
package) and the JSON API behind it, a Starlette app that uvicorn serves
with the gateway's HTTP limits (:mod:`xtml.serving.limits`).

``GET /`` is the page, ``GET /static/NAME`` its files, ``GET /api/info``
what it starts with (templates, tokenizer, the example request and
completion); ``POST /api/render``, ``/api/parse``, ``/api/stream`` and
``/api/grammar`` compute the views (:mod:`.views`). A bad call is a 400
whose error names the field (``{"error": {"message", "field", "param",
"line", "column"}}``), a body past the limit a 413, never a 500.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import XtmlError
from ..serving.gateway import MAX_BODY
from ..vocab.vocabulary import Vocabulary
from .views import FieldError, Session, templates

__all__ = ["STATIC", "create_app"]

STATIC = {"index.html": "text/html; charset=utf-8", "app.css": "text/css; charset=utf-8",
          "app.js": "text/javascript; charset=utf-8", "example.json": "application/json",
          "completion.txt": "text/plain; charset=utf-8"}
"""The page's files and their types: nothing else is served."""

# The page loads nothing from another host, and this says so to the browser
# too: a script or style from elsewhere is refused, not fetched.
_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                               "frame-ancestors 'none'; form-action 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _error(status: int, message: str, field: str | None = None, **more: Any) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "field": field,
                                   "param": field, "line": None, "column": None, **more}},
                        status_code=status, headers=_HEADERS)


class _Api:
    def __init__(self, session: Session, max_body: int) -> None:
        self.session = session
        self.max_body = max_body

    async def _body(self, request: Request) -> dict[str, Any] | JSONResponse:
        length = request.headers.get("content-length", "")
        too_large = _error(413, f"the request body is larger than {self.max_body:,} bytes, the largest this "
                                "server reads", code=413)
        if length.isdigit() and int(length) > self.max_body:
            return too_large
        pieces: list[bytes] = []
        size = 0
        async for piece in request.stream():
            size += len(piece)
            if size > self.max_body:
                return too_large
            pieces.append(piece)
        try:
            body = json.loads(b"".join(pieces).decode("utf-8"))
        except UnicodeDecodeError as e:
            return _error(400, f"the request body is not UTF-8 (byte {e.start:,})")
        except RecursionError:
            return _error(400, "the request body nests arrays and objects deeper than the JSON parser reads")
        except ValueError as e:
            return _error(400, f"the request body is not JSON: {e}")
        if type(body) is not dict:
            return _error(400, "the request body must be a JSON object")
        return body

    def endpoint(self, view: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Request],
                                                                                      Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            body = await self._body(request)
            if isinstance(body, JSONResponse):
                return body
            try:
                # The views tokenize and parse: off the event loop.
                result = await run_in_threadpool(view, body)
            except FieldError as e:
                return JSONResponse({"error": e.to_json()}, status_code=400, headers=_HEADERS)
            except XtmlError as e:
                return _error(400, str(e), getattr(e, "location", None))
            except RecursionError:
                return _error(400, "the input nests deeper than it can be read")
            return JSONResponse(result, headers=_HEADERS)

        return handle


def create_app(tokenizer: Vocabulary | None = None, *, template: str = "kimi-k3", tokenizer_name: str | None = None,
               max_body: int = MAX_BODY) -> Starlette:
    """The playground app. ``tokenizer`` None: a small byte-level BPE made
    on the spot for each template (no file, no network). ``template`` is the
    one the page opens with (a built-in name or a template file's path)."""
    session = Session(tokenizer, tokenizer_name=tokenizer_name or (
        "a small byte-level BPE made on the spot (--tokenizer for your model's)" if tokenizer is None
        else "the tokenizer given"))
    opening: dict[str, Any] = {"name": template}
    from ..chat.template_file import BUILTIN

    if template not in BUILTIN:
        with open(template, encoding="utf-8") as f:
            opening = {"toml": f.read()}
        session.template(opening)  # a bad file fails now, not in the page
    else:
        session.default_template = template
    api = _Api(session, max_body)

    async def page(request: Request) -> Response:
        return Response(_static("index.html"), media_type=STATIC["index.html"], headers=_HEADERS)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return _error(404, f"no such file: {name[:60]}")
        return Response(_static(name), media_type=STATIC[name], headers=_HEADERS)

    async def info(request: Request) -> Response:
        return JSONResponse({"templates": templates(), "template": opening, "tokenizer": session.tokenizer_name,
                             "example": _static("example.json").decode("utf-8"),
                             "completion": _static("completion.txt").decode("utf-8")}, headers=_HEADERS)

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/static/{name}", static, methods=["GET"]),
        Route("/api/info", info, methods=["GET"]),
        Route("/api/render", api.endpoint(session.render), methods=["POST"]),
        Route("/api/parse", api.endpoint(session.parse), methods=["POST"]),
        Route("/api/stream", api.endpoint(session.stream), methods=["POST"]),
        Route("/api/grammar", api.endpoint(session.grammar), methods=["POST"]),
    ]
    return Starlette(routes=routes)
