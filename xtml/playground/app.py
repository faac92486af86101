"""The playground's HTTP side: one page (``static/``, shipped in the
package) and the JSON API behind it, a Starlette app that uvicorn serves
with the gateway's HTTP limits (:mod:`xtml.serving.limits`).

``GET /`` is the page, ``GET /static/NAME`` its files, ``GET /api/info``
what it starts with (templates, tokenizer, the example request and
completion); ``POST /api/render``, ``/api/parse``, ``/api/stream`` and
``/api/grammar`` compute the views (:mod:`.views`). A bad call is a 400
whose error names the field (``{"error": {"message", "field", "param",
"line", "column"}}``), a body past the limit a 413, never a 500.

Any web page the user visits can send requests to a server on their
machine, so the app answers only requests that a page of its own could
have sent: a ``Host`` header naming the address it listens on (else 421:
a page of another site whose name was made to resolve to this address, DNS
rebinding), and API bodies sent as ``Content-Type: application/json``
(else 415: a cross-site page may send ``text/plain`` without asking, JSON
only after a CORS preflight this server never grants). With an API key
(``--api-key``), ``/api/*`` also needs ``Authorization: Bearer KEY``; the
page and its files stay open, and the page sends the key it was given in
its address's fragment.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import MAX_DEPTH, XtmlError, too_deep
from ..plugins import jsonfmt
from ..serving.asgi import Refused, content_type, read_body, read_json
from ..serving.auth import BearerGuard
from ..serving.gateway import MAX_BODY
from ..vocab.vocabulary import Vocabulary
from .views import FieldError, Session, example_completion, templates

__all__ = ["STATIC", "HostCheck", "create_app"]

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


class HostCheck:
    """``app``, answering 421 to every HTTP request whose ``Host`` header
    does not name the address the server listens on.

    A browser sends the name it looked up, so a page of another site whose
    name was rebound to this address (DNS rebinding) names that site, and is
    refused; an address written out (``127.0.0.1``, ``[::1]``) cannot be
    rebound. The names are the listening host's, ``localhost`` and the
    loopback addresses, and the ``allow`` ones (a name given to a proxy in
    front); listening on every interface (``0.0.0.0``, ``::``) also takes
    any address and this machine's host name."""

    __slots__ = ("addresses", "any_address", "app", "names")

    def __init__(self, app: ASGIApp, host: str, allow: Iterable[str] = ()) -> None:
        self.app = app
        listen = _bare(host)
        self.names = {"localhost", *(_bare(n) for n in allow)}
        self.addresses: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
        self.any_address = False
        address = _address(listen)
        if address is not None:
            self.any_address = address.is_unspecified
            self.addresses.add(address)
        elif listen:
            self.names.add(listen)
            self.addresses.update(_resolved(listen))
        else:
            self.any_address = True
        if self.any_address:
            self.names.add(socket.gethostname().lower())

    def allowed(self, value: str) -> bool:
        """Whether a ``Host`` header's value names this server."""
        name = _bare(_without_port(value))
        if not name:
            return False
        address = _address(name)
        if address is None:
            return name in self.names
        return address.is_loopback or self.any_address or address in self.addresses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v for k, v in scope.get("headers", ()) if k == b"host"), b"")
            value = host.decode("latin-1")
            if not self.allowed(value):
                shown = value[:80] or "no Host header"
                await _error(421, f"this server answers to the address it listens on, not {shown!r}: a page that "
                                  "reached it through another name is refused (add the name with --allow-host "
                                  "if it is yours)", "host")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _bare(host: str) -> str:
    """A host name or address as compared: lower case, an IPv6 address
    without its brackets."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def _without_port(value: str) -> str:
    value = value.strip()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def _resolved(name: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses a listening host name stands for, as written out by a
    browser pointed at one of them."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    return {a for *_, sockaddr in infos if (a := _address(str(sockaddr[0]))) is not None}


class _Api:
    def __init__(self, session: Session, max_body: int) -> None:
        self.session = session
        self.max_body = max_body

    async def _body(self, request: Request) -> dict[str, Any] | Response:
        # A cross-site page may send a text/plain (or form) body without
        # asking, or one that declares no type; JSON needs a CORS preflight,
        # never granted.
        refused = content_type(request.scope["headers"], required=True)
        if refused is None:
            raw = await read_body(request.scope, request.receive, self.max_body)
            if raw is None:
                return Response(status_code=400)  # the client left: nobody reads this
            refused = raw if isinstance(raw, Refused) else None
            if refused is None:
                assert isinstance(raw, bytes)
                body = read_json(raw)
                if not isinstance(body, Refused):
                    # Its depth measured once, here: every view then works
                    # on values no deeper than a request may be (a request
                    # sits one level down, in its field).
                    path = jsonfmt.deep_path(body, MAX_DEPTH + 1)
                    if path is None:
                        return body
                    deep = too_deep(path[1:])
                    body = Refused(400, str(deep), ".".join(map(str, path[:1])) or None)
                refused = body
        code = refused.status if refused.status != 400 else None
        return _error(refused.status, refused.message, refused.param, **({"code": code} if code else {}))

    def endpoint(self, view: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Request],
                                                                                      Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            body = await self._body(request)
            if isinstance(body, Response):
                return body
            try:
                # The views tokenize and parse: off the event loop.
                result = await run_in_threadpool(view, body)
            except FieldError as e:
                return JSONResponse({"error": e.to_json()}, status_code=400, headers=_HEADERS)
            except XtmlError as e:
                return _error(400, str(e), getattr(e, "location", None))
            return JSONResponse(result, headers=_HEADERS)

        return handle


def create_app(tokenizer: Vocabulary | None = None, *, template: str = "kimi-k3", tokenizer_name: str | None = None,
               max_body: int = MAX_BODY, host: str = "127.0.0.1", allow_hosts: Iterable[str] = (),
               api_key: str | None = None) -> ASGIApp:
    """The playground app. ``tokenizer`` None: a small byte-level BPE made
    on the spot for each template (no file, no network). ``template`` is the
    one the page opens with (a built-in name or a template file's path).
    ``host`` is the address it listens on: requests naming another in their
    ``Host`` header are refused (see :class:`HostCheck`, and ``allow_hosts``
    for more names); ``api_key`` guards ``/api/*``."""
    session = Session(tokenizer, tokenizer_name=tokenizer_name or (
        "a small byte-level BPE made on the spot (--tokenizer for your model's)" if tokenizer is None
        else "the tokenizer given"))
    opening: dict[str, Any] = {"name": template}
    from ..chat.template_file import BUILTIN, LAYOUT_BUILTIN

    if template not in BUILTIN and template not in LAYOUT_BUILTIN:
        with open(template, encoding="utf-8") as f:
            opening = {"toml": f.read()}
        # The operator's own file may read local files, as it would with
        # xtml render: it is the one template the API takes that from.
        session.trusted.add(opening["toml"])
        session.template(opening)  # a bad file fails now, not in the page
    else:
        session.default_template = template
    # A completion in the opening template's own format, for the views that
    # read one: the example's is in K3's.
    completion = example_completion(session.template(opening)) or _static("completion.txt").decode("utf-8")
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
                             "completion": completion}, headers=_HEADERS)

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/static/{name}", static, methods=["GET"]),
        Route("/api/info", info, methods=["GET"]),
        Route("/api/render", api.endpoint(session.render), methods=["POST"]),
        Route("/api/parse", api.endpoint(session.parse), methods=["POST"]),
        Route("/api/stream", api.endpoint(session.stream), methods=["POST"]),
        Route("/api/grammar", api.endpoint(session.grammar), methods=["POST"]),
    ]
    app: ASGIApp = Starlette(routes=routes)
    if api_key is not None:
        app = BearerGuard(app, api_key, lambda path: path.startswith("/api/"))
    return HostCheck(app, host, allow_hosts)
