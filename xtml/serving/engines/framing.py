"""What every engine behind ``xtml serve`` shares: token ids in, token ids out.

Each engine (one module of this package per kind) builds its request from a
:class:`Generation` (prompt ids, sampling fields, stop ids, an optional
grammar) and reads the engine's answer, whole (:meth:`Backend.generate`) or
as it streams (:meth:`Backend.stream`), back to ids. Nothing here decodes
text: the ids go to xtml's parser as they are. The framing is the same for
all of them: the call, the server-sent events of a stream (``data: {...}``
lines, ending with ``data: [DONE]`` or the engine's last event), the ids
checked against the tokenizer, and the errors.

Failures are :class:`BackendError`, with the HTTP status the gateway answers
(502: unreachable, refused, or an answer that is not the engine's format;
504: timed out; 400: the engine refused the request as too long or invalid).

The engine is reached with :class:`~xtml.serving.client.Client` (aiohttp, pooled
connections), which hands a stream's reader everything that has arrived at
once, so that a read's events are parsed in one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from ...errors import PeerError
from ...plugins.jsonfmt import read
from ..client import Client, ConnectError, ProtocolError, Response, Timeout, TransportError
from ..sampling import MAX_LOGIT_BIAS as MAX_LOGIT_BIAS  # its former home
from ..sampling import MAX_N as MAX_N  # its former home
from ..sampling import MAX_STOP as MAX_STOP  # its former home
from ..sampling import MAX_STOP_CHARS as MAX_STOP_CHARS  # its former home
from ..sampling import MAX_STOP_IDS as MAX_STOP_IDS  # its former home
from ..sampling import sampling as sampling  # its former home

log = logging.getLogger("xtml.serve")

__all__ = [
    "MAX_LOGIT_BIAS",
    "MAX_N",
    "MAX_STOP",
    "MAX_STOP_CHARS",
    "MAX_STOP_IDS",
    "Backend",
    "BackendError",
    "Choice",
    "EventReader",
    "Generation",
    "Output",
    "Piece",
    "answer_object",
    "checked_ids",
    "dumps",
    "garbage",
    "one_choice",
    "sampling",
    "status_error",
    "transport_error",
]

# Bounds what a backend may make the gateway hold: one server-sent event,
# or one whole answer.
_MAX_EVENT = 16 << 20
_MAX_BODY = 256 << 20
_FINISH = 1.0
"""Seconds given to an engine to end a stream's body once it has said it
finished (its closing events), so that the connection can be used again;
the client has its answer by then."""


class EventSplitter:
    """Server-sent events out of a body read in pieces: each read gives the
    data of the events it completes.

    An event that comes in many reads is kept as its pieces and joined once,
    when the blank line that ends it has come: joining on every read copied
    it again each time (quadratic in its size)."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._size = 0
        self._cr = b""  # a read's last \r, whose \n may be the next read's first byte

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._cr:
            chunk, self._cr = self._cr + chunk, b""
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], b"\r"
            chunk = chunk.replace(b"\r\n", b"\n")
            if not chunk:
                return []
        pending = self._pending
        if pending and b"\n\n" not in chunk and not (chunk[:1] == b"\n" and pending[-1][-1:] == b"\n"):
            pending.append(chunk)
            self._size += len(chunk)
            if self._size > _MAX_EVENT:
                raise garbage(f"an event of more than {_MAX_EVENT:,} bytes", "stream")
            return []
        buf = b"".join((*pending, chunk)) if pending else chunk
        self._pending = []
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
        if buf:
            self._pending, self._size = [buf], len(buf)
            if self._size > _MAX_EVENT:
                raise garbage(f"an event of more than {_MAX_EVENT:,} bytes", "stream")
        return events

    def end(self) -> list[bytes]:
        """The end of the body: a last event without the blank line after it."""
        buf = b"".join((*self._pending, self._cr))
        self._pending, self._cr = [], b""
        if not buf.strip():
            return []
        data = _event_data(buf)
        if data is None:
            raise garbage(f"not server-sent events: {buf[:200]!r}", "stream")
        return [data]


