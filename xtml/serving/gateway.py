"""``xtml serve``: an OpenAI-compatible chat endpoint in front of an engine
that takes and gives token ids.

:func:`create_app` makes a Starlette app with

* ``POST /v1/chat/completions`` — the request is checked and rendered to ids
  by the chat layer (unknown keys ignored, as clients send many; bad messages
  refused), the ids go to the backend (:mod:`.engines`), and the ids that
  come back are parsed as they arrive (:class:`~xtml.codec.stream.StreamParser`)
  into ``chat.completion.chunk`` server-sent events (:class:`~.openai.ChunkStream`),
  or parsed whole into a ``chat.completion`` (:func:`~.openai.chat_completion`);
* ``POST /v1/responses`` — the Responses API, on the same path: the request
  is translated to the chat request it stands for and the answer back to a
  ``response`` object or its typed events (:mod:`.responses`), with
  ``previous_response_id`` served from a bounded store; ``GET`` and
  ``DELETE /v1/responses/{id}`` for a stored one;
* ``GET /v1/models`` — the one model served;
* ``GET /health`` — 200 when the backend says it is ready, else 503.

With an API key (``api_key``), every other path answers 401 unless the
request carries ``Authorization: Bearer KEY`` (:mod:`.auth`).

Errors are OpenAI error objects, ``{"error": {"message", "type", "param",
"code"}}``: 400 for a bad request (``param`` names where: ``messages[2].role``),
502 when the backend is unreachable, fails or answers garbage, 504 when it
times out. Model output never fails a request: it is parsed leniently and
what was repaired is in ``xtml_diagnostics``. A failure after a stream has
started ends it with one ``data: {"error": {...}}`` event and ``data:
[DONE]``, as vLLM and SGLang do (the openai SDK raises it as an
``APIError``). A client that disconnects cancels its backend request: the
connection to the backend is closed, which engines take as an abort.

The app is read by its files: the routing and the endpoints here; the
HTTP plumbing (body, content type, JSON) in :mod:`.asgi`; one request
check per API in :mod:`.checks`; the answer paths, whole and streamed, in
:mod:`.answers`, each choice through :class:`~.choice.Choice`; what a
client is told of a failure in :mod:`.faults`. The two chat endpoints are
plain ASGI, served ahead of Starlette's middleware (which wraps every
``send`` of a stream): one table of routes says which.

The template and tokenizer are given by the caller (the command line loads
them); the module needs starlette (``pip install 'xtml[serve]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import OptionError, XtmlError, shown
from . import answers
from .asgi import Refused, content_type, read_body, read_json, respond
from .auth import BearerGuard, check_api_key
from .checks import MAX_TOOLS, chat_job, responses_job
from .chunks import SSE
from .engines import BACKENDS, Backend, BackendError, dumps
from .faults import error_body, internal, refused, request_error
from .responses import MAX_AGE, MAX_BYTES, MAX_ENTRIES, Exchange, ResponseStore
from .served import Job, Served

if TYPE_CHECKING:
    from ..template import Template
    from ..vocab.vocabulary import Vocabulary

__all__ = ["GRAMMAR_FORMATS", "MAX_TOOLS", "SSE", "Gateway", "check_backend_url", "create_app"]

MAX_BODY = 32 << 20
"""The largest request body read by default, in bytes (``max_body``): a
chat request's text and images, with room to spare; larger is a 413."""
GRAMMAR_FORMATS = ("llguidance", "gbnf")
"""The grammar syntaxes sent to an engine: llguidance's Lark (every kind's
llguidance backend) or GBNF (llama.cpp's own grammar sampler)."""
KEEP_ALIVE = 65
"""Seconds an idle client connection is kept open: longer than the 5 s
clients (httpx, the openai SDK) keep one, so that the server never closes a
connection just as a client sends its next request on it."""
_THREAD_BODY = 64 << 10
"""Requests larger than this (their body, and the stored conversation a
Responses follow-up continues) are rendered in a worker thread, so that a
long prompt does not hold up the streams of other requests."""


