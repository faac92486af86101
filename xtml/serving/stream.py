"""Streaming parse of model output, token by token.

:class:`StreamParser` reads the ids a model generates after the generation
prompt and returns, for each token, the events it completes: channel starts
and ends, text deltas (UTF-8 safe), tool calls and their arguments, and the
end of the message with the whole message in the same shape as the batch
parser. Work per token is constant: a dictionary lookup, a few bytes through
an incremental UTF-8 decoder, and an event when there is something to say.

Lenient by default: nothing the model writes makes it raise. The final
message is the batch parser's answer (:meth:`Template.parse` with
``completion=True``) for the same ids, so streaming and batch cannot
disagree; ``keep=False`` drops the ids as they stream, keeping memory bounded
by the current element, and the final message then holds only the tool calls.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ParseError
from ..markup.header import parse_header
from ..markup.markers import CLOSE, END, OPEN, SEP
from ..markup.nodes import Diagnostic

if TYPE_CHECKING:
    from ..template import Template, TokenizerLike

__all__ = ["StreamEvent", "StreamParser"]


@dataclass(slots=True)
class StreamEvent:
    """One thing a token completed.

    ``type`` is one of ``message_start``, ``channel_start``, ``text``, ``channel_end``,
    ``tool_call_start``, ``argument_start``, ``argument_delta``,
    ``argument_end``, ``tool_call_end``, ``message_end``, ``diagnostic``.
    """

    type: str
    offset: int
    """Token offset (from the start of the completion) of the token that
    completed the event."""
    channel: str | None = None
    """For channel and text events: ``think``, ``response`` or ``tools``."""
    text: str | None = None
    """For ``text`` and ``argument_delta``: the new characters."""
    index: int | None = None
    """For tool-call events: the call's index (1-based)."""
    name: str | None = None
    """For ``tool_call_start``: the tool name."""
    key: str | None = None
    """For argument events: the argument name (None for a json block)."""
    value_type: str | None = None
    """For ``argument_start``: the declared type (``json`` for a json block)."""
    call: dict[str, Any] | None = None
    """For ``tool_call_end``: the whole call, as in ``tool_calls``."""
    message: dict[str, Any] | None = None
    """For ``message_end``: the whole message, as the batch parser gives it."""
    stop_reason: str | None = None
    """For ``message_end``: ``stop``, ``tool_calls`` or ``length`` (cut off)."""
    diagnostic: dict[str, Any] | None = field(default=None)
    """For ``diagnostic``: kind, offset, message."""
    role: str | None = None
    """For ``message_start``: the role."""


