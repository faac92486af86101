"""The engines behind ``xtml serve``: token ids in, token ids out.

Each backend kind builds its engine's request from a :class:`Generation`
(prompt ids, sampling fields, stop ids, an optional grammar) and reads the
engine's answer, whole (:meth:`Backend.generate`) or as it streams
(:meth:`Backend.stream`), back to ids. Nothing here decodes text: the ids go
to xtml's parser as they are.

The wire formats, as read from each engine's documentation and source
(docs/serving.md, "The gateway", lists them per kind):

* ``vllm`` — ``POST /v1/completions`` with ``prompt`` as a list of ids and
  ``return_token_ids: true``. vLLM's request model describes it: "If
  specified, the result will include token IDs alongside the generated text.
  In streaming mode, prompt_token_ids is included only in the first chunk,
  and token_ids contains the delta tokens for each chunk"
  (vllm/entrypoints/openai/protocol.py, ``CompletionRequest.return_token_ids``).
  Streams are server-sent events ending with ``data: [DONE]``; an error in a
  stream is ``data: {"error": {...}}``.
* ``sglang`` — the native ``POST /generate`` with ``input_ids`` and
  ``sampling_params``. Its answer is ``{"text", "output_ids", "meta_info"}``;
  ``meta_info.finish_reason`` is null until the end, then ``{"type": "stop" |
  "length" | "abort", ...}``, and ``meta_info.completion_tokens`` counts the
  ids so far. Streamed (``"stream": true``), each event ``data: {...}`` holds
  *all* ids so far, or only the new ones when the server runs with
  ``--incremental-streaming-output`` (sglang/srt/managers/tokenizer_manager
  output processing: ``"output_ids": state.output_ids`` against
  ``delta_output_ids``); the stream ends with ``data: [DONE]`` and an error is
  ``data: {"error": {"message": ...}}`` (sglang/srt/entrypoints/http_server.py,
  ``generate_request``).
* ``llamacpp`` — llama.cpp server's ``POST /completion`` (tools/server/README.md):
  "``prompt``: ... a single sequence of tokens: ``[12, 34, 56]``",
  "``return_tokens``: Return the raw generated token ids in the ``tokens``
  field", "``n_predict``: Set the maximum number of tokens to predict",
  "``stop``: Boolean for use with ``stream`` to check whether the generation
  has stopped", "``stop_type``: ... ``eos`` ... ``limit``: Stopped because
  ``n_predict`` tokens were generated ... ``word``". Streamed, each event is
  ``data: {"content", "tokens", "stop", "tokens_predicted", ...}``, and some
  ids are never sent (see :class:`LlamaCpp`).

Failures are :class:`BackendError`, with the HTTP status the gateway answers
(502: unreachable, refused, or an answer that is not the engine's format;
504: timed out; 400: the engine refused the request as too long or invalid).

The engine is reached with :class:`~.client.Client` (aiohttp, pooled
connections), which hands a stream's reader everything that has arrived at
once, so that a read's events are parsed in one pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from ..chat.request import surrogate_in
from ..errors import RequestError, XtmlError
from .client import Client, ConnectError, ProtocolError, Response, Timeout, TransportError

log = logging.getLogger("xtml.serve")

__all__ = [
    "BACKENDS",
    "KINDS",
    "VLLM",
    "Backend",
    "BackendError",
    "Generation",
    "LlamaCpp",
    "Output",
    "SGLang",
    "sampling",
]

# Bounds what a backend may make the gateway hold: one server-sent event,
# or one whole answer.
_MAX_EVENT = 16 << 20
_MAX_BODY = 256 << 20
_FINISH = 1.0
"""Seconds given to an engine to end a stream's body once it has said it
finished (its closing events), so that the connection can be used again;
the client has its answer by then."""


class BackendError(XtmlError):
    """The backend failed: ``status`` is what the gateway answers (502, 504,
    or 400 when the engine refused the request), ``code`` a short name for
    the cause."""

    def __init__(self, msg: str, *, status: int = 502, code: str = "backend_error",
                 location: str | None = None) -> None:
        self.status = status
        self.code = code
        super().__init__(msg, location=location)


def _garbage(msg: str, where: str) -> BackendError:
    return BackendError(f"the backend's answer is not what it should send: {msg}", code="backend_invalid_response",
                        location=where)


# -- sampling fields -------------------------------------------------------------------

_NUMBERS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
_INTS = ("top_k", "seed", "max_tokens", "min_tokens")
_INT64 = (-(2**63), 2**63 - 1)


def sampling(body: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """The sampling fields of a chat-completions body, checked: numbers are
    numbers, counts are integers, token ids (``stop_token_ids``, the keys of
    ``logit_bias``) are below ``vocab_size``, ``stop`` is a string or a list of them,
    ``max_completion_tokens`` (which wins) and ``max_tokens`` are one
    ``max_tokens``. Fields left out or null are not in the result. One
    choice only (``n`` 1), and no log probabilities: the gateway cannot
    return them, and silently dropping them would answer something else
    than was asked. Bad values raise :class:`RequestError` naming the
    field."""
    out: dict[str, Any] = {}
    for k in _NUMBERS:
        v = body.get(k)
        if v is not None:
            # Python's JSON reader takes NaN and Infinity, which no engine's
            # JSON parser does: the engine would refuse the whole body.
            if type(v) not in (int, float) or not math.isfinite(v):
                raise RequestError(f"{k} must be a finite number", location=k)
            out[k] = v
    for k in _INTS:
        v = body.get(k)
        if v is not None:
            if type(v) is not int:
                raise RequestError(f"{k} must be an integer", location=k)
            if not _INT64[0] <= v <= _INT64[1]:
                # Engines read these into 64-bit integers (vLLM's seed field
                # is bounded so); past that the engine refuses the body.
                raise RequestError(f"{k} must fit in 64 bits", location=k)
            out[k] = v
    mct = body.get("max_completion_tokens")
    if mct is not None:
        if type(mct) is not int:
            raise RequestError("max_completion_tokens must be an integer", location="max_completion_tokens")
        if not _INT64[0] <= mct <= _INT64[1]:
            raise RequestError("max_completion_tokens must fit in 64 bits", location="max_completion_tokens")
        out["max_tokens"] = mct
    mt = out.get("max_tokens")
    if mt is not None and mt < 1:
        raise RequestError("max_tokens must be at least 1", location="max_completion_tokens"
                           if mct is not None else "max_tokens")
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise RequestError("stop must be a string or a list of strings", location="stop")
        # The one text of the request that goes to the engine as it came:
        # UTF-8 cannot write a lone surrogate, so the body could not be sent.
        hit = surrogate_in(stop, "stop")
        if hit is not None:
            raise RequestError(hit[1], location=hit[0] if isinstance(body.get("stop"), list) else "stop")
        if stop:
            out["stop"] = stop
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
            raise RequestError("stop_token_ids must be a list of token ids", location="stop_token_ids")
        for j, i in enumerate(ids):
            if i >= vocab_size:
                raise RequestError(f"{i} is not a token id of this tokenizer", location=f"stop_token_ids[{j}]")
        out["stop_token_ids"] = ids
    ignore = body.get("ignore_eos")
    if ignore is not None:
        if type(ignore) is not bool:
            raise RequestError("ignore_eos must be true or false", location="ignore_eos")
        out["ignore_eos"] = ignore
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise RequestError("logit_bias must map token ids to numbers", location="logit_bias")
        for k, b in bias.items():
            if not (isinstance(k, str) and k.isascii() and k.isdigit()):
                raise RequestError(f"logit_bias keys are token ids, not {k!r}", location="logit_bias")
            if len(k) > len(str(vocab_size)) or int(k) >= vocab_size:  # the length first: int() of 5,000 digits fails
                raise RequestError(f"{k} is not a token id of this tokenizer", location=f"logit_bias[{k!r}]")
            if type(b) not in (int, float) or not math.isfinite(b):
                raise RequestError(f"logit_bias[{k!r}] must be a finite number", location="logit_bias")
        if bias:
            out["logit_bias"] = dict(bias)
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError("this server returns one choice: n must be 1", location="n")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise RequestError("this server returns no log probabilities", location="logprobs")
    return out


@dataclass(slots=True)
class Generation:
    """What one request asks of the engine."""

    prompt: list[int]
    params: dict[str, Any]
    """Sampling fields as :func:`sampling` gives them."""
    stop_ids: tuple[int, ...]
    """The template's stop ids (the end marker); :meth:`all_stop_ids` adds
    the request's."""
    vocab_size: int
    """Ids at or past it are not the tokenizer's: an answer holding one is
    refused."""
    grammar: str | None = None
    """The completion grammar (llguidance Lark), when the request constrains
    the output."""
    token_bytes: Callable[[], Sequence[bytes | None]] | None = None
    """The bytes of each id (None for a marker), when the gateway has them:
    what finds again the ids a llama.cpp stream leaves out."""
    lost: int = 0
    """Ids the engine generated but did not send, and whose text could not
    be found again (set while streaming; a diagnostic tells the client)."""
    lost_at: int = 0
    """How many ids had come before the first of them."""

    def all_stop_ids(self) -> list[int]:
        """The ids an answer ends at: the template's, then the request's
        ``stop_token_ids``."""
        extra = self.params.get("stop_token_ids")
        if not extra:
            return list(self.stop_ids)
        return list(dict.fromkeys([*self.stop_ids, *extra]))


