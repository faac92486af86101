"""Completions in the shapes of the OpenAI Chat Completions API.

A parsed completion (``Template.parse(ids, tok, completion=True,
lenient=True)``, or the ``message`` of the stream's ``message_end``) becomes a
``chat.completion`` object (:func:`chat_completion`, or just its message and
finish reason: :func:`shape_message`), and the events of a
:class:`~xtml.codec.stream.StreamParser` become ``chat.completion.chunk``
objects (:class:`ChunkStream`, one per response). The functions keep no
state; a :class:`ChunkStream` holds only what one response needs, and its work
per text token is one small dict.

The rules (docs/serving.md has them with examples; spec.md §8.8 the cut-off
rule):

* **Fields.** The message is ``role``, ``content`` (text; ``None`` when there
  is none and the message makes calls, as OpenAI sends it),
  ``reasoning_content`` when the model reasoned, and ``tool_calls``. Content
  parts that are not text (an image the model wrote) have no place in an
  assistant message's text: they are left out, with a diagnostic.
* **Finish reason.** ``length`` when the completion was cut off (the stream's
  ``stop_reason``; for a batch parse, a ``truncated`` diagnostic without an
  ``early-end`` one: the input ended inside the message), else
  ``tool_calls`` when a call is handed back, else ``stop``. A message the
  engine stopped before its end (stop sequences or ids, a token of its own)
  is cut off too, and finishes with ``stop`` (``cut_by``).
* **Stop sequences** (:class:`StopSequences`): the text ends before the
  first one the model writes; a stream holds back what could start one.
* **Call ids** come from ``ids``, a function called once per call (default
  :func:`new_call_id`: ``call_`` and 24 random URL-safe characters, as
  OpenAI's); the normal form's ``call_0_K`` are ids inside a conversation and
  are not used. In a stream a call gets its id when it starts, and keeps it
  in the final message.
* **Cut-off calls.** When the completion was cut off, its last tool call is
  withheld from ``tool_calls``: the cut may have fallen inside it, and a call
  the model did not finish must not run. A diagnostic (kind
  ``withheld-call``) names it. A stream that has already sent the call's start
  sends nothing more for it: its arguments never get their closing brace, so
  they do not parse as JSON. ``ChunkStream(stream_arguments=False)`` sends
  each call whole once it is known to be kept, so that its chunks add up to
  exactly the batch message, cut-off calls included.
* **One call at most** (``max_calls=1``, for a request that set
  ``parallel_tool_calls`` false, when the engine made more anyway): the
  first call is kept, each further one withheld with a ``withheld-call``
  diagnostic; a stream sends nothing of it.
* **Arguments as they stream.** Typed arguments are sent as JSON text:
  ``{"key": `` when an argument starts, a string value's characters
  JSON-escaped as they arrive (escaping is per character, so the pieces join
  to the escaped whole), any other value once its argument ends (in the
  spelling of :func:`xtml.plugins.jsonfmt.arguments`; a value that is not of
  its declared type, or not standard JSON, is the string it was, as the
  parser reads it), ``, `` between arguments, and ``}`` when the call is
  known to be kept (the next call starts, or the message ends uncut). A json fallback
  block (arguments that are not a JSON object) is sent whole at the same
  point: a piece of it is no use to a client, and a cut-off one must not look
  complete. The pieces of a kept call join to exactly its final
  ``arguments``; when the parser settles on other arguments than those
  already sent (a key given twice, a json block after typed arguments), the
  call gets nothing more and a diagnostic (``diverged-call``) says so; the
  final message (:meth:`ChunkStream.completion`) has the parser's reading.
* **Diagnostics** go in ``choices[i]["xtml_diagnostics"]``, next to
  ``message`` (or, in a stream, on the chunk that carries ``finish_reason``);
  the message itself holds only OpenAI's fields. Each is the parser's
  ``{kind, offset, message}``; those about a call add its ``index`` (as in
  the chunks), ``id`` and ``name``. Diagnostics the stream reports after the
  message ended (output after the end marker) are in
  :attr:`ChunkStream.diagnostics` and :meth:`ChunkStream.completion` only.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any, NamedTuple

from ..chat.dialect import Dialect
from ..codec.stream import StreamEvent
from ..errors import RequestError
from ..plugins import jsonfmt

if TYPE_CHECKING:
    from ..template import Template

__all__ = [
    "SSE_DONE",
    "ChunkStream",
    "FunctionCalls",
    "Shaped",
    "StopSequences",
    "chat_completion",
    "new_call_id",
    "new_completion_id",
    "shape_message",
    "sse",
]

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


def new_call_id() -> str:
    """A tool-call id as OpenAI makes them: ``call_`` and 24 random
    URL-safe characters."""
    return "call_" + secrets.token_urlsafe(18)


def new_completion_id() -> str:
    """A completion id: ``chatcmpl-`` and 24 random URL-safe characters."""
    return "chatcmpl-" + secrets.token_urlsafe(18)


def sse(chunk: Mapping[str, Any]) -> str:
    """A chunk as one server-sent event (``data: {...}`` and a blank line);
    :data:`SSE_DONE` ends the stream."""
    return "data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")) + "\n\n"


class Shaped(NamedTuple):
    """A completion in OpenAI's terms."""

    message: dict[str, Any]
    """``{"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}``."""
    finish_reason: str
    """``stop``, ``tool_calls`` or ``length``."""
    diagnostics: list[dict[str, Any]]
    """The parser's diagnostics, then those of the shaping (withheld calls,
    dropped parts)."""


