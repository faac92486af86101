"""Streaming parse of model output, token by token.

:class:`StreamParser` reads the ids a model generates after the generation
prompt and returns, for each token, the events it completes: channel starts
and ends, text deltas (UTF-8 safe), tool calls and their arguments, and the
end of the message with the whole message in the same shape as the batch
parser.

It is the batch parser run incrementally, so that the two cannot disagree:
ids are lexed as :meth:`Binding.lex` lexes them (a run of ordinary ids is one
text lexeme, decoded as the batch decodes it), the lexemes go through
:class:`~xtml.markup.parse.TreeBuilder` (the driver of ``build``) as they
come, a closed call is read by the tools channel's own reader, and the end of
the message reads the tree with :func:`~xtml.chat.parse.parse_completion`.
The open elements say where text goes while it streams. Work per text token
is a dictionary lookup and a few bytes through an incremental decoder; per
marker, a step of the tree builder; at the end, a read of a tree that holds
one node per text run and tag, so its cost follows the number of tags, not
the length of the text.

Lenient by default: nothing the model writes makes it raise.

The events it returns are :mod:`.stream_events`, its states
:mod:`.stream_states`; the text between two markers is decoded by
:class:`~.text_run.TextRun`.
"""

from __future__ import annotations

from codecs import utf_8_decode as _utf8
from collections import Counter, deque
from collections.abc import Iterable
from typing import Any

from ..chat.channels import read_call
from ..chat.dialect import Dialect
from ..chat.parse import Reader, parse_completion
from ..chat.prompt import generation_prompt
from ..errors import ParseError
from ..markup.markers import CLOSE, END, OPEN, SEP, TEXT
from ..markup.nodes import Diagnostic, Document, Element, Embed, Node, Text
from ..markup.parse import Lexemes, TreeBuilder
from ..vocab.binding import Binding, split_text_marks
from ..vocab.ids import as_id, bad_id
from .stream_events import Sink, StreamEvent
from .stream_states import Ended, Failed, Phase, Reading, Ready, Refused, StreamState
from .text_run import CHUNK, TextRun, byte_fallback_ids

__all__ = ["StreamEvent", "StreamParser", "StreamState"]

class _Open:
    """An open element of the tree builder, as the stream reads it."""

    __slots__ = ("calls", "embed", "frame", "index", "key", "role", "seen", "text")

    def __init__(self, frame: Any) -> None:
        self.frame = frame
        """The builder's open element (``tag``, ``attrs``, ``children``, ``offset``)."""
        self.seen = len(frame.children)
        """How many of its children the stream has looked at."""
        self.role = ""
        """What it is to the message: ``message``, a channel by what it holds
        (``reasoning``, ``content``, ``tool_calls``), ``call``, ``argument``,
        ``hoisted`` (a channel another was opened inside), or nothing."""
        self.text: Sink | None = None
        """Where its body text goes."""
        self.embed: Sink | None = None
        """Where the text form of an embed in it goes (an embed in a response
        is an image part, not text; in reasoning or an argument it is text)."""
        self.index = 0
        self.key: str | None = None
        self.calls = 0


# Checked per token: a module constant is one global lookup, where
# StreamState.X is an Enum class attribute (several times slower).
_READY, _READING, _REFUSED, _ENDED, _FAILED = StreamState


