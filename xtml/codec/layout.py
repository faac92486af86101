"""A layout dialect put to work with a tokenizer binding: request → ids,
ids (or text) → request, and the stream of a completion.

The stream is the batch parse run as tokens come: text tokens are decoded
incrementally (a run's pending bytes flushed at each token, as the batch
decodes each run whole), tokens end the answer or are repaired as the
lenient batch parse repairs them, and ``message_end`` carries the batch
parse of every id fed, so the two cannot disagree.
"""

from __future__ import annotations

import bisect
import codecs
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..chat.layout import LayoutDialect
from ..chat.layout_call_array import array_shape
from ..chat.layout_engine import parse_completion, parse_prompt
from ..chat.layout_fold_answer import fold_shape
from ..chat.layout_harmony import reasoning_length_harmony
from ..chat.layout_open import open_shape
from ..chat.layout_parse import Lexed, first_of, shape
from ..chat.layout_pattern import TOKEN_BASE, Slot
from ..errors import ParseError, shown
from ..vocab.tokens import TokenBinding, locate, tokens_bound
from ..vocab.vocabulary import Vocabulary
from .layout_fold_stream import FoldLive
from .layout_harmony_stream import HarmonyLive
from .layout_turns import TurnsLive
from .stream import StreamEvent, StreamState

__all__ = ["LayoutStream", "bind", "lex_text", "parse", "reasoning_length"]


def reasoning_length(d: LayoutDialect, binding: TokenBinding, ids: Sequence[int]) -> int:
    """How many of an answer's ids are reasoning, as the parse reads them:
    up to and with the close of its reasoning block, all those before the
    stop token when it never closes, none when it has none (the block does
    not open the answer, or the prompt opened it and it closes after the
    stop token or never)."""
    if d.split is not None:
        try:
            return reasoning_length_harmony(d, lex_ids(binding, ids), len(ids))
        except ParseError as e:
            return reasoning_length_harmony(d, lex_ids(binding, ids[:e.offset]), e.offset)
    sh = open_shape(d) if d.open_turns else array_shape(d) if d.system_turns else fold_shape(d) if d.folded_turns \
        else shape(d)
    if sh.think is None or d.header_turns is not None:
        return 0
    try:
        lx = lex_ids(binding, ids)
    except ParseError as e:
        # What comes before an id that is none (the parse refuses it).
        lx = lex_ids(binding, ids[:e.offset])
    s = lx.text
    stop_at = first_of(s, sh.stops)
    body = s if stop_at < 0 else s[:stop_at]
    opening, closing = sh.think
    # (Where the format writes whitespace first, the block opens after it.)
    start = len(body) - len(body.lstrip()) if sh.lead else 0
    if not sh.opened and body[start:start + 1] != opening:
        return 0
    ci = body.find(closing, start)
    if ci >= 0:
        return lx.offset(ci) + 1
    if sh.opened:
        return 0
    return lx.offset(stop_at) if stop_at >= 0 else len(ids)


def bind(d: LayoutDialect, vocab: Vocabulary) -> TokenBinding:
    # A message_end token lets the model go on: generation does not stop there.
    return tokens_bound(d.special, d.added, tuple(t for t, m in d.stops.items() if m != "message_end"), TOKEN_BASE,
                        vocab)


_SURROGATE = re.compile("[\ud800-\udfff]")


def lex_text(d: LayoutDialect, text: str) -> Lexed:
    """Text as a parse reads it: every token string of the dialect is its
    token (a literal a content spelled reads as the token: the text form's
    ambiguity, reported on render)."""
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise ParseError(f"a lone surrogate (U+{ord(bad.group()):04X}): text must be valid Unicode",
                         offset=bad.start(), source=text)
    chars = d.chars()
    pieces: list[str] = []
    starts: list[int] = []
    offsets: list[int] = []
    pos = out = 0
    for m in d.finder().finditer(text):
        if m.start() > pos:
            starts.append(out)
            offsets.append(pos)
            pieces.append(text[pos:m.start()])
            out += m.start() - pos
        starts.append(out)
        offsets.append(m.start())
        pieces.append(chars[m.group()])
        out += 1
        pos = m.end()
    if pos < len(text):
        starts.append(out)
        offsets.append(pos)
        pieces.append(text[pos:])
    s = "".join(pieces)

    def offset(at: int) -> int:
        if at >= len(s):
            return len(text)
        k = bisect.bisect_right(starts, at) - 1
        return offsets[k] + (at - starts[k] if pieces[k] not in chars.values() else 0)

    return Lexed(s, offset)


