"""One choice of an answer, from the engine's ids to OpenAI's shapes
(:class:`Choice`): a whole answer, the one choice of a stream and each of
a stream's ``n`` all go through it.

What it decides, once for all of them: where the ids are cut (after a stop
id of the template or the request; at the request's token limit, which an
engine may run past; in a stream, nothing after the message's end is
read), with what finish (``cut_by``: ``stop`` unless the engine or the cut
says the limit), what of the text the request's stop sequences leave out,
how many calls are handed back, and the deprecated ``functions`` shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import XtmlError
from .chunks import ChunkStream
from .engines import BackendError, Generation
from .legacy import FunctionCalls
from .served import Job, Served
from .shape import Shaped, shape_message, writes_call_ids
from .stops import StopSequences

if TYPE_CHECKING:
    from ..codec.stream import StreamParser

__all__ = ["Choice"]


def _lost(k: int, offset: int) -> dict[str, Any]:
    return {"kind": "lost-ids", "offset": offset,
            "message": f"the engine generated {k} id{'s' if k != 1 else ''} here that its stream did not send "
                       "(llama.cpp sends no id for a token that ends inside a UTF-8 character) and whose text "
                       "could not be found again: it is missing"}


class Choice:
    """Choice ``index`` of the answer to ``job``, generated as ``gen`` (the
    job's own for one choice, else its :func:`~.engines.one_choice`).

    A whole answer: :meth:`whole`. A stream (``stream=True``, its chunks
    with the response's ``id`` and ``created``): :meth:`start`, then
    :meth:`feed` for each piece the engine sends until :attr:`done`, then
    :meth:`close`."""

    __slots__ = ("_closed", "_plain", "chunks", "done", "early", "gen", "index", "legacy", "limit", "lost", "max_calls",
                 "n", "parser", "reasoning", "served", "stop_ids", "stops", "thinking", "tools")

    parser: StreamParser
    chunks: ChunkStream

    def __init__(self, served: Served, job: Job, gen: Generation, index: int = 0, *, stream: bool = False,
                 id: str | None = None, created: int | None = None) -> None:
        self.served = served
        self.gen = gen
        self.index = index
        self.thinking = job.thinking
        self.max_calls = job.max_calls
        self.tools = job.tools
        stop = gen.params.get("stop")
        self.stops = StopSequences(stop) if stop else None
        self.legacy = FunctionCalls() if job.legacy else None
        self.stop_ids = frozenset(gen.all_stop_ids())
        self.limit: int | None = gen.params.get("max_tokens")
        self.n = 0
        """Ids read (the engine's lost ones apart)."""
        self.lost = 0
        self.reasoning = 0
        """Of a whole answer, the ids that were reasoning."""
        self.done = False
        """Nothing more of the engine's is read."""
        self.early = False
        """The message ended before the engine said it finished."""
        self._closed = False
        self._plain = self.stops is None and self.legacy is None and not index
        """Whether the chunks go out as the chunk stream makes them."""
        if stream:
            t = served.template
            self.parser = t.stream(served.vocab, thinking=job.thinking, tools=job.tools)
            self.chunks = ChunkStream(model=served.model, id=id, created=created, include_usage=job.include_usage,
                                      template=t, max_calls=job.max_calls)

    @property
    def generated(self) -> int:
        """The ids the engine generated: those read and those it lost."""
        return self.n + self.gen.lost

    def _cut(self, ids: list[int], finish: str | None) -> tuple[list[int], str | None, bool]:
        """``ids`` up to and with the first stop id (and whether there was
        one), and up to the token limit (then the finish is ``length``)."""
        stopped = False
        if not self.stop_ids.isdisjoint(ids):
            # Nor what follows a stop id, in this piece or a later one: the
            # answer and its usage end there.
            ids = ids[:next(k for k, t in enumerate(ids) if t in self.stop_ids) + 1]
            stopped = True
        lost = self.gen.lost
        if self.limit is not None and self.n + lost + len(ids) > self.limit:
            # An engine that goes on past the limit the request set: the
            # answer ends there, as a cut-off one (a stream is closed, which
            # stops the engine).
            ids = ids[:max(0, self.limit - self.n - lost)]
            finish, stopped = "length", False
        return ids, finish, stopped

    # -- a whole answer --------------------------------------------------------------

    def whole(self, ids: list[int], finish: str | None) -> Shaped:
        """The message of a whole answer's ``ids`` and the engine's finish;
        ids the template cannot read are the backend's fault (a 502)."""
        ids, finish, _ = self._cut(ids, finish)
        t, vocab = self.served.template, self.served.vocab
        try:
            parsed = t.parse(ids, vocab, completion=True, lenient=True, thinking=self.thinking,
                             max_chars=max(len(ids), 1), tools=self.tools)
        except XtmlError as e:
            raise BackendError(f"the backend's ids cannot be read: {e}", code="backend_invalid_response") from None
        shaped = shape_message(parsed, cut_by="stop" if finish == "stop" else "length", max_calls=self.max_calls,
                               keep_ids=writes_call_ids(t))
        if self.stops is not None:
            shaped = self.stops.message(shaped, len(ids))
        self.n = len(ids)
        self.reasoning = t.reasoning_tokens(ids, vocab, thinking=self.thinking)
        return shaped

    def rewrite(self, choice: dict[str, Any]) -> None:
        """The choice of the ``chat.completion`` made of :meth:`whole`'s
        message, in the shape the request asked for."""
        if self.legacy is not None:
            self.legacy.choice(choice)

    # -- a stream --------------------------------------------------------------------

    def _out(self, cs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.stops is not None:
            cs = self.stops.chunks(cs, self.n)
        if self.index:
            for c in cs:
                for choice in c["choices"]:
                    choice["index"] = self.index
        if self.legacy is not None:
            cs = [self.legacy.chunk(c) for c in cs]
        return cs

    def start(self) -> list[dict[str, Any]]:
        """The first chunk (the assistant's role)."""
        return self._out(self.chunks.feed(()))

    def feed(self, ids: list[int], finish: str | None) -> list[dict[str, Any]]:
        """The chunks of a piece of the engine's stream: new ``ids`` and, at
        its end, its finish reason."""
        if self.done:
            return []
        gen, chunks = self.gen, self.chunks
        if gen.lost > self.lost:
            # Counted while the engine's events were read, which is before
            # their piece comes here: the note goes out with the message's end.
            chunks.note(_lost(gen.lost - self.lost, gen.lost_at if not self.lost else self.n))
            self.lost = gen.lost
        out: list[dict[str, Any]] = []
        stopped = False
        if ids:
            if chunks.finish_reason is not None:
                # The model goes on after the end of its message (an engine
                # without the end marker as a stop id): that is not read, and
                # closing the stream stops it.
                self.done = True
                return out
            limit = self.limit
            if not self.stop_ids.isdisjoint(ids) or (limit is not None and self.n + gen.lost + len(ids) > limit):
                ids, finish, stopped = self._cut(ids, finish)
            self.n += len(ids)
            parser = self.parser
            out = chunks.feed(parser.feed(ids[0]) if len(ids) == 1 else parser.feed_many(ids))
            if not self._plain:
                out = self._out(out)
        if finish is not None:
            # A message it cut is cut by the request's stop sequences or ids
            # unless the engine says the limit.
            chunks.cut_by = "stop" if finish == "stop" else "length"
            self.done = True
        elif chunks.finish_reason is not None:
            self.done = self.early = True
        elif stopped:
            # A stop id of the request inside the message (llama.cpp takes
            # none and generates on): cut there. What the engine sends next
            # is read as after the end.
            chunks.cut_by = "stop"
            self.done = self.early = True
        return out

    def close(self) -> list[dict[str, Any]]:
        """The last chunks: the end of the message, if it has not ended."""
        if self._closed:
            return []
        self._closed = self.done = True
        return self._out(self.chunks.feed(self.parser.close()))