class StreamParser:
    """Parse a completion as it is generated, for a dialect and a tokenizer
    binding (:meth:`xtml.Template.stream` makes one).

    ``thinking`` says which generation prompt the model continues (think or
    response channel; default: the dialect's default mode). ``keep=False``
    keeps no text of the think and response channels (memory is bounded by
    the current text run); the final message then holds only the tool calls.
    ``lenient=False`` raises :class:`ParseError` (with the token offset) at
    the first error, as a strict batch parse does; a strict stream that
    raised stays failed.

    The text deltas of a channel add up to its text in the final message
    (when that is text, not parts). With a tokenizer that is not byte-level
    they are the tokenizer's own incremental decoding, completed at the end
    of each run of text; a decoder that rewrites text it already gave
    (WordPiece's clean-up of spaces before punctuation) can make them differ.
    The final message is the batch parser's in every case.
    """

    def __init__(
        self,
        dialect: Dialect,
        binding: Binding,
        *,
        thinking: bool | None = None,
        keep: bool = True,
        lenient: bool = True,
    ) -> None:
        d = dialect
        self.dialect = d
        self.binding = binding
        self.names = n = d.names
        self.thinking = d.thinking_default if thinking is None else thinking
        self.keep = keep
        self.lenient = lenient
        self.diagnostics: list[Diagnostic] = []
        vocab = binding.vocab
        self._kinds = {i: k for i, (k, _) in binding.kind_of_id.items()}
        self._marker_text = {i: s for i, (_, s) in binding.kind_of_id.items()}
        self._size = vocab.size
        self._table = vocab.byte_table()
        self._text_bytes = binding.text_table()
        self._text_strs = binding.text_strs()
        self._marks = binding.text_marks
        # What each channel holds decides how the stream reads it (a role of
        # _Open below is the kind a channel holds).
        self._holds = {ch.tag: ch.holds for ch in d.assistant_channels}
        self._channels = frozenset(self._holds)
        self._order = {ch.tag: k for k, ch in enumerate(d.assistant_channels)}
        self._content_tag = d.channel_tag("content")
        self._tools_tag = d.channel_tag("tool_calls")
        # A call is read as the batch reads it the moment it closes.
        self._tools = self._tools_tag is not None
        self._tools_path = f"{n['message']}/{self._tools_tag}"
        self._tb = TreeBuilder(lenient=lenient)
        self._view: list[_Open] = []
        self._tail: deque[tuple[str, str]] = deque(maxlen=3)
        self._diags_seen = 0
        # Diagnostics of calls read as they closed: the reader at the end
        # finds them again and they are not reported twice.
        self._read = Counter[tuple[str, int, str]]()
        # Calls closed while there was no per-call reader: ended at the end.
        self._deferred: list[_Open] = []
        self._message_tags: set[str] = set()
        self._stray: Node | None = None
        self._has_message = False
        self._closed_message = False
        self._offset = 0
        self._calls: list[dict[str, Any]] = []
        self._reader = Reader(d, lenient)
        # Where the parser is: the state object, and its StreamState kept
        # beside it (set together by _enter) for a check per token.
        self._at: Phase
        self._state: StreamState
        # The current run while it may take feed's short path (it started,
        # streams on a byte-level vocabulary that spells no placeholder as
        # text, and holds no byte back); None otherwise, and always outside
        # READING. The one hot flag: feed tests it before anything else, so
        # that most tokens look at no state.
        self._fast: TextRun | None = None
        startup: list[StreamEvent] = []
        self._enter(Ready(startup))
        # The generation prompt opened the message (and its first channel):
        # its lexemes start the tree, as the batch parser prepends them.
        self._shift, lexemes = _prompt_lexemes(d, binding, self.thinking)
        for k, t, o in lexemes:
            self._push(k, t, o)
        self._tb.advance()
        self._sync(0, startup, 0)
        self._tb.drop_consumed()
        byte_ids: frozenset[int] = frozenset() if self._table else byte_fallback_ids(vocab)
        self._run = TextRun(vocab, self._table, byte_ids, self._marks)
        self._new_run()

    @property
    def state(self) -> StreamState:
        """Where the parser is: READY until the first token, READING while
        the message is open, REFUSED after the builder refused the input
        (lenient), ENDED after ``message_end``, FAILED after a strict stream
        raised."""
        return self._state

    def _enter(self, to: Phase) -> None:
        self._at = to
        self._state = to.state
        # Only a READING parser streams text; a new state starts off the
        # short path and _feed puts it back on.
        self._fast = None

    # -- feeding -------------------------------------------------------------------

    def feed(self, token_id: int) -> list[StreamEvent]:
        """The events completed by one more generated token."""
        run = self._fast
        if run is not None:
            # Most tokens: text of a run that streams, no bytes held back.
            # What _feed does for them, in one call instead of five. The
            # tables have None for marker ids and end with the vocabulary;
            # what is not an int goes the long way. Most tokens are whole
            # characters, whose text is ready in text_strs.
            try:
                s = self._text_strs[token_id] if type(token_id) is int and token_id >= 0 else None
            except IndexError:
                s = None
            if s is None:
                # Not whole characters on its own (or holding U+FFFD, or
                # empty): decoded, its tail held back, the run marked lossy.
                try:
                    raw = self._text_bytes[token_id] if type(token_id) is int and token_id >= 0 else None
                except IndexError:
                    raw = None
                if raw is not None:
                    s, used = _utf8(raw, "replace", False)
                    if used < len(raw):
                        run.pend = raw[used:]
                        self._fast = None
                    if "\ufffd" in s:
                        run.lossy = True
            if s is not None:
                at = self._offset
                self._offset = at + 1
                ids = run.ids
                if ids is not None:
                    ids.append(token_id)
                    if s:
                        pieces = run.pieces
                        pieces.append(s)
                        if len(pieces) >= CHUNK:
                            run.chunks.append("".join(pieces))
                            pieces.clear()
                if not s:
                    return []
                # A run on the short path streams: its sink is set.
                sink = run.sink
                channel = sink.channel  # type: ignore[union-attr]
                if channel is not None:
                    # Channel text, by far the most common, has no index or
                    # key, and the generated __init__ fills defaults faster
                    # than it takes arguments; its type is known.
                    return [StreamEvent("text", at, channel, s)]
                return [StreamEvent(sink.type, at, None, s, sink.index, None, sink.key)]  # type: ignore[union-attr]
        out: list[StreamEvent] = []
        if self._state is _FAILED:
            raise self._failure()
        try:
            self._feed(token_id, out)
        except ParseError as e:
            self._enter(Failed(e))
            raise
        return out

    def feed_many(self, ids: Iterable[int]) -> list[StreamEvent]:
        """The events completed by several tokens, in order."""
        out: list[StreamEvent] = []
        if self._state is _FAILED:
            raise self._failure()
        try:
            for t in ids:
                self._feed(t, out)
        except ParseError as e:
            self._enter(Failed(e))
            raise
        return out

    def close(self) -> list[StreamEvent]:
        """End of the stream: the final message (and any repairs). Once
        the message has ended, nothing."""
        out: list[StreamEvent] = []
        state = self._state
        if state is _FAILED:
            raise self._failure()
        if state is _ENDED:
            return out
        self._fast = None
        try:
            if state is _READY:
                self._start(out)
            self._finish(out, None)
        except ParseError as e:
            self._enter(Failed(e))
            raise
        return out

    def _failure(self) -> ParseError:
        failed = self._at
        assert type(failed) is Failed
        return failed.error

    def _start(self, out: list[StreamEvent]) -> None:
        ready = self._at
        assert type(ready) is Ready
        self._enter(Reading())
        out.append(StreamEvent("message_start", 0, role="assistant"))
        out += ready.startup

    def _feed(self, t: Any, out: list[StreamEvent]) -> None:
        at = self._offset
        self._offset = at + 1
        if self._state is not _READING:
            if self._state is not _READY:
                self._past(t, at, out)
                return
            self._start(out)
        if type(t) is not int or not 0 <= t < self._size:
            t = self._checked(t, at, out)
            if t is None:
                return
        kind = self._kinds.get(t)
        if kind is not None:
            self._marker(t, kind, at, out)
            return
        run = self._run
        if run.at < 0:
            run.at = at
        ids = run.ids
        if ids is not None:
            ids.append(t)
        if run.sink is None:
            # Not streamed (a tag header, an embed, text outside the
            # message): decoded once, when the run ends.
            return
        s = run.step(t)
        if self._table and not self._marks:
            self._fast = None if run.pend else run
        if not s:
            return
        if self._marks:
            self._split(s, at, out)
        else:
            self._emit_text(s, at, out)

    def _past(self, t: Any, at: int, out: list[StreamEvent]) -> None:
        """A token once the message is no longer read: when refused, the end
        marker still ends it; when ended, the first is reported as trailing."""
        if type(t) is not int or not 0 <= t < self._size:
            t = self._checked(t, at, out)
            if t is None:
                return
        ended = self._at
        if type(ended) is Ended:
            if not ended.trailing:
                ended.trailing = True
                self._diag(out, "trailing-output", at, "output continues after the end of the message")
        elif self._state is _REFUSED and self._kinds.get(t) == END:
            self._finish(out, at)

    def _checked(self, t: Any, at: int, out: list[StreamEvent]) -> int | None:
        """An id as an int (integers of other types are ids too, as in batch
        parses), or None, reported, for what is no id of the vocabulary."""
        i = as_id(t, self._size)
        if i is not None or self._state is not _READING:
            return i
        # Batch parses refuse such input; the stream skips the id, as if it
        # were not there.
        d = bad_id(t, at)
        self._diag(out, d.kind, at, d.message)
        return None

    # -- text --------------------------------------------------------------------

    def _new_run(self) -> None:
        """The next run of text, routed by the open elements."""
        self._fast = None
        run = self._run
        tb = self._tb
        header = bool(self._tail) and self._tail[-1][0] in (OPEN, CLOSE)
        sink = self._view[-1].text if self._view else None
        state = self._state
        if sink is None or state is _REFUSED or state is _ENDED or tb.next < len(tb.lexemes.kinds):
            run.restart(None, [], False, header)
            return
        # Without keep, a channel's text goes out and is not kept (what
        # else the tree needs of it: placeholders spelled as text).
        blank = not self.keep and sink.type == "text"
        collect = not blank or bool(self._marks) or not self._table
        run.restart(sink, [] if collect else None, blank, header)

    def _emit_text(self, s: str, at: int, out: list[StreamEvent]) -> None:
        """Characters of the current run, to where it goes."""
        out.append(self._run.sink.event(at, s))  # type: ignore[union-attr]

    def _split(self, s: str, at: int, out: list[StreamEvent]) -> None:
        """Text with placeholders that the vocabulary spells as text: each is
        an embed; the text around them streams."""
        for piece, mark in self._run.split(s):
            if not mark:
                self._emit_text(piece, at, out)
                continue
            embed = self._view[-1].embed if self._view else None
            if embed is not None:
                out.append(embed.event(at, piece))

    def _end_run(self, at: int, out: list[StreamEvent]) -> int:
        """A marker (or the end) ends the run of text: its lexemes, decoded
        as the batch decodes the run, go to the tree builder. Returns how
        many there are."""
        run = self._run
        if run.at < 0:
            return 0
        sent, text = run.end()
        for piece in sent:
            self._stream_text(piece, at, out)
        if run.hold:
            self._emit_text(run.hold, at, out)
        off = self._shift + run.at
        if self._marks and not run.header:
            lx = split_text_marks(Lexemes([TEXT], [text], [off]), self._marks)
            pieces = list(zip(lx.kinds, lx.texts))
        else:
            pieces = [(TEXT, text)]
        for k, t in pieces:
            self._push(k, "" if run.blank and k == TEXT else t, off)
        return len(pieces)

    def _stream_text(self, s: str, at: int, out: list[StreamEvent]) -> None:
        if self._marks:
            self._split(s, at, out)
        else:
            self._emit_text(s, at, out)

    # -- markers and the tree ----------------------------------------------------------

    def _push(self, kind: str, text: str, offset: int) -> None:
        lx = self._tb.lexemes
        lx.kinds.append(kind)
        lx.texts.append(text)
        lx.offsets.append(offset)
        self._tail.append((kind, text))

    def _marker(self, t: int, kind: str, at: int, out: list[StreamEvent]) -> None:
        # The run ends here; the next one is routed before it may stream.
        self._fast = None
        idle = self._idle()
        run = self._end_run(at, out)
        self._push(kind, self._marker_text[t], self._shift + at)
        if idle and not run and (kind == OPEN or kind == CLOSE):
            # Nothing to decide before the tag's header and separator come.
            self._new_run()
            return
        self._step(at, out, run if idle else 0)
        if kind == END and self._state is _READING:
            self._finish(out, at)
        else:
            self._new_run()

    def _idle(self) -> bool:
        """Whether the builder has consumed every lexeme (so the next text
        becomes nodes of the innermost open element)."""
        return self._tb.next == len(self._tb.lexemes.kinds)

    def _step(self, at: int, out: list[StreamEvent], run: int) -> None:
        """Advance the tree builder and say what changed; the first ``run``
        nodes it adds are the text just streamed."""
        tb = self._tb
        try:
            tb.advance()
        except ParseError as e:
            self._refuse(e, out)
            return
        self._sync(at, out, run)
        if tb.next == len(tb.lexemes.kinds):
            tb.drop_consumed()

    def _refuse(self, e: ParseError, out: list[StreamEvent]) -> None:
        """The builder refused the input (nesting past the limit, or any
        error in a strict stream)."""
        if not self.lenient:
            raise e.moved(self._shift) from None
        self._enter(Refused())
        self._diag(out, "too-deep", max(0, e.offset - self._shift), e.msg)

    def _sync(self, at: int, out: list[StreamEvent], run: int) -> None:
        """Events for what the last advance of the builder did: nodes added
        to the innermost open element (the first ``run`` of them, the text
        just streamed), elements closed, an element opened."""
        view = self._view
        stack = self._tb.stack
        self._added(at, out, run)
        # Elements open and close at the top of the stack only: the two agree
        # below the first place from the top where they differ.
        p = min(len(view), len(stack))
        while p and view[p - 1].frame is not stack[p - 1]:
            p -= 1
        if p == len(view) == len(stack):
            self._report(out)
            return
        while len(view) > p:
            self._closed(view.pop(), at, out)
            if view:
                view[-1].seen = len(view[-1].frame.children)
        for frame in stack[len(view) :]:
            self._opened(frame, at, out)
        self._report(out)

    def _added(self, at: int, out: list[StreamEvent], run: int) -> None:
        """Nodes added to the innermost open element (elements aside: they
        are closed ones, reported as such)."""
        if not self._view:
            return
        inner = self._view[-1]
        children = inner.frame.children
        for k in range(inner.seen, len(children)):
            node = children[k]
            if type(node) is Element:
                continue
            if inner.role in ("message", "hoisted"):
                self._stray_candidate(node)
            elif run <= 0:
                self._node(inner, node, at, out)
            run -= 1
        inner.seen = len(children)

    def _node(self, o: _Open, node: Node, at: int, out: list[StreamEvent]) -> None:
        """A node that was not streamed as text: a marker read as text (a
        stray separator) or an embed."""
        if type(node) is Text:
            sink, s = o.text, node.text
        elif type(node) is Embed:
            sink, s = o.embed, node.raw
        else:
            return
        if sink is not None and s:
            out.append(sink.event(at, s))

    def _stray_candidate(self, node: Node) -> None:
        # The batch reader takes the first non-blank text or embed right in
        # the message as its content when there is no response channel.
        if self._stray is None and (type(node) is Embed or (type(node) is Text and node.text.strip())):
            self._stray = node

    def _opened(self, frame: Any, at: int, out: list[StreamEvent]) -> None:
        view = self._view
        parent = view[-1] if view else None
        o = _Open(frame)
        view.append(o)
        n = self.names
        tag = frame.tag
        if parent is None:
            if not self._has_message:
                # The prompt's message; any later top-level element is
                # output after it, which the batch reader does not read.
                self._has_message = True
                o.role = "message"
            return
        role = parent.role
        if role in ("reasoning", "content") and self._order.get(tag, -1) > self._order[parent.frame.tag]:
            # A later channel inside an earlier one that was not closed
            # first: the batch reader takes it out to the message's level,
            # and so does the stream; the earlier channel ends here.
            out.append(StreamEvent("channel_end", at, channel=parent.frame.tag))
            parent.role = "hoisted"
            parent.text = parent.embed = None
            role = "message"
        elif role == "hoisted":
            role = "message"
        if role == "message":
            if tag in self._message_tags:
                return  # a channel again: the batch reads only the first
            self._message_tags.add(tag)
            if tag not in self._channels:
                return
            kind = self._holds[tag]
            o.role = kind
            if kind == "reasoning":
                o.text = o.embed = Sink("text", channel=tag)
            elif kind == "content":
                o.text = Sink("text", channel=tag)
            out.append(StreamEvent("channel_start", at, channel=tag))
        elif role == "tool_calls":
            if tag == n["call"]:
                parent.calls += 1
                o.role = "call"
                o.index = parent.calls
                name = dict(frame.attrs).get(n["tool"], "")
                out.append(StreamEvent("tool_call_start", at, index=o.index, name=name))
        elif role == "call":
            if tag in (n["argument"], n["json"]):
                a = dict(frame.attrs)
                o.role = "argument"
                o.index = parent.index
                o.key = a.get(n["key"]) if tag == n["argument"] else None
                vtype = a.get(n["type"], "string") if tag == n["argument"] else "json"
                o.text = o.embed = Sink("argument_delta", index=o.index, key=o.key)
                out.append(StreamEvent("argument_start", at, index=o.index, key=o.key, value_type=vtype))
        else:
            # Inside a channel or an argument, nested elements are read as
            # their text (embeds included); anywhere else, not at all.
            o.text = o.embed = parent.text

    def _closed(self, o: _Open, at: int, out: list[StreamEvent]) -> None:
        role = o.role
        if role == "argument":
            out.append(StreamEvent("argument_end", at, index=o.index, key=o.key))
        elif role == "call":
            parent = self._view[-1]
            el = parent.frame.children[-1]
            assert type(el) is Element and el.offset == o.frame.offset
            if not self._tools:
                self._deferred.append(o)
                return
            call = self._read_call(el, o.index)
            self._calls.append(call)
            out.append(StreamEvent("tool_call_end", at, index=o.index, call=call))
            self._report_read(out)
        elif role in ("reasoning", "content", "tool_calls"):
            out.append(StreamEvent("channel_end", at, channel=o.frame.tag))
        elif role == "message":
            self._closed_message = self._tail[-1][0] != END

    def _read_call(self, el: Element, k: int) -> dict[str, Any]:
        self._reader = Reader(self.dialect, self.lenient)
        try:
            return read_call(el, 0, k, self._tools_path, self._reader)
        except ParseError as e:
            raise e.moved(self._shift) from None

    # -- diagnostics ---------------------------------------------------------------------

    def _report(self, out: list[StreamEvent]) -> None:
        """The builder's new repairs."""
        found = self._tb.diagnostics
        for x in found[self._diags_seen :]:
            self._record(out, Diagnostic(x.kind, max(0, x.offset - self._shift), x.message))
        self._diags_seen = len(found)

    def _report_read(self, out: list[StreamEvent]) -> None:
        for x in self._reader.diags:
            d = Diagnostic(x.kind, max(0, x.offset - self._shift), x.message)
            self._read[(d.kind, d.offset, d.message)] += 1
            self._record(out, d)

    def _diag(self, out: list[StreamEvent], kind: str, at: int, msg: str) -> None:
        if not self.lenient:
            raise ParseError(msg, offset=at)
        self._record(out, Diagnostic(kind, at, msg))

    def _record(self, out: list[StreamEvent], d: Diagnostic) -> None:
        self.diagnostics.append(d)
        out.append(StreamEvent("diagnostic", d.offset, diagnostic=d.as_dict()))

    # -- the end -----------------------------------------------------------------------

    def _finish(self, out: list[StreamEvent], at: int | None) -> None:
        """The end marker (at ``at``) or the end of the stream: what is still
        open ends, and the message is read as the batch reads it."""
        end_at = self._offset - 1 if at is None else at
        message: dict[str, Any]
        if self._state is _READING:
            tb = self._tb
            if at is None:
                idle = self._idle()
                run = self._end_run(max(0, end_at), out)
                self._step(max(0, end_at), out, run if idle else 0)
            if self._state is _READING:
                if at is None:
                    self._end_if_closed()
                open_ = list(reversed(self._view))
                tb.lexemes.end = self._shift + self._offset
                try:
                    doc = tb.finish()
                    found, diags = self._read_message(doc, out)
                except ParseError as e:
                    if not self.lenient:
                        raise e.moved(self._shift) from None
                    self._refuse(e, out)
                else:
                    self._added(end_at, out, 0)
                    self._report(out)
                    calls = found.get("tool_calls", [])
                    for o in self._deferred:
                        self._end_call(o, calls, end_at, out)
                    for o in open_:
                        if o.role == "call":
                            self._end_call(o, calls, end_at, out)
                        elif o.role != "message":
                            self._closed(o, end_at, out)
                    self._view.clear()
                    for x in diags:
                        self._record(out, x)
                    stray = self._stray
                    answer = self._content_tag
                    if type(stray) is Text and answer is not None and answer not in self._message_tags:
                        out.append(StreamEvent("text", end_at, channel=answer, text=stray.text))
                    if self.keep:
                        message = found
                    else:
                        message = {"role": "assistant", **({"tool_calls": calls} if calls else {})}
                    self._calls = list(calls)
        refused = self._state is _REFUSED
        self._enter(Ended())
        if refused:
            message = {"role": "assistant", **({"tool_calls": list(self._calls)} if self._calls else {})}
        cut = at is None and not self._closed_message
        reason = "length" if cut else ("tool_calls" if message.get("tool_calls") else "stop")
        out.append(StreamEvent("message_end", max(0, end_at), message=message, stop_reason=reason))

    def _read_message(self, doc: Document, out: list[StreamEvent]) -> tuple[dict[str, Any], list[Diagnostic]]:
        """The batch reader's message for the tree, and its diagnostics that
        were not reported yet.

        Calls read as they closed are not read again: the first tools
        channel is read without them and they are put back as they were read
        (by the same reader), so that the end of a message with a thousand
        calls does not cost a thousand reads. The rest is
        :func:`parse_completion`, step by step."""
        if not self._tools or not self._calls or self._tools_at(doc) is None:
            found, diags = parse_completion(self.dialect, doc, thinking=self.thinking, lenient=self.lenient,
                                            shift=self._shift)
            read = self._read
            fresh: list[Diagnostic] = []
            for x in diags[len(doc.diagnostics) :]:
                key = (x.kind, x.offset, x.message)
                if read[key]:
                    read[key] -= 1
                else:
                    fresh.append(x)
            return found, fresh
        lighter, calls = self._without_calls(doc, out)
        r = Reader(self.dialect, self.lenient)
        msg = r.completion(lighter, self.thinking, any(x.kind == "truncated" for x in doc.diagnostics))
        if calls:
            msg["tool_calls"] = calls
        r.finish(msg)
        return msg, [Diagnostic(x.kind, max(0, x.offset - self._shift), x.message) for x in r.diags]

    def _without_calls(self, doc: Document, out: list[StreamEvent]) -> tuple[Document, list[dict[str, Any]]]:
        """The tree with the calls of the message's first tools channel taken
        out, and those calls as the tools channel reads them."""
        n = self.names
        nodes = doc.nodes
        mi = next(i for i, x in enumerate(nodes) if type(x) is Element)
        m = nodes[mi]
        assert type(m) is Element
        ti = self._tools_at(doc)
        assert ti is not None
        tools = m.children[ti]
        assert type(tools) is Element
        calls: list[dict[str, Any]] = []
        rest: list[Node] = []
        for c in tools.children:
            if type(c) is Element and c.tag == n["call"]:
                k = len(calls) + 1
                if k <= len(self._calls):
                    calls.append(self._calls[k - 1])
                else:  # still open when the message ended
                    calls.append(self._read_call(c, k))
                    self._report_read(out)
            else:
                rest.append(c)
        bare = Element(tools.tag, tools.attrs, tuple(rest), tools.closed, tools.offset)
        m = Element(m.tag, m.attrs, (*m.children[:ti], bare, *m.children[ti + 1 :]), m.closed, m.offset)
        return Document((*nodes[:mi], m, *nodes[mi + 1 :]), doc.diagnostics), calls

    def _tools_at(self, doc: Document) -> int | None:
        """Where the message's first tools channel stands among its children,
        or None when it is not right in the message (a channel written
        inside another, which the reader takes out itself)."""
        m = next((x for x in doc.nodes if type(x) is Element), None)
        if m is None:
            return None
        tag = self._tools_tag
        return next((i for i, c in enumerate(m.children) if type(c) is Element and c.tag == tag), None)

    def _end_call(self, o: _Open, calls: list[dict[str, Any]], at: int, out: list[StreamEvent]) -> None:
        if 0 < o.index <= len(calls):
            out.append(StreamEvent("tool_call_end", at, index=o.index, call=calls[o.index - 1]))

    def _end_if_closed(self) -> None:
        """As the batch parser does: a completion may stop right before the
        stop token (engines strip it), so the end marker is supplied after a
        closed message."""
        tail = list(self._tail)
        if [k for k, _ in tail] == [CLOSE, TEXT, SEP] and tail[1][1] == self.names["message"]:
            self._push(END, "", self._shift + self._offset)


_Prompt = tuple[int, tuple[tuple[str, str, int], ...]]


def _prompt_lexemes(d: Dialect, binding: Binding, thinking: bool) -> _Prompt:
    """The length in ids and the lexemes of the generation prompt: the
    assistant message and the channel it opens, both left open (made once
    per binding and mode, and kept on the binding: a server starts a stream
    per request)."""
    cache: dict[tuple[str, str, str], _Prompt] = binding.derived.setdefault(_prompt_lexemes, {})
    n = d.names
    key = (n["message"], n["role"], d.prompt_tag(thinking))
    hit = cache.get(key)
    if hit is None:
        ids = binding.encode([generation_prompt(d, thinking)])
        lx = binding.lex(ids)
        hit = cache[key] = (len(ids), tuple(zip(lx.kinds, lx.texts, lx.offsets)))
    return hit