class BackendError(PeerError):
    """The backend failed: ``status`` is what the gateway answers (502, 504,
    or 400 when the engine refused the request), ``code`` a short name for
    the cause. A :class:`~xtml.errors.PeerError`: the engine's fault, not
    the caller's (even a 400 is the engine's refusal, passed on)."""

    def __init__(self, msg: str, *, status: int = 502, code: str = "backend_error",
                 location: str | None = None) -> None:
        self.status = status
        self.code = code
        super().__init__(msg, location=location)


def garbage(msg: str, where: str) -> BackendError:
    """An answer, at ``where``, that is not in the engine's format."""
    return BackendError(f"the backend's answer is not what it should send: {msg}", code="backend_invalid_response",
                        location=where)


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
Choice = tuple[int, list[int], "str | None"]
"""What a stream of ``n`` choices gives per event: the choice's index, its
new ids and, at its end, its finish reason."""


def one_choice(gen: Generation, k: int = 0) -> Generation:
    """``gen`` asking for choice ``k`` alone (one of the ``n`` requests of an
    engine without ``n``; the state of one choice of a stream). A request's
    ``seed`` becomes ``seed + k``: the same seed n times would sample the same
    choice n times, where an engine's own ``n`` samples n different ones."""
    params = {key: v for key, v in gen.params.items() if key != "n"}
    seed = params.get("seed")
    if k and type(seed) is int:
        params["seed"] = seed + k
    return dataclasses.replace(gen, params=params, lost=0, lost_at=0)