@dataclass(slots=True)
class Output:
    """A whole answer: the generated ids and the engine's finish reason
    (``stop``, ``length``, or None when it gave none)."""

    ids: list[int]
    finish_reason: str | None


Piece = tuple[list[int], "str | None"]
"""What a stream gives per event: the new ids and, at the end, the finish
reason."""


def _ids(v: Any, size: int, where: str) -> list[int]:
    """A list of ids from an answer, each checked to be one of the
    tokenizer's."""
    if not isinstance(v, list):
        raise _garbage(f"expected a list of token ids, not {type(v).__name__}", where)
    for k, t in enumerate(v):
        if type(t) is not int or not 0 <= t < size:
            raise _garbage(f"{t!r} is not a token id of the tokenizer (0 to {size - 1})", f"{where}[{k}]")
    return v


def _message(data: Any) -> str:
    """The error message of an answer, in the shapes engines give it."""
    if isinstance(data, Mapping):
        err = data.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for k in ("message", "detail"):
            if isinstance(data.get(k), str):
                return str(data[k])
    return json.dumps(data, ensure_ascii=False)[:1000]


class Backend:
    """An engine at ``url`` that takes and gives token ids; one subclass
    per kind. ``model`` is the name sent to engines that want one;
    ``timeout`` (seconds) bounds connecting and each wait for data.
    :meth:`aclose` closes its idle connections."""

    kind: ClassVar[str]
    path: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    lacks: ClassVar[tuple[str, ...]] = ()
    """Sampling fields the engine has no counterpart for: a request that
    sets one is refused rather than answered as if it had not."""

    def __init__(self, url: str, *, model: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.client = Client(self.url, timeout=timeout)
        self.model = model
        self.ready = False
        """Whether :meth:`learn` has what it needs from the engine."""
        self._learning = asyncio.Lock()

    async def aclose(self) -> None:
        await self.client.aclose()

    async def learn(self) -> None:
        """Ask the engine, once, what its requests depend on (vLLM: the
        context length). The engine being unreachable raises; an engine
        that does not say is asked no more."""
        self.ready = True

    # -- what each kind says -----------------------------------------------------------

    def body(self, gen: Generation, stream: bool) -> dict[str, Any]:
        """The engine's request."""
        raise NotImplementedError

    def read(self, data: Any, gen: Generation) -> Output:
        """A whole answer."""
        raise NotImplementedError

    def reader(self, gen: Generation) -> _EventReader:
        """What reads the events of one streamed answer."""
        raise NotImplementedError

    # -- calls -------------------------------------------------------------------------

    async def _ready(self) -> None:
        # One question at a time: the requests that arrive meanwhile wait
        # for its answer instead of asking too.
        async with self._learning:
            if not self.ready:
                await self.learn()

    async def generate(self, gen: Generation) -> Output:
        """The whole answer to ``gen``."""
        if not self.ready:
            await self._ready()
        try:
            status, content = await self.client.request("POST", self.path, dumps(self.body(gen, False)),
                                                        limit=_MAX_BODY)
        except TransportError as e:
            raise _transport(e, self.url) from None
        if status != 200:
            raise _status(status, content, self.url)
        try:
            data = json.loads(content)
        except (ValueError, RecursionError):
            raise _garbage(f"not JSON: {content[:200]!r}", "body") from None
        if isinstance(data, Mapping) and data.get("error"):
            raise BackendError(f"the backend failed: {_message(data)}", code="backend_error")
        return self.read(data, gen)

    async def stream(self, gen: Generation) -> AsyncGenerator[Piece, None]:
        """The answer to ``gen`` as it is generated: ``(new ids, finish
        reason)``, the reason None until the engine's last piece, which is
        the last one given. Each piece holds the ids of every event that had
        arrived when it was read: one event when the gateway keeps up,
        several when it falls behind, so that its work per read, not per
        event, is what a busy gateway pays. Closing the iterator early
        closes the connection, which cancels the engine's request."""
        reader = self.reader(gen)
        if not self.ready:
            await self._ready()
        try:
            resp = await self.client.send("POST", self.path, dumps(self.body(gen, True)))
        except TransportError as e:
            raise _transport(e, self.url) from None
        ended = False
        try:
            if resp.status != 200:
                raise _status(resp.status, await _read_capped(resp), self.url)
            buf = b""
            while True:
                try:
                    chunk = await resp.read()
                except TransportError as e:
                    raise _transport(e, self.url) from None
                if not chunk:
                    break
                buf = buf + chunk if buf else chunk
                if b"\r" in buf:
                    buf = buf.replace(b"\r\n", b"\n")
                events: list[bytes] = []
                start = 0
                while True:
                    end = buf.find(b"\n\n", start)
                    if end < 0:
                        break
                    data = _event_data(buf[start:end])
                    start = end + 2
                    if data is not None:
                        events.append(data)
                buf = buf[start:]
                if len(buf) > _MAX_EVENT:
                    raise _garbage(f"an event of more than {_MAX_EVENT:,} bytes", "stream")
                if events:
                    ids, finish, ended, failure = _read_events(reader, events)
                    if ids or finish is not None:
                        yield ids, finish
                    if failure is not None:
                        raise failure
                    if ended:
                        return
            if buf.strip():  # a last event without the blank line after it
                data = _event_data(buf)
                if data is None:
                    raise _garbage(f"not server-sent events: {buf[:200]!r}", "stream")
                ids, finish, ended, failure = _read_events(reader, [data])
                if ids or finish is not None:
                    yield ids, finish
                if failure is not None:
                    raise failure
                if ended:
                    return
            # A stream ends with [DONE], or with the engine's last event.
            raise BackendError("the backend's stream ended before the engine said it finished",
                               code="backend_connection_lost")
        finally:
            if ended:
                await resp.finish(min(_FINISH, self.client.timeout))
            else:
                resp.close()

    async def health(self) -> None:
        """Raise :class:`BackendError` unless the engine says it is ready."""
        try:
            status, _ = await self.client.request("GET", self.health_path, limit=1 << 20)
        except TransportError as e:
            raise _transport(e, self.url) from None
        if status != 200:
            raise BackendError(f"the backend is not ready: {self.health_path} answered {status}",
                               status=503, code="backend_not_ready")


def dumps(body: Any) -> bytes:
    """Compact JSON as UTF-8: an engine's body, a gateway's answer."""
    # An engine's body holds the whole prompt as ids: the standard library writes
    # 200 ids in 18 us, orjson in 1 (and 100,000 in about 9 ms against 0.5).
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:  # an integer past 64 bits, which the standard library writes
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _read_events(reader: _EventReader, events: list[bytes]) -> tuple[list[int], str | None, bool,
                                                                      BackendError | None]:
    """The ids of a read's events, the finish reason, whether the engine
    said it finished, and the failure of a bad event (what came before it
    is still the client's)."""
    ids: list[int] = []
    finish: str | None = None
    try:
        for raw in events:
            data = _decode(raw)
            if data is None:
                return ids, finish, True, None
            piece = reader.read(data)
            if piece is None:
                continue
            ids += piece[0]
            if piece[1] is not None or reader.done:
                # Anything after the engine's last piece (a usage event,
                # [DONE]) holds no ids.
                return ids, piece[1], True, None
    except BackendError as e:
        return ids, None, False, e
    return ids, finish, False, None


class _EventReader:
    """Reads one stream's events; ``done`` once the engine has said it
    finished (anything it sends after that is not read)."""

    __slots__ = ("done", "gen")

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.done = False

    def read(self, data: Any) -> Piece | None:
        raise NotImplementedError


async def _read_capped(resp: Response) -> bytes:
    out = bytearray()
    try:
        while len(out) <= 65536:
            piece = await resp.read()
            if not piece:
                break
            out += piece
    except TransportError:
        pass  # an error answer cut short still says what it can
    return bytes(out)


_loads = json.JSONDecoder().decode


def _decode(data: bytes) -> Any:
    """An event's data as JSON; None for ``[DONE]``."""
    if data == b"[DONE]":
        return None
    try:
        # Decoded first: json.loads of bytes guesses their encoding, on
        # every event.
        return _loads(data.decode())
    except (ValueError, RecursionError):
        if data.strip() == b"[DONE]":
            return None
        raise _garbage(f"an event that is not JSON: {data[:200]!r}", "stream") from None


def _event_data(event: bytes) -> bytes | None:
    if event.startswith(b"data:") and b"\n" not in event:  # one line: the usual case
        return event[6:] if event[5:6] == b" " else event[5:]
    lines: list[bytes] = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            lines.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"error:"):
            raise BackendError(f"the backend failed: {line[6:].strip().decode('utf-8', 'replace')[:1000]}")
    return b"\n".join(lines) if lines else None