def _cut(diagnostics: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a batch parse's diagnostics say the input ended inside the
    message (an end marker inside it ends it instead: ``early-end``)."""
    kinds = {d.get("kind") for d in diagnostics}
    return "truncated" in kinds and "early-end" not in kinds


def _cut_at(diagnostics: Sequence[Mapping[str, Any]], default: int) -> int:
    """Where the cut was reported (the last ``truncated`` diagnostic)."""
    for d in reversed(diagnostics):
        if d.get("kind") == "truncated" and isinstance(d.get("offset"), int):
            return int(d["offset"])
    return default


def _call_diag(kind: str, offset: int, index: int, id_: str, name: str, why: str) -> dict[str, Any]:
    return {"kind": kind, "offset": offset, "message": f"tool call {index} ({name!r}, id {id_}) {why}",
            "index": index, "id": id_, "name": name}


def _text_of(content: Any, diags: list[dict[str, Any]]) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content", f"content must be a string or a list of parts, not {type(content).__name__}")
    pieces: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        else:
            what = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            diags.append({"kind": "dropped-part", "offset": 0,
                          "message": f"content part {i} ({what!r}) is not text: an OpenAI assistant message "
                                     "holds only text, so it is left out"})
    return "".join(pieces)


def _bad(where: str, msg: str) -> RequestError:
    return RequestError(msg, location=f"parsed completion: {where}")


def _calls_of(parsed: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, arguments) of each call of a parsed message."""
    calls = parsed.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _bad("tool_calls", "tool_calls must be a list")
    out: list[tuple[str, str]] = []
    for i, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments"), str):
            raise _bad(f"tool_calls[{i}]", "a call must be {'function': {'name': str, 'arguments': str}}")
        out.append((fn["name"], fn["arguments"]))
    return out


_CUT_BY = {"length": "was cut off by the token limit", "stop": "was cut off where the engine stopped (a stop "
           "sequence or stop token of the request)"}


_ONE_CALL = ("is more than the request allows (parallel_tool_calls is false, and the engine made more than one "
             "call): it is withheld and must not run")


def _shape(parsed: Any, cut: bool, id_of: Callable[[int], str], end: int, cut_by: str = "length",
           max_calls: int | None = None) -> Shaped:
    """The shaping itself; ``id_of(k)`` gives call ``k``'s id (from 0);
    ``cut_by``: the finish reason of a cut message (``stop`` when the
    engine stopped it for the request's stop sequences or ids);
    ``max_calls``: the most calls handed back."""
    if not isinstance(parsed, Mapping):
        raise _bad("", f"expected the assistant message a completion parse returns, not {type(parsed).__name__}")
    if parsed.get("role", "assistant") != "assistant":
        raise _bad("role", f"expected an assistant message, not role {parsed.get('role')!r}")
    given = parsed.get("diagnostics") or []
    if not isinstance(given, list):
        raise _bad("diagnostics", "diagnostics must be a list")
    diags: list[dict[str, Any]] = [dict(d) for d in given if isinstance(d, Mapping)]
    text = _text_of(parsed.get("content"), diags)
    calls = _calls_of(parsed)
    kept = len(calls) - 1 if cut and calls else len(calls)
    allowed = kept if max_calls is None else min(kept, max_calls)
    tool_calls = [{"id": id_of(k), "type": "function", "function": {"name": name, "arguments": args}}
                  for k, (name, args) in enumerate(calls[:allowed])]
    for k in range(allowed, kept):
        diags.append(_call_diag("withheld-call", end, k, id_of(k), calls[k][0], _ONE_CALL))
    if kept < len(calls):
        diags.append(_call_diag("withheld-call", _cut_at(diags, end), kept, id_of(kept), calls[kept][0],
                                f"{_CUT_BY[cut_by]}: it is withheld and must not run"))
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not tool_calls else None}
    reasoning = parsed.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    reason = cut_by if cut else ("tool_calls" if tool_calls else "stop")
    return Shaped(message, reason, diags)


