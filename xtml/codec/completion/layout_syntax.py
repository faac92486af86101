"""Call arguments written by a value syntax (``[calls] arguments =
"syntax"``) in a layout dialect's completion grammar.

The grammar of the arguments is the value syntax's own: its ``grammar``
operation writes the rules of one tool's arguments (against the tool's
parameters schema) in the grammar syntax asked for, the format's tokens
referenced as the vocabulary binds them (Gemma 4's string quote ``<|"|>``
is one), and the writer places them as that tool's arguments. The core
names no value syntax: the dialect's ``[calls] syntax`` is loaded through
:func:`~xtml.plugins.values.load_value_syntax`. A syntax that writes no
grammar in the format asked for has the grammar refused by the format's
name (a located :class:`~xtml.OptionError` at ``format``) where the answer
may hold calls; without calls the format is written as for any dialect. A
tool whose schema the syntax's grammar cannot write, or whose name holds
the character its arguments open with (a parse reads the name up to it),
is left out with a note.

``[calls] each`` may write arguments given as a string apart
(``{?string}…{/}``): the grammar writes arguments as the syntax writes an
object (the ``{!string}`` branch), so the other branch is left out. Where
the dialect names no reasoning block of its own, the block is read from
the assistant's body (``{?…}<|channel>thought\n{reasoning}\n<channel|>{/}``:
its tokens and the label the model writes after the opening one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...chat.layout import LayoutDialect
from ...chat.layout_pattern import Cond, Item, Lit, Slot, Tok
from ...errors import OptionError, RequestError
from ...plugins.values import NoOperation, load_value_syntax
from .schema import Tool

__all__ = ["SYNTAXES", "body_block", "fragment_lines", "syntax_arguments", "syntax_call_items"]

SYNTAXES = {"llguidance": "llguidance", "gbnf": "gbnf", "xgrammar": "xgrammar", "xgrammar-tag": "xgrammar"}
"""The grammar syntax a value syntax is asked for, by completion format
(the structural tag holds xgrammar's EBNF)."""


def syntax_call_items(d: LayoutDialect) -> tuple[Item, ...]:
    """``[calls] each`` as a call with arguments given as an object writes
    it: the ``string`` condition's body where it is negated, nothing where
    it is not."""
    each = d.calls_each.items if d.calls_each is not None else ()
    out: list[Item] = []
    for item in each:
        if isinstance(item, Cond) and item.name == "string":
            if item.negate:
                out += item.body
            continue
        out.append(item)
    return tuple(out)


def body_block(d: LayoutDialect) -> tuple[str, str, str] | None:
    """The reasoning block as the assistant's body writes it inside a
    condition, where the dialect names no block of its own: its opening
    token, the label text before the reasoning, its closing token
    (``{?…}<|channel>thought\\n{reasoning}\\n<channel|>{/}``)."""
    body = d.roles["assistant"].body if "assistant" in d.roles else None
    for item in body.items if body is not None else ():
        if not isinstance(item, Cond) or item.negate:
            continue
        b = item.body
        at = next((k for k, x in enumerate(b) if x == Slot("reasoning")), -1)
        if at < 1 or not isinstance(b[0], Tok) or not isinstance(b[-1], Tok):
            continue
        between = b[1:at]
        after = b[at + 1:-1]
        if all(isinstance(x, Lit) for x in (*between, *after)):
            return b[0].token, "".join(x.text for x in between if isinstance(x, Lit)), b[-1].token
    return None


def syntax_arguments(d: LayoutDialect, fmt: str, tools: list[Tool], refs: Mapping[str, str], request: Any,
                     notes: list[str]) -> tuple[list[Tool], dict[str, str]]:
    """The tools whose arguments the value syntax writes a grammar of, and
    each one's rules (by tool name, the rule named ``args_t{index}`` of
    its index among the tools kept, ``args-t{index}`` in GBNF and EBNF), the format's tokens referenced as
    ``refs`` says (a token absent there is text). A tool whose schema the
    syntax cannot write is left out with a note; a format the syntax writes
    no grammar in is refused by name."""
    syntax = load_value_syntax(d.calls_syntax)
    given = request.get("tools") if isinstance(request, Mapping) else None
    positions = {t["function"].get("name"): k for k, t in enumerate(given if isinstance(given, list) else ())
                 if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)}
    kept: list[Tool] = []
    fragments: dict[str, str] = {}
    # A parse reads the name up to where the arguments open.
    opening = syntax.write({}, {})[:1] if "write" in syntax.operations else ""
    for t in tools:
        if opening and opening in t.name:
            notes.append(f"tool {t.name!r}: its name holds {opening!r}, where the arguments open in this format, "
                         "so the tool is left out")
            continue
        params = t.params if isinstance(t.params, Mapping) and t.params else {"type": "object"}
        try:
            # GBNF's rule names have no "_": the EBNF writers spell the reference args-tN.
            rule = f"args_t{len(kept)}" if fmt == "llguidance" else f"args-t{len(kept)}"
            text = syntax.grammar(params, SYNTAXES[fmt], rule, tokens=refs)
        except NoOperation as e:
            raise OptionError(f"the calls of the layout dialect {d.name!r} are written in the value syntax "
                              f"{d.calls_syntax!r}, which writes no {SYNTAXES[fmt]} grammar ({e.msg}): the {fmt} "
                              "grammar of an answer that may call a tool cannot be written (ask for another "
                              "format, or tool_choice none)", option="format") from None
        except RequestError as e:
            at = f"tools[{positions[t.name]}].function.{e.location}" if t.name in positions and e.location \
                else "tools"
            notes.append(f"tool {t.name!r}: the value syntax {d.calls_syntax!r} writes no grammar of its "
                         f"arguments ({e.msg}, at {at}), so the tool is left out")
            continue
        kept.append(t)
        fragments[t.name] = text
    return kept, fragments


def fragment_lines(text: str) -> list[str]:
    """A fragment's rule and terminal definitions, one line each."""
    return [line for line in text.splitlines() if line.strip()]