def _transport(e: TransportError, url: str) -> BackendError:
    if isinstance(e, Timeout):
        return BackendError(f"the backend at {url} did not answer in time ({e})", status=504,
                            code="backend_timeout")
    if isinstance(e, ConnectError):
        return BackendError(f"cannot reach the backend at {url}: {e}", code="backend_unreachable")
    if isinstance(e, ProtocolError):
        return _garbage(f"not HTTP/1.1: {e}", "http")
    return BackendError(f"the connection to the backend at {url} failed: {type(e).__name__}: {e}",
                        code="backend_connection_lost")


def _status(status: int, content: bytes, url: str) -> BackendError:
    try:
        msg = _message(json.loads(content))
    except (ValueError, RecursionError):
        msg = content[:1000].decode("utf-8", "replace")
    if status in (400, 413, 422):
        # The engine refused the request itself (a prompt longer than its
        # context, a sampling value it does not take): the client's to fix.
        return BackendError(f"the backend refused the request: {msg}", status=400, code="backend_rejected")
    return BackendError(f"the backend at {url} answered {status}: {msg}", code="backend_error")


def _mapping(data: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise _garbage(f"expected a JSON object, not {type(data).__name__}", where)
    if data.get("error"):
        raise BackendError(f"the backend failed: {_message(data)}", code="backend_error")
    return data


# -- vLLM --------------------------------------------------------------------------------

# Sampling fields vLLM's CompletionRequest takes under the same names.
_VLLM_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty", "seed", "max_tokens", "min_tokens", "stop", "ignore_eos", "logit_bias")


class VLLM(Backend):
    """vLLM's OpenAI-compatible completions endpoint, on ids."""

    kind = "vllm"
    path = "/v1/completions"

    def __init__(self, url: str, *, model: str | None = None, timeout: float = 600.0) -> None:
        super().__init__(url, model=model, timeout=timeout)
        self.max_model_len: int | None = None
        """The engine's context length, from its model list."""

    async def learn(self) -> None:
        # A chat request without max_tokens may fill the context, but vLLM's
        # CompletionRequest defaults max_tokens to 16 (the completions API's
        # default; vllm/entrypoints/openai/completion/protocol.py), and its
        # stream asserts max_tokens is not None: so the gateway always sends
        # one, the context length less the prompt, which is what vLLM itself
        # takes when a request leaves it out (entrypoints/utils.py,
        # get_max_tokens). The context length is the model card's
        # max_model_len in GET /v1/models (engine/protocol.py, ModelCard).
        try:
            status, content = await self.client.request("GET", "/v1/models", limit=1 << 20)
        except TransportError as e:
            raise _transport(e, self.url) from None
        if status >= 500:
            # Not ready (loading, or a proxy's hiccup): asked again next time.
            raise _status(status, content, self.url)
        self.ready = True
        try:
            cards = json.loads(content)["data"] if status == 200 else []
        except (ValueError, RecursionError, TypeError, KeyError):
            cards = []
        if not isinstance(cards, list):
            cards = []
        cards = [c for c in cards if isinstance(c, Mapping)]
        card = next((c for c in cards if c.get("id") == self.model), cards[0] if cards else None)
        n = card.get("max_model_len") if card is not None else None
        if type(n) is int and n > 0:
            self.max_model_len = n
        else:
            log.warning("the backend's GET /v1/models gives no max_model_len: a request without max_tokens "
                        "gets the engine's default limit (16 tokens for vLLM's completions)")

    def body(self, gen: Generation, stream: bool) -> dict[str, Any]:
        p = gen.params
        out: dict[str, Any] = {"prompt": gen.prompt, "return_token_ids": True, "skip_special_tokens": False,
                               "stop_token_ids": gen.all_stop_ids(), "stream": stream}
        if self.model is not None:
            out["model"] = self.model
        for k in _VLLM_FIELDS:
            if k in p:
                out[k] = p[k]
        if "max_tokens" not in p and self.max_model_len is not None:
            # A prompt that fills the context is vLLM's to refuse, in its words.
            out["max_tokens"] = max(1, self.max_model_len - len(gen.prompt))
        if gen.grammar is not None:
            # docs/features/structured_outputs.md: "guided_grammar ->
            # {"structured_outputs": {"grammar": ...}}"; the guidance backend
            # (vllm/v1/structured_output/backend_guidance.py) loads it with
            # llguidance.grammar_from("grammar", ...), which takes Lark.
            out["structured_outputs"] = {"grammar": gen.grammar}
        return out

    def read(self, data: Any, gen: Generation) -> Output:
        c = _vllm_choice(_mapping(data, "body"))
        if c is None:
            raise _garbage("no choices", "choices")
        ids = c.get("token_ids")
        if ids is None:
            raise _garbage("no token_ids: the backend must be vLLM with return_token_ids (0.10.2 or later)",
                           "choices[0].token_ids")
        return Output(_ids(ids, gen.vocab_size, "choices[0].token_ids"), _finish(c.get("finish_reason")))

    def reader(self, gen: Generation) -> _EventReader:
        return _VLLMReader(gen)


def _vllm_choice(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise _garbage("no choices list", "choices")
    if not choices:
        return None  # the usage chunk
    c = choices[0]
    if not isinstance(c, Mapping):
        raise _garbage("a choice that is not an object", "choices[0]")
    return c


class _VLLMReader(_EventReader):
    __slots__ = ()

    def read(self, data: Any) -> Piece | None:
        c = _vllm_choice(_mapping(data, "stream"))
        if c is None:
            return None
        finish = _finish(c.get("finish_reason"))
        ids = c.get("token_ids")
        if ids is None:
            if finish is None:
                raise _garbage("an event without token_ids: the backend must be vLLM with return_token_ids "
                               "(0.10.2 or later)", "choices[0].token_ids")
            ids = []
        return _ids(ids, self.gen.vocab_size, "choices[0].token_ids"), finish


def _finish(v: Any) -> str | None:
    if v is None:
        return None
    if v == "length":
        return "length"
    if v in ("abort", "error"):
        raise BackendError(f"the backend ended the request: finish_reason {v!r}", code="backend_error")
    return "stop"


# -- SGLang ------------------------------------------------------------------------------

# OpenAI's names → SGLang's sampling_params names.
_SGLANG_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "repetition_penalty": "repetition_penalty", "max_tokens": "max_new_tokens",
                  "min_tokens": "min_new_tokens", "stop": "stop", "ignore_eos": "ignore_eos",
                  "seed": "sampling_seed", "logit_bias": "logit_bias"}


class SGLang(Backend):
    """SGLang's native generate endpoint, on ids."""

    kind = "sglang"
    path = "/generate"

    def body(self, gen: Generation, stream: bool) -> dict[str, Any]:
        # max_new_tokens is 128 when left out (SamplingParams), but null is
        # "up to the context": the scheduler takes min(max_new_tokens, or
        # 1 << 30 when None, max_req_len - prompt - 1)
        # (sglang/srt/managers/scheduler.py, init_req_max_new_tokens), as
        # SGLang's own chat endpoint does for a request without max_tokens.
        params: dict[str, Any] = {"stop_token_ids": gen.all_stop_ids(), "skip_special_tokens": False,
                                  "max_new_tokens": None}
        for k, name in _SGLANG_FIELDS.items():
            if k in gen.params:
                params[name] = gen.params[k]
        if gen.grammar is not None:
            # sampling_params.ebnf; SGLang's llguidance grammar backend
            # (sglang/srt/constrained/llguidance_backend.py, dispatch_ebnf)
            # loads it with llguidance.grammar_from("ebnf", ...), which
            # takes Lark as it is.
            params["ebnf"] = gen.grammar
        return {"input_ids": gen.prompt, "sampling_params": params, "stream": stream}

    def read(self, data: Any, gen: Generation) -> Output:
        d = _mapping(data, "body")
        ids = d.get("output_ids")
        if ids is None:
            raise _garbage("no output_ids", "output_ids")
        meta = d.get("meta_info")
        return Output(_ids(ids, gen.vocab_size, "output_ids"),
                      _sglang_finish(meta.get("finish_reason") if isinstance(meta, Mapping) else None))

    def reader(self, gen: Generation) -> _EventReader:
        return _SGLangReader(gen)


def _sglang_finish(v: Any) -> str | None:
    if v is None:
        return None
    kind = v.get("type") if isinstance(v, Mapping) else v
    if kind == "length":
        return "length"
    if kind == "abort":
        why = v.get("message") if isinstance(v, Mapping) else None
        raise BackendError(f"the backend aborted the request{': ' + str(why) if why else ''}",
                           code="backend_error")
    return "stop"


class _SGLangReader(_EventReader):
    __slots__ = ("seen",)

    def __init__(self, gen: Generation) -> None:
        super().__init__(gen)
        self.seen = 0

    def read(self, data: Any) -> Piece | None:
        d = _mapping(data, "stream")
        ids = d.get("output_ids")
        if not isinstance(ids, list):
            raise _garbage("an event without output_ids", "output_ids")
        meta = d.get("meta_info")
        meta = meta if isinstance(meta, Mapping) else {}
        count = meta.get("completion_tokens")
        seen = self.seen
        # Events hold all ids so far (SGLang's default) or only the new
        # ones (--incremental-streaming-output): completion_tokens, the
        # count so far, says which. Without it, all so far.
        if type(count) is int and count == seen + len(ids) and (seen == 0 or count != len(ids)):
            new = ids
        elif len(ids) >= seen:
            new = ids[seen:]
        else:
            raise _garbage(f"{len(ids)} ids after {seen} were already sent", "output_ids")
        self.seen = seen + len(new)
        return _ids(new, self.gen.vocab_size, "output_ids"), _sglang_finish(meta.get("finish_reason"))


# -- llama.cpp ---------------------------------------------------------------------------

# OpenAI's names → the /completion endpoint's.
_LLAMACPP_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                    "repetition_penalty": "repeat_penalty", "max_tokens": "n_predict", "stop": "stop",
                    "seed": "seed", "ignore_eos": "ignore_eos"}