class StreamParser:
    """Parse a completion as it is generated.

    ``thinking`` says which generation prompt the model continues (think or
    response channel; default: the template's default mode).
    """

    def __init__(
        self,
        template: Template,
        tokenizer: TokenizerLike,
        *,
        thinking: bool | None = None,
        keep: bool = True,
        lenient: bool = True,
    ) -> None:
        self.template = template
        self.binding = template.bind(tokenizer)
        d = template.dialect
        self.names = d.names
        self.thinking = d.thinking_default if thinking is None else thinking
        self.keep = keep
        self.lenient = lenient
        self._kinds = {i: k for i, (k, _) in self.binding.kind_of_id.items()}
        self._marker_text = {i: s for i, (_, s) in self.binding.kind_of_id.items()}
        self._bytes = self.binding.vocab.byte_table()
        self._size = self.binding.vocab.size
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stream: Any = None
        if not self._bytes:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=False)
        n = self.names
        self._channels = {n["think"], n["response"], n["tools"]}
        self._owned = frozenset(d.element_owner)
        opened = d.prompt_tag(self.thinking)
        self._stack: list[str] = [n["message"], *([opened] if opened else [])]
        self._header: list[int] | None = None
        self._header_kind = ""
        self._header_at = 0
        self._offset = 0
        self._ids: list[int] = []
        self._calls: list[dict[str, Any]] = []
        self._call: dict[str, Any] | None = None
        self._arg: tuple[str | None, str] | None = None
        self._arg_text: list[str] = []
        self._args: dict[str, Any] = {}
        self._json: str | None = None
        self._closed_message = False
        self._done = False
        self.diagnostics: list[Diagnostic] = []

    # -- feeding -------------------------------------------------------------------

    def feed(self, token_id: int) -> list[StreamEvent]:
        """The events completed by one more generated token."""
        out: list[StreamEvent] = []
        self._feed(token_id, out)
        return out

    def feed_many(self, ids: Iterable[int]) -> list[StreamEvent]:
        """The events completed by several tokens, in order."""
        out: list[StreamEvent] = []
        for t in ids:
            self._feed(t, out)
        return out

    def close(self) -> list[StreamEvent]:
        """End of the stream: the final message (and any repairs)."""
        out: list[StreamEvent] = []
        if self._offset == 0:
            out.append(StreamEvent("message_start", 0, role="assistant"))
        if not self._done:
            self._flush(out)
            if self._header is not None:
                self._diag(out, "truncated", self._header_at, "the stream ends inside a tag")
            self._finish(out, None)
        return out

    def _feed(self, t: int, out: list[StreamEvent]) -> None:
        at = self._offset
        self._offset += 1
        if type(t) is not int or not 0 <= t < self._size:
            if not self.lenient:
                raise ParseError(f"{t!r} is not a token id of this tokenizer", offset=at)
            self._diag(out, "bad-id", at, f"{t!r} is not a token id of this tokenizer")
            return
        if self._done:
            self._diag(out, "trailing-output", at, "output continues after the end of the message")
            return
        if self.keep:
            self._ids.append(t)
        if at == 0:
            # The generation prompt opened the message and its first channel.
            out.append(StreamEvent("message_start", at, role="assistant"))
            if len(self._stack) > 1:
                out.append(StreamEvent("channel_start", at, channel=self._stack[-1]))
        kind = self._kinds.get(t)
        if self._header is not None:
            if kind is None:
                self._header.append(t)
            elif kind == SEP:
                self._tag(out, at)
            else:
                self._diag(out, "bad-tag", at, "a tag is interrupted by a marker")
                self._header = None
                self._marker(t, kind, at, out)
            return
        if kind is None:
            self._text(t, at, out)
        else:
            self._marker(t, kind, at, out)

    def _marker(self, t: int, kind: str, at: int, out: list[StreamEvent]) -> None:
        if kind == OPEN or kind == CLOSE:
            self._flush(out)
            self._header = []
            self._header_kind = kind
            self._header_at = at
        elif kind == END:
            self._flush(out)
            self._finish(out, at)
        elif kind == SEP:
            self._diag(out, "stray-marker", at, "a separator outside any tag")
        else:
            # Embed markers (an image in output): passed on as their text.
            self._emit_text(self._marker_text[t], at, out)

    # -- text ------------------------------------------------------------------------

    def _text(self, t: int, at: int, out: list[StreamEvent]) -> None:
        if self._bytes:
            s = self._decoder.decode(self._bytes[t])
        else:
            s = self._stream.step(self.binding.vocab.tokenizer, t) or ""
        if s:
            self._emit_text(s, at, out)

    def _flush(self, out: list[StreamEvent]) -> None:
        """A marker ends the text run: emit what the decoder still holds."""
        if self._bytes:
            s = self._decoder.decode(b"", final=True)
            self._decoder.reset()
            if s:
                self._emit_text(s, self._offset - 1, out)

    def _emit_text(self, s: str, at: int, out: list[StreamEvent]) -> None:
        if self._arg is not None:
            if self._call is not None:
                self._arg_text.append(s)
            out.append(StreamEvent("argument_delta", at, text=s, index=self._call_index(), key=self._arg[0]))
            return
        top = self._stack[-1] if self._stack else None
        if top in self._owned:
            # Text of a plugin's element (a citation, say) is text of the
            # channel it stands in; the final message has it as a part.
            top = next((t for t in reversed(self._stack) if t not in self._owned), None)
        if top in self._channels and top != self.names["tools"]:
            out.append(StreamEvent("text", at, channel=top, text=s))
        elif not s.isspace():
            self._diag(out, "stray-content", at, f"text outside a channel: {s[:40]!r}")

    def _call_index(self) -> int | None:
        return None if self._call is None else int(self._call["index"])

    # -- tags ------------------------------------------------------------------------

    def _tag(self, out: list[StreamEvent], at: int) -> None:
        assert self._header is not None
        ids, self._header = self._header, None
        hdr = parse_header(self.binding.vocab.decode(ids)) if ids else None
        if hdr is None:
            self._diag(out, "bad-header", self._header_at, "a malformed tag")
            return
        tag, attrs = hdr
        a = dict(attrs)
        n = self.names
        if self._header_kind == OPEN:
            self._stack.append(tag)
            if tag in self._channels:
                out.append(StreamEvent("channel_start", at, channel=tag))
            elif tag == n["call"]:
                idx = a.get(n["index"], "")
                self._call = {"index": int(idx) if idx.isdigit() else len(self._calls) + 1,
                              "name": a.get(n["tool"], "")}
                self._args = {}
                self._json = None
                out.append(StreamEvent("tool_call_start", at, index=self._call["index"], name=self._call["name"]))
            elif tag in (n["argument"], n["json"]):
                key = a.get(n["key"]) if tag == n["argument"] else None
                vtype = a.get(n["type"], "string") if tag == n["argument"] else "json"
                self._arg = (key, vtype)
                self._arg_text = []
                out.append(StreamEvent("argument_start", at, index=self._call_index(), key=key, value_type=vtype))
            return
        # A close tag: it must close the innermost element, or (leniently) one
        # further out, closing what is inside it.
        if tag not in self._stack:
            self._diag(out, "stray-close", self._header_at, f"close tag {tag!r} has no open element")
            return
        while self._stack:
            inner = self._stack.pop()
            if inner != tag:
                self._diag(out, "unclosed", self._header_at, f"element {inner!r} was never closed")
            self._closed(inner, at, out)
            if inner == tag:
                break

    def _closed(self, tag: str, at: int, out: list[StreamEvent]) -> None:
        n = self.names
        if tag in self._channels:
            out.append(StreamEvent("channel_end", at, channel=tag))
        elif tag in (n["argument"], n["json"]) and self._arg is not None:
            key, vtype = self._arg
            text = "".join(self._arg_text)
            if key is None:
                self._json = text
            else:
                self._args[key] = _typed(text, vtype)
            self._arg = None
            self._arg_text = []
            out.append(StreamEvent("argument_end", at, index=self._call_index(), key=key))
        elif tag == n["call"] and self._call is not None:
            arguments = self._json if self._json is not None else json.dumps(self._args, ensure_ascii=False)
            call = {"id": f"call_0_{self._call['index']}", "type": "function",
                    "function": {"name": self._call["name"], "arguments": arguments}}
            self._calls.append(call)
            self._call = None
            out.append(StreamEvent("tool_call_end", at, index=len(self._calls), call=call))
        elif tag == n["message"]:
            self._closed_message = True

    # -- the end -----------------------------------------------------------------------

    def _finish(self, out: list[StreamEvent], at: int | None) -> None:
        self._done = True
        cut = not self._closed_message
        if at is not None and cut:
            self._diag(out, "early-end", at, "end of message before the message was closed")
        elif at is None and cut:
            self._diag(out, "truncated", self._offset, "the stream ends before the message is closed")
        message: dict[str, Any] | None = None
        if self.keep:
            try:
                message = self.template.parse(self._ids, self.binding.vocab, completion=True, lenient=True,
                                              thinking=self.thinking)
                message.pop("diagnostics", None)
            except ParseError as e:
                # Only resource limits (nesting) make even a lenient parse
                # refuse; the stream reports it and keeps what it streamed.
                self._diag(out, "too-deep", e.offset, e.msg)
        if message is None:
            message = {"role": "assistant"}
            if self._calls:
                message["tool_calls"] = list(self._calls)
        reason = "length" if cut and at is None else ("tool_calls" if self._calls else "stop")
        out.append(StreamEvent("message_end", self._offset - 1 if at is None else at, message=message,
                               stop_reason=reason))

    def _diag(self, out: list[StreamEvent], kind: str, at: int, msg: str) -> None:
        if not self.lenient:
            raise ParseError(msg, offset=at)
        d = Diagnostic(kind, at, msg)
        self.diagnostics.append(d)
        out.append(StreamEvent("diagnostic", at, diagnostic=d.as_dict()))


def _typed(text: str, vtype: str) -> Any:
    if vtype == "string":
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text