def lex_ids(binding: TokenBinding, ids: Sequence[int]) -> Lexed:
    s = binding.lex_whole(ids)
    if s is not None:
        return Lexed(s, _located_later(binding, ids, s))
    s, starts, offsets = binding.lex(ids)
    return Lexed(s, locate(starts, offsets, len(ids), s))


def _located_later(binding: TokenBinding, ids: Sequence[int], s: str) -> Callable[[int], int]:
    """Where a character of ``s`` came from, as :meth:`TokenBinding.lex`
    says it, worked out when first asked (an error, a diagnostic): most
    parses never ask."""
    found: Callable[[int], int] | None = None

    def offset(at: int) -> int:
        nonlocal found
        if found is None:
            _, starts, offsets = binding.lex(ids)
            found = locate(starts, offsets, len(ids), s)
        return found(at)

    return offset


def parse(d: LayoutDialect, binding: TokenBinding | None, data: Sequence[int] | str, *, completion: bool,
          lenient: bool, tools: Any = None) -> dict[str, Any]:
    if isinstance(data, str):
        lx = lex_text(d, data)
        source: str | None = data
    else:
        if binding is None:
            raise TypeError("parsing token ids needs the tokenizer")
        lx = lex_ids(binding, data)
        source = None
    try:
        if completion:
            return parse_completion(d, lx, lenient=lenient, tools=tools)
        if lenient:
            raise ParseError("a lenient parse of a whole conversation is not yet available for layout dialects "
                             "(a completion's is: completion=True)", offset=0)
        return parse_prompt(d, lx)
    except ParseError as e:
        if source is not None and e.line is None:
            raise ParseError(e.msg, offset=e.offset, source=source, path=e.path) from None
        raise


