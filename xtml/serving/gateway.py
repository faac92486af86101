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

The chat endpoint is plain ASGI, ahead of Starlette's routing and
middleware (which serve the rest): a stream's events are written as one
payload per read from the engine, each ``send`` straight to the server.

The template and tokenizer are given by the caller (the command line loads
them); the module needs starlette (``pip install 'xtml[serve]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..chat import fields
from ..chat.request import TEXT_PART_TYPES
from ..errors import MessageError, OptionError, RequestError, XtmlError, shown
from .auth import BearerGuard, check_api_key
from .engines import BACKENDS, Backend, BackendError, Generation, Piece, dumps, one_choice, sampling
from .openai import (
    SSE_DONE,
    ChunkStream,
    FunctionCalls,
    Shaped,
    StopSequences,
    chat_completion,
    shape_message,
    sse,
)
from .responses import MAX_AGE, MAX_BYTES, MAX_ENTRIES, Exchange, ResponseStore, translate

if TYPE_CHECKING:
    from ..template import Template
    from ..vocab.vocabulary import Vocabulary

__all__ = ["GRAMMAR_FORMATS", "SSE", "Gateway", "create_app"]

log = logging.getLogger("xtml.serve")

MAX_BODY = 32 << 20
"""The largest request body read by default, in bytes (``max_body``): a
chat request's text and images, with room to spare; larger is a 413."""
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "true or false", type(None): "null"}
_MESSAGE_LIMIT = 1000
"""Characters of an error message sent: one that quotes a client's value
at length is cut, whatever check wrote it."""
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

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]
_FINISH = 1.0
"""Seconds a stream whose message has ended waits, after answering, for the
engine's closing events: the connection is then used again, not closed."""


def _error_body(status: int, message: str, *, type: str, param: str | None = None,
                code: str | int | None = None) -> bytes:
    if len(message) > _MESSAGE_LIMIT:
        message = f"{message[:_MESSAGE_LIMIT]}… ({len(message):,} characters)"
    if param is not None and len(param) > _MESSAGE_LIMIT // 10:
        param = f"{param[:_MESSAGE_LIMIT // 10]}… ({len(param):,} characters)"
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}},
                      ensure_ascii=False).encode()


def _error(status: int, message: str, *, type: str, param: str | None = None,
           code: str | int | None = None) -> Response:
    return Response(_error_body(status, message, type=type, param=param, code=code), status_code=status,
                    media_type="application/json")


def _request_error(e: XtmlError, api: Exchange | None = None) -> tuple[int, bytes]:
    # A message's location is its path (messages[2].role); an option's is
    # worded for people ("option 'tool_choice'"), so its name is the param.
    param = e.option if isinstance(e, OptionError) else e.location
    message = str(e)
    if api is not None:
        # A Responses request's messages are its items: say which.
        message = api.where(message)
        param = api.where(param) if param is not None else None
    status = getattr(e, "status", 400)
    return status, _error_body(status, message, type="invalid_request_error", param=param,
                               code="previous_response_not_found" if status == 404 else None)


def _backend_error(e: BackendError) -> tuple[int, bytes]:
    kind = "invalid_request_error" if e.status == 400 else "backend_error"
    return e.status, _error_body(e.status, str(e), type=kind, code=e.code)


def _json(data: Any) -> Response:
    return Response(dumps(data), media_type="application/json")


