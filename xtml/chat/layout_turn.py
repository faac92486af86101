"""What a layout dialect's ``[turns]`` section says (spec.md §12): formats
that open with a fixed head and always write a system turn of their own
(dates, the environment, the declared tools), place the tool declarations
in that turn or in the first user message as an option says, write one
call per assistant turn (as JSON, or as a built-in tool's call after its
own token), and read options that are text or lists of names.

The model only; :mod:`.layout_turns` renders, normalizes and parses with
it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .layout_pattern import Pattern

__all__ = ["KEEP", "STRING", "STRINGS", "TURNS", "CallTurn", "TextOption", "TurnLayout"]

STRING = "string"
STRINGS = "strings"
TURNS = "turns"
"""``[tools] render``: placed as ``[turns]`` says."""
KEEP = "keep"
"""``[content] parts`` of a role: the list kept as given, for a body that
writes it as JSON (``{content|tojson}``)."""


@dataclass(frozen=True, slots=True)
class TextOption:
    """An option that is text (``string``) or a list of names (``strings``),
    under the official template's keyword name. A ``strings`` option is a
    condition of the patterns (whether it was given) and a slot (the names
    joined by ``join``, but those in ``omit``, which the template leaves out
    of what it writes)."""

    name: str
    type: str
    default: str | None
    """A ``string``'s default; a ``strings`` option is absent unless given."""
    join: str = ", "
    omit: tuple[str, ...] = ()
    clock: str = ""
    """A ``string`` with no default: the day of the render, as ``strftime``
    spells it with this format (a template that reads the clock)."""


@dataclass(frozen=True, slots=True)
class CallTurn:
    """How an assistant turn with tool calls is written."""

    max: int
    """The most calls one message may hold (0: no bound); more is refused,
    as the template raises."""
    content: str
    """``drop``: the content beside the calls is not written (reported)."""
    arguments: str
    """``tojson``: arguments written as the template's ``tojson`` writes the
    value given (an object as JSON, a string as a quoted JSON string);
    ``text``: as JSON text."""
    builtin: Pattern | None = None
    """A call to one of the names in the ``builtin_when`` option (slots
    ``name``, ``arguments``: each argument as ``builtin_argument``, joined
    by ``builtin_separator``)."""
    builtin_when: str = ""
    builtin_argument: Pattern | None = None
    """One argument of a built-in call (slots ``key``, ``value``); its values
    must be strings."""
    builtin_separator: str = ", "
    close: Pattern | None = None
    """The close of a turn with calls, instead of the frame's."""


@dataclass(frozen=True, slots=True)
class TurnLayout:
    head: Pattern
    """Written first (a begin-of-text token)."""
    system: Pattern
    """The system turn, always written. Slots: ``system`` (the first system
    message's content), ``tools`` (``tools_system`` when tools are declared
    and not placed in the first user message), and each text option;
    conditions: ``has_tools``, ``has_system``, every bool option, and
    each ``strings`` option (given or not)."""
    tool: Pattern
    """One declared tool (slot ``tool``: its JSON as transformers' ``tojson``
    writes it, with ``tool_indent``), then literal text."""
    tool_indent: int | None
    tools_system: Pattern | None
    """The declaration in the system turn (slot ``tools``)."""
    tools_user: Pattern | None
    """The first user message holding the declaration (slots ``tools``,
    ``content``), written when the bool option ``tools_user_when`` holds:
    the first message after the system message, whatever its role; none is
    refused."""
    tools_user_when: str
    calls: CallTurn
    options: Mapping[str, TextOption] = field(default_factory=dict)