def checked_ids(v: Any, size: int, where: str) -> list[int]:
    """A list of ids from an answer, each checked to be one of the
    tokenizer's."""
    if not isinstance(v, list):
        raise garbage(f"expected a list of token ids, not {type(v).__name__}", where)
    for k, t in enumerate(v):
        if type(t) is not int or not 0 <= t < size:
            raise garbage(f"{t!r} is not a token id of the tokenizer (0 to {size - 1})", f"{where}[{k}]")
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
    takes_n: ClassVar[bool] = False
    """Whether one request asks the engine for ``n`` choices (else the
    gateway sends ``n`` requests)."""

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

    def reader(self, gen: Generation) -> EventReader:
        """What reads the events of one streamed answer."""
        raise NotImplementedError

    def read_n(self, data: Any, gen: Generation, n: int) -> list[Output]:
        """The ``n`` choices of a whole answer, in order (kinds that take ``n``)."""
        raise NotImplementedError

    def index_of(self, data: Any) -> int:
        """Which choice a stream's event is of (kinds that take ``n``)."""
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
        return self.read(await self._answer(gen), gen)

    async def generate_n(self, gen: Generation) -> list[Output]:
        """The ``n`` choices of the whole answer to ``gen``: one request for
        them all when the engine takes ``n``, else ``n`` requests at once."""
        n = gen.params.get("n", 1)
        if n == 1:
            return [await self.generate(gen)]
        if self.takes_n:
            return self.read_n(await self._answer(gen), gen, n)
        return list(await asyncio.gather(*(self.generate(one_choice(gen, k)) for k in range(n))))

    async def _answer(self, gen: Generation) -> Any:
        if not self.ready:
            await self._ready()
        try:
            status, content = await self.client.request("POST", self.path, dumps(self.body(gen, False)),
                                                        limit=_MAX_BODY)
        except TransportError as e:
            raise transport_error(e, self.url) from None
        if status != 200:
            raise status_error(status, content, self.url)
        try:
            data = read(content)
        except ValueError:
            raise garbage(f"not JSON: {content[:200]!r}", "body") from None
        if isinstance(data, Mapping) and data.get("error"):
            raise BackendError(f"the backend failed: {_message(data)}", code="backend_error")
        return data

    async def stream(self, gen: Generation) -> AsyncGenerator[Piece, None]:
        """The answer to ``gen`` as it is generated: ``(new ids, finish
        reason)``, the reason None until the engine's last piece, which is
        the last one given. Each piece holds the ids of every event that had
        arrived when it was read: one event when the gateway keeps up,
        several when it falls behind, so that its work per read, not per
        event, is what a busy gateway pays. Closing the iterator early
        closes the connection, which cancels the engine's request."""
        async with contextlib.aclosing(self._read(gen, [self.reader(gen)])) as pieces:
            async for got in pieces:
                _, ids, finish = got[0]
                yield ids, finish

    def stream_n(self, gen: Generation, choices: list[Generation]) -> AsyncGenerator[list[Choice], None]:
        """The choices of the answer to ``gen`` as they are generated, each
        read with its own state (``choices``: ``[gen]`` for one, else one
        :func:`one_choice` each): one stream when there is one choice or the
        engine takes ``n`` (its events say which choice they are of), else
        one stream per choice at once. Each item holds the pieces that had
        arrived, as ``(index, new ids, finish reason)``; a choice's last
        piece has its finish reason."""
        if len(choices) > 1 and not self.takes_n:
            return _merged([self._read(c, [self.reader(c)]) for c in choices])
        return self._read(gen, [self.reader(c) for c in choices])

    async def _read(self, gen: Generation, readers: list[EventReader]) -> AsyncGenerator[list[Choice], None]:
        """The one read loop of a stream: each read's events, as the pieces
        of the choices they are of (one reader: its ids of the read joined in
        one piece). Ends when the engine says every choice finished; closing
        it early closes the connection, which cancels the engine's request."""
        if not self.ready:
            await self._ready()
        try:
            resp = await self.client.send("POST", self.path, dumps(self.body(gen, True)))
        except TransportError as e:
            raise transport_error(e, self.url) from None
        ended = False
        finished: set[int] = set()
        index_of = self.index_of if len(readers) > 1 else None
        try:
            if resp.status != 200:
                raise status_error(resp.status, await _read_capped(resp), self.url)
            events = EventSplitter()
            while True:
                try:
                    chunk = await resp.read()
                except TransportError as e:
                    raise transport_error(e, self.url) from None
                found = events.feed(chunk) if chunk else events.end()
                if found:
                    got, ended, failure = _read_events(readers, finished, found, index_of)
                    if got:
                        yield got
                    if failure is not None:
                        raise failure
                    if ended:
                        return
                if not chunk:
                    break
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
            raise transport_error(e, self.url) from None
        if status != 200:
            raise BackendError(f"the backend is not ready: {self.health_path} answered {status}",
                               status=503, code="backend_not_ready")


