"""An answer written as several messages (harmony's, :mod:`~xtml.chat.layout_split`)
in a layout dialect's completion grammar.

The messages are learnt as the answer's reader learns them
(:func:`~xtml.chat.layout_harmony.harmony`): the assistant's body gives the
message token, the channel token, the reasoning and final channels and the
closes; ``[calls] each`` gives a call's header as the template writes it.
The generation prompt writes the first message's start and author, so the
answer opens with a header; each later message opens with both.

The grammar writes what the template writes of an answer: reasoning
messages, each closed by the close after which the model goes on (maybe
none), then either the final message (text, or JSON under
``response_format``) closed by the close that ends the render, or one call
(the format writes one call a message, and the model waits for its result
after it): the template's header with a declared tool's name, the
arguments as a JSON object of its schema, the call's close. The other
headers the reader takes (a recipient after the channel, a constraint token
before the type, preambles) are not written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...chat.layout import LayoutDialect
from ...chat.layout_harmony import harmony
from ...chat.layout_pattern import Item, Lit, Slot, Tok
from ...errors import OptionError, ParseError, TokenizerError
from .schema import Tool

if TYPE_CHECKING:
    from .layout_plan import LayoutPlan

__all__ = ["Messages", "MessagesAnswer", "messages_pattern", "split_messages"]

# The reader takes a header's words between spaces: a recipient ends at one.
_WORDS = " "


@dataclass(frozen=True)
class Messages:
    """What an answer's messages are made of (tokens by their text)."""

    start: str
    """The token that opens a later message."""
    author: str
    """The assistant's author text after it."""
    channel: str
    message: str
    """The token between a header and its text."""
    reasoning: str
    """The reasoning channel's name."""
    final: str
    """The final channel's name."""
    message_close: str
    """The close after which the model goes on with another message."""
    end_close: str
    """The close of the answer's final message."""
    call: tuple[Item, ...]
    """A call after its author: literal text, tokens, the slots ``name``
    and ``arguments``, its close last."""
    name_end: str
    """What ends a recipient's name as the reader reads one (a token
    aside): a name holding it is not read back whole."""

    @property
    def tokens(self) -> tuple[str, ...]:
        used = [self.start, self.channel, self.message, self.message_close, self.end_close]
        return tuple(dict.fromkeys([*used, *(i.token for i in self.call if isinstance(i, Tok))]))


def _refused(d: LayoutDialect, why: str) -> OptionError:
    return OptionError(f"the completion grammar of the answers of the layout dialect {d.name!r} is not yet "
                       f"available ({why})", option="tool_choice")


def messages_pattern(d: LayoutDialect) -> Messages:
    """The messages of an answer of ``d``, as its reader reads them; a
    format whose answers the reader does not read, or whose generation
    prompt is not a message's start and author, or whose call is not that
    start and author then one header, raises :class:`~xtml.OptionError`."""
    try:
        h = harmony(d)
    except ParseError:
        raise _refused(d, "its reader does not read its messages") from None
    token = {c: t for t, c in d.chars().items()}
    opening = (Tok(token[h.start]), Lit(h.author))
    if _merged(d.prompt.items) != opening:
        raise _refused(d, "the generation prompt is not a message's start and author")
    each = _merged(d.calls_each.items if d.calls_each is not None else ())
    head = each[1] if len(each) > 1 else None
    if each[:1] != opening[:1] or not isinstance(head, Lit) or not head.text.startswith(h.author) or \
            len(head.text) == len(h.author) or each[-1] != Tok(token[h.call_close]) or \
            sorted(i.name for i in each if isinstance(i, Slot)) != ["arguments", "name"] or \
            any(not isinstance(i, Lit | Slot | Tok) for i in each):
        raise _refused(d, "a call is not a message of the assistant to its tool")
    call = (Lit(head.text[len(h.author):]), *each[2:])
    return Messages(token[h.start], h.author, token[h.channel], token[h.message], h.reasoning, h.final,
                    token[h.message_close], token[h.end_close], call, _WORDS)


def _merged(items: tuple[Item, ...]) -> tuple[Item, ...]:
    """A pattern's items with adjacent literal text as one."""
    out: list[Item] = []
    for i in items:
        if isinstance(i, Lit) and out and isinstance(out[-1], Lit):
            out[-1] = Lit(out[-1].text + i.text)
        elif not (isinstance(i, Lit) and not i.text):
            out.append(i)
    return tuple(out)


def split_messages(plan: LayoutPlan) -> None:
    """Turns the plan of a format that writes an answer as several messages
    into the plan of those messages: the reasoning is theirs, one call at
    most, each tool's name one the reader reads back whole."""
    m = messages_pattern(plan.d)
    spelled = [t for t in m.tokens if t in plan.text_tokens]
    if spelled:
        raise TokenizerError(f"this vocabulary writes {', '.join(spelled)} as text: the completion grammar of the "
                             f"messages of the layout dialect {plan.d.name!r} needs each as one id")
    tools: list[Tool] = []
    for t in plan.tools:
        if m.name_end in t.name:
            plan.notes.append(f"tool {t.name!r}: its name holds {m.name_end!r}, which ends a recipient in this "
                              "format, so the tool is left out")
        else:
            tools.append(t)
    if not tools and plan.calls == "yes":
        raise OptionError("no declared tool can be called with its schema", option="tool_choice")
    plan.tools = tools
    plan.calls = plan.calls if tools else "no"
    plan.messages = m
    plan.reasoning = None
    plan.call_open, plan.call_rest, plan.separator = "", m.call, ""
    plan.max_calls = 1


class MessagesAnswer:
    """The answer's messages, over a writer's tokens, literals, text, JSON
    and call rules."""

    if TYPE_CHECKING:  # the writer's own, which this is mixed into
        lp: Any

        def tok(self, t: str) -> str: ...
        def lit(self, s: str) -> str: ...
        def rule(self, name: str, body: str) -> None: ...
        def repeat(self, expr: str, most: int | None) -> str: ...
        def text_opt(self) -> str: ...
        def json_answer(self) -> str: ...
        def call_rules(self) -> None: ...

    def messages_answer(self) -> str:
        """The start rule's body: reasoning messages, each then the start
        and author of the next, then the final message or a call."""
        p = self.lp
        m: Messages = p.messages
        self.rule("reasoning", f"{self.tok(m.channel)} {self.lit(m.reasoning)} {self.tok(m.message)} "
                               f"{self.text_opt()} {self.tok(m.message_close)} {self.tok(m.start)} "
                               f"{self.lit(m.author)}")
        alts: list[str] = []
        if p.calls != "yes":
            content = self.json_answer() if p.response_schema is not None else self.text_opt()
            # xgrammar takes a stop token the grammar names and ends at any
            # of its stops where the grammar may end: every close is
            # written. llguidance and llama.cpp take the end-of-generation
            # token only where the grammar may end, never by reference: the
            # close that ends the answer is left to the engine there.
            close = self.tok(m.end_close) if p.format.startswith("xgrammar") else f"({self.tok(m.end_close)})?"
            alts.append(f"{self.tok(m.channel)} {self.lit(m.final)} {self.tok(m.message)} {content} {close}")
        if p.calls != "no":
            # Each call's rule ends with the call's close.
            self.call_rules()
            alts.append("call")
        ending = alts[0] if len(alts) == 1 else "((" + ") | (".join(alts) + "))"
        return f"{self.repeat('reasoning', None)} {ending}"
