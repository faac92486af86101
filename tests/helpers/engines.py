"""Stand-in engines for the gateway's tests and benchmark: small ASGI apps
that speak each engine's wire format on token ids and answer with scripted
completion ids, recording what they were sent.

The formats, as each engine documents them:

* vLLM, ``POST /v1/completions`` (vllm/entrypoints/openai/protocol.py,
  ``CompletionRequest``): ``prompt`` a list of ids; with ``return_token_ids``
  "the result will include token IDs alongside the generated text. In
  streaming mode, prompt_token_ids is included only in the first chunk, and
  token_ids contains the delta tokens for each chunk". A choice is
  ``{"index", "text", "logprobs", "finish_reason", "stop_reason",
  "token_ids"}``; generation stops at a ``stop_token_ids`` id (which is
  in the output) or at ``max_tokens`` (``finish_reason: "length"``), which
  is 16 when left out (``max_tokens: int | None = 16``) and the context
  length less the prompt when null (entrypoints/utils.py,
  ``get_max_tokens``); ``GET /v1/models`` lists model cards with
  ``max_model_len``; a stream is server-sent events ``data: {...}`` ending
  with ``data: [DONE]``.
* SGLang, ``POST /generate`` (docs: basic_usage/sampling_params and
  native_api; sglang/srt/entrypoints/http_server.py ``generate_request``):
  ``input_ids`` and ``sampling_params`` (``max_new_tokens``, 128 when left
  out, the context less the prompt less one when null;
  ``stop_token_ids`` ...); the answer is ``{"text", "output_ids",
  "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens"}}``,
  ``finish_reason`` null until the end, then ``{"type": "stop", "matched": id}``
  or ``{"type": "length", "length": n}``; streamed, every event holds all ids
  so far (the default) or only the new ones (``--incremental-streaming-output``),
  ending with ``data: [DONE]``.
* llama.cpp, ``POST /completion`` (tools/server/README.md): ``prompt`` a
  list of ids, ``n_predict``, ``return_tokens`` ("Return the raw generated
  token ids in the ``tokens`` field"), ``stream``; the answer holds
  ``content``, ``tokens``, ``stop`` (true at the end), ``stop_type``
  (``eos``, ``limit``, ``word``), ``tokens_evaluated``, ``tokens_predicted``.
  It has no stop ids per request: it stops at the model's end-of-generation
  ids (here: the ids given as ``eog``), which it leaves out of ``tokens``.

Run one on its own (the load test and the benchmark do)::

    python -m tests.helpers.engines --kind vllm --answers answers.json [--port 0]

prints ``port N`` once it listens.
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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import uvicorn

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]

PATHS = {"vllm": "/v1/completions", "sglang": "/generate", "llamacpp": "/completion"}

# Valid JSON that Python's parser gives up on (RecursionError).
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000


class StandIn:
    """One scripted engine of ``kind``.

    ``answer`` is what the model generates (ids), or a function of the
    request body giving them; the engine cuts it at a stop id and at the
    token limit as the real one does. ``mode`` makes it misbehave:
    ``not_json``, ``no_ids``, ``out_of_range`` (an id past the vocabulary),
    ``garbage_mid_stream`` (a bad event after ``good`` events),
    ``deep_json`` (JSON nested past any parser's depth, as the answer or
    as the event after ``good``),
    ``error_mid_stream`` (the engine's own error event after ``good``),
    ``status`` (answers ``status`` with an error object), ``unhealthy``.
    ``delay`` is the time between stream events, ``head_delay`` the time
    before answering at all. ``incremental``: SGLang's
    ``--incremental-streaming-output``. ``runaway``: an engine that ignores
    the token limit it is sent and generates on.
    """

    def __init__(self, kind: str, *, eog: tuple[int, ...] = (), vocab_size: int = 1 << 20,
                 token_bytes: Sequence[bytes | None] | None = None) -> None:
        if kind not in PATHS:
            raise ValueError(kind)
        self.kind = kind
        # llamacpp: the bytes of each id (None: a control token, no text),
        # to stream as llama.cpp does (see _events).
        self.token_bytes = token_bytes
        self.path = PATHS[kind]
        self.eog = eog
        self.vocab_size = vocab_size
        self.answer: list[int] | Callable[[dict[str, Any]], list[int]] = []
        self.mode = "normal"
        self.status = 500
        self.good = 2
        self.delay = 0.0
        self.head_delay = 0.0
        self.incremental = False
        self.runaway = False
        # The context length (vLLM's max_model_len, SGLang's max_req_len);
        # None: vLLM's model card leaves it out.
        self.context: int | None = 1 << 16
        # GET /v1/models: how many times it was asked, and how many of the
        # next askings answer 503 (an engine still loading).
        self.models_asked = 0
        self.models_fail = 0
        self.requests: list[dict[str, Any]] = []
        self.sent: list[list[int]] = []
        self.finished = 0
        self.closed_early = 0
        self.record = True

    def reset(self) -> None:
        self.answer = []
        self.mode = "normal"
        self.status = 500
        self.good = 2
        self.delay = self.head_delay = 0.0
        self.incremental = self.runaway = False
        self.context = 1 << 16
        self.requests.clear()
        self.sent.clear()
        self.finished = self.closed_early = 0

    # -- the engine ------------------------------------------------------------------

    def generate(self, body: dict[str, Any]) -> tuple[list[int], list[int], str, Any]:
        """(prompt, output ids, finish reason, what stopped it)."""
        context = self.context or 1 << 16
        if self.kind == "vllm":
            prompt, limit, stops = body["prompt"], body.get("max_tokens", 16), body.get("stop_token_ids") or []
            if limit is None:
                limit = context - len(prompt)
        elif self.kind == "sglang":
            sp = body.get("sampling_params") or {}
            prompt, limit, stops = body["input_ids"], sp.get("max_new_tokens", 128), sp.get("stop_token_ids") or []
            if limit is None:
                limit = context - len(prompt) - 1
        else:
            prompt, limit, stops = body["prompt"], body.get("n_predict"), list(self.eog)
            if limit is not None and limit < 0:
                limit = None
        if self.runaway:
            limit = None
        if not isinstance(prompt, list) or not all(type(t) is int for t in prompt):
            raise ValueError("the prompt must be a list of token ids")
        # Stop sequences are matched on the text generated so far, and the
        # token that completes one is the last generated (its id is in the
        # output, as vLLM's token_ids keep it; the text would be cut).
        words = (body.get("sampling_params") or {}).get("stop") if self.kind == "sglang" else body.get("stop")
        words = [words] if isinstance(words, str) else list(words or ())
        table = self.token_bytes
        text = b""
        answer = self.answer(body) if callable(self.answer) else self.answer
        out: list[int] = []
        for t in answer:
            if limit is not None and len(out) >= limit:
                return prompt, out, "length", None
            if t in stops:
                if self.kind != "llamacpp":
                    out.append(t)
                return prompt, out, "stop", t
            out.append(t)
            if words and table is not None:
                text += (table[t] if 0 <= t < len(table) else None) or b""
                said = text.decode("utf-8", "ignore")
                hit = next((w for w in words if w in said), None)
                if hit is not None:
                    return prompt, out, "stop", hit
        return prompt, out, "stop", None

    # -- ASGI ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/health":
            if self.mode == "unhealthy":
                await _send_json(send, 503, {"error": {"message": "loading model", "code": 503}})
            else:
                await _send_json(send, 200, {"status": "ok"})
            return
        if method == "GET" and path == "/v1/models" and self.kind == "vllm":
            self.models_asked += 1
            if self.models_fail:
                self.models_fail -= 1
                await _send_json(send, 503, {"error": {"message": "loading model", "code": 503}})
                return
            await asyncio.sleep(0.05)  # long enough for other first requests to arrive meanwhile
            card: dict[str, Any] = {"id": "stand-in", "object": "model", "owned_by": "vllm"}
            if self.context is not None:
                card["max_model_len"] = self.context
            await _send_json(send, 200, {"object": "list", "data": [card]})
            return
        if method != "POST" or path != self.path:
            await _send_json(send, 404, {"error": {"message": f"no route {method} {path}"}})
            return
        body = json.loads(await _read_body(receive))
        if self.record:
            self.requests.append(body)
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        done = False
        try:
            if self.head_delay:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(gone.wait(), self.head_delay)
                if gone.is_set():
                    self.closed_early += 1
                    return
            if self.mode == "status":
                await _send_json(send, self.status, {"error": {"message": "scripted failure", "type": "BadRequest",
                                                               "code": self.status}})
                done = True
                return
            if self.mode == "not_json":
                await _send(send, 200, b"<html>not an engine</html>", "text/html")
                done = True
                return
            if self.mode == "deep_json" and not body.get("stream"):
                await _send(send, 200, DEEP_JSON, "application/json")
                done = True
                return
            n = self.choices(body)
            if n > 1:
                # vLLM's n, SGLang's sampling_params.n: one request, n choices.
                outs = [self.generate({**body, "choice": i}) for i in range(n)]
                if self.record:
                    self.sent += [o[1] for o in outs]
                if body.get("stream"):
                    done = await self._stream_events(send, self._events_n(outs), gone)
                else:
                    await _send_json(send, 200, self._whole_n(outs))
                    done = True
                return
            prompt, ids, finish, matched = self.generate(body)
            if self.mode == "out_of_range":
                ids = [*ids[:2], self.vocab_size + 5, *ids[2:]]
            if self.record:
                self.sent.append(ids)
            if body.get("stream"):
                done = await self._stream(send, prompt, ids, finish, matched, gone)
            else:
                await _send_json(send, 200, self._whole(prompt, ids, finish, matched))
                done = True
        finally:
            watcher.cancel()
            if done:
                self.finished += 1

    def choices(self, body: dict[str, Any]) -> int:
        """How many choices a request asks for, where the engine takes ``n``
        (llama.cpp's /completion has no such field)."""
        if self.kind == "vllm":
            return int(body.get("n") or 1)
        if self.kind == "sglang":
            return int((body.get("sampling_params") or {}).get("n") or 1)
        return 1

    def _whole_n(self, outs: list[tuple[list[int], list[int], str, Any]]) -> Any:
        """n choices whole: vLLM's choices, each with its index; SGLang's
        list of n answers (tokenizer_manager._handle_batch_request gathers
        the n requests of a parallel sample and yields their outputs)."""
        wholes = [self._whole(*o) for o in outs]
        if self.kind == "sglang":
            for i, w in enumerate(wholes):
                w["meta_info"]["id"] = f"rid-1-{i}"
            return wholes
        first = wholes[0]
        first["choices"] = [{**w["choices"][0], "index": i} for i, w in enumerate(wholes)]
        return first

    def _events_n(self, outs: list[tuple[list[int], list[int], str, Any]]) -> Iterator[bytes]:
        """n choices streamed, their events interleaved: vLLM's chunks carry
        each choice's index; SGLang's events its ``index``
        (tokenizer_manager._stream_batch_responses sets
        ``result["index"]``)."""
        streams = []
        for i, o in enumerate(outs):
            events = [e for e in self._events(*o) if e != b"data: [DONE]\n\n"]
            streams.append([_with_index(e, i, self.kind) for e in events])
        for k in range(max(map(len, streams))):
            for events in streams:
                if k < len(events):
                    yield events[k]
        yield b"data: [DONE]\n\n"

    async def _stream(self, send: Send, prompt: list[int], ids: list[int], finish: str, matched: Any,
                      gone: asyncio.Event) -> bool:
        return await self._stream_events(send, self._events(prompt, ids, finish, matched), gone)

    async def _stream_events(self, send: Send, events: Iterator[bytes], gone: asyncio.Event) -> bool:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for k, event in enumerate(events):
            if gone.is_set():
                self.closed_early += 1
                return False
            if self.mode in ("garbage_mid_stream", "deep_json", "error_mid_stream", "no_ids") and k >= self.good:
                if self.mode == "garbage_mid_stream":
                    event = b"data: {not json\n\n"
                elif self.mode == "deep_json":
                    event = b"data: " + DEEP_JSON + b"\n\n"
                elif self.mode == "no_ids":
                    event = b"data: " + json.dumps({"choices": [{"index": 0, "text": "x"}]}).encode() + b"\n\n"
                else:
                    event = b'data: {"error": {"message": "the engine failed", "code": 500}}\n\n'
                await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return True
            await send({"type": "http.response.body", "body": event, "more_body": True})
            if self.delay:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(gone.wait(), self.delay)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    def _whole(self, prompt: list[int], ids: list[int], finish: str, matched: Any) -> dict[str, Any]:
        if self.kind == "vllm":
            choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish,
                                      "stop_reason": matched, "prompt_token_ids": prompt}
            if self.mode != "no_ids":
                choice["token_ids"] = ids
            return {"id": "cmpl-1", "object": "text_completion", "created": int(time.time()), "model": "m",
                    "choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                                   "total_tokens": len(prompt) + len(ids)}}
        if self.kind == "sglang":
            out: dict[str, Any] = {"text": "", "meta_info": self._meta(prompt, len(ids), finish, matched)}
            if self.mode != "no_ids":
                out["output_ids"] = ids
            return out
        out = {"index": 0, "content": "", "id_slot": 0, "stop": True, "model": "m",
               "stop_type": "limit" if finish == "length" else "word" if isinstance(matched, str) else "eos",
               "stopping_word": matched if isinstance(matched, str) else "",
               "tokens_evaluated": len(prompt), "tokens_predicted": len(ids), "truncated": False}
        if self.mode != "no_ids":
            out["tokens"] = ids
        return out

    def _meta(self, prompt: list[int], n: int, finish: str | None, matched: Any) -> dict[str, Any]:
        reason: Any = None
        if finish == "length":
            reason = {"type": "length", "length": n}
        elif finish == "stop":
            reason = {"type": "stop", "matched": matched}
        return {"id": "rid-1", "finish_reason": reason, "prompt_tokens": len(prompt), "completion_tokens": n,
                "cached_tokens": 0}

    def _events(self, prompt: list[int], ids: list[int], finish: str, matched: Any) -> Iterator[bytes]:
        def data(obj: Any) -> bytes:
            return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

        if self.kind == "vllm":
            base = {"id": "cmpl-1", "object": "text_completion", "created": int(time.time()), "model": "m"}
            for k, t in enumerate(ids):
                choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None, "finish_reason": None,
                                          "stop_reason": None, "token_ids": [t]}
                if k == 0:
                    choice["prompt_token_ids"] = prompt
                yield data({**base, "choices": [choice]})
            yield data({**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish,
                                             "stop_reason": matched, "token_ids": []}]})
            yield b"data: [DONE]\n\n"
        elif self.kind == "sglang":
            for k in range(len(ids)):
                last = k == len(ids) - 1
                out = ids[k : k + 1] if self.incremental else ids[: k + 1]
                yield data({"text": "", "output_ids": out,
                            "meta_info": self._meta(prompt, k + 1, finish if last else None, matched)})
            if not ids:
                yield data({"text": "", "output_ids": [], "meta_info": self._meta(prompt, 0, finish, matched)})
            yield b"data: [DONE]\n\n"
        else:
            # llama.cpp (tools/server/server-context.cpp, process_token and
            # send_partial_response): a token whose text leaves the generated
            # text ending inside a UTF-8 character (validate_utf8, in
            # server-common.cpp) is sent with no event; the next event has
            # the held text and only its own id, "tokens": [tok], and
            # "tokens_predicted" counts every generated id. The last event
            # of a stream has empty "content" and "tokens".
            table = self.token_bytes
            held = b""
            for n, t in enumerate(ids, 1):
                if table is not None:
                    held += (table[t] if 0 <= t < len(table) else None) or b""  # out_of_range: no text
                    if _cut_inside_a_character(held):
                        continue
                yield data({"index": 0, "content": held.decode("utf-8", "replace"), "tokens": [t], "stop": False,
                            "id_slot": 0, "tokens_predicted": n})
                held = b""
            yield data(self._whole(prompt, [], finish, matched) | {"tokens": [],
                                                                    "tokens_predicted": len(ids)})