def _error_response(status: int, message: str, *, type: str, param: str | None = None,
                    code: str | int | None = None) -> Response:
    return Response(error_body(message, type=type, param=param, code=code), status_code=status,
                    media_type="application/json")


def _json_response(data: Any) -> Response:
    return Response(dumps(data), media_type="application/json")


class Gateway:
    """The state of one served model: template, tokenizer, backend.

    ``template`` is an :class:`xtml.Template`, ``tokenizer`` what it takes
    (a :class:`~xtml.Vocabulary`, a path ...). ``backend`` is the engine's
    base URL, ``kind`` one of :data:`.engines.KINDS`. ``model`` is the name
    served (in ``/v1/models`` and every response; default: the template's
    name) and, when ``backend_model`` is None, nothing is sent to the
    engine as its model. ``timeout`` (seconds) bounds each wait on the
    backend: connecting, and each read. ``grammar=False`` sends no
    completion grammar to the backend; ``grammar_format`` is the syntax
    of the one sent (:data:`GRAMMAR_FORMATS`; default: ``gbnf`` for
    llama.cpp, whose builds mostly lack llguidance, else ``llguidance``).
    ``max_body`` is the largest
    request body read, in bytes (default :data:`MAX_BODY`): past it the
    answer is a 413, before the rest is read. ``store_entries``,
    ``store_bytes`` and ``store_age`` (seconds) bound the responses kept for the Responses
    API's ``previous_response_id`` (:class:`~.responses.ResponseStore`).
    ``api_key``: every path but ``/health`` answers 401 to a request without
    ``Authorization: Bearer`` and this key (:class:`~.auth.BearerGuard`)."""

    def __init__(self, template: Template, tokenizer: Any, backend: str, *, kind: str = "vllm",
                 model: str | None = None, backend_model: str | None = None, timeout: float = 600.0,
                 grammar: bool = True, grammar_format: str | None = None, max_body: int = MAX_BODY,
                 store_entries: int = MAX_ENTRIES, store_age: float = MAX_AGE,
                 store_bytes: int = MAX_BYTES, api_key: str | None = None) -> None:
        if kind not in BACKENDS:
            raise OptionError(f"backend kind must be one of {', '.join(BACKENDS)}, not {kind!r}",
                              option="backend_kind")
        render_only: tuple[str, ...] = getattr(getattr(template, "layout", None), "render_only", ())
        if render_only:
            # Refused before anything listens: every answer would be read
            # back by a reader the dialect does not have yet.
            raise OptionError(f"the layout dialect {template.name!r} renders only (it writes "
                              f"{', '.join(render_only)}): xtml serve reads answers back, which is not yet "
                              "available for it", option="template")
        if grammar_format is None:
            grammar_format = "gbnf" if kind == "llamacpp" else "llguidance"
        if grammar_format not in GRAMMAR_FORMATS or (grammar_format == "gbnf" and kind != "llamacpp"):
            raise OptionError(f"grammar format must be llguidance{' or gbnf' if kind == 'llamacpp' else ''} for "
                              f"the {kind} backend, not {grammar_format!r}", option="grammar_format")
        check_backend_url(backend)
        if type(max_body) is not int or max_body < 1:
            raise OptionError(f"max_body must be a positive number of bytes, not {shown(max_body)}",
                              option="max_body")
        self.max_body = max_body
        if api_key is not None:
            try:
                check_api_key(api_key)
            except ValueError as e:
                raise OptionError(str(e), option="api_key") from None
        self.api_key = api_key
        try:
            self.store = ResponseStore(store_entries, store_age, max_bytes=store_bytes)
        except ValueError as e:
            option = next(o for o in ("store_entries", "store_age", "store_bytes") if o[6:] in str(e))
            raise OptionError(str(e), option=option) from None
        self.template = template
        self.binding = template.bind(tokenizer)
        self.vocab: Vocabulary = self.binding.vocab
        self.url = backend
        self.kind = kind
        self.model = model or backend_model or template.name
        self.backend_model = backend_model
        self.timeout = timeout
        self.grammar = grammar
        self.grammar_format = grammar_format
        self.served = Served(template, self.vocab, self.binding, self.model, kind, grammar, grammar_format)
        self.created = int(time.time())
        self._backend: Backend | None = None

    # -- the app -----------------------------------------------------------------------

    def app(self) -> Starlette:
        """The Starlette app."""
        routes = [
            Route("/v1/chat/completions", _Direct(self.serve_chat), methods=["POST"]),
            Route("/v1/responses", _Direct(self.serve_responses), methods=["POST"]),
            Route("/v1/responses/{id}", self.stored_response, methods=["GET", "DELETE"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model_card, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ]
        return _App(routes, self.api_key, lifespan=self._lifespan,
                    exception_handlers={HTTPException: self._http_error, Exception: self._server_error})

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        backend = BACKENDS[self.kind](self.url, model=self.backend_model, timeout=self.timeout)
        self._backend = backend
        # What every stream reads its tokens through, built before the first
        # request instead of inside it (about 0.13 s for a 130,000-id vocabulary).
        self.binding.text_strs()
        try:
            yield
        finally:
            self._backend = None
            await backend.aclose()

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("the app has not started (its lifespan makes the backend client)")
        return self._backend

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return _error_response(exc.status_code, str(exc.detail), type=kind, code=exc.status_code)

    async def _server_error(self, request: Request, exc: Exception) -> Response:
        return _error_response(500, internal("a request failed", exc), type="server_error", code=500)

    # -- endpoints ---------------------------------------------------------------------

    def _card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.created, "owned_by": "xtml"}

    async def models(self, request: Request) -> Response:
        return _json_response({"object": "list", "data": [self._card()]})

    async def model_card(self, request: Request) -> Response:
        """``GET /v1/models/{model}`` (the SDK's ``models.retrieve``)."""
        name = request.path_params["model"]
        if name != self.model:
            return _error_response(404, f"the model {shown(name)} does not exist: this server serves {self.model!r}",
                          type="invalid_request_error", code="model_not_found")
        return _json_response(self._card())

    async def health(self, request: Request) -> Response:
        try:
            await self.backend.health()
        except BackendError as e:
            return _error_response(503, str(e), type="backend_error", code=e.code)
        return _json_response({"status": "ok", "backend": self.url, "kind": self.kind, "model": self.model})

    async def serve_chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/chat/completions``, as an ASGI app."""
        await self._serve(scope, receive, send, False)

    async def serve_responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/responses``, as an ASGI app: the request is translated
        to a chat completion's (:mod:`.responses`) and served on its path."""
        await self._serve(scope, receive, send, True)

    async def stored_response(self, request: Request) -> Response:
        """``GET`` (the SDK's ``responses.retrieve``) and ``DELETE
        /v1/responses/{id}`` of a stored response."""
        id = request.path_params["id"]
        if request.method == "DELETE":
            if self.store.delete(id):
                return _json_response({"id": id, "object": "response", "deleted": True})
        else:
            stored = self.store.response_json(id)
            if stored is not None:
                return Response(stored, media_type="application/json")
        return _error_response(404, f"no response with id {shown(id)} is stored here", type="invalid_request_error",
                      code="not_found")

    async def _serve(self, scope: Scope, receive: Receive, send: Send, responses: bool) -> None:
        try:
            await self._answer(scope, receive, send, responses)
        except Exception as e:  # a fault of the gateway itself, before its answer started
            message = internal("a chat completion failed", e)
            with contextlib.suppress(Exception):
                await respond(send, 500, error_body(message, type="server_error", code=500))

    async def _answer(self, scope: Scope, receive: Receive, send: Send, responses: bool) -> None:
        no = content_type(scope["headers"])
        if no is not None:
            await respond(send, *refused(no))
            return
        raw = await read_body(scope, receive, self.max_body)
        if raw is None:
            return  # the client left
        if isinstance(raw, Refused):
            # The rest of the body is not read: the connection cannot serve another request.
            await respond(send, *refused(raw), close=True)
            return
        body = read_json(raw)
        if isinstance(body, Refused):
            await respond(send, *refused(body))
            return
        api: list[Exchange] = []
        try:
            if self._render_size(body, len(raw), responses) > _THREAD_BODY:
                job = await asyncio.to_thread(self._job, body, responses, api)
            else:
                job = self._job(body, responses, api)
        except XtmlError as e:
            await respond(send, *request_error(e, api[0] if api else None))
            return
        answer = answers.stream if job.stream else answers.complete
        await answer(self.served, self.backend, job, receive, send)

    def _render_size(self, body: Mapping[str, Any], size: int, responses: bool) -> int:
        """The bytes of what a request renders: its body, and for a
        Responses follow-up the stored conversation it continues (a
        100-byte body can name megabytes of it)."""
        previous = body.get("previous_response_id") if responses else None
        if isinstance(previous, str):
            size += self.store.size(previous) or 0
        return size

    def _job(self, body: Any, responses: bool, made: list[Exchange]) -> Job:
        return self.responses_job(body, made) if responses else self.job(body)

    def job(self, body: Any) -> Job:
        """Check a chat-completions body and render its prompt
        (:func:`.checks.chat_job`)."""
        return chat_job(self.served, body)

    def responses_job(self, body: Any, made: list[Exchange] | None = None) -> Job:
        """Check a Responses body and render its prompt
        (:func:`.checks.responses_job`)."""
        return responses_job(self.served, self.store, body, made)


class _Direct:
    """An ASGI app as a Starlette route's endpoint (a bound method would be
    taken for a request-response function), which :class:`_App` serves
    ahead of the middleware."""

    __slots__ = ("app",)

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _guarded(path: str) -> bool:
    """Whether a path needs the API key: all but the health check, which a
    load balancer or orchestrator asks without one."""
    return path != "/health"


class _App(Starlette):
    """Starlette over one table of routes, with those whose endpoint is
    :class:`_Direct` served ahead of its middleware and routing: those wrap
    every ``send`` of a stream, and the endpoint handles its own errors.
    With an API key, :class:`~.auth.BearerGuard` stands in front of all of
    it (the key is checked before any endpoint runs)."""

    def __init__(self, routes: list[Route], api_key: str | None, **options: Any) -> None:
        super().__init__(routes=routes, **options)
        self._direct = {(method, r.path): r.endpoint for r in routes if isinstance(r.endpoint, _Direct)
                        for method in r.methods or ()}
        self._front: ASGIApp = self._route if api_key is None else BearerGuard(self._route, api_key, _guarded)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._front(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request to its endpoint (past the guard)."""
        if scope["type"] == "http":
            direct = self._direct.get((scope["method"], scope["path"]))
            if direct is not None:
                scope["app"] = self
                await direct(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def check_backend_url(backend: str) -> None:
    """Raise :class:`~xtml.OptionError` unless ``backend`` is an http(s) URL
    with a host (and a port, if any, that is one)."""
    try:
        parts = urlsplit(backend)
        parts.port  # noqa: B018 - read for its check: a port that is no number, or past 65535, raises
    except ValueError as e:
        raise OptionError(f"the backend {backend!r} is not a URL: {e}", option="backend") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in backend):
        raise OptionError(f"the backend must be an http:// or https:// URL, not {backend!r}", option="backend")


def create_app(template: Template, tokenizer: Any, backend: str, **options: Any) -> Starlette:
    """The gateway's Starlette app; ``options`` are :class:`Gateway`'s."""
    return Gateway(template, tokenizer, backend, **options).app()
