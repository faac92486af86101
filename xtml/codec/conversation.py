"""A conversation that keeps its rendered ids and renders only what changes.

A multi-turn server or an agent renders the same history again every turn:
at 100 messages a full render costs 25-30 times the last turn alone. A
:class:`Conversation` keeps, for each message, the markup events it rendered
to and their ids; appending a message renders the new message (and the few
before it that it can change), and :meth:`Conversation.prompt_ids` adds only
the one-shot option messages and the generation prompt.

Its ids are always those of ``Template.encode`` of the whole request (the
messages, the conversation's options and the one-shot options). The
rendering is split where :mod:`xtml.chat.render` says what each part reads:

* the head (tool declaration, thinking effort) reads the options;
* a message reads itself as resolved, the options, and the plugin state the
  messages before it left; it is resolved from the messages since the latest
  assistant message before it (a tool result takes its index, name and place
  in its run from them). So a change at message ``i`` resolves and renders
  again from that assistant message (the *window*), and a change of options
  from the first message;
* the tail reads the one-shot options.

Whatever is rendered again is compared event by event with what was kept,
and only a message whose events differ is tokenized again: the events of a
message decide its ids (each text is encoded on its own, tags and markers
come from the binding's tables). A failed call leaves the conversation as
it was.

A conversation may be shared by threads: each call holds its lock for the
whole of its work, so calls serialize and each sees the state another left.
"""

from __future__ import annotations

import copy
import re
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from ..chat import fields
from ..chat.dialect import Dialect
from ..chat.options import Options, resolve_options
from ..chat.render import RenderState, final_message, message_renderer, render_head, render_tail
from ..chat.request import KNOWN_MESSAGE_KEYS, Msg, prepare
from ..chat.request_size import MAX_CHARS, request_size
from ..errors import MAX_DEPTH, MessageError, OptionError, RequestError
from ..markup.sink import Attrs
from ..plugins.api import call_id
from ..vocab.binding import Binding
from .parse import parse
from .stream import StreamParser

__all__ = ["CONVERSATION_OPTIONS", "ONE_SHOT_OPTIONS", "Conversation"]

ONE_SHOT_OPTIONS: frozenset[str] = frozenset({
    "tool_choice", "response_format", "response_schema", "add_generation_prompt", "continue_final_message",
})
"""Options that shape one prompt only (rendered after the messages): given to
:meth:`Conversation.prompt_ids`."""
CONVERSATION_OPTIONS: frozenset[str] = frozenset(fields.OPTIONS) - ONE_SHOT_OPTIONS
"""Options that shape how the messages render (tools, thinking and its
effort, image prompts): the conversation's own, set with
:meth:`Conversation.set_options`."""

_NO_IDS: list[int] = []

# Event kinds: the index of the sink method that replays them.
_OPEN, _CLOSE, _TEXT, _ELEMENT, _EMBED, _END = range(6)
Event = tuple[int, tuple[Any, ...]]


