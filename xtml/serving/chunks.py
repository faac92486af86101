"""The events of a :class:`~xtml.codec.stream.StreamParser` as
``chat.completion.chunk`` objects (:class:`ChunkStream`, one per response),
and those as server-sent events (:func:`sse`, :class:`SSE`). A chunk's
shape is written once (:func:`chunk`); the rules of what goes in it are
those of :mod:`.openai`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

from ..chat.dialect import Dialect
from ..codec.stream import StreamEvent
from ..plugins import jsonfmt
from .shape import (
    CUT_BY,
    Shaped,
    call_diagnostic,
    chat_completion,
    cut_at,
    new_call_id,
    new_completion_id,
    shape,
    usage,
    writes_call_ids,
)

if TYPE_CHECKING:
    from ..template import Template

__all__ = ["SSE", "SSE_DONE", "ChunkStream", "chunk", "sse"]

# What a typed argument's text must parse to (xtml.chat.channels reads
# arguments by the same table); anything else stays a string.
_TYPES: dict[str, type | tuple[type, ...]] = {
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
    "object": dict,
    "array": list,
}

SSE_DONE = "data: [DONE]\n\n"
"""The line that ends a server-sent event stream, as OpenAI ends it."""

def sse(chunk: Mapping[str, Any]) -> str:
    """A chunk as one server-sent event (``data: {...}`` and a blank line);
    :data:`SSE_DONE` ends the stream."""
    return "data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")) + "\n\n"



def chunk(base: Mapping[str, Any], delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A ``chat.completion.chunk`` of one choice: ``base`` (the response's
    id, object, created, model, and ``usage`` None when the stream ends
    with its usage) with the choice's ``delta`` and ``finish_reason``."""
    return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def _value(raw: str, typ: str) -> str:
    """A typed argument's JSON, as the parser reads it: its text parsed as
    its type, or the text as a string when it is not one."""
    if typ == "json":
        # A reader that reads a value by a syntax of its own (Gemma's) hands
        # over the value it read, as JSON: its type is the value's.
        try:
            return jsonfmt.value(jsonfmt.loads(raw))
        except ValueError:  # not JSON, or not standard JSON
            return encode_basestring(raw)
    want = _TYPES.get(typ)
    if want is not None:
        try:
            v = jsonfmt.loads(raw)
        except ValueError:  # not JSON, or not standard JSON
            pass
        else:
            if isinstance(v, want) and not (typ == "number" and isinstance(v, bool)):
                return jsonfmt.value(v)
    return encode_basestring(raw)


class _Call:
    """One tool call of a stream, as far as it has been sent."""

    __slots__ = ("args", "block", "buf", "diverged", "done", "final", "frozen", "id", "index", "keys", "name",
                 "open", "sent", "started", "typ")

    def __init__(self, index: int, id_: str, name: str) -> None:
        self.index = index
        """Its place in ``tool_calls``, from 0 (the chunks' ``index``)."""
        self.id = id_
        self.name = name
        self.started = False
        """Whether its first chunk (id and name) went out."""
        self.sent: list[str] = []
        """The argument text sent so far."""
        self.args = 0
        self.keys: set[str] = set()
        self.open = False
        """Inside an argument whose text is being sent."""
        self.buf: list[str] | None = None
        """A non-string value's text, kept until its argument ends."""
        self.typ = "string"
        self.block = False
        """Its arguments are a json block (sent whole at the end)."""
        self.frozen = False
        """Something was read that may change what was sent: nothing more
        is sent until the final arguments are known."""
        self.final: str | None = None
        """The arguments, once the call has ended."""
        self.done = False
        """Its last chunk went out (or it was given up)."""
        self.diverged = False


