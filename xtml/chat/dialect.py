"""A dialect: everything the chat layer knows of one model's chat format.

A dialect is read from a template file (:mod:`.template_file` reads and
checks it): marker strings, element and attribute names, roles, the
assistant's channels, thinking efforts, image settings and the prose of the
internal system messages. This module is the model alone; nothing here
reads a file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from ..errors import TemplateError
from ..markup.markers import Markers
from ..markup.parse import excerpt
from ..plugins.api import ContentExtension

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")

POSITIONS = ("global", "inline", "one-shot")

_K = TypeVar("_K")
_V = TypeVar("_V")


class ReadOnlyDict(dict[_K, _V]):
    """A dict no one can change: a dialect is shared by every caller of
    ``xtml.load`` in the process, so one caller's edit would be everyone's.
    Reads are a plain dict's (and so is its speed); make a changed copy with
    ``dict(d)``."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a dialect's tables are read-only (shared by every user of the template); "
                        "copy one with dict(...)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, tuple[dict[_K, _V]]]:
        # pickle would otherwise rebuild it item by item through __setitem__.
        return (type(self), (dict(self),))

    def __copy__(self) -> ReadOnlyDict[_K, _V]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ReadOnlyDict[_K, _V]:
        return self


def _frozen(obj: object, names: Iterable[str]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, ReadOnlyDict):
            object.__setattr__(obj, name, ReadOnlyDict(value))


@dataclass(frozen=True, slots=True)
class Body:
    """An internal message body with ``{name}`` placeholders."""

    source: str
    """The body as written in the file."""
    names: tuple[str, ...]
    """Placeholder names in order."""
    plain: str = ""
    """The rendered body, for a body without placeholders."""
    literals: tuple[str, ...] = ("",)
    """The text around the placeholders (one more than ``names``), braces
    unescaped."""

    @classmethod
    def compile(cls, source: str, where: str) -> Body:
        names: list[str] = []
        seen: set[str] = set()
        literals: list[str] = []
        piece: list[str] = []
        pos = 0
        for m in _PLACEHOLDER.finditer(source):
            piece.append(source[pos : m.start()])
            tok = m.group(0)
            if tok == "{{" or tok == "}}":
                piece.append(tok[0])
            else:
                name = m.group(1)
                if name in seen:
                    raise TemplateError(f"placeholder {{{excerpt(name)[1:-1]}}} is used twice", location=where)
                seen.add(name)
                names.append(name)
                literals.append("".join(piece))
                piece = []
            pos = m.end()
        rest = source[pos:]
        if "{" in rest.replace("{{", "") or "}" in rest.replace("}}", ""):
            raise TemplateError("a lone brace in a body; write {{ or }} for a literal one", location=where)
        piece.append(rest)
        literals.append("".join(piece))
        plain = _PLACEHOLDER.sub(lambda m: m.group(0)[0], source).strip()
        return cls(source, tuple(names), plain, tuple(literals))

    def _literals(self) -> tuple[str, ...]:
        lits = self.literals
        if len(lits) != len(self.names) + 1:  # made directly, not by compile()
            lits = Body.compile(self.source, "").literals
        return lits

    def pieces(self) -> tuple[str, ...]:
        """The literal text around the placeholders, in order: one more
        piece than :attr:`names` (the render is piece, value, piece ...)."""
        return self._literals()

    def render(self, **values: str) -> str:
        if not self.names:
            return self.plain
        lits = self._literals()
        out = [lits[0]]
        for name, lit in zip(self.names, lits[1:]):
            out.append(values[name])
            out.append(lit)
        return "".join(out).strip()

    def match(self, text: str) -> dict[str, str] | None:
        """The placeholders' values in a rendered body, or None."""
        got = self._match(text)
        if got is None and text != text.strip():
            # The rendered body was stripped: retry against the stripped form.
            got = self._match(text.strip())
        return got

    def _match(self, text: str) -> dict[str, str] | None:
        # What ``lit0(.*)lit1(.*)…litN`` (greedy, fully matched) captures,
        # without a regular expression: parsed text is model output, and
        # such a pattern can backtrack for time quadratic in it. Greedy
        # groups put each literal at its last possible place, found from
        # the right, one reverse search each.
        lits = self._literals()
        first, last = lits[0], lits[-1]
        if not self.names:
            return {} if text == first else None
        if len(text) < len(first) + len(last) or not text.startswith(first) or not text.endswith(last):
            return None
        starts = [len(text) - len(last)]
        for lit in reversed(lits[1:-1]):
            at = text.rfind(lit, len(first), starts[-1])
            if at < 0:
                return None
            starts.append(at)
        starts.reverse()
        values: dict[str, str] = {}
        pos = len(first)
        for name, lit, at in zip(self.names, lits[1:], starts):
            values[name] = text[pos:at]
            pos = at + len(lit)
        return values


