"""Layout dialects: chat formats that are not XTML-shaped, described as data.

An XTML dialect renames the parts of one fixed grammar. A layout dialect
instead lays each message out in a *frame* (``<|im_start|>{role}\\n`` …
``<|im_end|>\\n``), with patterns of literal text, tokens and slots
(:mod:`.layout_pattern`), and says what the format does with what it cannot
write: a declared *drop* (reported on render, never silent) or a declared
*refusal* (a located error where the model's own template raises). Render
(:mod:`.layout_render`, over the request as :mod:`.layout_request` reads it),
the normal form, the parse of a whole prompt and the parse of a completion
(:mod:`.layout_parse`) all read the same compiled patterns.

The chat layer knows no ids: render gives pieces of text and tokens; a parse
reads a lexed string, where each token of the dialect stands as one
character (:func:`~.layout_pattern.token_char`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .layout_pattern import Pattern, token_char, token_finder

__all__ = ["DROP", "EACH", "HISTORY", "REFUSE", "STOP_MEANINGS", "SYSTEM", "LayoutDialect", "RoleFrame",
           "RoleLayout"]


@dataclass(frozen=True, slots=True)
class RoleFrame:
    """A role's own frame: ``group`` messages in a row share one frame."""

    open: Pattern
    close: Pattern
    group: bool


@dataclass(frozen=True, slots=True)
class RoleLayout:
    """How messages of one role are written."""

    name: str
    text: str
    """The role text the frame writes (and reads back)."""
    body: Pattern
    """The frame's body; slots: ``content``."""


STOP_MEANINGS = ("end", "tool_calls", "message_end", "tool_wait")
"""What a stop token means: the answer is done (``end``), the model calls
tools (``tool_calls``), one message of a turn ended and the turn may go on
(``message_end``), the model waits for tool results (``tool_wait``)."""

DROP = "drop"
REFUSE = "refuse"
SYSTEM = "system"
EACH = "each"
HISTORY = "history"


@dataclass(frozen=True, slots=True)
class LayoutDialect:
    """Everything render and parse need to know about a layout format.

    It answers the questions the serving layer asks of any dialect
    (:attr:`efforts`, :attr:`thinking_off`, :meth:`channel_tag`), so one
    gateway serves both kinds."""

    name: str
    description: str
    path: str
    reference: Mapping[str, str]
    """What the layout mirrors: ``template`` (where the official chat
    template is) and ``sha256`` (of its text)."""
    special: tuple[str, ...]
    """Tokens that must be one special id each: never produced by text."""
    added: tuple[str, ...]
    """Tokens that are one id each, special or not."""
    stops: Mapping[str, str]
    """Stop token → its meaning (:data:`STOP_MEANINGS`)."""
    roles: Mapping[str, RoleLayout]
    frame_open: Pattern
    """Slot ``role``: the role text."""
    frame_close: Pattern
    prompt: Pattern
    """The generation prompt."""
    default_system: str | None
    """The system message written first when the request's first message is
    not a system message."""
    content_parts: str
    """``refuse`` (the template concatenates content as a string: a list of
    parts raises) or ``join`` (the text parts joined)."""
    content_missing: str
    """``refuse`` (a message without content raises in the template) or
    ``empty``."""
    calls: str
    """What the template does with an assistant's tool calls: ``drop``."""
    tools: str
    """What it does with declared tools: ``drop``."""
    reasoning: str
    """What it does with reasoning in history: ``drop``."""
    options: Mapping[str, bool] = field(default_factory=dict)
    """Boolean options the patterns read, with their defaults."""
    missing_by_role: Mapping[str, str] = field(default_factory=dict)
    """Roles whose missing content is treated otherwise (a template that
    prints a tool result's content, where an absent one prints nothing)."""
    role_frames: Mapping[str, RoleFrame] = field(default_factory=dict)
    """Roles whose frame is not ``[frame]``'s."""
    tools_each: Pattern | None = None
    """With ``tools = "system"``: one tool (slot ``tool``: its JSON as
    transformers' ``tojson`` writes it)."""
    tools_block: Pattern | None = None
    """The declaration (slot ``tools``: every tool's ``tools_each``)."""
    system_with_tools: Pattern | None = None
    """The system turn when tools are declared (slots ``system``, ``tools``;
    condition ``has_system``): the first system message is written in it."""
    reasoning_show: str = "never"
    """With ``reasoning = "history"``: which assistant messages show their
    reasoning: ``after_last_query`` (after the last user message that is a
    query, not tool results)."""
    query_excludes: tuple[str, str] | None = None
    """A user message that starts and ends with these is not a query."""
    reasoning_last: bool = False
    """The last message shows its reasoning block even when empty."""
    reasoning_split: tuple[str, str] | None = None
    """Reasoning taken out of content (between these, before the second)
    when the message gives none."""
    calls_each: Pattern | None = None
    """With ``calls = "each"``: one call (slots ``name``, ``arguments``;
    conditions ``first``, ``has_content``)."""
    parseable: bool = True
    """Whether the format reads back by its frame patterns alone (each is
    :meth:`Pattern.parseable` and it has no tools, calls, reasoning policy
    or role frames); else the reader of such formats reads it."""

    # What the serving layer reads of a dialect.
    thinking_default: bool = False
    efforts: tuple[str, ...] = ()
    default_effort: str = ""
    thinking_off: tuple[str, ...] = ()

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.special + self.added

    def channel_tag(self, holds: str) -> str | None:
        """The stream's channel name for what a channel holds."""
        return _CHANNELS.get(holds)

    def chars(self) -> dict[str, str]:
        return {t: token_char(k) for k, t in enumerate(self.tokens)}

    def finder(self) -> re.Pattern[str]:
        """Finds the dialect's tokens in text, longest first."""
        f = token_finder(self.tokens)
        assert f is not None  # a dialect has its frame's tokens
        return f


_CHANNELS = {"reasoning": "think", "content": "response", "tool_calls": "tools"}