class LlamaCpp(Backend):
    """llama.cpp server's native completion endpoint, on ids.

    It takes no stop ids: it stops at the model's end-of-generation tokens
    (the GGUF's), so the template's end marker should be one of them; the
    gateway cuts an answer after the end marker either way.

    A whole answer is asked for whole: its ``tokens`` are every generated
    id. A stream is not as exact. The server sends a token's id only with
    text it can send, and holds back text that ends inside a UTF-8
    character, so a token that ends inside one (a byte of a CJK character,
    say) never has its id sent: the next event has the held text and only
    its own id, and a stream cut by the token limit there has its last ids
    nowhere (tools/server/server-context.cpp: ``process_token`` sends
    nothing while ``validate_utf8(generated_text)`` is short of the text;
    ``send_partial_response`` sends ``tokens.assign(1, tkn.tok)``; the last
    event of a stream has empty ``content`` and ``tokens``). Each event's
    ``tokens_predicted`` counts what was generated, so a gap is seen: the
    held bytes are the event's text less its own token's, and are cut into
    that many tokens of the vocabulary (the model's own ids whenever only
    one such cut exists; any cut gives the client the same text). Where the
    text does not give them (bytes the server replaced, a stop string
    holding text back, the end of the stream) they are counted in
    :attr:`Generation.lost` and the client is told."""

    kind = "llamacpp"
    path = "/completion"
    lacks = ("min_tokens",)  # tools/server/README.md lists no minimum length

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._index: tuple[Sequence[bytes | None], dict[bytes, int], int] | None = None
        self._warned = False

    def body(self, gen: Generation, stream: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": gen.prompt, "return_tokens": True, "stream": stream,
                               "cache_prompt": True}
        for k, name in _LLAMACPP_FIELDS.items():
            if k in gen.params:
                out[name] = gen.params[k]
        bias = gen.params.get("logit_bias")
        if bias:
            out["logit_bias"] = [[int(k), v] for k, v in bias.items()]  # keys checked by sampling()
        if gen.grammar is not None:
            # The grammar opens with "%llguidance {}", which a llama.cpp
            # built with LLAMA_LLGUIDANCE hands to llguidance.
            out["grammar"] = gen.grammar
        return out

    def read(self, data: Any, gen: Generation) -> Output:
        d = _mapping(data, "body")
        if "tokens" not in d:
            raise _garbage("no tokens: the backend must be llama.cpp's server (return_tokens)", "tokens")
        ids = _ids(d["tokens"], gen.vocab_size, "tokens")
        finish = _llamacpp_finish(d)
        stops = frozenset(gen.all_stop_ids())
        if not stops.isdisjoint(ids):
            # A model whose end-of-generation tokens miss the end marker
            # goes on past it: what follows is not the answer's.
            end = next(k for k, t in enumerate(ids) if t in stops) + 1
            # Past a stop id of the request is what the server does (it
            # takes none); past the end marker means the model's setup.
            if end < len(ids) and ids[end - 1] in gen.stop_ids and not self._warned:
                self._warned = True
                log.warning("llama.cpp generated %d ids past the end marker: the model's end-of-generation "
                            "tokens (its GGUF's) do not include it, so each answer runs on to its token limit",
                            len(ids) - end)
            del ids[end:]
            finish = "stop"
        return Output(ids, finish)

    def reader(self, gen: Generation) -> _EventReader:
        return _LlamaCppReader(gen, self.token_index)

    def token_index(self, table: Sequence[bytes | None]) -> tuple[dict[bytes, int], int]:
        """Bytes → id of every ordinary token (-1 where two ids share their
        bytes), and the longest token's length; made once per table."""
        index = self._index
        if index is None or index[0] is not table:
            by: dict[bytes, int] = {}
            for i, b in enumerate(table):
                if b:
                    by[b] = -1 if b in by else i
            index = self._index = (table, by, max(map(len, by), default=0))
        return index[1], index[2]


