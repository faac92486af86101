"""The plugin API: everything a plugin, built-in or third-party, may use.

The chat layer calls plugins only through what is declared here, and hands
them only the views declared here: a content extension renders parts into a
:class:`~xtml.markup.sink.MarkupSink` and reads elements back with a
:class:`Context`; a channel extension renders an assistant message's channel
from a :class:`MessageView` through a :class:`RenderView`, and reads its
element back through a :class:`ReadView`. Call ids and the JSON spelling of
argument values are conventions both sides share, so they live here too.
The built-in channels, image, audio and video plugins use nothing else (the
test of this API: each of them could live in a package of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..markup.header import int_value, number_value
from . import jsonfmt

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..markup.nodes import Element
    from ..markup.sink import MarkupSink

__all__ = [
    "ATTRIBUTE_TYPES",
    "CallView",
    "ChannelExtension",
    "ContentExtension",
    "Context",
    "MessageView",
    "Plugin",
    "ReadView",
    "RenderView",
    "arguments_json",
    "call_id",
    "check_attributes",
    "jsonfmt",
]


def call_id(pos: int, k: int) -> str:
    """The id the normal form gives call ``k`` (1-based) of the assistant
    message at position ``pos``: ids are not in the tokens, so they are made
    up the same way on both sides."""
    return f"call_{pos}_{k}"


@runtime_checkable
class Plugin(Protocol):
    """What a template's ``[plugins.NAME]`` table is handed to."""

    name: str

    def configure(self, settings: Mapping[str, Any], where: str) -> Any:
        """The checked configuration for ``settings``."""


class Context:
    """Per-request state, for one render, normal form or parse."""

    __slots__ = ("options", "problem", "state")

    def __init__(self, options: Any = None, problem: Callable[[str, str], None] | None = None) -> None:
        self.options = options
        """The resolved request options (render and normal form), or None (parse)."""
        self.state: dict[str, Any] = {}
        """Plugin-owned state, keyed by plugin name."""
        self.problem = problem or _raise
        """Report a problem found while reading: ``problem(message, kind)``.
        Strict parses raise, lenient ones record a diagnostic."""

    def of(self, name: str) -> Any:
        """The state of plugin ``name`` (a dict made on first use)."""
        st = self.state.get(name)
        if st is None:
            st = self.state[name] = {}
        return st


def _raise(message: str, kind: str) -> None:
    raise ValueError(message)


ATTRIBUTE_TYPES: dict[type, str] = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def check_attributes(ext: ContentExtension, tag: str, attrs: tuple[tuple[str, str], ...]) -> str | None:
    """Why ``attrs`` do not fit what ``ext`` declares for ``tag``, or None."""
    spec = ext.attributes.get(tag)
    if spec is None:
        return None
    seen: set[str] = set()
    for k, v in attrs:
        typ = spec.get(k)
        if typ is None:
            return f"{tag!r} takes no attribute {k!r} (it takes {', '.join(spec) or 'none'})"
        if k in seen:
            return f"attribute {k!r} given twice"
        seen.add(k)
        if not _fits(v, typ):
            return f"attribute {k!r} of {tag!r} must be {ATTRIBUTE_TYPES.get(typ, typ.__name__)}, not {v!r}"
    return None


def _fits(v: str, typ: type) -> bool:
    if typ is str:
        return True
    if typ is bool:
        return v in ("true", "false")
    if typ is int:
        return int_value(v) is not None
    if typ is float:
        return number_value(v) is not None
    try:
        typ(v)
    except ValueError:
        return False
    return True


