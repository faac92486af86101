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
from types import MappingProxyType

from ..lru import Lru
from .layout_pattern import Pattern, token_char, token_finder
from .layout_split import SplitLayout
from .layout_turn import TextOption, TurnLayout

__all__ = ["DROP", "EACH", "HISTORY", "LAST_USER", "MESSAGE_CONDS", "REFUSE", "STOP_MEANINGS", "SYNTAX", "SYSTEM",
           "TURN", "LayoutDialect", "RoleFrame", "RoleLayout",
           "fold_kind", "system_turn_kind"]


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

MESSAGE_CONDS = ("after_user", "after_tool", "has_calls")
"""What a message's frame and body may ask of it: whether the message before
it (system messages aside) is a user message or a tool result, whether it
has calls. The prompt may ask ``after_user`` of the last message."""

DROP = "drop"
REFUSE = "refuse"
SYSTEM = "system"
TURN = "turn"
EACH = "each"
HISTORY = "history"
LAST_USER = "last_user"
"""``[tools] render``: declared before the last user message, and before
each user message equal to it (as the official template compares them)."""
SYNTAX = "syntax"
"""``[tools] render``: declared by a value syntax in the system turn;
``[calls] arguments``: written by a value syntax."""


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
    query, not tool results) or ``after_last_answer`` (after the last
    assistant message without calls) or ``after_last_user`` (after the last
    user message, every one when there is none)."""
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
    role_names: bool = False
    """A message's name, when it has one, is written as its role text (and
    read back from it); else a name is dropped."""
    tools_turn: Pattern | None = None
    """With ``tools = "turn"``: the declaration's own turn, written first
    (slot ``tools``: the list as transformers' ``tojson`` writes it)."""
    calls_section: Pattern | None = None
    """The section an assistant's calls are written in (slot ``calls``),
    when it has calls."""
    call_ids: str = "absent"
    """How a call's id (slot ``id`` of :attr:`calls_each`) is written:
    ``absent``, ``given`` (as the request gives it, empty when it gives
    none) or ``generated`` (by :attr:`call_id`)."""
    call_id: Pattern | None = None
    """The spelling of a generated id (slots ``name``, ``index``: the call's
    index in its message); a format that writes no name reads it back out
    of an id of this spelling."""
    arguments: str = "as_given"
    """``as_given`` (a string as it is, an object as ``tojson``) or
    ``tojson`` (either through ``tojson``: a string is quoted)."""
    parts_by_role: Mapping[str, str] = field(default_factory=dict)
    """Roles (and ``with_calls``: an assistant's content beside its calls)
    whose content parts are treated otherwise than :attr:`content_parts`
    (``keep``: the body writes the list itself)."""
    image: Pattern | None = None
    """How an image part is written where parts are joined (``None``: an
    image part is refused)."""
    reasoning_block: tuple[str, str] | None = None
    """The reasoning block's opening and closing, around the reasoning as
    written (no newline trimmed), on every assistant message."""
    system_hoist: Pattern | None = None
    """Where every system message is written, joined by
    :attr:`system_join`, before all the others (slot ``system``): at the
    start of the text. None: each in its place."""
    system_join: str = "\n\n"
    flags: tuple[str, ...] = ()
    """Boolean message fields the patterns read as conditions (``prefix``)."""
    message_conds: bool = False
    """Whether frames, bodies or the prompt read the message conditions
    (:data:`MESSAGE_CONDS` and :attr:`flags`)."""
    content_cut: tuple[str, str] | None = None
    """An assistant's content written only after the first occurrence of the
    first string, unless the condition (the second) holds."""
    reasoning_opened: tuple[str, str] | None = None
    """The reasoning block a generation prompt may open (its two tokens): in
    an answer, text before the closing token is reasoning."""
    option_aliases: Mapping[str, str] = field(default_factory=dict)
    """Option → another name it is read under when not given itself."""
    header_turns: TurnLayout | None = None
    """A format with a head, a system turn of its own and one call per turn
    (:mod:`.layout_turn`); render and parse are then :mod:`.layout_turns`'."""
    role_aliases: Mapping[str, str] = field(default_factory=dict)
    """Roles read as another (``ipython`` as ``tool``)."""
    head: Pattern | None = None
    """Written first, before the declarations and the messages."""
    tools_turn_each: Pattern | None = None
    """With :attr:`tools_turn`: one tool (slot ``tool``: its JSON), the turn's
    ``tools`` slot every tool so written; None: the list's JSON."""
    content_suffix: tuple[str, str, str] | None = None
    """(role, text, condition): the text added to the content of the role's
    messages where the condition holds, unless it already ends with it."""
    call_pair: Pattern | None = None
    """With ``arguments = "pairs"``: one argument (slots ``key``, ``value``:
    a string as it is, anything else as ``tojson`` writes it)."""
    render_only: tuple[str, ...] = ()
    """What the format writes that no reader reads yet: parse, the stream,
    the grammar and the exports refuse the dialect, naming these."""
    parseable: bool = True
    """Whether the format reads back by its frame patterns alone (each is
    :meth:`Pattern.parseable` and it has no tools, calls, reasoning policy
    or role frames); else the reader of such formats reads it."""

    # What the serving layer reads of a dialect.
    thinking_default: bool = False
    efforts: tuple[str, ...] = ()
    default_effort: str = ""
    thinking_off: tuple[str, ...] = ()

    system_turn: Pattern | None = None
    """The system turn, always written after :attr:`head` (slots ``system``,
    the first system message's content, which it then holds, and each of
    :attr:`text_options`; conditions ``has_system``, ``has_tools``: tools
    given, even none)."""
    text_options: Mapping[str, TextOption] = field(default_factory=dict)
    """Options that are text (a format without ``[turns]``): a default, or
    the day of the render as ``clock`` spells it."""
    first_only: tuple[str, ...] = ()
    """Roles written only as the first message; a later one is refused."""
    tools_pair: Pattern | None = None
    """With ``tools = "last_user"``: one key of a tool's ``function`` (slots
    ``key``, ``value``: a string as it is, anything else as ``tojson``;
    conditions ``first``, ``last``, ``string``), the ``tool`` slot of
    :attr:`tools_each` every key so written."""
    tools_skip: tuple[str, ...] = ()
    """Keys of a tool's ``function`` :attr:`tools_pair` does not write."""
    id_tail: int = 0
    """Call ids and tool results' ``tool_call_id`` written as their last so
    many characters; a shorter or absent one refused (0: as given)."""
    calls_content: str = "keep"
    """``drop``: an assistant's content beside its calls is not written."""
    system_roles: tuple[str, ...] = ("system",)
    """Roles a first message may have for :attr:`system_turn` to hold it as
    the system message (a first ``developer`` message read as one)."""
    tools_syntax: str = ""
    """With ``tools = "syntax"``: the value syntax (an ``xtml.value_syntaxes``
    entry point) whose declaration of the tools :attr:`system_turn`'s
    ``tools`` slot writes."""
    tools_keywords: tuple[str, ...] = ()
    """The keywords of a parameter's schema that declaration writes: any
    other is reported as a drop of ``tools``."""
    calls_syntax: str = ""
    """With ``arguments = "syntax"``: the value syntax that writes arguments
    given as an object (a string is written as given)."""
    call_result: Pattern | None = None
    """Tool results folded into the calling turn (:mod:`.layout_fold`): each
    result of a run right after the calls (slots ``name``: the called
    function's, ``content``)."""
    calls_pending: Pattern | None = None
    """Written in place of the close of a turn whose calls have no results."""
    results_open: bool = False
    """A turn with results and no content is left open (not closed)."""
    continues: tuple[str, ...] = ()
    """Roles whose message after another of the same role (tool results
    aside) continues that turn: no open is written."""
    content_trim: tuple[str, ...] = ()
    """Roles whose text is trimmed, each part before the parts are joined."""
    content_strip: tuple[str, str] | None = None
    """An assistant's text (each part) split at each second string, each
    piece cut at its first first string, then joined."""
    reasoning_keys: tuple[str, ...] = ()
    """Where results are folded: the reasoning fields in the order the
    template reads them, the first holding text written (empty: as
    transformers aliases them)."""
    split: SplitLayout | None = None
    """A format that writes one request message as several of its own
    (:mod:`.layout_split`); render is then :mod:`.layout_split_render`'s."""

    @property
    def turns(self) -> bool:
        """Whether each message is a turn of its own that a token opens (no
        frame shared by a run of messages): read by the turn reader."""
        return self.tools == TURN or (bool(self.role_frames)
                                      and not any(f.group for f in self.role_frames.values()))

    @property
    def open_turns(self) -> bool:
        """Whether every role has a frame of its own that no marker closes
        (the token that opens the next turn ends it) and calls write their
        arguments as pairs: read by :mod:`.layout_open`."""
        return (self.call_pair is not None and not self.frame_close.items and set(self.role_frames) >= set(self.roles)
                and not any(f.close.items for f in self.role_frames.values()))

    @property
    def system_turns(self) -> bool:
        """Whether the format writes a system turn of its own, each message in
        a frame of its role, the tools before the last user message and calls
        as one JSON array in a section (the roles written only first aside, in
        the system turn): read by :mod:`.layout_system_turn`."""
        return system_turn_kind(self.system_turn is not None, self.tools, self.calls, self.calls_section is not None,
                                self.arguments,
                                set(self.role_frames) >= set(self.roles) - set(self.first_only),
                                bool(self.tools_syntax or self.calls_syntax or self.call_result is not None
                                     or self.continues or self.content_trim or self.content_strip is not None
                                     or self.split is not None or self.header_turns is not None
                                     or self.call_pair is not None))

    @property
    def folded_turns(self) -> bool:
        """Whether the format folds tool results into the calling turn, writes
        calls one by one with arguments by a value syntax and tools (if any)
        by a value syntax in a system turn of its own: read by
        :mod:`.layout_fold_read` and :mod:`.layout_fold_answer`."""
        return fold_kind(self.call_result is not None, self.calls, self.arguments, self.tools,
                         self.system_turn is not None, self.calls_section is not None,
                         bool(self.split is not None or self.header_turns is not None or self.call_pair is not None
                              or self.role_frames or self.text_options or self.first_only or self.id_tail
                              or self.system_hoist is not None or self.call_ids != "absent"))

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.special + self.added

    def channel_tag(self, holds: str) -> str | None:
        """The stream's channel name for what a channel holds."""
        return _CHANNELS.get(holds)

    def chars(self) -> Mapping[str, str]:
        """Each token of the dialect as the one character the readers' text
        holds for it (made once a dialect: readers ask per message)."""
        hit = _CHARS.get(id(self))
        if hit is not None and hit[0] is self:
            return hit[1]
        made = MappingProxyType({t: token_char(k) for k, t in enumerate(self.tokens)})
        return _CHARS.put(id(self), (self, made))[1]

    def finder(self) -> re.Pattern[str]:
        """Finds the dialect's tokens in text, longest first."""
        f = token_finder(self.tokens)
        assert f is not None  # a dialect has its frame's tokens
        return f


def system_turn_kind(system_turn: bool, tools: str, calls: str, section: bool, arguments: str, framed: bool,
                     other: bool) -> bool:
    """The kind :attr:`LayoutDialect.system_turns` names, from what the
    dialect file gives (``other``: any feature that kind's reader does not
    read)."""
    return system_turn and tools == LAST_USER and calls == EACH and section and arguments == "tojson" and framed \
        and not other


def fold_kind(folded: bool, calls: str, arguments: str, tools: str, system_turn: bool, section: bool,
              other: bool) -> bool:
    """The kind :attr:`LayoutDialect.folded_turns` names, from what the
    dialect file gives (``other``: any feature that kind's reader does not
    read)."""
    return folded and calls == EACH and arguments == SYNTAX and tools in (SYNTAX, DROP) and system_turn \
        and not section and not other


_CHANNELS = {"reasoning": "think", "content": "response", "tool_calls": "tools"}
# What chars() made of a dialect, kept as layout_parse keeps what it makes.
_CHARS: Lru[int, tuple[LayoutDialect, Mapping[str, str]]] = Lru()