def _llamacpp_finish(d: Mapping[str, Any]) -> str | None:
    if not d.get("stop"):
        return None
    return "length" if d.get("stop_type") == "limit" else "stop"


class _LlamaCppReader(_EventReader):
    __slots__ = ("delivered", "index", "table")

    def __init__(self, gen: Generation,
                 index: Callable[[Sequence[bytes | None]], tuple[dict[bytes, int], int]]) -> None:
        super().__init__(gen)
        self.index = index
        self.delivered = 0  # ids given on so far, sent or found again
        # A stop string makes the server hold text back for a while with its
        # ids sent, so an event's text no longer starts with what was left
        # out: nothing is looked for then, and a gap is reported.
        self.table = None if gen.params.get("stop") else gen.token_bytes

    def read(self, data: Any) -> Piece | None:
        d = _mapping(data, "stream")
        ids = d.get("tokens")
        if ids is None:
            ids = []
            if not d.get("stop"):
                raise _garbage("an event without tokens: the backend must be llama.cpp's server", "tokens")
        finish = _llamacpp_finish(d)
        if finish is not None:
            self.done = True
        ids = _ids(ids, self.gen.vocab_size, "tokens")
        predicted = d.get("tokens_predicted")
        gap = predicted - self.delivered - self.gen.lost - len(ids) if type(predicted) is int else 0
        if gap > 0:
            if finish is not None:
                # The last event carries no text: ids held back when the
                # stream ended (the token limit cut a character) are lost.
                self._lose(gap)
            else:
                table = self.table() if self.table is not None else None
                held = self._held(d.get("content"), ids, table) if table else None
                if held is None:
                    self._lose(gap)
                elif held:
                    assert table is not None
                    found = cut_into_tokens(held, gap, *self.index(table))
                    if found is None:
                        self._lose(gap)
                    else:
                        ids = found + ids
                # No held text: the count ran ahead of the events (a draft
                # model's tokens are counted before each is sent).
        self.delivered += len(ids)
        return ids, finish

    def _lose(self, k: int) -> None:
        if not self.gen.lost:
            self.gen.lost_at = self.delivered
        self.gen.lost += k

    @staticmethod
    def _held(content: Any, ids: list[int], table: Sequence[bytes | None]) -> bytes | None:
        """The bytes the server held back, from an event's text (theirs, then
        the sent ids'); None when the text does not give them."""
        if not isinstance(content, str) or "\ufffd" in content:
            # U+FFFD: the server replaced bytes that are not UTF-8.
            return None
        pieces = [table[t] if t < len(table) else None for t in ids]
        if None in pieces:
            return None
        try:
            whole = content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            return None
        tail = b"".join(pieces)  # type: ignore[arg-type]
        if not whole.endswith(tail):
            return None
        return whole[: len(whole) - len(tail)]