def shape_message(parsed: Mapping[str, Any], *, stop_reason: str | None = None,
                  ids: Callable[[], str] | None = None, cut_by: str = "length",
                  max_calls: int | None = None) -> Shaped:
    """A parsed completion as an OpenAI message, finish reason and
    diagnostics.

    ``parsed`` is what ``Template.parse(..., completion=True, lenient=True)``
    returns (its ``diagnostics`` say whether it was cut off), or the
    ``message`` of a ``message_end`` event with its ``stop_reason``. ``ids``
    makes each call's id (default :func:`new_call_id`). ``cut_by`` is the
    finish reason of a message that was cut off: ``length`` (the token
    limit), or ``stop`` when the engine said it stopped for the request's
    stop sequences or ids. ``max_calls`` is the most calls handed back
    (1 when the request set ``parallel_tool_calls`` false): the first ones
    are kept, and each further one is withheld with a diagnostic
    (``withheld-call``)."""
    if cut_by not in _CUT_BY:
        raise ValueError(f"cut_by must be one of {', '.join(_CUT_BY)}, not {cut_by!r}")
    make = ids or new_call_id
    cut = _cut(parsed.get("diagnostics") or []) if stop_reason is None else stop_reason == "length"
    return _shape(parsed, cut, lambda k: make(), 0, cut_by, max_calls)


def _usage(prompt_tokens: int | None, completion_tokens: int | None,
           reasoning_tokens: int | None = None) -> dict[str, Any] | None:
    if prompt_tokens is None and completion_tokens is None:
        return None
    if prompt_tokens is None or completion_tokens is None:
        raise TypeError("usage needs both prompt_tokens and completion_tokens")
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def _choice(index: int, shaped: Shaped) -> dict[str, Any]:
    return {"index": index, "message": shaped.message, "finish_reason": shaped.finish_reason, "logprobs": None,
            "xtml_diagnostics": shaped.diagnostics}