class _RichLive:
    """The reading of an answer with a reasoning block and calls, token by
    token, as :func:`~xtml.chat.layout_parse.parse_completion` reads it whole: the
    reasoning block only where it opens the answer, its newlines stripped
    at both ends; the content after it with its leading newlines skipped;
    the one separator before the first call not content; nothing after the
    first call (the calls go out with the message). Newlines at the end of
    what was read are held until the text after them says where they go."""

    __slots__ = ("held", "sh", "skip", "state")

    def __init__(self, sh: Any) -> None:
        self.sh = sh
        self.state = "begin"  # begin, think, content, calls
        self.held = ""
        self.skip = False  # leading newlines (all whitespace, where trimmed) are not text here

    def _channel(self) -> str:
        return "think" if self.state == "think" else "response"

    def plain(self, s: str) -> bool:
        """Whether ``s`` goes out as content as it is: content, nothing held
        or skipped, and nothing at its end to hold."""
        if self.state != "content":
            return False
        if self.sh.exact:
            return True
        return not self.skip and not self.held and (s.rstrip() if self.sh.trim else s.rstrip("\n")) is s

    def text(self, s: str, at: int, out: list[StreamEvent]) -> None:
        if self.state == "calls":
            return
        trim = self.sh.trim
        if self.state == "begin":
            if self.sh.lead and not s.strip():
                return  # the format's own whitespace: the reasoning block may still open
            self.state, self.skip = "content", trim
            out.append(StreamEvent("channel_start", at, "response"))
        if self.sh.exact:
            # Written as is: no newline is the format's own.
            if s:
                out.append(StreamEvent("text", at, self._channel(), s))
            return
        if self.skip:
            s = s.lstrip() if trim else s.lstrip("\n")
            if not s:
                return
            self.skip = False
        s = self.held + s
        body = s.rstrip() if trim else s.rstrip("\n")
        self.held = s[len(body):]
        if body:
            out.append(StreamEvent("text", at, self._channel(), body))

    def token(self, c: str, at: int, out: list[StreamEvent]) -> None:
        think, call = self.sh.think, self.sh.call
        if self.state == "begin":
            if think is not None and c == think[0]:
                self.state, self.skip = "think", not self.sh.exact
                out.append(StreamEvent("channel_start", at, "think"))
                return
            # Only the first token can open the reasoning block.
            self.state, self.skip = "content", self.sh.trim
            out.append(StreamEvent("channel_start", at, "response"))
        if self.state == "think":
            if think is not None and c == think[1]:
                self.held = ""  # the block's own newlines
                out.append(StreamEvent("channel_end", at, "think"))
                self.state, self.skip = "content", not self.sh.exact
                out.append(StreamEvent("channel_start", at, "response"))
        elif self.state == "content":
            if call is not None and c == self.sh.calls_open:
                sep = call[3]
                held = "" if self.sh.trim else self.held[:-len(sep)] if sep and self.held.endswith(sep) else self.held
                if held:
                    out.append(StreamEvent("text", at, "response", held))
                self.held = ""
                self.state = "calls"
            else:
                # Out of place (the message's diagnostics say so): it ends
                # the newlines that follow a reasoning block, and the held
                # ones are not the separator before a call. (Trimmed
                # content: left out, the token joins what is around it,
                # and the held whitespace waits for text after it.)
                if self.sh.trim:
                    return
                self.skip = False
                if self.held:
                    out.append(StreamEvent("text", at, "response", self.held))
                    self.held = ""

    def finish(self, at: int, out: list[StreamEvent], message: Any = None) -> None:
        if self.state == "think":
            out.append(StreamEvent("channel_end", at, "think"))  # cut off: its newlines are stripped
        elif self.state == "content" and self.held and not self.sh.trim:
            out.append(StreamEvent("text", at, "response", self.held))
        self.held = ""


def _always(s: str) -> bool:
    return True


_READY, _READING, _ENDED, _FAILED = (StreamState.READY, StreamState.READING, StreamState.ENDED,
                                     StreamState.FAILED)


