"""Training samples: token ids with a loss mask, and where each message and
channel lies in them.

:func:`encode_training` renders a request exactly as
:meth:`Template.encode <xtml.template.Template.encode>` does and marks the
ids a model is trained on. What is trained comes from the template's
``[training]`` section (:class:`~xtml.chat.dialect.Training`), overridable
per call with ``train=``. The mask is computed from where each element's
tags fall in the ids, noted while the ids are made, so it lines up with them
by construction (:mod:`xtml.spans` gives the same offsets for any tree).

:class:`MapFunction` does the same for batches of rows, for Hugging Face
``datasets`` (``dataset.map(fn, batched=True, num_proc=N)``) and Ray Data
(``map_batches(fn)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any, NamedTuple

from ..chat.dialect import Dialect, Training
from ..chat.render import render
from ..chat.request import prepare
from ..errors import OptionError
from ..vocab.binding import IdSink, join_ids

if TYPE_CHECKING:
    from ..vocab.binding import Binding

__all__ = ["IGNORE_INDEX", "Overrun", "Span", "TrainingExample", "encode_example", "overruns"]


IGNORE_INDEX = -100
"""The label of an id that is not trained (what PyTorch's cross-entropy
ignores by default)."""

Train = Training | str | Iterable[int] | None
"""What ``train=`` accepts: ``None`` or ``"all"`` (the template's defaults),
``"last"`` (only the last turn), message indexes, or a :class:`Training`."""


class Span(NamedTuple):
    """Where a message, or one channel of it, lies in the ids. ``end`` is
    exclusive; a message span runs from its open tag to its end marker,
    inclusive; a channel span covers the channel's tags too."""

    message: int | None
    """Index in the request's ``messages``; None for a message the template
    writes itself (a tool declaration or an option message)."""
    role: str
    channel: str | None
    """The channel's element name (``think``, ``response``, ``tools``), or
    None for the message as a whole."""
    start: int
    end: int
    body_start: int
    """First id inside the element (after its open tag)."""
    body_end: int
    """First id of its close tag."""

    @property
    def body_tokens(self) -> int:
        """Ids inside the element, tags not counted."""
        return self.body_end - self.body_start


class TrainingExample:
    """What :func:`encode_training` returns."""

    __slots__ = ("_source", "_spans", "effort", "ids", "mask_bytes", "training")

    ids: list[int]
    mask_bytes: bytes
    """The loss mask, one byte (1 or 0) per id: compact, for writers."""
    effort: str | None
    """The thinking effort the request was rendered with; None when thinking
    is off."""
    training: Training
    """The rules the mask was made with."""
    _source: _SpanSource | None
    _spans: tuple[Span, ...] | None

    def __init__(self, ids: list[int], mask_bytes: bytes, effort: str | None, training: Training,
                 source: _SpanSource | None) -> None:
        init = object.__setattr__  # the instance is read-only once made
        init(self, "ids", ids)
        init(self, "mask_bytes", mask_bytes)
        init(self, "effort", effort)
        init(self, "training", training)
        init(self, "_source", source)
        init(self, "_spans", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a TrainingExample is read-only")

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with its spans made, so the copy needs no span source.
        return (_example, (self.ids, self.mask_bytes, self.effort, self.training, self.spans))

    @property
    def spans(self) -> tuple[Span, ...]:
        """Each message (``channel=None``) followed by its channels, in id
        order. The generation prompt, when rendered, is not a span. (Made
        on first use: writing a dataset needs only the ids and the mask.)"""
        spans: tuple[Span, ...] | None = self._spans
        if spans is None:
            source = self._source
            if source is None:  # another thread made them meanwhile
                assert self._spans is not None
                return self._spans
            spans = source.spans()
            object.__setattr__(self, "_spans", spans)
            object.__setattr__(self, "_source", None)
        return spans

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrainingExample):
            return NotImplemented
        return (self.ids, self.mask_bytes, self.effort, self.training, self.spans) == (
            other.ids, other.mask_bytes, other.effort, other.training, other.spans)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and the ids are a list

    def __repr__(self) -> str:
        return (f"TrainingExample(ids=<{len(self.ids)} ids>, trained={self.trained}, effort={self.effort!r}, "
                f"spans={len(self.spans)})")

    @property
    def mask(self) -> list[int]:
        """1 for each trained id, 0 for the rest; as long as :attr:`ids`."""
        return list(self.mask_bytes)

    @property
    def labels(self) -> list[int]:
        """The ids, with :data:`IGNORE_INDEX` where the mask is 0."""
        return [t if m else IGNORE_INDEX for t, m in zip(self.ids, self.mask_bytes)]

    @property
    def trained(self) -> int:
        """How many ids are trained."""
        return self.mask_bytes.count(1)

    def channels(self, name: str) -> list[Span]:
        """The spans of one channel (``think``, say), in order."""
        return [s for s in self.spans if s.channel == name]


@dataclass(frozen=True, slots=True)
class Overrun:
    """An assistant message whose think channel is longer than the budget of
    the sample's effort."""

    message: int
    effort: str
    tokens: int
    budget: int


def overruns(example: TrainingExample, dialect: Dialect) -> list[Overrun]:
    """The think channels of ``example`` over the budget its effort has in
    ``dialect.training.budgets`` (none without thinking or without a budget
    for the effort). Tokens are counted inside the channel, tags excluded."""
    if example.effort is None:
        return []
    budget = dialect.training.budgets.get(example.effort)
    if budget is None:
        return []
    think = dialect.channel_tag("reasoning")
    return [Overrun(s.message, example.effort, s.body_tokens, budget)
            for s in example.spans
            if think is not None and s.channel == think and s.message is not None and s.body_tokens > budget]


def encode_example(d: Dialect, binding: Binding, request: Any, *, train: Train = None,
                   options: Mapping[str, Any] | None = None) -> TrainingExample:
    """Ids (equal to the template's ``encode``), loss mask and spans of a
    request, for a dialect and its binding to a tokenizer.

    ``train`` picks the trained messages: ``None``/``"all"``, every message
    of the template's trained roles; ``"last"``, those after the last user
    message (the final turn, tool calls and results included); message
    indexes, exactly those (each must be of a trained role); a
    :class:`Training`, other rules for every message. Within a trained
    message the rules say which channels are trained (tags included), which
    elements never are, and whether the close tag and end marker are.
    Messages the template writes itself (tool declarations, options) and the
    generation prompt are never trained.
    """
    rules = train if isinstance(train, Training) else d.training
    o, msgs = prepare(d, request, options or {})
    if o.continue_final:
        # A training example is whole messages with the loss on what the
        # model wrote; a message left open has no end to learn.
        raise OptionError("continue_final_message leaves the last message open, which a training example cannot "
                          "be: train on the whole message instead", option="continue_final_message")
    sets = _SETS.get(id(rules))
    if sets is None or sets[0] is not rules or sets[1] is not d:
        if len(_SETS) >= 64:
            _SETS.clear()
        sets = _SETS[id(rules)] = (rules, d, frozenset(d.channels()), frozenset(rules.exclude))
    sink = _SpanSink(binding, sets[2], sets[3])
    render(d, o, msgs, sink)
    ids, off = sink.spans()
    tops = sink.tops
    # The tree is written in this order (xtml.chat.render): global option
    # messages, one element per message, one-shot option messages, the
    # generation prompt.
    first = int(bool(o.tools)) + int(o.thinking)
    n = len(msgs)
    if len(tops) < first + n:
        raise AssertionError("rendered tree does not match the request's messages")
    role_key = d.names["role"]
    roles = ["system" if m.tools is not None else m.role for m in msgs]
    chosen = _chosen(train, rules, [(m.index, r) for m, r in zip(msgs, roles)])
    trained_channels = rules.channels

    mask = bytearray(len(ids))
    for k, m in enumerate(msgs):
        top = tops[first + k]
        if _attr(top.attrs, role_key) != roles[k]:
            raise AssertionError(f"rendered message {first + k} is not message {m.index}")
        if m.index not in chosen:
            continue
        # Messages the template writes itself (first, and after the last
        # request message) are never trained.
        kids = top.kids
        body, body_end = off[top.body], off[top.close]
        if trained_channels and kids:
            for tag, c0, _, _, c3 in kids:
                if tag in trained_channels:
                    mask[off[c0]:off[c3]] = b"\x01" * (off[c3] - off[c0])
        else:
            mask[body:body_end] = b"\x01" * (body_end - body)
        for c0, c3 in top.excluded:
            mask[off[c0]:off[c3]] = bytes(off[c3] - off[c0])
        if rules.end:
            after = off[top.after]
            end = after + 1 if top.end == top.after else after
            mask[body_end:end] = b"\x01" * (end - body_end)
    return TrainingExample(ids, bytes(mask), o.effort if o.thinking else None, rules,
                           _SpanSource(tops, off, first, [m.index for m in msgs], role_key))


def _example(ids: list[int], mask_bytes: bytes, effort: str | None, training: Training,
             spans: tuple[Span, ...]) -> TrainingExample:
    """A TrainingExample back from a pickle."""
    ex = TrainingExample(ids, mask_bytes, effort, training, None)
    object.__setattr__(ex, "_spans", spans)
    return ex


class _SpanSource:
    """What :attr:`TrainingExample.spans` is made from, when asked."""

    __slots__ = ("first", "indexes", "off", "role_key", "tops")

    def __init__(self, tops: list[_Top], off: list[int], first: int, indexes: list[int], role_key: str) -> None:
        self.tops = tops
        self.off = off
        self.first = first
        self.indexes = indexes
        self.role_key = role_key

    def spans(self) -> tuple[Span, ...]:
        off, first, indexes = self.off, self.first, self.indexes
        out: list[Span] = []
        for t, top in enumerate(self.tops):
            if top.close < 0:
                continue  # the generation prompt
            k = t - first
            index = indexes[k] if 0 <= k < len(indexes) else None
            role = _attr(top.attrs, self.role_key) or ""
            after = off[top.after]
            end = after + 1 if top.end == top.after else after
            out.append(Span(index, role, None, off[top.start], end, off[top.body], off[top.close]))
            for tag, c0, c1, c2, c3 in top.kids:
                out.append(Span(index, role, tag, off[c0], off[c3], off[c1], off[c2]))
        return tuple(out)


# Per training rules (and their dialect): the element names the span sink
# looks for. Each entry holds the objects it was made for, so an id reused by
# another object is told apart.
_SETS: dict[int, tuple[Training, Dialect, frozenset[str], frozenset[str]]] = {}


def _attr(attrs: tuple[tuple[str, str], ...], key: str) -> str | None:
    for k, v in attrs:
        if k == key:
            return v
    return None


class _Top:
    """A top-level element as :class:`_SpanSink` records it: chunk indexes of
    its open tag, body, close tag and what follows; its channels and its
    excluded elements (chunk ranges)."""

    __slots__ = ("after", "attrs", "body", "close", "end", "excluded", "kids", "start")

    def __init__(self, attrs: tuple[tuple[str, str], ...], start: int) -> None:
        self.attrs = attrs
        self.start = start
        self.body = start + 1
        self.close = -1
        self.after = -1
        self.end = -2
        self.kids: list[tuple[str, int, int, int, int]] = []
        self.excluded: list[tuple[int, int]] = []


class _SpanSink(IdSink):
    """An :class:`~xtml.vocab.IdSink` (the same ids) that also notes
    where top-level elements, their channels and excluded elements lie,
    without building the tree; offsets are summed once the batch is encoded."""

    __slots__ = ("_channels", "_exclude", "_open_at", "tops")

    def __init__(self, binding: Any, channels: frozenset[str], exclude: frozenset[str]) -> None:
        super().__init__(binding)
        self._channels = channels
        self._exclude = exclude
        self._open_at: list[int] = []
        self.tops: list[_Top] = []

    # IdSink's methods are called by name, not through super(): these run for
    # every element of every sample.

    def open(self, tag: str, attrs: tuple[tuple[str, str], ...] = ()) -> None:
        at = len(self._chunks)
        if not self._tags:
            self.tops.append(_Top(attrs, at))
        self._open_at.append(at)
        IdSink.open(self, tag, attrs)

    def close(self) -> None:
        tag = self._tags[-1]
        close = len(self._chunks)
        IdSink.close(self)
        self._closed(tag, self._open_at.pop(), close, len(self._tags))

    def element(self, tag: str, attrs: tuple[tuple[str, str], ...], text: str, stable: bool = False) -> None:
        depth = len(self._tags)
        start = len(self._chunks)
        if not depth:
            self.tops.append(_Top(attrs, start))
        IdSink.element(self, tag, attrs, text, stable)
        if depth > 1 and tag not in self._exclude:
            return  # an argument, say: nothing to note
        self._closed(tag, start, len(self._chunks) - 1, depth)

    def _closed(self, tag: str, start: int, close: int, depth: int) -> None:
        top = self.tops[-1]
        if depth == 0:
            top.close, top.after = close, close + 1
            return
        if depth == 1 and tag in self._channels:
            top.kids.append((tag, start, start + 1, close, close + 1))
        if tag in self._exclude:
            top.excluded.append((start, close + 1))

    def end(self) -> None:
        if self.tops and not self._tags:
            self.tops[-1].end = len(self._chunks)
        IdSink.end(self)

    def spans(self) -> tuple[list[int], list[int]]:
        """The ids, and the id offset of each chunk (one more at the end)."""
        chunks = self._fill()
        return join_ids(chunks), list(accumulate(map(len, chunks), initial=0))


def _chosen(train: Train, rules: Training, msgs: list[tuple[int, str]]) -> set[int]:
    """Indexes of the messages to train."""
    trainable = [i for i, role in msgs if role in rules.roles]
    if train is None or isinstance(train, Training) or train == "all":
        return set(trainable)
    if train == "last":
        after = max((i for i, role in msgs if role == "user"), default=-1)
        return {i for i in trainable if i > after}
    if isinstance(train, str):
        raise OptionError(f"train must be 'all', 'last', message indexes or a Training, not {train!r}",
                          option="train")
    try:
        wanted = set(train)
    except TypeError:
        raise OptionError(f"train must be 'all', 'last', message indexes or a Training, not "
                          f"{type(train).__name__}", option="train") from None
    roles = dict(msgs)
    for i in sorted(wanted, key=lambda x: (type(x) is not int, str(x))):
        if type(i) is not int or i not in roles:
            raise OptionError(f"train names message {i!r}, which the request does not have", option="train")
        if roles[i] not in rules.roles:
            raise OptionError(f"train names message {i}, a {roles[i]} message; trained roles: "
                              f"{', '.join(rules.roles)}", option="train")
    return wanted