def chat_completion(parsed: Mapping[str, Any] | Shaped | Sequence[Mapping[str, Any] | Shaped], *, model: str,
                    id: str | None = None, created: int | None = None, prompt_tokens: int | None = None,
                    completion_tokens: int | None = None, stop_reason: str | None = None,
                    ids: Callable[[], str] | None = None, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """A whole ``chat.completion`` object: ``parsed`` as :func:`shape_message`
    takes it (or already shaped), or a list of them, one choice each (``n``).
    ``usage`` is there when the token counts are given, with
    ``completion_tokens_details.reasoning_tokens`` when that is given
    (:meth:`xtml.Template.reasoning_tokens` counts it)."""
    items: list[Mapping[str, Any] | Shaped] = [parsed] if isinstance(parsed, Shaped | Mapping) else list(parsed)
    choices = []
    for k, p in enumerate(items):
        shaped = p if isinstance(p, Shaped) else shape_message(p, stop_reason=stop_reason, ids=ids)
        choices.append(_choice(k, shaped))
    out: dict[str, Any] = {"id": id or new_completion_id(), "object": "chat.completion",
                           "created": int(time.time()) if created is None else created, "model": model,
                           "choices": choices}
    usage = _usage(prompt_tokens, completion_tokens, reasoning_tokens)
    if usage is not None:
        out["usage"] = usage
    return out


class StopSequences:
    """OpenAI's ``stop``: the text a model returns ends before the first stop
    sequence it writes, which is left out with all that follows.

    An engine asked for stop sequences matches them on its own text and
    stops, but the ids it returns still hold the tokens that spelled the
    sequence (and may run past its end): a gateway on ids cuts the text
    here. :meth:`message` cuts a whole answer's message; :meth:`chunks`
    filters a stream's chunks, holding back the end of a text field while it
    could be the start of a stop sequence (what it holds goes out once it
    cannot, or when the field or the message ends). Text is matched within
    ``reasoning_content`` and within ``content``; a sequence inside a tool
    call's arguments leaves the call cut off, and the cut withholds it."""

    __slots__ = ("_hold", "_pending", "found", "stops")

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self._hold = max(map(len, self.stops), default=1) - 1
        self._pending: dict[str, str] = {}
        self.found: str | None = None
        """The stop sequence the model wrote, once it has."""

    def _first(self, text: str) -> tuple[int, str | None]:
        """Where the stop sequence that the text completes first starts, and
        which one it is: an engine checks as it generates, so of two that
        overlap the one that ends first stops it."""
        at, end, found = -1, -1, None
        for s in self.stops:
            i = text.find(s)
            if i >= 0 and (found is None or i + len(s) < end or (i + len(s) == end and i < at)):
                at, end, found = i, i + len(s), s
        return at, found

    def _held(self, text: str) -> int:
        """How much of the end of ``text`` could start a stop sequence."""
        for k in range(min(self._hold, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def text(self, field: str, text: str) -> str:
        """What of a field's new ``text`` can go out now."""
        if self.found is not None:
            return ""
        held = self._pending.pop(field, None)
        buf = held + text if held else text
        at, found = self._first(buf)
        if found is not None:
            self.found = found
            self._pending.clear()
            return buf[:at]
        k = self._held(buf)
        if k:
            self._pending[field] = buf[-k:]
            return buf[:-k]
        return buf

    def diagnostic(self, offset: int) -> dict[str, Any]:
        return {"kind": "stop-sequence", "offset": offset,
                "message": f"the model wrote the stop sequence {self.found!r}: it and the text after it are left "
                           "out"}

    def message(self, shaped: Shaped, offset: int) -> Shaped:
        """A whole answer's message, cut at the first stop sequence: what
        follows it (the content after reasoning, the calls after content)
        is left out."""
        m = dict(shaped.message)
        for field in ("reasoning_content", "content"):
            v = m.get(field)
            at, found = self._first(v) if isinstance(v, str) else (-1, None)
            if found is not None:
                self.found = found
                m[field] = v[:at]  # type: ignore[index]
                break
        if self.found is None:
            return shaped
        if field == "reasoning_content":
            m["content"] = ""
        m["content"] = m["content"] or ""  # no calls now: text, even when empty
        if not m.get("reasoning_content"):
            m.pop("reasoning_content", None)
        m.pop("tool_calls", None)
        reason = "stop" if shaped.finish_reason == "tool_calls" else shaped.finish_reason
        return Shaped(m, reason, [*shaped.diagnostics, self.diagnostic(offset)])

    def _flush(self, like: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
        """What every field holds back goes out, in chunks like ``like``:
        it can no longer start a stop sequence."""
        for field, held in self._pending.items():
            out.append(_text_chunk(like, field, held))
        self._pending.clear()

    def chunks(self, chunks: list[dict[str, Any]], offset: int = 0) -> list[dict[str, Any]]:
        """A stream's chunks (as :class:`ChunkStream` gives them), with the
        text that could start a stop sequence held back and the text from
        one on left out."""
        out: list[dict[str, Any]] = []
        for c in chunks:
            choices = c.get("choices")
            if not choices:
                out.append(c)  # the usage chunk
                continue
            choice = choices[0]
            delta = choice["delta"]
            for field in ("reasoning_content", "content"):
                v = delta.get(field)
                if not v:
                    continue
                # The other field has ended: what it held was no stop sequence.
                other = "content" if field == "reasoning_content" else "reasoning_content"
                held = self._pending.pop(other, None)
                if held:
                    out.append(_text_chunk(c, other, held))
                delta[field] = self.text(field, v)
            if "tool_calls" in delta:
                if self.found is not None:
                    del delta["tool_calls"]  # a call after the stop sequence is no part of the answer
                else:
                    self._flush(c, out)  # a call ends the text before it
            if choice["finish_reason"] is not None:
                self._flush(c, out)
                if self.found is not None:
                    if choice["finish_reason"] == "tool_calls":
                        choice["finish_reason"] = "stop"
                    diags = choice.get("xtml_diagnostics")
                    if isinstance(diags, list):
                        diags.append(self.diagnostic(offset))
            elif delta.keys() <= {"content", "reasoning_content"} and not any(delta.values()):
                continue  # all its text is held back
            out.append(c)
        return out


def _text_chunk(like: Mapping[str, Any], field: str, text: str) -> dict[str, Any]:
    return {**like, "choices": [{"index": 0, "delta": {field: text}, "logprobs": None, "finish_reason": None}]}


def _value(raw: str, typ: str) -> str:
    """A typed argument's JSON, as the parser reads it: its text parsed as
    its type, or the text as a string when it is not one."""
    want = _TYPES.get(typ)
    if want is not None:
        try:
            v = jsonfmt.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or not standard JSON
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

    def close(self, *, prompt_tokens: int | None = None, completion_tokens: int | None = None) -> list[dict[str, Any]]:
        """The end of the response: the usage chunk (``choices`` empty) when
        ``include_usage``, which needs both token counts; else nothing."""
        self._ended()
        if self._closed or not self.include_usage:
            return []
        usage = _usage(prompt_tokens, completion_tokens,
                       None if completion_tokens is None else self.reasoning_tokens(completion_tokens))
        if usage is None:
            raise TypeError("include_usage needs prompt_tokens and completion_tokens")
        self._closed = True
        return [{**self._base, "choices": [], "usage": usage}]

    # -- chunks ----------------------------------------------------------------------

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**self._base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

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
        # The chunk is built here rather than by _chunk: this runs per token.
        out.append({**self._base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]})
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
        delta = {"tool_calls": [{"index": c.index, "function": fn}]}
        out.append({**self._base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]})
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

        shaped = _shape(e.message or {"role": "assistant"}, e.stop_reason == "length", id_of,
                        _cut_at(self._diags, e.offset), self.cut_by if self.cut_by in _CUT_BY else "length",
                        self.max_calls)
        kept = shaped.message.get("tool_calls", [])
        extra: list[dict[str, Any]] = []
        for k, call in enumerate(kept):
            c = calls.get(k + 1)
            if c is None:
                c = calls[k + 1] = _Call(k, call["id"], call["function"]["name"])
            if not c.done:
                self._finish_call(out, c, call["function"]["arguments"])
            if c.diverged:
                extra.append(_call_diag("diverged-call", e.offset, k, c.id, c.name,
                                        "was read with other arguments than those already sent (a key given "
                                        "twice, or a json block after arguments): nothing more is sent for it; "
                                        "the final message has the arguments as read"))
        # A call withheld by the cut is named by the shaping; any other call
        # that started but is not in the message is named here.
        named = len(kept) + sum(d.get("kind") == "withheld-call" for d in shaped.diagnostics)
        for c in calls.values():
            if c.index >= named:
                extra.append(_call_diag("withheld-call", e.offset, c.index, c.id, c.name,
                                        "is not in the final message: it is withheld and must not run"))
        self._diags += [*shaped.diagnostics, *extra]
        self._shaped = shaped
        final = self._chunk({}, shaped.finish_reason)
        final["choices"][0]["xtml_diagnostics"] = list(self._diags)
        out.append(final)


class FunctionCalls:
    """Answers to a request that declared its tools as the deprecated
    ``functions``, in that API's shape: the call is the message's
    ``function_call`` (``{"name", "arguments"}``, no id), and a finish reason
    of ``tool_calls`` is ``function_call``. That shape holds one call: a
    further one is left out, with a diagnostic ``dropped-call`` naming it.
    One object per response; :meth:`completion` shapes a whole answer,
    :meth:`chunk` each chunk of a stream, in order."""

    __slots__ = ("dropped",)

    def __init__(self) -> None:
        self.dropped: dict[int, str] = {}

    def _diag(self, index: int, name: str) -> dict[str, Any]:
        return {"kind": "dropped-call", "offset": 0, "index": index, "name": name,
                "message": f"tool call {index} ({name!r}) is left out: the deprecated functions API answers with "
                           "one function_call"}

    def completion(self, completion: dict[str, Any]) -> dict[str, Any]:
        for choice in completion["choices"]:
            m = choice["message"]
            calls = m.pop("tool_calls", None)
            if calls:
                m["function_call"] = dict(calls[0]["function"])
                choice.setdefault("xtml_diagnostics", []).extend(
                    self._diag(k, c["function"]["name"]) for k, c in enumerate(calls) if k)
            if choice["finish_reason"] == "tool_calls":
                choice["finish_reason"] = "function_call"
        return completion

    def chunk(self, chunk: dict[str, Any]) -> dict[str, Any]:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            calls = delta.pop("tool_calls", None)
            for tc in calls or ():
                fn = tc.get("function") or {}
                if tc.get("index", 0) == 0:
                    piece = {k: fn[k] for k in ("name", "arguments") if k in fn and (k == "name" or fn[k])}
                    if "name" in piece or "arguments" in piece:
                        delta["function_call"] = piece
                elif "name" in fn:
                    self.dropped[tc["index"]] = fn["name"]
            if choice["finish_reason"] is not None:
                if choice["finish_reason"] == "tool_calls":
                    choice["finish_reason"] = "function_call"
                choice.setdefault("xtml_diagnostics", []).extend(
                    self._diag(k, name) for k, name in sorted(self.dropped.items()))
        return chunk