def _with_index(event: bytes, i: int, kind: str) -> bytes:
    obj = json.loads(event[6:])
    if kind == "vllm":
        for c in obj["choices"]:
            c["index"] = i
    else:
        obj["index"] = i
        obj["meta_info"]["id"] = f"rid-1-{i}"
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _cut_inside_a_character(text: bytes) -> bool:
    """llama.cpp's ``validate_utf8(text) < text.size()``: one of the last
    four bytes starts a character longer than what follows it."""
    for i in range(1, min(4, len(text)) + 1):
        c = text[-i]
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 0
        if i < need:
            return True
    return False


async def _send(send: Send, status: int, body: bytes, ctype: str) -> None:
    # With its length, as engines (FastAPI's JSONResponse) answer: without
    # it the answer is chunked, and its end goes out in a write of its own.
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype.encode()), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _lifespan(receive: Any, send: Any, on_shutdown: Any = None) -> None:
    """ASGI lifespan: start at once; on shutdown, run ``on_shutdown`` first."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            if on_shutdown is not None:
                await on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Any) -> bytes:
    """A request's whole body, from its ASGI messages."""
    raw = b""
    while True:
        msg = await receive()
        raw += msg.get("body", b"")
        if not msg.get("more_body"):
            return raw


async def _send_json(send: Send, status: int, obj: Any) -> None:
    await _send(send, status, json.dumps(obj).encode(), "application/json")