class _Recorder:
    """A markup sink that keeps its events, to compare and to replay."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[Event] = []

    def open(self, tag: str, attrs: Attrs = ()) -> None:
        self.events.append((_OPEN, (tag, attrs)))

    def close(self) -> None:
        self.events.append((_CLOSE, ()))

    def text(self, text: str, stable: bool = False) -> None:
        self.events.append((_TEXT, (text, stable)))

    def element(self, tag: str, attrs: Attrs, text: str, stable: bool = False) -> None:
        self.events.append((_ELEMENT, (tag, attrs, text, stable)))

    def embed(self, raw: str) -> None:
        self.events.append((_EMBED, (raw,)))

    def end(self) -> None:
        self.events.append((_END, ()))


@dataclass(slots=True, eq=False)
class _Turn:
    """One message, from what was appended to where its ids are: one record,
    so that what is kept of a message is replaced all at once.

    Never changed once the conversation holds it: a copy of the
    conversation shares its turns."""

    raw: dict[str, Any]
    """The message as appended (a normalized copy), or the completion as
    parsed."""
    size: int
    """What request_size counts of ``raw`` (0 with no ``max_chars``)."""
    msg: Msg
    """The message resolved (its ``index`` is the turn's)."""
    events: list[Event]
    """What it renders to, with its end marker."""
    state: dict[str, Any] | None
    """The plugins' render state before it renders (None: empty)."""
    window: int | None
    """Where a change after it is resolved from: the latest assistant
    message up to it (tool results take their index, name and place in
    their run from it), else the first tool result up to it."""
    start: int
    stop: int
    """Its ids: ``Conversation._ids[start:stop]``. A run of tool results
    renders in call order, so within one the ids need not follow the turns'
    order."""


_by_index = attrgetter("msg.index")
_raw_of = attrgetter("raw")
_size_of = attrgetter("size")


class Conversation:
    """Messages, options and the ids they render to, kept up to date.

    Made by :meth:`xtml.Template.conversation`. ``options`` are the
    conversation's options (:data:`CONVERSATION_OPTIONS`: ``tools``,
    ``thinking``, ``thinking_effort`` ...; their aliases such as
    ``enable_thinking`` and ``functions`` are read as ``encode`` reads
    them). ``max_chars`` and ``unknown_keys`` are those of
    ``Template.encode``. It may be shared by threads: its calls serialize.
    """

    def __init__(self, dialect: Dialect, binding: Binding, messages: Iterable[Any] = (), *,
                 max_chars: int | None = MAX_CHARS, unknown_keys: str = "error", **options: Any) -> None:
        if max_chars is not None and (type(max_chars) is not int or max_chars < 0):
            raise OptionError("max_chars must be a non-negative integer or None", option="max_chars")
        if unknown_keys not in fields.UNKNOWN_KEYS:
            raise OptionError(f"unknown_keys must be one of {', '.join(map(repr, fields.UNKNOWN_KEYS))}, "
                              f"not {unknown_keys!r}", option="unknown_keys")
        self.dialect = dialect
        self.binding = binding
        # Reentrant: a message's model_dump or a tokenizer may read the
        # conversation back while a call holds it.
        self._lock = threading.RLock()
        self._limit = max_chars
        self._ignore = unknown_keys == "ignore"
        self._turns: list[_Turn] = []
        """The messages, in order."""
        self._size = 0
        """What request_size counts of the messages."""
        self._opts_size = 0
        self._opts: dict[str, Any] = {}
        self._o: Options = resolve_options(dialect, {})
        self._head: list[Event] = []
        self._state_end: dict[str, Any] | None = None
        """The plugins' render state after the last message."""
        self._ids: list[int] = []
        """Head and messages, closed: the history's ids."""
        self._continuing = False
        opts = self._conversation_options(options)
        self._update(_copy_all(self._normalized(messages, 0)), 0, opts)

    # -- reading -----------------------------------------------------------------------

    @property
    def messages(self) -> tuple[dict[str, Any], ...]:
        """The messages, in order: copies of what was appended (normalized as
        ``encode`` reads them: objects dumped, ``function_call`` as a tool
        call), and each completion as parsed. Read them; changing them in
        place would put the conversation out of step with its ids."""
        with self._lock:
            return tuple(map(_raw_of, self._turns))

    @property
    def options(self) -> dict[str, Any]:
        """The conversation's options (a copy)."""
        with self._lock:
            return dict(self._opts)

    @property
    def tools(self) -> list[Any] | None:
        """The tool list as declared (Python functions made schemas), or None."""
        with self._lock:
            return self._o.tools

    @property
    def thinking(self) -> bool:
        """Whether the conversation renders thinking (and its generation
        prompt opens the think channel)."""
        with self._lock:
            return self._o.thinking

    @property
    def ids(self) -> list[int]:
        """The ids of the messages so far, each closed: ``encode`` of the
        request with ``add_generation_prompt=False`` (a copy)."""
        with self._lock:
            return list(self._ids)

    def __len__(self) -> int:
        with self._lock:
            return len(self._turns)

    def __repr__(self) -> str:
        with self._lock:
            n, ids = len(self._turns), len(self._ids)
        return f"<xtml.Conversation {self.dialect.name!r}: {n} messages, {ids} ids>"

    def request(self, **options: Any) -> dict[str, Any]:
        """The whole request as a chat-completions body: the messages, the
        conversation's options and ``options`` (one-shot ones, say)."""
        with self._lock:
            return {"messages": list(map(_raw_of, self._turns)), **self._opts, **options}

    # -- changing ----------------------------------------------------------------------

    def append(self, message: Any) -> None:
        """Add one message (a dict as ``encode`` takes it, or an object with
        ``model_dump``); a list of messages goes to :meth:`extend`. Anything
        else raises :class:`~xtml.errors.MessageError` with the index the
        message would have had."""
        if isinstance(message, list | tuple):
            with self._lock:
                raise MessageError(f"append takes one message, not a {type(message).__name__} of them: "
                                   "extend() adds several", index=len(self._turns))
        self.extend((message,))

    def extend(self, messages: Iterable[Any]) -> None:
        """Add messages, in order, all or none: a bad one raises
        :class:`~xtml.errors.MessageError` with its index in the whole
        conversation."""
        with self._lock:
            start = len(self._turns)
            new = _copy_all(self._normalized(messages, start))
            if new:
                self._update(new, start, None)

    def append_completion(self, ids: Sequence[int], *, lenient: bool = False) -> dict[str, Any]:
        """Read what the model generated after :meth:`prompt_ids` and add it
        as the next assistant message; returns the parsed message (with
        ``diagnostics`` when ``lenient``).

        After a prompt that continued the final message
        (``continue_final_message=True``), the ids continue that message,
        which is replaced by the whole of it. Tool calls get the ids the
        normal form gives them (``call_{index}_{k}``); answer them with
        those ``tool_call_id``s. Strict by default: output that is not
        well-formed raises :class:`~xtml.errors.ParseError`, and nothing is
        added."""
        with self._lock:
            prefill = self._turns[-1].raw if self._continuing and self._turns else None
            parsed = parse(self.dialect, self.binding, ids, completion=True, thinking=self._o.thinking,
                           prefill=prefill, lenient=lenient, max_chars=self._limit)
            index = len(self._turns) - (prefill is not None)
            for k, call in enumerate(parsed.get("tool_calls") or (), start=1):
                call["id"] = call_id(index, k)
            message = _copy({k: v for k, v in parsed.items() if k != "diagnostics"})
            self._update([message], index, None)
            return parsed

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` messages (to retry a turn, say)."""
        if type(n) is not int or n < 0:
            raise RequestError(f"truncate keeps a number of messages, not {n!r}")
        with self._lock:
            if n < len(self._turns):
                self._update([], n, None)

    def set_options(self, **options: Any) -> None:
        """Change conversation options (merged over the current ones as
        keyword options are over a request's; ``None`` removes one). What
        renders differently is tokenized again, from the first message whose
        markup changed; the rest keeps its ids."""
        given = self._conversation_options(options)
        with self._lock:
            merged = {**self._opts, **given}
            opts = {k: v for k, v in merged.items() if v is not None}
            if resolve_options(self.dialect, opts) == self._o:
                # The same resolved options render the same: a server may
                # pass a request's options every turn.
                size = self._options_size(opts) if self._limit is not None else 0
                if self._limit is not None:
                    self._check_size(self._size + size)
                self._opts, self._opts_size = opts, size
                return
            self._update([], len(self._turns), opts)

    def set_tools(self, tools: Sequence[Any] | None) -> None:
        """Replace the tool list (None or ``[]``: no tools)."""
        self.set_options(tools=tools)

    def copy(self) -> Conversation:
        """An independent conversation with the same messages and ids (to
        try several continuations, say). It has its own lock."""
        return copy.copy(self)

    def __getstate__(self) -> dict[str, Any]:
        # A lock neither copies nor pickles: a copy gets its own
        # (__setstate__), and the state is taken whole, under this one. The
        # turns are never changed once held, so they are shared.
        with self._lock:
            state = dict(self.__dict__)
            state["_turns"] = list(self._turns)
            state["_ids"] = list(self._ids)
            state["_opts"] = dict(self._opts)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # -- the prompt --------------------------------------------------------------------

    def prompt_ids(self, **options: Any) -> list[int]:
        """The ids to generate from: the messages, then the one-shot option
        messages and the generation prompt, exactly as ``encode`` of the whole
        request. ``options`` are one-shot (:data:`ONE_SHOT_OPTIONS`:
        ``tool_choice``, ``response_format``, ``add_generation_prompt``,
        ``continue_final_message`` ...), for this prompt only."""
        one = _keyword_options(options)
        bad = sorted(k for k in one if k not in ONE_SHOT_OPTIONS)
        if bad:
            raise OptionError(f"{bad[0]} is an option of the whole conversation: change it with set_options()",
                              option=bad[0])
        with self._lock:
            return self._prompt_ids(one)

    def _prompt_ids(self, one: dict[str, Any]) -> list[int]:
        if self._limit is not None and one:
            self._check_size(self._size + self._opts_size + self._options_size(one))
        o = self._o
        if one:
            r = resolve_options(self.dialect, one)
            o = replace(o, tool_choice=r.tool_choice, response_format=r.response_format,
                        add_generation_prompt=r.add_generation_prompt, continue_final=r.continue_final)
        # The last message is the last one rendered unless it is a tool
        # result (a run of them renders in call order), which cannot be
        # continued either way.
        last = self._turns[-1] if self._turns else None
        final = final_message([last.msg] if last is not None else []) if o.continue_final else None
        rec = _Recorder()
        s = RenderState(self.dialect, o, rec)
        state = last.state if last is not None and final is not None else self._state_end
        if state:
            s.ctx.state = copy.deepcopy(state)
        render_tail(s, final)
        tail = self._tokenize(rec.events)
        self._continuing = final is not None
        if last is not None and final is not None:
            return self._ids[: last.start] + tail
        return self._ids + tail

    def stream(self, *, keep: bool = True, lenient: bool = True) -> StreamParser:
        """A stream parser for what the model generates after the
        generation prompt of :meth:`prompt_ids` (see ``Template.stream``; not
        after ``continue_final_message``); add its final message with
        :meth:`append`, or the ids with :meth:`append_completion`."""
        return StreamParser(self.dialect, self.binding, thinking=self.thinking, keep=keep, lenient=lenient)

    # -- inside ------------------------------------------------------------------------

    def _conversation_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        opts = _keyword_options(options)
        bad = sorted(k for k in opts if k not in CONVERSATION_OPTIONS)
        if bad:
            raise OptionError(f"{bad[0]} applies to one prompt: pass it to prompt_ids()", option=bad[0])
        # Copies, as of messages: a tool list the caller changes later must
        # not change what request() shows but the ids do not hold. The copy
        # recurses per level: the depth encode allows is checked first.
        for k, v in opts.items():
            request_size(v, sys.maxsize, levels=MAX_DEPTH - 1, at=(k,))
        return {k: _copy(v) for k, v in opts.items()}

    def _normalized(self, messages: Iterable[Any], start: int) -> list[Any]:
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
            raise RequestError(f"expected a list of messages, not {type(messages).__name__}")
        try:
            out = fields.messages_of(list(messages), self._ignore, KNOWN_MESSAGE_KEYS)
        except RequestError as e:
            raise _shifted(e, start) from None
        # Refused here, as encode's check refuses them, before anything reads
        # a message as a mapping.
        for i, m in enumerate(out):
            if not isinstance(m, Mapping):
                raise MessageError(f"a message must be an object, not {type(m).__name__}", index=start + i)
            # As deep as encode allows a message in its request, before
            # anything (the copy) recurses per level.
            request_size(m, sys.maxsize, levels=MAX_DEPTH - 2, at=("messages", start + i))
        return out

    def _options_size(self, opts: Mapping[str, Any]) -> int:
        assert self._limit is not None
        return sum(len(k) + request_size(v, self._limit) for k, v in opts.items())

    def _check_size(self, size: int) -> None:
        """The limit ``encode`` puts on the whole request, counted as
        :func:`request_size` counts ``{"messages": [...], **options}`` (the
        messages' and the options' sizes are given)."""
        assert self._limit is not None
        total = 2 + len("messages") + size
        if total > self._limit:
            raise RequestError(f"the request is too large: at least {total:,} characters, more than "
                               f"max_chars={self._limit:,}")

    def _window(self, start: int) -> int:
        """The first message that a change at message ``start`` can render
        differently: the latest assistant message before it (tool results
        are resolved against it), or the first tool result when there is
        none."""
        window = self._turns[start - 1].window if start else None
        return start if window is None else window

    def _resolve(self, window: list[Any], w: int, o: Options) -> list[Msg]:
        request: dict[str, Any] = {"messages": window, "thinking": o.thinking}
        if o.image_prompts is not None:
            request["image_prompts"] = o.image_prompts
        try:
            _, msgs = prepare(self.dialect, request,
                              {"max_chars": None, "unknown_keys": "ignore" if self._ignore else "error"})
        except RequestError as e:
            raise _shifted(e, w) from None
        if w:
            for m in msgs:
                m.index += w
                if m.call_ref is not None:
                    m.call_ref = (m.call_ref[0] + w, m.call_ref[1])
        return msgs

    def _tokenize(self, events: list[Event]) -> list[int]:
        sink = self.binding.sink()
        emit = (sink.open, sink.close, sink.text, sink.element, sink.embed, sink.end)
        for kind, args in events:
            emit[kind](*args)
        return sink.finish()

    def _tokenize_many(self, messages: list[list[Event]]) -> list[list[int]]:
        """The ids of several messages, their texts encoded in one batch (a
        tokenizer call per message would cost more than the text).

        The batch is cut at the end markers: a message's events end with
        its one end event, text is never encoded as a marker id, and
        neither are tags; an embed may hold markers, so a message with one
        is tokenized on its own."""
        if len(messages) < 2:
            return [self._tokenize(ev) for ev in messages]
        alone = [any(kind == _EMBED for kind, _ in ev) or not ev or ev[-1][0] != _END
                 or sum(kind == _END for kind, _ in ev) != 1 for ev in messages]
        joined = self._tokenize([e for ev, a in zip(messages, alone) if not a for e in ev])
        end = self.binding.marker_ids[self.binding.markers.end]
        cuts: list[int] = []
        at = 0
        try:
            while True:
                at = joined.index(end, at) + 1
                cuts.append(at)
        except ValueError:
            pass
        batch = iter([joined[a:b] for a, b in zip([0, *cuts], cuts)])
        if len(cuts) != alone.count(False) or (cuts and cuts[-1] != len(joined)):
            batch = iter([self._tokenize(ev) for ev, a in zip(messages, alone) if not a])
        return [self._tokenize(ev) if a else next(batch) for ev, a in zip(messages, alone)]

    def _update(self, new: list[dict[str, Any]], start: int, opts: dict[str, Any] | None) -> None:
        """Keep the first ``start`` messages and put ``new`` after them, and
        make ``opts`` the options (None: unchanged; else every message is
        rendered again). Everything is computed before anything is changed."""
        d = self.dialect
        turns = self._turns
        if opts is None:
            o = self._o
            # Only tool results are resolved against the messages before
            # them: other messages appended render alike whatever precedes.
            w = self._window(start) if start < len(turns) or any(_is_tool(d, m) for m in new) else start
        else:
            o = resolve_options(d, opts)
            w = 0
        size, opts_size = self._size, self._opts_size
        new_sizes = [0] * len(new)
        if self._limit is not None:
            new_sizes = [request_size(m, self._limit) for m in new]
            size += sum(new_sizes) - sum(t.size for t in turns[start:])
            if opts is not None:
                opts_size = self._options_size(opts)
            self._check_size(size + opts_size)
        kept = turns[w:start]
        raw = [*map(_raw_of, kept), *new]
        sizes = [*map(_size_of, kept), *new_sizes]
        msgs = self._resolve(raw, w, o)

        head = self._head
        head_ids: list[int] | None = None
        if opts is not None:
            rec = _Recorder()
            render_head(RenderState(d, o, rec))
            head = rec.events
            if head != self._head:
                head_ids = self._tokenize(head)

        # The messages from the window on, in render order, as events, from
        # the plugin state left by the messages before it (the window starts
        # a run of tool results if it is in one, so it renders first).
        s = RenderState(d, o, None)
        before = turns[w].state if w < len(turns) else self._state_end
        if before:
            s.ctx.state = copy.deepcopy(before)
        render_one = message_renderer(s)
        made: list[_Turn] = []
        moved = False
        # Render order differs from message order only inside a run of tool
        # results after an assistant message, where the window stays put:
        # it can be followed in render order.
        window = turns[w - 1].window if w else None
        # One recorder whose list each message takes: an object fewer per
        # message, which shows when options change and all render again.
        rec = _Recorder()
        s.sink = rec
        for p, m in enumerate(msgs):
            state = copy.deepcopy(s.ctx.state) if s.ctx.state else None
            render_one(m)
            i = m.index - w
            moved = moved or i != p
            if m.role == "assistant" or (window is None and m.role == "tool"):
                window = m.index
            made.append(_Turn(raw[i], sizes[i], m, rec.events, state, window, 0, 0))
            rec.events = []
        state_end = copy.deepcopy(s.ctx.state) if s.ctx.state else None

        # Ids: kept where the events are those kept, else tokenized.
        old_ids = self._ids
        pieces: list[list[int]] = []
        fresh: list[int] = []
        for t in made:
            i = t.msg.index
            old = turns[i] if i < len(turns) else None
            if old is not None and old.events == t.events:
                pieces.append(old_ids[old.start : old.stop])
            else:
                fresh.append(len(pieces))
                pieces.append(_NO_IDS)
        for k, ids in zip(fresh, self._tokenize_many([made[k].events for k in fresh])):
            pieces[k] = ids
        cut = turns[w].start if w < len(turns) else len(old_ids)
        at = cut if head_ids is None else len(head_ids)
        for t, piece in zip(made, pieces):
            t.start = at
            at += len(piece)
            t.stop = at
        # The turns go in message order, which truncating and windows count
        # in; their ids stay in render order.
        if moved:
            made.sort(key=_by_index)

        # Commit: nothing below raises.
        if head_ids is not None:
            self._ids = head_ids
        else:
            del self._ids[cut:]
        for piece in pieces:
            self._ids.extend(piece)
        self._head = head
        self._size = size
        self._opts_size = opts_size
        if opts is not None:
            self._opts = opts
            self._o = o
        turns[w:] = made
        self._state_end = state_end
        self._continuing = False


def _keyword_options(options: Mapping[str, Any]) -> dict[str, Any]:
    if "max_chars" in options or "unknown_keys" in options:
        key = "max_chars" if "max_chars" in options else "unknown_keys"
        raise OptionError(f"{key} is set when the conversation is made", option=key)
    return fields.keyword_options(options)


def _is_tool(d: Dialect, m: Mapping[str, Any]) -> bool:
    role = m.get("role")
    return isinstance(role, str) and d.role_aliases.get(role, role) == "tool"


_AT = re.compile(r"messages\[(\d+)\]")


def _shifted(e: RequestError, by: int) -> RequestError:
    """The error with its message index in the whole conversation (a
    message's own errors, and those of a value inside one: a tool
    declaration's schema, say)."""
    if not by:
        return e
    if isinstance(e, MessageError):
        return MessageError(e.msg, index=e.index + by, path=e.path)

    def shift(where: str) -> str:
        return _AT.sub(lambda m: f"messages[{int(m.group(1)) + by}]", where, count=1) \
            if where.startswith("messages[") else where

    if isinstance(e, OptionError):
        return OptionError(e.msg, option=shift(e.option)) if type(e) is OptionError else e
    if type(e) is RequestError and e.location is not None:
        return RequestError(e.msg, location=shift(e.location))
    return e


def _copy(x: Any) -> Any:
    """A copy of a JSON-like value, so that the caller changing theirs later
    does not change the conversation's."""
    t = type(x)
    if t is str:
        return x
    if t is dict or (t is not list and t is not tuple and isinstance(x, Mapping)):
        return {k: _copy(v) for k, v in x.items()}
    if t is list:
        return [_copy(v) for v in x]
    if t is tuple:
        return tuple(_copy(v) for v in x)
    return x


def _copy_all(messages: list[Any]) -> list[Any]:
    return [_copy(m) for m in messages]