# Held text longer than this is not cut into tokens (the cut's cost grows
# with it); what a server holds back is the start of one character and the
# tokens before it in one event.
_MAX_HELD = 128
_MAX_CUT = 32


def cut_into_tokens(held: bytes, k: int, by: dict[bytes, int], longest: int) -> list[int] | None:
    """Ids of tokens of ``by`` (bytes → id, -1 where two ids share bytes)
    whose bytes make up ``held``: ``k`` of them if that can be (the model's
    own ids when only one such cut exists), else as few as can be; None if
    no cut exists or ``held`` is longer than :data:`_MAX_HELD`. Any cut gives
    the same text, which is what a client gets."""
    n = len(held)
    if not held or n > _MAX_HELD:
        return None
    # The tokens starting at each offset, looked up once.
    starts: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for i in range(n):
        for e in range(i + 1, min(n, i + longest) + 1):
            t = by.get(held[i:e])
            if t is not None and t >= 0:
                starts[i].append((e, t))
    # fewest[i]: the fewest tokens that make up held[i:] (n + 1: none do).
    fewest = [n + 1] * (n + 1)
    fewest[n] = 0
    for i in range(n - 1, -1, -1):
        fewest[i] = min((fewest[e] + 1 for e, _ in starts[i]), default=n + 1)
    if fewest[0] > n:
        return None
    out: list[int] = []
    if k <= _MAX_CUT:
        # reach[i]: the numbers of tokens (up to k) that make up held[i:].
        reach: list[set[int]] = [set() for _ in range(n + 1)]
        reach[n].add(0)
        for i in range(n - 1, -1, -1):
            for e, _ in starts[i]:
                reach[i].update(j + 1 for j in reach[e] if j < k)
        if k in reach[0]:
            i, j = 0, k
            while j:
                e, t = next((e, t) for e, t in starts[i] if j - 1 in reach[e])
                out.append(t)
                i, j = e, j - 1
            return out
    i = 0
    while i < n:
        e, t = next((e, t) for e, t in starts[i] if fewest[e] == fewest[i] - 1)
        out.append(t)
        i = e
    return out


BACKENDS: dict[str, type[Backend]] = {b.kind: b for b in (VLLM, SGLang, LlamaCpp)}
KINDS: Sequence[str] = tuple(BACKENDS)