# -- running a server ------------------------------------------------------------------------

class Running:
    """An ASGI app served by uvicorn on 127.0.0.1 in a thread."""

    def __init__(self, app: Any, *, startup: float = 15.0) -> None:
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets
        # whose proto says TCP, and without it every response waits out a
        # delayed ACK (40 ms).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + startup
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@contextlib.contextmanager
def running(app: Any) -> Iterator[Running]:
    r = Running(app)
    try:
        yield r
    finally:
        r.stop()


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    """End a server the test started: asked to stop, then killed if it
    does not within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], startup: float) -> bool:
    """Whether ``url``'s ``/health`` answered 200 within ``startup`` seconds
    while ``proc`` kept running."""
    deadline = time.monotonic() + startup
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Relay:
    """The floor of a Python gateway (the benchmark's baselines): it takes
    ``POST /v1/chat/completions``, sends the engine a fixed completions body
    (``body``, with the request's ``seed`` and ``stream``) and hands back
    what the engine answers: JSON decoded and encoded again, or a stream's
    bytes as they come. No rendering, no parsing. ``client`` is what it
    reaches the engine with: ``httpx`` (what a gateway on uvicorn and httpx
    pays) or ``xtml`` (xtml serve's own client: the hop on its stack)."""

    def __init__(self, backend: str, body: dict[str, Any], client: str = "httpx") -> None:
        import httpx

        from xtml.serving.client import Client

        self.url = backend.rstrip("/") + "/v1/completions"
        self.body = body
        self.client = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None,
                                                                        keepalive_expiry=2.0))
        self.own = Client(backend, timeout=60) if client == "xtml" else None

    async def _close(self) -> None:
        await self.client.aclose()
        if self.own is not None:
            await self.own.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, self._close)
            return
        if scope["path"] == "/health":
            await _send_json(send, 200, {"status": "ok"})
            return
        request = json.loads(await _read_body(receive))
        body = {**self.body, "seed": request.get("seed", 0), "stream": bool(request.get("stream"))}
        if self.own is not None:
            await self._own(body, send)
            return
        if not body["stream"]:
            r = await self.client.post(self.url, json=body)
            await _send_json(send, r.status_code, json.loads(r.content))
            return
        async with self.client.stream("POST", self.url, json=body) as r:
            await send({"type": "http.response.start", "status": r.status_code,
                        "headers": [(b"content-type", b"text/event-stream")]})
            async for chunk in r.aiter_bytes():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


    async def _own(self, body: dict[str, Any], send: Send) -> None:
        assert self.own is not None
        data = json.dumps(body).encode()
        if not body["stream"]:
            status, content = await self.own.request("POST", "/v1/completions", data)
            await _send_json(send, status, json.loads(content))
            return
        resp = await self.own.send("POST", "/v1/completions", data)
        try:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", b"text/event-stream")]})
            while chunk := await resp.read():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            resp.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Run a stand-in engine that answers scripted ids.")
    ap.add_argument("--kind", choices=tuple(PATHS), default="vllm")
    ap.add_argument("--answers", help="JSON file: a list of answers (lists of ids); a request's seed picks one")
    ap.add_argument("--relay", metavar="URL", help="run a Relay to the engine at URL instead")
    ap.add_argument("--body", help="with --relay: JSON file, the completions body it sends")
    ap.add_argument("--client", choices=("httpx", "xtml"), default="httpx",
                    help="with --relay: what it reaches the engine with")
    ap.add_argument("--eog", default="", help="comma-separated end-of-generation ids (llamacpp)")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    app: Any
    if args.relay:
        with open(args.body) as f:
            app = Relay(args.relay, json.load(f), args.client)
    else:
        app = _scripted(args)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    # Listening before the port is printed: a caller may connect at once, and
    # waits in the backlog until uvicorn accepts.
    sock.listen(128)
    print(f"port {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                           timeout_keep_alive=65))
    server.run(sockets=[sock])


def _scripted(args: argparse.Namespace) -> StandIn:
    with open(args.answers) as f:
        answers: list[list[int]] = json.load(f)

    def pick(body: dict[str, Any]) -> list[int]:
        seed = body.get("seed", (body.get("sampling_params") or {}).get("sampling_seed", 0)) or 0
        return answers[seed % len(answers)]

    eog = tuple(int(x) for x in args.eog.split(",") if x)
    standin = StandIn(args.kind, eog=eog)
    standin.answer = pick
    standin.record = False
    return standin


if __name__ == "__main__":
    sys.exit(main())