class ContentExtension:
    """What a content plugin's ``configure`` returns. Override what applies;
    the defaults own nothing."""

    name: str = ""
    part_types: tuple[str, ...] = ()
    """Content-part ``type`` values this extension renders (the first is
    the type parse gives back)."""
    elements: tuple[str, ...] = ()
    """Element names it owns inside a message body."""
    attributes: Mapping[str, Mapping[str, type]] = {}
    """For each owned element, the attributes it may carry and the type of
    each value (``str``, ``int``, ``float`` or ``bool``). Checked when the
    plugin renders one and before :meth:`read_element` sees one; numbers
    are JSON's number syntax in ASCII digits (spec.md §3.2), so ``int(v)``
    and ``float(v)`` of a checked value are finite and what was written."""
    embeds: bool = False
    """Whether it reads embeds back (see :meth:`read_embed`)."""
    markers: tuple[str, ...] = ()
    """Strings it writes as markers (a pad, a placeholder): each must be one
    of the template's markers, so a tokenizer gives it one special id."""
    grammar: str | None = None
    """A Lark fragment added to the reference grammar (``%extend`` a rule or
    terminal of ``grammar/xtml.lark``); the combined grammar must build as a
    strict LALR parser."""

    def prepare(self, part: Mapping[str, Any]) -> Any:
        """Check an input part and resolve what rendering needs; raise
        ValueError with a message for a bad part."""
        return dict(part)

    def render(self, value: Any, out: MarkupSink, ctx: Context) -> None:
        """Emit the markup of one prepared part."""
        raise NotImplementedError(f"plugin {self.name!r} renders no parts")

    def normal(self, value: Any, ctx: Context) -> dict[str, Any]:
        """The part as parse will give it back."""
        return {"type": self.part_types[0]} if self.part_types else {}

    def read_element(self, el: Element, ctx: Context) -> dict[str, Any] | None:
        """The part an owned element stands for (raise ValueError if malformed)."""
        return None

    def read_embed(self, raw: str, ctx: Context) -> dict[str, Any] | None:
        """The part an embed stands for, or None if it is not this plugin's."""
        return None

    def finish_render(self, ctx: Context) -> None:
        """After a request is rendered: check what spans parts (counts)."""

    def finish_normal(self, request: dict[str, Any], ctx: Context) -> None:
        """After the normal form is built: request-level rewrites."""

    def finish_parse(self, request: dict[str, Any], ctx: Context) -> None:
        """After a parse: request-level results (an option, say)."""

    def strategy(self) -> SearchStrategy[dict[str, Any]] | None:
        """Hypothesis strategy for parts this extension renders."""
        return None

    def completion_grammar(self, names: Mapping[str, str]) -> str | None:
        """The grammar of the elements a model may write with this plugin
        inside a response channel, for constrained decoding (see
        :func:`xtml.codec.completion.completion_grammar`); None (the default):
        the exported grammar admits none of them.

        Rules ``name: expression`` in the subset of Lark every export shares:
        string literals (JSON escapes), rule names, grouping, ``|``, ``?``,
        ``*``, ``+``. ``names`` gives the rules to use: ``start``, the rule to
        define (one alternative per element); ``open``, ``close``, ``sep``,
        the markers; ``text``, body text (maybe empty, never a marker);
        ``value`` and ``nonempty_value``, an attribute value as the markup
        escapes it. Other lowercase names are the fragment's own rules."""
        return None


# -- channels ------------------------------------------------------------------------


class CallView(Protocol):
    """One tool call of an assistant message, as the chat layer resolved it."""

    @property
    def name(self) -> str: ...

    @property
    def args(self) -> Sequence[tuple[str, Any]] | None:
        """Typed arguments in order, or None when they are not a JSON object
        (then :attr:`raw` holds them)."""

    @property
    def raw(self) -> str | None: ...


class MessageView(Protocol):
    """An assistant message as a channel renders it."""

    @property
    def index(self) -> int:
        """Its index in the request's ``messages``."""

    @property
    def parts(self) -> list[Any]:
        """Content: strings and plugin parts, for :meth:`RenderView.body`."""

    @property
    def reasoning(self) -> str: ...

    @property
    def calls(self) -> Sequence[CallView]: ...


class RenderView(Protocol):
    """What a channel renders with."""

    @property
    def names(self) -> Mapping[str, str]:
        """The template's ``[names]``: element and attribute names."""

    @property
    def thinking(self) -> bool:
        """Whether the request renders thinking."""

    @property
    def json_fallback_type(self) -> str:
        """The ``type`` attribute of a json block."""

    @property
    def sink(self) -> MarkupSink: ...

    def body(self, parts: list[Any]) -> None:
        """Render text and plugin parts, in order, into the sink."""

    def content(self, parts: list[Any]) -> str | list[dict[str, Any]]:
        """Parts in normal form."""


class ReadView(Protocol):
    """What a channel reads its element back with."""

    @property
    def names(self) -> Mapping[str, str]: ...

    @property
    def lenient(self) -> bool: ...

    def problem(self, el: Element | None, msg: str, kind: str, path: str = "") -> None:
        """Report a problem: strict parses raise, lenient ones record it."""

    def attrs(self, el: Element, allowed: frozenset[str], path: str) -> dict[str, str]:
        """The element's attributes, reporting unknown and repeated ones."""

    def text(self, el: Element, path: str) -> str:
        """Body text of an element that may hold only text."""

    def content(self, el: Element, path: str) -> str | list[dict[str, Any]]:
        """Text and plugin parts, in normal form."""


class ChannelExtension:
    """One channel of an assistant message (what a channel plugin's
    ``configure`` returns)."""

    name = ""
    """The channel's key in ``[names]`` and ``[channels] order``."""
    field_order = 0
    """Where its fields go in a message dict (content, reasoning, calls)."""

    def render(self, m: MessageView, s: RenderView) -> None:
        """Emit the channel for message ``m`` (or nothing)."""
        raise NotImplementedError

    def normal(self, m: MessageView, pos: int, s: RenderView, out: dict[str, Any]) -> None:
        """Add what the channel means to ``out``, the message's normal form
        (``pos``: the message's position among the request's messages)."""
        raise NotImplementedError

    def read(self, el: Element | None, msg: dict[str, Any], r: ReadView, pos: int, path: str) -> None:
        """Read the channel's element (None when absent) into ``msg``."""
        raise NotImplementedError


def arguments_json(c: CallView) -> str:
    """A call's ``arguments`` string, as parse gives it back."""
    if c.args is None:
        return c.raw or ""
    return jsonfmt.arguments(dict(c.args))