async def _respond(send: Send, status: int, body: bytes) -> None:
    """A whole JSON answer, straight to the server."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@dataclass(slots=True)
class _Job:
    """One checked request, rendered."""

    gen: Generation
    thinking: bool
    stream: bool
    include_usage: bool
    api: Exchange | None = None
    """The Responses request it serves, if any (else a chat completion)."""
    legacy: bool = False
    """Tools declared as the deprecated ``functions``: the answer's call is
    a ``function_call``."""
    max_calls: int | None = None
    """The most calls an answer hands back: 1 when the request set
    ``parallel_tool_calls`` false (an engine given no grammar, or one that
    ignores it, may make more)."""


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
        # The template's methods take the Vocabulary itself at no cost (a
        # path would be resolved on every call).
        self.tokenizer = self.vocab
        self.dialect = template.dialect
        self.url = backend
        self.kind = kind
        self.model = model or backend_model or template.name
        self.backend_model = backend_model
        self.timeout = timeout
        self.grammar = grammar
        self.grammar_format = grammar_format
        self.created = int(time.time())
        self._backend: Backend | None = None

    # -- the app -----------------------------------------------------------------------

    def app(self) -> Starlette:
        """The Starlette app."""
        routes = [
            Route("/v1/chat/completions", _Endpoint(self.serve_chat), methods=["POST"]),
            Route("/v1/responses", _Endpoint(self.serve_responses), methods=["POST"]),
            Route("/v1/responses/{id}", self.stored_response, methods=["GET", "DELETE"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model_card, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ]
        app = _App(routes=routes, lifespan=self._lifespan,
                   exception_handlers={HTTPException: self._http_error, Exception: self._server_error})
        app.chat = self.serve_chat
        app.responses = self.serve_responses
        if self.api_key is not None:
            app.guard = BearerGuard(app.route, self.api_key, _guarded)
        return app

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
        return _error(exc.status_code, str(exc.detail), type=kind, code=exc.status_code)

    async def _server_error(self, request: Request, exc: Exception) -> Response:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code=500)

    # -- endpoints ---------------------------------------------------------------------

    def _card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.created, "owned_by": "xtml"}

    async def models(self, request: Request) -> Response:
        return _json({"object": "list", "data": [self._card()]})

    async def model_card(self, request: Request) -> Response:
        """``GET /v1/models/{model}`` (the SDK's ``models.retrieve``)."""
        name = request.path_params["model"]
        if name != self.model:
            return _error(404, f"the model {shown(name)} does not exist: this server serves {self.model!r}",
                          type="invalid_request_error", code="model_not_found")
        return _json(self._card())

    async def health(self, request: Request) -> Response:
        try:
            await self.backend.health()
        except BackendError as e:
            return _error(503, str(e), type="backend_error", code=e.code)
        return _json({"status": "ok", "backend": self.url, "kind": self.kind, "model": self.model})

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
                return _json({"id": id, "object": "response", "deleted": True})
        else:
            stored = self.store.response_json(id)
            if stored is not None:
                return Response(stored, media_type="application/json")
        return _error(404, f"no response with id {shown(id)} is stored here", type="invalid_request_error",
                      code="not_found")

    async def _serve(self, scope: Scope, receive: Receive, send: Send, responses: bool) -> None:
        try:
            await self._chat(scope, receive, send, responses)
        except Exception as e:  # a fault of the gateway itself, before its answer started
            log.exception("a chat completion failed")
            with contextlib.suppress(Exception):
                await _respond(send, 500, _error_body(500, f"internal error: {type(e).__name__}: {e}",
                                                      type="server_error", code=500))

    async def _chat(self, scope: Scope, receive: Receive, send: Send, responses: bool = False) -> None:
        refused = _content_type(scope)
        if refused is not None:
            await _respond(send, *refused)
            return
        raw = await self._body(scope, receive, send)
        if raw is None:
            return
        refused, body = _read_json(raw)
        if refused is not None:
            await _respond(send, *refused)
            return
        make = self.responses_job if responses else self.job
        api: list[Exchange] = []
        try:
            if self._render_size(body, len(raw), responses) > _THREAD_BODY:
                job = await asyncio.to_thread(make, body, api)
            else:
                job = make(body, api)
        except XtmlError as e:
            await _respond(send, *_request_error(e, api[0] if api else None))
            return
        except RecursionError:
            await _respond(send, 400, _error_body(400, "the request nests arrays and objects deeper than it can be "
                                                  "read", type="invalid_request_error"))
            return
        if job.stream:
            await self._stream(job, receive, send)
        else:
            await self._complete(job, receive, send)

    def _render_size(self, body: Mapping[str, Any], size: int, responses: bool) -> int:
        """The bytes of what a request renders: its body, and for a
        Responses follow-up the stored conversation it continues (a
        100-byte body can name megabytes of it)."""
        previous = body.get("previous_response_id") if responses else None
        if isinstance(previous, str):
            size += self.store.size(previous) or 0
        return size

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The request body, or None when it was refused (413, answered) or
        the client left. The pieces are joined once: adding each to what
        came before copies it all again, quadratic in the body's size."""
        limit = self.max_body
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                # Said before it is sent: refused before a byte of it is read.
                await _too_large(send, limit)
                return None
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
                    await _too_large(send, limit)
                    return None
                pieces.append(piece)
            if not message.get("more_body"):
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    # -- a request ---------------------------------------------------------------------

    def responses_job(self, body: Any, made: list[Exchange] | None = None) -> _Job:
        """Check a Responses body and render its prompt as :meth:`job` does;
        the request's :class:`~.responses.Exchange` is added to ``made`` as
        soon as it exists (its errors name the request's own items)."""
        if not isinstance(body, dict):
            raise RequestError(f"the request must be a JSON object, not {type(body).__name__}")
        d = self.dialect
        chat, api = translate(body, self.store, efforts=d.efforts, thinking_off=d.thinking_off)
        if made is not None:
            made.append(api)
        job = self.job(chat)
        job.api = api
        job.include_usage = True  # the last event's response has the usage
        return job

    def job(self, body: Any, made: list[Exchange] | None = None) -> _Job:
        """Check a chat-completions body and render its prompt; bad requests
        raise :class:`~xtml.RequestError` naming where."""
        if not isinstance(body, dict):
            raise RequestError(f"the request must be a JSON object, not {type(body).__name__}")
        if body.get("messages") == []:
            # OpenAI's answer too: there is nothing to answer.
            raise RequestError("messages must hold at least one message", location="messages")
        stream = body.get("stream")
        if stream is not None and type(stream) is not bool:
            raise RequestError("stream must be true or false", location="stream")
        so = body.get("stream_options")
        if so is not None and not isinstance(so, Mapping):
            raise RequestError("stream_options must be an object", location="stream_options")
        include_usage = so.get("include_usage") if so else None
        if include_usage is not None and type(include_usage) is not bool:
            raise RequestError("include_usage must be true or false", location="stream_options.include_usage")
        params = sampling(body, self.vocab.size)
        _servable(body)
        for k in BACKENDS[self.kind].lacks:
            if params.get(k):
                raise RequestError(f"{k} cannot be served: the {self.kind} backend has no such field",
                                   location=k)
        t = self.template
        ids, o = t.encode_request(body, self.tokenizer, unknown_keys="ignore")
        if o.continue_final:
            raise OptionError("continue_final_message is not served: a chat completion starts a new assistant "
                              "message", option="continue_final_message")
        if not o.add_generation_prompt:
            raise OptionError("a chat completion continues the generation prompt: add_generation_prompt "
                              "cannot be false", option="add_generation_prompt")
        grammar = None
        # "none" with tools declared: the grammar has no tools channel.
        if self.grammar and (o.tool_choice == "required" or o.response_format is not None
                             or (o.tool_choice == "none" and o.tools)
                             # One call at most: only a grammar holds a model to it.
                             or (body.get("parallel_tool_calls") is False and o.tools)
                             or isinstance(fields.request_options(body, True).get("tool_choice"), Mapping)):
            grammar = t.completion_grammar(body, self.tokenizer, format=self.grammar_format, unknown_keys="ignore")
        gen = Generation(ids, params, self.binding.stop_ids, self.vocab.size, grammar, self.binding.text_table)
        legacy = bool(body.get("functions")) and not body.get("tools")
        return _Job(gen, o.thinking, bool(stream), bool(include_usage), legacy=legacy,
                    max_calls=1 if body.get("parallel_tool_calls") is False else None)

    async def _complete(self, job: _Job, receive: Receive, send: Send) -> None:
        watch = _Watch(receive)
        try:
            outs = await self.backend.generate_n(job.gen)
        except BackendError as e:
            watch.stop()
            await _respond(send, *_backend_error(e))
            return
        except asyncio.CancelledError:
            watch.stop()
            if not watch.forgive():
                raise
            return  # nobody is listening
        watch.stop()
        choices: list[Shaped] = []
        generated = reasoning = 0
        for out in outs:
            ids, finish = out.ids, out.finish_reason
            limit = job.gen.params.get("max_tokens")
            if limit is not None and len(ids) > limit:
                # An engine that generated past the limit asked for: what it
                # asked for is the answer, cut off there.
                ids, finish = ids[:limit], "length"
            try:
                parsed = self.template.parse(ids, self.tokenizer, completion=True, lenient=True,
                                             thinking=job.thinking, max_chars=max(len(ids), 1))
            except XtmlError as e:
                await _respond(send, 502, _error_body(502, f"the backend's ids cannot be read: {e}",
                                                      type="backend_error", code="backend_invalid_response"))
                return
            shaped = shape_message(parsed, cut_by="stop" if finish == "stop" else "length", max_calls=job.max_calls)
            stop = job.gen.params.get("stop")
            if stop:
                shaped = StopSequences(stop).message(shaped, len(ids))
            choices.append(shaped)
            generated += len(ids)
            reasoning += self.template.reasoning_tokens(ids, self.tokenizer, thinking=job.thinking)
        # Usage as OpenAI counts n choices: the prompt once, every choice's tokens.
        completion = chat_completion(choices, model=self.model, prompt_tokens=len(job.gen.prompt),
                                     completion_tokens=generated, reasoning_tokens=reasoning)
        if job.api is not None:
            await _respond(send, 200, dumps(job.api.whole(completion)))
            return
        if job.legacy:
            completion = FunctionCalls().completion(completion)
        await _respond(send, 200, dumps(completion))

    async def _stream(self, job: _Job, receive: Receive, send: Send) -> None:
        if job.gen.params.get("n", 1) > 1:
            await self._stream_n(job, receive, send)
            return
        pieces = self.backend.stream(job.gen)
        watch = _Watch(receive)
        try:
            # The first piece is awaited before answering, so that a backend
            # that is down or refuses gets its own status code, not a stream.
            try:
                first = await anext(pieces, None)
            except BackendError as e:
                watch.stop()
                await _respond(send, *_backend_error(e))
                return
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            ended = await self._events(job, first, pieces, send, watch)
            if ended:
                # The client has its answer; the engine's closing events are
                # read so that its connection can be used again (ids instead
                # mean the model goes on: closing the stream stops it).
                with contextlib.suppress(BackendError, TimeoutError):
                    async with asyncio.timeout(_FINISH):
                        await anext(pieces, None)
        except asyncio.CancelledError:
            watch.stop()
            if not watch.forgive():
                raise
        except OSError:
            pass  # the client went away while being written to
        finally:
            watch.stop()
            await pieces.aclose()

    async def _events(self, job: _Job, piece: Piece | None, pieces: AsyncGenerator[Piece, None], send: Send,
                      watch: _Watch) -> bool:
        """Write the stream's events, one payload per piece; true when the
        message ended before the engine's stream did."""
        parser = self.template.stream(self.tokenizer, thinking=job.thinking)
        chunks = ChunkStream(model=self.model, include_usage=job.include_usage, template=self.template,
                             max_calls=job.max_calls)
        sse = SSE(chunks)
        stop = job.gen.params.get("stop")
        stops = StopSequences(stop) if stop else None
        api = job.api
        legacy = FunctionCalls() if job.legacy else None

        def encode(cs: list[dict[str, Any]]) -> list[str]:
            if stops is not None:
                cs = stops.chunks(cs, n)
            if api is not None:
                return api.events(cs)
            if legacy is not None:
                cs = [legacy.chunk(c) for c in cs]
            return [sse(c) for c in cs]

        def failed(message: str, *, type: str, code: str | int | None) -> str:
            return api.error_event(message, code) if api is not None else _error_event(message, type=type, code=code)

        if api is not None:
            api.source = chunks

        n = 0
        out = encode(chunks.feed(()))
        early = False
        lost = 0
        stop_ids = frozenset(job.gen.all_stop_ids())  # where a whole answer is cut too
        limit = job.gen.params.get("max_tokens")
        try:
            while piece is not None:
                ids, finish = piece
                if job.gen.lost > lost:
                    # Counted while the engine's events were read, which is
                    # before their piece comes here: the note goes out with
                    # the message's end.
                    chunks.note(_lost(job.gen.lost - lost, job.gen.lost_at if not lost else n))
                    lost = job.gen.lost
                stopped = False
                if ids:
                    if chunks.finish_reason is not None:
                        # The model goes on after the end of its message (an
                        # engine without the end marker as a stop id): that
                        # is not read, and closing the stream stops it.
                        break
                    if not stop_ids.isdisjoint(ids):
                        # Nor what follows a stop id, in this piece or a
                        # later one: the answer and its usage end there, as
                        # a whole answer's do.
                        ids = ids[:next(k for k, t in enumerate(ids) if t in stop_ids) + 1]
                        stopped = True
                    if limit is not None and n + job.gen.lost + len(ids) > limit:
                        # An engine that goes on past the limit the request
                        # set: the answer ends there, as a cut-off one, and
                        # closing the stream stops the engine.
                        ids = ids[:max(0, limit - n - job.gen.lost)]
                        finish, stopped = "length", False
                    n += len(ids)
                    out += encode(chunks.feed(parser.feed(ids[0]) if len(ids) == 1 else parser.feed_many(ids)))
                if finish is not None:
                    # A message it cut is cut by the request's stop
                    # sequences or ids unless the engine says the limit.
                    chunks.cut_by = "stop" if finish == "stop" else "length"
                    break
                if chunks.finish_reason is not None:
                    early = True
                    break
                if stopped:
                    # A stop id of the request inside the message (llama.cpp
                    # takes none and generates on): cut there. What the
                    # engine sends next is read as after the end.
                    chunks.cut_by = "stop"
                    early = True
                    break
                if out:
                    await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": True})
                    out = []
                piece = await anext(pieces, None)
        except BackendError as e:
            if chunks.finish_reason is None:
                out.append(failed(str(e), type="backend_error", code=e.code))
                watch.stop()
                await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
                return False
            # The message had ended: what failed after it is not the
            # client's concern.
        except OSError:
            raise  # the client went away
        except Exception as e:  # a fault of the gateway itself: the stream says so and ends
            log.exception("the stream of a chat completion failed")
            out.append(failed(f"internal error: {type(e).__name__}: {e}", type="server_error", code=500))
            watch.stop()
            await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
            return False
        out += encode(chunks.feed(parser.close()))
        out += encode(chunks.close(prompt_tokens=len(job.gen.prompt), completion_tokens=n + job.gen.lost))
        if api is None:
            out.append(SSE_DONE)  # a Responses stream ends with its response.completed event
        watch.stop()
        await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
        return early


    async def _stream_n(self, job: _Job, receive: Receive, send: Send) -> None:
        """A stream of ``n`` choices: each choice is read, cut and parsed as
        the one choice of :meth:`_events` is, its chunks carrying its index."""
        n = job.gen.params["n"]
        gens = [one_choice(job.gen, k) for k in range(n)]
        first = ChunkStream(model=self.model, include_usage=job.include_usage, template=self.template)
        choices = [_OneOfN(self, job, k, g, first.id, first.created) for k, g in enumerate(gens)]
        pieces = self.backend.stream_n(job.gen, gens)
        watch = _Watch(receive)
        try:
            try:
                got = await anext(pieces, None)
            except BackendError as e:
                watch.stop()
                await _respond(send, *_backend_error(e))
                return
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            out = [sse(c) for one in choices for c in one.start()]
            try:
                while got is not None:
                    for k, ids, finish in got:
                        out += [sse(c) for c in choices[k].feed(ids, finish)]
                    if all(one.done for one in choices):
                        break
                    if out:
                        await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": True})
                        out = []
                    got = await anext(pieces, None)
            except BackendError as e:
                if not all(one.done for one in choices):
                    out.append(_error_event(str(e), type="backend_error", code=e.code))
                    watch.stop()
                    await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
                    return
            except OSError:
                raise  # the client went away
            except Exception as e:  # a fault of the gateway itself: the stream says so and ends, as n=1's does
                log.exception("the stream of a chat completion of n choices failed")
                out.append(_error_event(f"internal error: {type(e).__name__}: {e}", type="server_error", code=500))
                watch.stop()
                await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
                return
            for one in choices:
                out += [sse(c) for c in one.close()]
            if job.include_usage:
                generated = sum(one.n + one.gen.lost for one in choices)
                reasoning = sum(one.chunks.reasoning_tokens(one.n + one.gen.lost) for one in choices)
                out.append(sse({"id": first.id, "object": "chat.completion.chunk", "created": first.created,
                                "model": self.model, "choices": [],
                                "usage": {"prompt_tokens": len(job.gen.prompt), "completion_tokens": generated,
                                          "total_tokens": len(job.gen.prompt) + generated,
                                          "completion_tokens_details": {"reasoning_tokens": reasoning}}}))
            out.append(SSE_DONE)
            watch.stop()
            await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
        except asyncio.CancelledError:
            watch.stop()
            if not watch.forgive():
                raise
        except OSError:
            pass  # the client went away while being written to
        finally:
            watch.stop()
            await pieces.aclose()


class _OneOfN:
    """One choice of a stream of ``n``: its parser, its chunks (with the
    response's id), the cuts of the request's stop ids, stop sequences and
    token limit, as :meth:`Gateway._events` makes them for one choice."""

    def __init__(self, gateway: Gateway, job: _Job, index: int, gen: Generation, id: str, created: int) -> None:
        self.index = index
        self.gen = gen
        self.parser = gateway.template.stream(gateway.tokenizer, thinking=job.thinking)
        self.chunks = ChunkStream(model=gateway.model, id=id, created=created, include_usage=job.include_usage,
                                  template=gateway.template, max_calls=job.max_calls)
        stop = gen.params.get("stop")
        self.stops = StopSequences(stop) if stop else None
        self.legacy = FunctionCalls() if job.legacy else None
        self.stop_ids = frozenset(gen.all_stop_ids())
        self.limit = gen.params.get("max_tokens")
        self.n = 0
        self.lost = 0
        self.done = False
        self.closed = False

    def _out(self, cs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.stops is not None:
            cs = self.stops.chunks(cs, self.n)
        for c in cs:
            for choice in c["choices"]:
                choice["index"] = self.index
        if self.legacy is not None:
            cs = [self.legacy.chunk(c) for c in cs]
        return cs

    def start(self) -> list[dict[str, Any]]:
        return self._out(self.chunks.feed(()))

    def feed(self, ids: list[int], finish: str | None) -> list[dict[str, Any]]:
        if self.done:
            return []
        gen = self.gen
        if gen.lost > self.lost:
            self.chunks.note(_lost(gen.lost - self.lost, gen.lost_at if not self.lost else self.n))
            self.lost = gen.lost
        out: list[dict[str, Any]] = []
        stopped = False
        if ids:
            if self.chunks.finish_reason is not None:
                self.done = True  # what the model writes after its message is not read
                return out
            if not self.stop_ids.isdisjoint(ids):
                ids = ids[:next(k for k, t in enumerate(ids) if t in self.stop_ids) + 1]
                stopped = True
            if self.limit is not None and self.n + gen.lost + len(ids) > self.limit:
                ids = ids[:max(0, self.limit - self.n - gen.lost)]
                finish, stopped = "length", False
            self.n += len(ids)
            out += self._out(self.chunks.feed(self.parser.feed_many(ids)))
        if finish is not None:
            self.chunks.cut_by = "stop" if finish == "stop" else "length"
            self.done = True
        elif stopped:
            self.chunks.cut_by = "stop"
            self.done = True
        elif self.chunks.finish_reason is not None:
            self.done = True
        return out

    def close(self) -> list[dict[str, Any]]:
        if self.closed:
            return []
        self.closed = True
        self.done = True
        return self._out(self.chunks.feed(self.parser.close()))


async def _too_large(send: Send, limit: int) -> None:
    body = _error_body(413, f"the request body is larger than {limit:,} bytes, the largest this server reads",
                       type="invalid_request_error", code=413)
    # The rest of the body is not read: the connection cannot serve another request.
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _content_type(scope: Scope) -> tuple[int, bytes] | None:
    """A 415 unless the body is declared JSON (or not declared at all)."""
    for name, value in scope["headers"]:
        if name != b"content-type":
            continue
        kind, _, params = value.decode("latin-1").partition(";")
        kind = kind.strip().lower()
        charset = next((v.strip().strip('"').lower() for k, _, v in (p.partition("=") for p in params.split(";"))
                        if k.strip().lower() == "charset"), "utf-8")
        if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
            if charset in ("utf-8", "utf8"):
                return None
            return 415, _error_body(415, f"the request body must be UTF-8 JSON, not charset {shown(charset)}",
                                    type="invalid_request_error", code=415)
        return 415, _error_body(415, f"the request body must be JSON (content-type: application/json), not "
                                     f"{shown(kind)}", type="invalid_request_error", code=415)
    return None


def _read_json(raw: bytes) -> tuple[tuple[int, bytes] | None, Any]:
    """The body as a JSON object, or the 400 that says what it is instead."""

    def bad(message: str) -> tuple[tuple[int, bytes], None]:
        return (400, _error_body(400, message, type="invalid_request_error")), None

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return bad(f"the request body is not UTF-8: byte {e.object[e.start]:#04x} at offset {e.start:,} "
                   f"({e.reason})")
    try:
        body = json.loads(text)
    except RecursionError:
        return bad("the request body nests arrays and objects deeper than the JSON parser reads")
    except ValueError as e:
        return bad(f"the request body is not JSON: {e}")
    if type(body) is not dict:
        return bad(f"the request body must be a JSON object, not {_JSON_TYPES.get(type(body), 'a value')}")
    return None, body


MAX_TOOLS = 128
"""The most tools a request may declare, as OpenAI takes: each one is in
the prompt and, when the output is constrained, in the grammar the engine
compiles."""


def _servable(body: Mapping[str, Any]) -> None:
    """Refuse what would reach no engine, and tool lists past their bound.

    The engine is sent token ids only: an image (or audio, video) part
    would be one placeholder in the prompt, the model answering about a
    picture it never got. Until an engine is sent the media itself, such a
    request is refused, naming the part, rather than answered without it."""
    for key in ("tools", "functions"):
        tools = body.get(key)
        if isinstance(tools, list) and len(tools) > MAX_TOOLS:
            raise RequestError(f"{key} declares {len(tools)} tools: at most {MAX_TOOLS} are taken", location=key)
    if body.get("image_prompts"):
        raise OptionError("image_prompts cannot be served: the engine is sent token ids only, and no image",
                          option="image_prompts")
    messages = body.get("messages")
    if not isinstance(messages, list):
        return  # the chat layer says what is wrong with it
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            t = part.get("type") if isinstance(part, Mapping) else None
            if isinstance(t, str) and t not in TEXT_PART_TYPES:
                raise MessageError(f"a content part of type {shown(t)} cannot be served: the engine is sent token "
                                   "ids only, so the model would never see it", index=i, path=f"content[{j}]")


def _lost(k: int, offset: int) -> dict[str, Any]:
    return {"kind": "lost-ids", "offset": offset,
            "message": f"the engine generated {k} id{'s' if k != 1 else ''} here that its stream did not send "
                       "(llama.cpp sends no id for a token that ends inside a UTF-8 character) and whose text "
                       "could not be found again: it is missing"}


class SSE:
    """``openai.sse`` for the chunks of one :class:`ChunkStream`, the same
    text, with the chunk's constant part written once: most chunks are one
    delta (a piece of text or of arguments), and encoding only that delta
    is several times cheaper than encoding the chunk."""

    __slots__ = ("head", "size", "tail")

    def __init__(self, chunks: ChunkStream) -> None:
        base: dict[str, Any] = {"id": chunks.id, "object": "chat.completion.chunk", "created": chunks.created,
                                "model": chunks.model}
        if chunks.include_usage:
            base["usage"] = None
        self.size = len(base) + 1
        self.head = sse(base)[:-3] + ',"choices":[{"index":0,"delta":'
        self.tail = ',"logprobs":null,"finish_reason":null}]}\n\n'

    def __call__(self, chunk: dict[str, Any]) -> str:
        choices = chunk["choices"]
        if len(chunk) == self.size and len(choices) == 1:
            c = choices[0]
            if len(c) == 4 and c["finish_reason"] is None and c["index"] == 0 and c["logprobs"] is None:
                delta = c["delta"]
                if len(delta) == 1:
                    key, value = next(iter(delta.items()))
                    if type(value) is str:
                        return self.head + "{" + encode_basestring(key) + ":" + encode_basestring(value) + "}" \
                            + self.tail
                return self.head + json.dumps(delta, ensure_ascii=False, separators=(",", ":")) + self.tail
        return sse(chunk)


def _error_event(message: str, *, type: str, code: str | int | None) -> str:
    return "data: " + _error_body(0, message, type=type, code=code).decode() + "\n\n" + SSE_DONE


class _Watch:
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


class _Endpoint:
    """An ASGI app as a Starlette route's endpoint (a bound method would be
    taken for a request-response function)."""

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
    """Starlette, with ``POST /v1/chat/completions`` served ahead of its
    middleware and routing: those wrap every ``send`` of a stream, and the
    endpoint handles its own errors. ``guard``, when set, stands in front of
    all of it (the key is checked before any endpoint runs)."""

    chat: Callable[[Scope, Receive, Send], Awaitable[None]]
    responses: Callable[[Scope, Receive, Send], Awaitable[None]]
    guard: BearerGuard | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.guard is not None:
            await self.guard(scope, receive, send)
        else:
            await self.route(scope, receive, send)

    async def route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request to its endpoint (past the guard)."""
        if scope["type"] == "http" and scope["method"] == "POST":
            if scope["path"] == "/v1/chat/completions":
                scope["app"] = self
                await self.chat(scope, receive, send)
                return
            if scope["path"] == "/v1/responses":
                scope["app"] = self
                await self.responses(scope, receive, send)
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