@dataclass(frozen=True, slots=True)
class SystemMessage:
    """An internal system message: an option or a declaration, as prose."""

    key: str
    """The entry's name in the file."""
    type: str
    """The value of the ``type`` attribute."""
    position: str
    """``global`` (before the history), ``inline`` (in place of a message) or
    ``one-shot`` (after the history, before the generation prompt)."""
    body: Body


@dataclass(frozen=True, slots=True)
class Training:
    """Which parts of a rendered request a loss mask trains by default."""

    roles: tuple[str, ...] = ("assistant",)
    """Messages of these roles are trained."""
    channels: tuple[str, ...] = ()
    """Names of the channel elements of a trained message that are trained,
    tags included. Empty: the whole message body."""
    exclude: tuple[str, ...] = ()
    """Element names never trained, even inside a trained channel."""
    end: bool = True
    """Whether a trained message's end-of-message marker is trained."""
    budgets: dict[str, int] = field(default_factory=dict)
    """Token budget of the think channel per thinking effort."""

    def __post_init__(self) -> None:
        _frozen(self, ("budgets",))


HOLDS = ("reasoning", "content", "tool_calls")
"""What a channel may hold: the request fields ``reasoning_content``,
``content`` (with content parts) and ``tool_calls``. Each is held by exactly
one channel."""


@dataclass(frozen=True, slots=True)
class Channel:
    """One channel of an assistant message, as the template declares it."""

    key: str
    """Its key in ``[names]`` and ``[channels] order``."""
    tag: str
    """Its element name."""
    holds: str
    """One of :data:`HOLDS`: what the channel renders and reads back."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """Everything the chat layer needs to know about one model's format."""

    name: str
    description: str
    markers: Markers
    names: dict[str, str]
    roles: tuple[str, ...]
    role_aliases: dict[str, str]
    thinking_default: bool
    efforts: tuple[str, ...]
    default_effort: str
    thinking_off: tuple[str, ...]
    image_placeholder: str
    """Empty when the template has no images."""
    image_part_types: tuple[str, ...]
    image_prompt: re.Pattern[str]
    json_fallback_type: str
    system: dict[str, SystemMessage]
    path: str
    assistant_channels: tuple[Channel, ...]
    """The channels of an assistant message, in the order they are written."""
    prompt_channel: tuple[str, str] = ("response", "think")
    """Keys of the channel the generation prompt opens without and with
    thinking; empty: none."""
    plugins: dict[str, Any] = field(default_factory=dict)
    """Enabled plugins: name → the configuration the plugin made of its
    settings (for content plugins, their extension)."""
    part_owner: dict[str, ContentExtension] = field(default_factory=dict)
    """Content-part type → the extension that renders it."""
    element_owner: dict[str, ContentExtension] = field(default_factory=dict)
    """Element name inside a message body → the extension that reads it."""
    embed_readers: tuple[ContentExtension, ...] = ()
    """Extensions that read embeds back, in the file's order."""
    content: tuple[ContentExtension, ...] = ()
    """Every content extension, in the file's order."""
    grammar: str = ""
    """The reference grammar with the plugins' fragments."""
    training: Training = field(default_factory=lambda: Training())
    off_wins: bool = False
    """Whether a ``reasoning_effort`` in ``thinking_off`` turns thinking off
    even when ``thinking`` is true (else that contradiction is an error)."""

    def __post_init__(self) -> None:
        _frozen(self, ("names", "role_aliases", "system", "plugins", "part_owner", "element_owner"))

    def n(self, key: str) -> str:
        """An element or attribute name by its role (``message``, ``role`` ...)."""
        return self.names[key]

    @property
    def channel_order(self) -> tuple[str, ...]:
        """Keys (in ``names``) of the assistant channels, in writing order."""
        return tuple(ch.key for ch in self.assistant_channels)

    def channels(self) -> tuple[str, ...]:
        """Element names of the assistant channels, in writing order."""
        return tuple(ch.tag for ch in self.assistant_channels)

    def channel_tag(self, holds: str) -> str | None:
        """The element name of the channel holding ``holds`` (one of
        :data:`HOLDS`), or None if no channel does."""
        for ch in self.assistant_channels:
            if ch.holds == holds:
                return ch.tag
        return None

    def prompt_tag(self, thinking: bool) -> str:
        """The element name the generation prompt opens, or ``""``."""
        key = self.prompt_channel[thinking]
        return self.names[key] if key else ""