async def _merged(streams: list[AsyncGenerator[list[Choice], None]]) -> AsyncGenerator[list[Choice], None]:
    """Several streams of one choice each as one, each piece with its
    stream's index, in the order they arrive; closing it closes them all."""
    waiting = {asyncio.ensure_future(anext(s)): k for k, s in enumerate(streams)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            got: list[Choice] = []
            for task in sorted(done, key=waiting.__getitem__):
                k = waiting.pop(task)
                try:
                    ((_, ids, finish),) = task.result()
                except StopAsyncIteration:
                    continue
                got.append((k, ids, finish))
                if finish is None:
                    waiting[asyncio.ensure_future(anext(streams[k]))] = k
            if got:
                yield got
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for s in streams:
            await s.aclose()


def dumps(body: Any) -> bytes:
    """Compact JSON as UTF-8: an engine's body, a gateway's answer."""
    # An engine's body holds the whole prompt as ids: the standard library writes
    # 200 ids in 18 us, orjson in 1 (and 100,000 in about 9 ms against 0.5).
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:  # an integer past 64 bits, which the standard library writes
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _read_events(readers: list[EventReader], finished: set[int], events: list[bytes],
                 index_of: Callable[[Any], int] | None) -> tuple[list[Choice], bool, BackendError | None]:
    """The pieces of a read's events (``index_of`` says which choice an
    event is of, when there are several; one reader's ids are joined in one
    piece), whether the engine said it finished (``[DONE]``, or every choice
    its last piece: anything after that, a usage event, holds no ids), and
    the failure of a bad event (what came before it is still the client's)."""
    got: list[Choice] = []
    ids: list[int] = []
    finish: str | None = None
    one = index_of is None
    ended = False
    try:
        for raw in events:
            data = _decode(raw)
            if data is None:
                ended = True
                break
            k = 0 if index_of is None else index_of(answer_object(data, "stream"))
            if not 0 <= k < len(readers):
                raise garbage(f"an event of choice {k} of {len(readers)}", "stream")
            if k in finished:
                continue
            reader = readers[k]
            piece = reader.read(data)
            if piece is None:
                continue
            if one:
                ids += piece[0]
                finish = piece[1]
            else:
                got.append((k, *piece))
            if piece[1] is not None or reader.done:
                finished.add(k)
                if len(finished) == len(readers):
                    ended = True
                    break
    except BackendError as e:
        failure: BackendError | None = e
    else:
        failure = None
    if one and (ids or finish is not None):
        got.append((0, ids, finish))
    return got, ended, failure


class EventReader:
    """Reads one stream's events, one subclass per kind: :meth:`read` turns
    an event's JSON into a :data:`Piece`, or None for an event without one.
    ``done`` once the engine has said it finished (anything it sends after
    that is not read)."""

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
        return read(data.decode(), _loads)
    except ValueError:
        if data.strip() == b"[DONE]":
            return None
        raise garbage(f"an event that is not JSON: {data[:200]!r}", "stream") from None


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


def _logged(message: str, e: TransportError, url: str) -> str:
    """``message`` for the client, with an id; the engine's address and the
    HTTP client's own words (which may name hosts, ports and paths of the
    network behind the gateway) go to the log under that id."""
    ref = secrets.token_hex(6)
    log.warning("%s (error id %s): %s: %s: %s", message, ref, url, type(e).__name__, e)
    return f"{message} (error id {ref}: the server's log has the details)"


def transport_error(e: TransportError, url: str) -> BackendError:
    """A failed call to the engine at ``url``: 504 when it timed out, else 502."""
    if isinstance(e, Timeout):
        return BackendError(_logged("the backend did not answer in time", e, url), status=504,
                            code="backend_timeout")
    if isinstance(e, ConnectError):
        return BackendError(_logged("cannot reach the backend", e, url), code="backend_unreachable")
    if isinstance(e, ProtocolError):
        return garbage(_logged("not HTTP/1.1", e, url), "http")
    return BackendError(_logged("the connection to the backend failed", e, url), code="backend_connection_lost")


def status_error(status: int, content: bytes, url: str) -> BackendError:
    """An answer with an HTTP ``status`` other than 200: 400 when the engine
    refused the request itself, else 502."""
    try:
        msg = _message(read(content))
    except ValueError:
        msg = content[:1000].decode("utf-8", "replace")
    if status in (400, 413, 422):
        # The engine refused the request itself (a prompt longer than its
        # context, a sampling value it does not take): the client's to fix.
        return BackendError(f"the backend refused the request: {msg}", status=400, code="backend_rejected")
    return BackendError(f"the backend at {url} answered {status}: {msg}", code="backend_error")


def answer_object(data: Any, where: str) -> Mapping[str, Any]:
    """An answer (``where``: ``body``, or ``stream`` for an event) as the
    JSON object it must be; one that holds an error raises it."""
    if not isinstance(data, Mapping):
        raise garbage(f"expected a JSON object, not {type(data).__name__}", where)
    if data.get("error"):
        raise BackendError(f"the backend failed: {_message(data)}", code="backend_error")
    return data