class LayoutStream:
    """Streaming parse of what a model generates after a layout dialect's
    generation prompt (the :class:`~xtml.StreamParser` API)."""

    def __init__(self, d: LayoutDialect, binding: TokenBinding, *, keep: bool = True, lenient: bool = True,
                 tools: Any = None) -> None:
        self._d = d
        self._tools = tools
        self._b = binding
        self._lenient = lenient
        self._keep = keep
        self._ids: list[int] = []
        self._state = _READY
        self._error: ParseError | None = None
        self._size = binding.vocab.size
        self._bytes = binding.text_table()
        # Each id's text where its bytes are whole UTF-8: read without the
        # decoder while it holds no bytes of a character cut in two.
        self._strs = binding.text_strs() if self._bytes else []
        self._clean = True
        self._chars = binding.char_of_id
        stop_chars = {d.chars()[t]: m for t, m in d.stops.items()}
        self._stops = {i: stop_chars[c] for i, c in self._chars.items()
                       if c in stop_chars and stop_chars[c] != "message_end"}
        # Text streams as it comes when the answer is its content alone;
        # otherwise the content goes out whole at the end.
        body = d.roles["assistant"].body.items if "assistant" in d.roles else ()
        self._live = len(body) == 1 and isinstance(body[0], Slot) and body[0].name == "content" \
            and not body[0].codec and bool(self._bytes)
        # An answer with reasoning and calls streams its reasoning and
        # content as they come when every token of it is an id here.
        sh = open_shape(d) if d.open_turns else array_shape(d) if d.system_turns else fold_shape(d) \
            if d.folded_turns else shape(d)
        self._rich: _RichLive | TurnsLive | FoldLive | HarmonyLive | None = None
        # (Not where the prompt may open the reasoning block: only its close
        # says the text before it was reasoning.)
        if not self._live and bool(self._bytes) and not binding.text_tokens and (sh.think or sh.call) \
                and not sh.opened:
            self._rich = _RichLive(sh)
        if d.header_turns is not None and bool(self._bytes) and not binding.text_tokens:
            self._rich = TurnsLive(d)
        if d.folded_turns and bool(self._bytes) and not binding.text_tokens:
            self._rich = FoldLive(d, tools)
        if d.split is not None:
            self._rich = HarmonyLive(d) if bool(self._bytes) and not binding.text_tokens else None
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._trailing = False
        # The live reader's test for text that goes out as it is, where it
        # has one (see content_text).
        self._plain: Callable[[str], bool] | None = getattr(self._rich, "plain", None)
        if self._rich is None and self._live:
            self._plain = _always  # the answer is its content, every piece as it comes
        # The lexed string of what was fed, made as it comes (as the batch
        # lex makes it: a run of text decoded whole, each token its
        # character), so the end parses it without reading the ids again.
        # Without a byte table the end lexes the ids.
        self._lexing = bool(self._bytes)
        self._pieces: list[str] = []
        self._starts: list[int] = []
        self._offsets: list[int] = []
        self._length = 0
        self._run: list[str] = []
        self._run_at = -1

    @property
    def state(self) -> StreamState:
        return self._state

    def feed(self, token_id: int) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        self._feed(token_id, out)
        return out

    def feed_many(self, ids: Iterable[int]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for t in ids:
            self._feed(t, out)
        return out

    def content_text(self, token_id: int) -> str | None:
        """Feeds ``token_id`` where it is ordinary text that goes out as
        content as it is (a piece of an answer's content, with nothing held),
        and returns that text: :meth:`feed` would give one ``text`` event of
        it on the response channel. Anywhere else, None, and nothing is fed:
        :meth:`feed` reads it. (A server's fast path, one delta at a time.)"""
        plain = self._plain
        if plain is None or self._state is not _READING or not self._clean or self._run_at < 0 \
                or type(token_id) is not int or not 0 <= token_id < self._size:
            return None
        s = self._strs[token_id]  # None for a token's id
        if not s or not plain(s):
            return None
        self._ids.append(token_id)
        self._run.append(s)
        return s

    def close(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if self._state is _FAILED:
            assert self._error is not None
            raise self._error
        if self._state is _ENDED:
            return out
        if self._state is _READY:
            self._start(out)
        self._end(out, None)
        return out

    def _start(self, out: list[StreamEvent]) -> None:
        self._state = _READING
        out.append(StreamEvent("message_start", 0, role="assistant"))
        if self._rich is None:
            out.append(StreamEvent("channel_start", 0, "response"))

    def _fail(self, e: ParseError) -> ParseError:
        self._state = _FAILED
        self._error = e
        return e

    def _feed(self, t: Any, out: list[StreamEvent]) -> None:
        state = self._state
        if state is _FAILED:
            assert self._error is not None
            raise self._error
        at = len(self._ids)
        if state is _ENDED:
            if not self._trailing:
                self._trailing = True
                out.append(StreamEvent("diagnostic", at, diagnostic={
                    "kind": "after-end", "offset": at, "message": "ids after the stop token are not read"}))
            return
        if state is _READY:
            self._start(out)
        if type(t) is not int or not 0 <= t < self._size:
            e = ParseError(f"{shown(t)} is not a token id of this tokenizer", offset=at)
            if not self._lenient:
                raise self._fail(e)
            out.append(StreamEvent("diagnostic", at, diagnostic={"kind": "bad-id", "offset": at, "message": e.msg}))
            return
        self._ids.append(t)
        rich = self._rich
        c = self._chars.get(t)
        if c is None:
            if self._lexing:
                s = self._strs[t] if self._clean else None
                if s is None:
                    s = self._dec.decode(self._bytes[t] or b"", False)
                    self._clean = not self._dec.getstate()[0]
                if self._run_at < 0:
                    self._run_at = at
                if s:
                    self._run.append(s)
                    if rich is not None:
                        rich.text(s, at, out)
                    elif self._live:
                        out.append(StreamEvent("text", at, "response", s))
            return
        self._flush(at, out, rich.text if rich is not None else self._send if self._live else None)
        if self._lexing:
            self._pieces.append(c)
            self._starts.append(self._length)
            self._offsets.append(at)
            self._length += 1
        if t in self._stops:
            self._end(out, t)
            return
        if rich is not None:
            rich.token(c, at, out)
            return
        if not self._live:
            return  # read by the parse at the end
        if not self._lenient:
            token = self._b.tokens[ord(c) - TOKEN_BASE]
            raise self._fail(ParseError(f"{token!r} does not belong in an answer", offset=at))

    @staticmethod
    def _send(s: str, at: int, out: list[StreamEvent]) -> None:
        out.append(StreamEvent("text", at, "response", s))

    def _flush(self, at: int, out: list[StreamEvent],
               send: Callable[[str, int, list[StreamEvent]], None] | None) -> None:
        """The end of a run of text: the decoder's pending bytes, to ``send``,
        and the run, whole, a piece of the lexed string."""
        if not self._lexing:
            return
        s = self._dec.decode(b"", True)
        self._dec.reset()
        self._clean = True
        if s:
            self._run.append(s)
            if send is not None:
                send(s, at, out)
        if self._run_at >= 0:
            text = self._b.lexed_run("".join(self._run))
            self._pieces.append(text)
            self._starts.append(self._length)
            self._offsets.append(self._run_at)
            self._length += len(text)
            self._run = []
            self._run_at = -1

    def _message(self) -> dict[str, Any]:
        """The batch parse of every id fed."""
        if not self._lexing:
            return parse(self._d, self._b, self._ids, completion=True, lenient=self._lenient, tools=self._tools)
        s = "".join(self._pieces)
        lx = Lexed(s, locate(self._starts, self._offsets, len(self._ids), s))
        return parse_completion(self._d, lx, lenient=self._lenient, tools=self._tools)

    def _end(self, out: list[StreamEvent], stop: int | None) -> None:
        at = len(self._ids)
        # Cut off (no stop token): pending bytes go out where the answer
        # streams as it comes.
        self._flush(at, out, self._send if self._live else None)
        try:
            message = self._message()
        except ParseError as e:
            raise self._fail(e) from None
        if self._rich is not None:
            self._rich.finish(at, out, message)
        elif not self._live:
            # Not streamed as it came: the answer goes out whole, reasoning
            # first, as the XTML stream's channels go.
            if message.get("reasoning_content"):
                out.append(StreamEvent("channel_start", at, "think"))
                out.append(StreamEvent("text", at, "think", message["reasoning_content"]))
                out.append(StreamEvent("channel_end", at, "think"))
            if message.get("content"):
                out.append(StreamEvent("text", at, "response", message["content"]))
        # The repairs go out as events, as the XTML stream sends them; the
        # message is the rest of the batch parse.
        for diag in message.pop("diagnostics", ()):
            out.append(StreamEvent("diagnostic", at, diagnostic=diag))
        if self._rich is None or self._rich.state in ("content", "calls"):
            out.append(StreamEvent("channel_end", at, "response"))
        meaning = self._stops.get(stop) if stop is not None else None
        reason = "length" if meaning is None else "tool_calls" if message.get("tool_calls") else "stop"
        out.append(StreamEvent("message_end", at, message=message, stop_reason=reason))
        self._state = _ENDED
        self._pieces, self._starts, self._offsets = [], [], []
        if not self._keep:
            self._ids = []
