"""The gateway's two answer paths, over :class:`~.choice.Choice`: a whole
answer (:func:`complete`: every choice at once, as one ``chat.completion``
or Responses ``response``) and a stream (:func:`stream`: one choice or
``n``, as ``chat.completion.chunk`` events or a Responses stream's typed
events).

A stream's events are written as one payload per read from the engine,
each ``send`` straight to the server. The engine's first piece is awaited
before answering, so that a backend that is down or refuses gets its own
status code, not a stream; a failure after the stream has started ends it
with one error event (and ``data: [DONE]``). A client that disconnects
cancels its backend request: the connection to the backend is closed,
which engines take as an abort.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from starlette.types import Receive, Send

from .asgi import SSE_HEADERS, Watch, respond
from .choice import Choice
from .chunks import SSE, SSE_DONE
from .engines import Backend, BackendError, dumps, one_choice
from .engines import Choice as Pieces
from .faults import backend_error, error_event, internal
from .served import Job, Served
from .shape import chat_completion

__all__ = ["complete", "stream"]

_FINISH = 1.0
"""Seconds a stream whose message has ended waits, after answering, for the
engine's closing events: the connection is then used again, not closed."""


async def complete(served: Served, backend: Backend, job: Job, receive: Receive, send: Send) -> None:
    """The whole answer to ``job``."""
    watch = Watch(receive)
    try:
        outs = await backend.generate_n(job.gen)
    except BackendError as e:
        watch.stop()
        await respond(send, *backend_error(e))
        return
    except asyncio.CancelledError:
        watch.stop()
        if not watch.forgive():
            raise
        return  # nobody is listening
    watch.stop()
    choices = [Choice(served, job, job.gen, k) for k in range(len(outs))]
    try:
        shaped = [one.whole(out.ids, out.finish_reason) for one, out in zip(choices, outs, strict=True)]
    except BackendError as e:
        await respond(send, *backend_error(e))
        return
    # Usage as OpenAI counts n choices: the prompt once, every choice's tokens.
    completion = chat_completion(shaped, model=served.model, prompt_tokens=len(job.gen.prompt),
                                 completion_tokens=sum(one.n for one in choices),
                                 reasoning_tokens=sum(one.reasoning for one in choices))
    if job.api is not None:
        await respond(send, 200, dumps(job.api.whole(completion)))
        return
    for one, choice in zip(choices, completion["choices"], strict=True):
        one.rewrite(choice)
    await respond(send, 200, dumps(completion))


async def stream(served: Served, backend: Backend, job: Job, receive: Receive, send: Send) -> None:
    """The answer to ``job`` as it is generated: its one choice, or each of
    its ``n`` read, cut and parsed alike, its chunks carrying its index."""
    n = job.gen.params.get("n", 1)
    gens = [job.gen] if n == 1 else [one_choice(job.gen, k) for k in range(n)]
    first = Choice(served, job, gens[0], stream=True)
    choices = [first, *(Choice(served, job, g, k, stream=True, id=first.chunks.id, created=first.chunks.created)
                        for k, g in enumerate(gens) if k)]
    pieces = backend.stream_n(job.gen, gens)
    watch = Watch(receive)
    try:
        try:
            got = await anext(pieces, None)
        except BackendError as e:
            watch.stop()
            await respond(send, *backend_error(e))
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        early = await _events(job, choices, got, pieces, send, watch)
        if early and len(choices) == 1:
            # The client has its answer; the engine's closing events are read
            # so that its connection can be used again (ids instead mean the
            # model goes on: closing the stream stops it). Those of n choices
            # come on n connections, or among the others' ids: not waited for.
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


async def _events(job: Job, choices: list[Choice], got: list[Pieces] | None,
                  pieces: AsyncGenerator[list[Pieces], None], send: Send, watch: Watch) -> bool:
    """Write the stream's events, one payload per read; true when every
    message ended before the engine's stream did."""
    api = job.api
    first = choices[0].chunks
    sse = SSE(first)

    def encode(cs: list[dict[str, Any]]) -> list[str]:
        if api is not None:
            return api.events(cs)
        return [sse(c) for c in cs]

    def failed(message: str, *, type: str, code: str | int | None) -> str:
        return api.error_event(message, code) if api is not None else error_event(message, type=type, code=code)

    async def end(last: str) -> bool:
        out.append(last)
        watch.stop()
        await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
        return False

    if api is not None:
        api.source = first
    out: list[str] = []
    left = len(choices)  # those still reading
    try:
        for one in choices:
            out += encode(one.start())
        while got is not None:
            for k, ids, finish in got:
                one = choices[k]
                if not one.done:
                    out += encode(one.feed(ids, finish))
                    left -= one.done
            if not left:
                break
            if out:
                await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": True})
                out = []
            got = await anext(pieces, None)
    except BackendError as e:
        if left:
            return await end(failed(str(e), type="backend_error", code=e.code))
        # The messages had ended: what failed after them is not the client's concern.
    except OSError:
        raise  # the client went away
    except Exception as e:  # a fault of the gateway itself: the stream says so and ends
        return await end(failed(internal("the stream of a chat completion failed", e), type="server_error",
                                code=500))
    try:
        for one in choices:
            out += encode(one.close())
        generated = sum(one.generated for one in choices)
        out += encode(first.close(prompt_tokens=len(job.gen.prompt), completion_tokens=generated,
                                  reasoning_tokens=sum(one.chunks.reasoning_tokens(one.generated)
                                                       for one in choices)))
    except Exception as e:
        return await end(failed(internal("the stream of a chat completion failed", e), type="server_error",
                                code=500))
    if api is None:
        out.append(SSE_DONE)  # a Responses stream ends with its response.completed event
    watch.stop()
    await send({"type": "http.response.body", "body": "".join(out).encode(), "more_body": False})
    return all(one.early for one in choices)