class ChunkStream:
    """The events of one streamed completion as ``chat.completion.chunk``
    objects.

    ``feed(events)`` takes what :meth:`StreamParser.feed` (or ``feed_many``,
    ``close``) returned and gives the chunks to send, in order; the chunk
    with ``finish_reason`` comes with the ``message_end`` event. ``close()``
    gives the usage chunk when ``include_usage`` (OpenAI's
    ``stream_options.include_usage``). ``id`` and ``created`` default to a new
    id and now; ``ids`` makes call ids (default :func:`new_call_id`);
    ``template`` (a Template or Dialect) names the channels when the
    template renames think and response. ``stream_arguments=False`` sends
    each tool call whole once it is known to be kept. ``max_calls`` is the
    most calls sent (1 when the request set ``parallel_tool_calls`` false):
    a further call sends nothing, and is named by a ``withheld-call``
    diagnostic.
    """

    def __init__(self, *, model: str, id: str | None = None, created: int | None = None,
                 include_usage: bool = False, ids: Callable[[], str] | None = None,
                 stream_arguments: bool = True, template: Template | Dialect | None = None,
                 max_calls: int | None = None) -> None:
        self.model = model
        self.max_calls = max_calls
        self.id = id or new_completion_id()
        self.created = int(time.time()) if created is None else created
        self.include_usage = include_usage
        self.stream_arguments = stream_arguments
        self._ids = ids or new_call_id
        self._keep_ids = writes_call_ids(template)
        d: Dialect | None = template if template is None or isinstance(template, Dialect) else template.dialect
        # Which channel's text is which field: the dialect says what each holds.
        reasoning = d.channel_tag("reasoning") if d is not None else "think"
        content = d.channel_tag("content") if d is not None else "response"
        self._fields: dict[str | None, str] = {
            tag: field for tag, field in ((reasoning, "reasoning_content"), (content, "content")) if tag is not None}
        # Where the reasoning channel was opened and closed: the usage's
        # reasoning_tokens.
        self._reasoning_tag = reasoning
        self._reasoning_open = False
        self._reasoning_end: int | None = None
        self._base: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                      "model": model}
        if include_usage:
            self._base["usage"] = None  # as OpenAI sends every chunk but the last
        self._begun = False
        self._calls: dict[int, _Call] = {}
        self._diags: list[dict[str, Any]] = []
        self._shaped: Shaped | None = None
        self._closed = False
        # The chunk last added to the output of the current feed, and what
        # its delta carries: consecutive pieces of one field share a chunk.
        self._last: dict[str, Any] | None = None
        self._last_key: Any = None
        # The pieces of that chunk's text when more than one came, joined
        # once when the chunk is done: adding each to the text so far copied
        # it again per piece (one engine read of 400,000 ids took 13 s).
        self._pieces: list[str] | None = None
        self._field = ""
        self.cut_by = "length"
        """The finish reason if the message turns out cut off: set it to
        ``stop`` before the last events when the engine said it stopped for
        the request's stop sequences or ids."""

    # -- results ---------------------------------------------------------------------

    @property
    def message(self) -> dict[str, Any] | None:
        """The final message (the batch shape of the parser's message, with
        this stream's call ids), once the message has ended."""
        return self._shaped.message if self._shaped is not None else None

    @property
    def finish_reason(self) -> str | None:
        return self._shaped.finish_reason if self._shaped is not None else None

    @property
    def diagnostics(self) -> list[dict[str, Any]]:
        """Every diagnostic so far: the parser's, then the shaping's."""
        return self._diags

    def note(self, diagnostic: Mapping[str, Any]) -> None:
        """Add a diagnostic from outside the parser (the engine's): it goes
        with the others in the chunk that ends the message."""
        self._diags.append(dict(diagnostic))

    def completion(self, *, prompt_tokens: int | None = None,
                   completion_tokens: int | None = None) -> dict[str, Any]:
        """The ``chat.completion`` object of this response (same id, model,
        created and call ids), once the message has ended."""
        shaped = self._ended()
        return chat_completion(Shaped(shaped.message, shaped.finish_reason, self._diags), model=self.model,
                               id=self.id, created=self.created, prompt_tokens=prompt_tokens,
                               completion_tokens=completion_tokens,
                               reasoning_tokens=None if completion_tokens is None
                               else self.reasoning_tokens(completion_tokens))

    def _ended(self) -> Shaped:
        if self._shaped is None:
            raise RuntimeError("the message has not ended: feed the events of StreamParser.close() first")
        return self._shaped

    # -- feeding ---------------------------------------------------------------------

    def feed(self, events: Iterable[StreamEvent]) -> list[dict[str, Any]]:
        """The chunks that ``events`` complete."""
        out: list[dict[str, Any]] = []
        self._seal()
        self._last = None
        if not self._begun:
            self._begun = True
            out.append(self._chunk({"role": "assistant", "content": ""}))
        fields = self._fields
        for e in events:
            t = e.type
            if t == "text":
                key = fields.get(e.channel)
                if key is None:
                    raise ValueError(f"text of a channel named {e.channel!r}: the events come from a template "
                                     "whose think and response channels have other names than this stream's "
                                     "(pass template=)")
                if e.text:
                    self._text(out, key, e.text)
            elif t == "argument_delta":
                c = self._calls.get(e.index or 0)
                if c is not None and c.open and e.text:
                    if c.buf is None:
                        self._send(out, c, encode_basestring(e.text)[1:-1])
                    else:
                        c.buf.append(e.text)
            elif t == "diagnostic":
                if e.diagnostic is not None:
                    self._diags.append(dict(e.diagnostic))
            elif t == "argument_start":
                self._argument_start(out, e)
            elif t == "argument_end":
                self._argument_end(out, e)
            elif t == "tool_call_start":
                self._call_start(out, e)
            elif t == "tool_call_end":
                c = self._calls.get(e.index or 0)
                fn = (e.call or {}).get("function")
                if c is not None and isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                    c.final = fn["arguments"]
            elif t == "message_end":
                self._message_end(out, e)
            elif t == "channel_start":
                if e.channel == self._reasoning_tag:
                    self._reasoning_open = True
            elif t == "channel_end":
                if e.channel == self._reasoning_tag and self._reasoning_end is None:
                    self._reasoning_end = e.offset + 1
        self._seal()
        return out

    def kept_arguments(self, index: int) -> str | None:
        """The final arguments of call ``index`` (from 0, the chunks'
        ``index``) once it is known to be kept: its element closed and the
        next call started, so its chunks have all been sent; else None."""
        c = self._calls.get(index + 1)
        return c.final if c is not None and c.done and c.final is not None else None

    def reasoning_tokens(self, completion_tokens: int) -> int:
        """How many of the ``completion_tokens`` ids were reasoning: up to
        and with the reasoning channel's close, all of them when it never
        closed, none when it never opened (as
        :meth:`xtml.Template.reasoning_tokens` counts a whole answer's)."""
        if self._reasoning_end is not None:
            return min(self._reasoning_end, completion_tokens)
        return completion_tokens if self._reasoning_open else 0

    def close(self, *, prompt_tokens: int | None = None, completion_tokens: int | None = None,
              reasoning_tokens: int | None = None) -> list[dict[str, Any]]:
        """The end of the response: the usage chunk (``choices`` empty) when
        ``include_usage``, which needs both token counts; else nothing.
        ``reasoning_tokens`` defaults to this stream's count
        (:meth:`reasoning_tokens`); a response of ``n`` choices gives their
        sum, as it gives the sum of their ``completion_tokens``."""
        self._ended()
        if self._closed or not self.include_usage:
            return []
        if reasoning_tokens is None and completion_tokens is not None:
            reasoning_tokens = self.reasoning_tokens(completion_tokens)
        counted = usage(prompt_tokens, completion_tokens, reasoning_tokens)
        if counted is None:
            raise TypeError("include_usage needs prompt_tokens and completion_tokens")
        self._closed = True
        return [{**self._base, "choices": [], "usage": counted}]

    # -- chunks ----------------------------------------------------------------------

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return chunk(self._base, delta, finish)

    def _seal(self) -> None:
        """The last chunk's text, joined from its pieces."""
        pieces = self._pieces
        if pieces is not None:
            assert self._last is not None
            self._last[self._field] = "".join(pieces)
            self._pieces = None

    def _more(self, text: str) -> None:
        pieces = self._pieces
        if pieces is None:
            assert self._last is not None
            self._pieces = [self._last[self._field], text]
        else:
            pieces.append(text)

    def _text(self, out: list[dict[str, Any]], key: str, text: str) -> None:
        if self._last_key == key and self._last is not None:
            self._more(text)
            return
        self._seal()
        delta = {key: text}
        out.append(chunk(self._base, delta))
        self._last, self._last_key, self._field = delta, key, key

    def _send(self, out: list[dict[str, Any]], c: _Call, s: str) -> None:
        """Argument text of a started call."""
        if not s:
            return
        c.sent.append(s)
        if self._last_key is c and self._last is not None:
            self._more(s)
            return
        self._seal()
        fn = {"arguments": s}
        out.append(chunk(self._base, {"tool_calls": [{"index": c.index, "function": fn}]}))
        self._last, self._last_key, self._field = fn, c, "arguments"

    def _whole(self, out: list[dict[str, Any]], c: _Call, arguments: str) -> None:
        self._seal()
        out.append(self._chunk({"tool_calls": [{"index": c.index, "id": c.id, "type": "function",
                                                "function": {"name": c.name, "arguments": arguments}}]}))
        self._last = self._last_key = None
        c.started = c.done = True

    # -- calls -----------------------------------------------------------------------

    def _call_start(self, out: list[dict[str, Any]], e: StreamEvent) -> None:
        k = (e.index or 0) - 1
        if k < 0 or k + 1 in self._calls:
            return
        # The call before this one is not the last: it is kept.
        prev = self._calls.get(k)
        if prev is not None and prev.final is not None and not prev.done:
            self._finish_call(out, prev, prev.final)
        if self.max_calls is not None and k >= self.max_calls:
            return  # one call too many: nothing of it is sent, and the shaping withholds it
        c = _Call(k, self._ids(), e.name or "")
        self._calls[k + 1] = c
        if self.stream_arguments:
            self._seal()
            out.append(self._chunk({"tool_calls": [{"index": k, "id": c.id, "type": "function",
                                                    "function": {"name": c.name, "arguments": ""}}]}))
            self._last = self._last_key = None
            c.started = True

    def _argument_start(self, out: list[dict[str, Any]], e: StreamEvent) -> None:
        c = self._calls.get(e.index or 0)
        if c is None or not c.started or c.frozen or c.block:
            return  # not streamed, or a json block's arguments (the rest of the call is ignored)
        if e.key is None and e.value_type == "json":
            if c.args:
                c.frozen = True  # the block replaces the arguments already sent
            else:
                c.block = True
            return
        key = e.key or ""
        if key in c.keys:
            c.frozen = True  # given twice: the parser keeps one
            return
        c.keys.add(key)
        head = ("{" if not c.args else ", ") + encode_basestring(key) + ": "
        c.args += 1
        c.typ = e.value_type or "string"
        if c.typ == "string":
            head += '"'
            c.buf = None
        else:
            c.buf = []
        c.open = True
        self._send(out, c, head)

    def _argument_end(self, out: list[dict[str, Any]], e: StreamEvent) -> None:
        c = self._calls.get(e.index or 0)
        if c is None or not c.open:
            return
        c.open = False
        if c.buf is None:
            self._send(out, c, '"')
        else:
            self._send(out, c, _value("".join(c.buf), c.typ))
            c.buf = None

    def _finish_call(self, out: list[dict[str, Any]], c: _Call, final: str) -> None:
        """The rest of a kept call's arguments."""
        c.done = True
        if not c.started:
            self._whole(out, c, final)
            return
        sent = "".join(c.sent)
        if final.startswith(sent):
            self._send(out, c, final[len(sent):])
        else:
            c.diverged = True

    def _message_end(self, out: list[dict[str, Any]], e: StreamEvent) -> None:
        if self._shaped is not None:
            return
        calls = self._calls
        self._seal()
        self._last = self._last_key = None

        def id_of(k: int) -> str:
            c = calls.get(k + 1)
            return c.id if c is not None else self._ids()

        shaped = shape(e.message or {"role": "assistant"}, e.stop_reason == "length", id_of,
                        cut_at(self._diags, e.offset), self.cut_by if self.cut_by in CUT_BY else "length",
                        self.max_calls, self._keep_ids)
        kept = shaped.message.get("tool_calls", [])
        extra: list[dict[str, Any]] = []
        for k, call in enumerate(kept):
            c = calls.get(k + 1)
            if c is None:
                c = calls[k + 1] = _Call(k, call["id"], call["function"]["name"])
            if not c.done:
                self._finish_call(out, c, call["function"]["arguments"])
            if c.diverged:
                extra.append(call_diagnostic("diverged-call", e.offset, k, c.id, c.name,
                                        "was read with other arguments than those already sent (a key given "
                                        "twice, or a json block after arguments): nothing more is sent for it; "
                                        "the final message has the arguments as read"))
        # A call withheld by the cut is named by the shaping; any other call
        # that started but is not in the message is named here.
        named = len(kept) + sum(d.get("kind") == "withheld-call" for d in shaped.diagnostics)
        for c in calls.values():
            if c.index >= named:
                extra.append(call_diagnostic("withheld-call", e.offset, c.index, c.id, c.name,
                                        "is not in the final message: it is withheld and must not run"))
        self._diags += [*shaped.diagnostics, *extra]
        self._shaped = shaped
        final = self._chunk({}, shaped.finish_reason)
        final["choices"][0]["xtml_diagnostics"] = list(self._diags)
        out.append(final)


class SSE:
    """:func:`sse` for the chunks of one :class:`ChunkStream`, the same
    text, with the chunk's constant part written once: most chunks are one
    delta (a piece of text or of arguments), and encoding only that delta
    is several times cheaper than encoding the chunk."""

    __slots__ = ("head", "size", "tail")

    def __init__(self, chunks: ChunkStream) -> None:
        base = chunks._base
        self.size = len(base) + 1
        # The text around the delta, as :func:`chunk` shapes it.
        self.head, _, self.tail = sse(chunk(base, {})).partition('"delta":{}')
        self.head += '"delta":'

    def __call__(self, c: dict[str, Any]) -> str:
        choices = c["choices"]
        if len(c) == self.size and len(choices) == 1:
            one = choices[0]
            if len(one) == 4 and one["finish_reason"] is None and one["index"] == 0 and one["logprobs"] is None:
                delta = one["delta"]
                if len(delta) == 1:
                    key, value = next(iter(delta.items()))
                    if type(value) is str:
                        return self.head + "{" + encode_basestring(key) + ":" + encode_basestring(value) + "}" \
                            + self.tail
                return self.head + json.dumps(delta, ensure_ascii=False, separators=(",", ":")) + self.tail
        return sse(c)
