"""A layout dialect's completion plan (:mod:`.layout_plan`) spelled in each
grammar syntax: llguidance's Lark, xgrammar's EBNF, GBNF and xgrammar's
structural tag.

The writers of the XTML engine spell text, literals and JSON values; these
classes reuse them (the JSON of a tool's arguments and of a JSON answer is
theirs, typed by :mod:`.schema`'s reading of the schema) and write the
answer's own structure: a reasoning block (optional, or on every answer
where the format writes one there), the content (text, or JSON under
``response_format``), the calls (in their section where the format has
one; an id the format generates spells the call's index, so the calls are
counted one rule each), then one of the stop tokens,
which may also be left to the engine (an engine whose end-of-generation
token is the stop token allows it only where the grammar may end).

A token the vocabulary lacks as one id is literal text here, and free text
(reasoning, content, JSON strings) spells none of those tokens: a parse
would read the spelling as the token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...chat.layout_pattern import Lit, Slot, Tok
from ...errors import TokenizerError
from .gbnf import _ENTITIES, _class_char, _Gbnf
from .layout_array import ArrayEbnf, ArrayLark
from .layout_messages import MessagesAnswer
from .layout_pairs import PairsEbnf, PairsLark
from .layout_plan import LayoutPlan
from .layout_syntax import fragment_lines
from .llguidance import _JSON_STRING, _Lark
from .plan import deep_schemas_refused
from .schema import Tool
from .xgrammar import _Ebnf

__all__ = ["write"]


def write(plan: LayoutPlan) -> str:
    """The plan as grammar text in its format."""
    with deep_schemas_refused():
        if plan.format == "llguidance":
            return _LayoutLark(plan).layout_write()
        if plan.format == "gbnf":
            return _LayoutGbnf(plan).layout_write()
        if plan.format == "xgrammar":
            return _LayoutEbnf(plan).layout_write()
        return _tag(plan)


def _object_schema(params: Any) -> Any:
    return params if isinstance(params, Mapping) and params else {"type": "object"}


class _Layout:
    """The structure of an answer, over a writer's rules, literals and text.
    Mixed into a writer of the XTML engine, whose JSON it uses."""

    layout_load: ClassVar[tuple[str, ...]] = ()
    """Header lines: how to load the grammar, what the syntax cannot express."""

    if TYPE_CHECKING:  # the writer's own, which this is mixed into
        p: Any
        rules: list[str]
        notes: list[str]
        defined: set[str]
        comment: ClassVar[str]
        syntax: ClassVar[str]
        start: ClassVar[str]
        preamble: ClassVar[str]

        def lit(self, s: str) -> str: ...
        def rule(self, name: str, body: str) -> None: ...
        def text_opt(self) -> str: ...
        def spell(self, name: str, body: str) -> str: ...
        def finish(self) -> list[str]: ...
        def json_answer(self) -> str: ...
        def object_value(self, schema: Any) -> str: ...
        def pairs(self, i: int, t: Tool, close: str) -> str: ...
        def array_rest(self) -> str: ...
        def messages_answer(self) -> str: ...

    lp: LayoutPlan

    def setup(self, plan: LayoutPlan) -> None:
        # What the XTML writers' own __init__ sets, for their JSON methods.
        self.p = self.lp = plan
        self.n: dict[str, str] = {}
        self.holds: dict[str, str] = {}
        self.rules = []
        self.defined = set()
        self.notes = list(plan.notes)
        self.calls_ref = ""
        self.elements_ref = ""

    def tok(self, t: str) -> str:
        """A token: by reference where the vocabulary has it as one id, else
        its text."""
        if t in self.lp.unnamed:
            raise TokenizerError(self.lp.unnamed[t])
        ref = self.lp.refs.get(t)
        return ref if ref is not None else self.lit(t)

    def text_then(self, t: str) -> str:
        """Any text (maybe none), then token ``t``."""
        return f"{self.text_opt()} {self.tok(t)}"

    def newlines(self) -> str:
        return f"{self.lit(chr(10))}*"

    def repeat(self, expr: str, most: int | None) -> str:
        return f"({expr})*" if most is None else f"({expr}){{0,{most}}}"

    def structure(self) -> str:
        """The start rule's body; the rules it uses are defined."""
        p = self.lp
        if p.messages is not None:
            return self.messages_answer()
        if p.bare:
            return self.bare_answer()
        if p.led:
            return self.led_structure()
        answer = self.answer()
        if p.opened:
            # The prompt opened the block: reasoning up to its close, then
            # the answer, as written.
            self.rule("reasoning", self.text_then(p.opened))
            body = f"reasoning {answer}"
        elif p.reasoning is not None:
            o, c = p.reasoning
            self.rule("reasoning", f"{self.tok(o)} {self.text_then(c)}")
            if p.exact:
                # The block the format writes on every answer, as it is.
                body = f"reasoning {answer}"
            else:
                lead = f"reasoning {self.newlines()}" if p.calls == "yes" else "reasoning"
                body = f"({lead})? {answer}"
        elif p.after_reasoning and not p.exact:
            body = f"{self.newlines()} {answer}"
        else:
            body = answer
        stops = " | ".join(self.tok(s) for s in p.stops)
        return f"{body} ({stops})?"

    def answer(self) -> str:
        p = self.lp
        content = self.json_answer() if p.response_schema is not None else self.text_opt()
        if p.calls == "no":
            return content
        first = p.section[0] if p.section is not None else p.call_open
        rest = self.calls_rest()
        if p.calls == "yes":
            self.rule("calls", f"{self.tok(first)} {rest}")
            return "calls"
        if p.response_schema is not None:
            sep = f"{self.lit(p.separator)} " if p.separator else ""
            self.rule("calls", f"{sep}{self.tok(first)} {rest}")
            # A JSON answer, maybe followed by calls; or calls alone.
            return f"({content} calls? | {self.tok(first)} {rest})"
        self.rule("calls", f"{self.text_then(first)} {rest}")
        return f"(calls | {content})"

    def led_structure(self) -> str:
        """The start rule's body where the format lays the answer out with
        text of its own: the reasoning block (on every answer after its lead
        where the body writes it so), then :meth:`led_answer`."""
        p = self.lp
        answer = self.led_answer()
        if p.opened:
            self.rule("reasoning", self.text_then(p.opened))
            return f"reasoning {answer}"
        if p.reasoning is None:
            return answer
        o, c = p.reasoning
        lead = f"{self.lit(p.reasoning_lead)} " if p.reasoning_lead else ""
        label = f"{self.lit(p.reasoning_label)} " if p.reasoning_label else ""
        self.rule("reasoning", f"{lead}{self.tok(o)} {label}{self.text_then(c)}")
        return f"reasoning {answer}" if p.reasoning_lead is not None else f"reasoning? {answer}"

    def led_answer(self) -> str:
        """Content after its lead (text, or JSON under ``response_format``)
        then a stop that ends answers; or calls, each after its lead (after
        content, which then ends with the lead), then a stop after which the
        model waits for their results."""
        p = self.lp
        ends = " | ".join(self.tok(t) for t in p.end_stops or p.stops)
        waits = " | ".join(self.tok(t) for t in p.wait_stops or p.stops)
        lead = f"{self.lit(p.content_lead)} " if p.content_lead else ""
        if p.response_schema is not None:
            content = f"{lead}{self.json_answer()}"
        else:
            content = f"({lead}{self.text_opt()})?" if lead else self.text_opt()
        if p.calls == "no":
            return f"{content} ({ends})?"
        assert p.section is None  # a section's calls are not laid out by leads
        rest = self.calls_rest()
        first = f"{self.lit(p.call_lead)} {self.tok(p.call_open)}" if p.call_lead else self.tok(p.call_open)
        if p.calls == "yes":
            return f"{first} {rest} ({waits})?"
        if p.response_schema is not None:
            calls = f"({content})? {first}"
        elif p.content_lead or p.call_lead:
            # Content before calls ends with the calls' lead.
            calls = f"({self.text_ending(p.content_lead, p.call_lead)} | {self.lit(p.call_lead)}) " \
                    f"{self.tok(p.call_open)}"
        else:
            calls = self.text_then(p.call_open)
        return f"({content} ({ends})? | {calls} {rest} ({waits})?)"

    def text_ending(self, lead: str, end: str) -> str:
        """``lead``, then text that ends with ``end``."""
        head = f"{self.lit(lead)} " if lead else ""
        return f"{head}{self.text_opt()} {self.lit(end)}" if end else f"{head}{self.text_opt()}"

    def bare_answer(self) -> str:
        """An answer of a format of bare calls: content (free text that
        never reads as a call, or JSON), or one call as the whole answer
        (to a declared tool, or to a built-in one after its token); content
        ends with a stop token that ends answers, a call with any."""
        p = self.lp
        ends = " | ".join(self.tok(t) for t in p.end_stops)
        anys = " | ".join(self.tok(t) for t in p.stops)
        content = self.json_answer() if p.response_schema is not None else self.text_opt()
        alts = [] if p.calls == "yes" else [f"{content} ({ends})?"]
        calls = []
        if p.tools:
            self.call_rules()
            calls.append("call")
        if p.builtin:
            calls.append(self.builtin_rule())
        if calls:
            alts.append(f"({' | '.join(calls)}) ({anys})?")
        return alts[0] if len(alts) == 1 else "(" + ") | (".join(alts) + ")"

    def builtin_rule(self) -> str:
        """A call to a built-in tool: its pattern, with at most one argument
        (a parse reads keys once each) whose value holds no quote."""
        p = self.lp
        arg = ""
        for item in p.argument_items:
            if isinstance(item, Lit):
                arg += f" {self.lit(item.text)}"
            elif isinstance(item, Slot) and item.name == "key":
                arg += f" {self.builtin_key()}"
            else:
                arg += f" {self.builtin_value()}"
        alts = []
        for name in p.builtin:
            parts: list[str] = []
            text = ""
            for item in p.builtin_items:
                if isinstance(item, Lit):
                    text += item.text
                elif isinstance(item, Slot) and item.name == "name":
                    text += name
                else:
                    if text:
                        parts.append(self.lit(text))
                        text = ""
                    if isinstance(item, Tok):
                        parts.append(self.tok(item.token))
                    elif arg:
                        parts.append(f"({arg.strip()})?")
            if text:
                parts.append(self.lit(text))
            alts.append(" ".join(parts))
        self.rule("builtin", alts[0] if len(alts) == 1 else "(" + ") | (".join(alts) + ")")
        return "builtin"

    def builtin_key(self) -> str:
        if "bkey" not in self.defined:
            self.defined.add("bkey")
            self.rule("bkey", "[A-Za-z_] [A-Za-z0-9_]*")
        return "bkey"

    def builtin_value(self) -> str:
        raise NotImplementedError  # each writer spells text its own way

    def calls_rest(self) -> str:
        """The calls after the first token that opens them (the section's or
        the first call's), the section's close included."""
        p = self.lp
        if p.array is not None:
            return self.array_rest()
        self.call_rules()
        head = f"{self.lit(p.separator)} {self.tok(p.call_open)}" if p.separator else self.tok(p.call_open)
        if p.indexed:
            # Each call's id spells its index: call k, then maybe call k+1.
            assert p.max_calls is not None
            for k in range(p.max_calls - 1, 0, -1):
                after = f" seq_{k + 1}?" if k + 1 < p.max_calls else ""
                self.rule(f"seq_{k}", f"{head} call_{k}{after}")
            more = " seq_1?" if p.max_calls > 1 else ""
            calls = f"call_0{more}"
        else:
            more = "" if p.max_calls == 1 else " " + self.repeat(
                f"{head} call", None if p.max_calls is None else p.max_calls - 1)
            calls = f"call{more}"
        if p.section is None:
            return calls
        return f"{self.tok(p.call_open)} {calls} {self.tok(p.section[1])}"

    def call_rules(self) -> None:
        p = self.lp
        close: Tok | None = None
        if p.pair_items:
            at = next(k for k, x in enumerate(p.call_rest) if isinstance(x, Slot) and x.name == "arguments")
            after = p.call_rest[at + 1]
            assert isinstance(after, Tok)  # the plan's check
            close = after
        for i, t in enumerate(p.tools):
            if close is not None:
                # The pairs end with the call's close: which keys were
                # given decides where it may come.
                self.rule(f"args_t{i}", self.pairs(i, t, self.tok(close.token)))
            elif p.fragments:
                # The value syntax's own rules, rule args_t{i} first.
                self.rules += fragment_lines(p.fragments[t.name])
            else:
                self.rule(f"args_t{i}", self.object_value(_object_schema(t.params)))
        for k in range(p.max_calls or 1) if p.indexed else [None]:
            alts = [self.call_body(i, t, k) for i, t in enumerate(p.tools)]
            self.rule("call" if k is None else f"call_{k}",
                      alts[0] if len(alts) == 1 else "(" + ") | (".join(alts) + ")")

    def call_body(self, i: int, t: Tool, k: int | None) -> str:
        """Call ``k`` (None: any call) to tool ``i`` after its opening token:
        adjacent literal text as one literal."""
        parts: list[str] = []
        text: list[str] = []

        def flush() -> None:
            if text:
                parts.append(self.lit("".join(text)))
                text.clear()

        items = list(self.lp.call_rest)
        if self.lp.pair_items:
            # The arguments' rule holds the token that closes the call.
            at = next(k for k, x in enumerate(items) if isinstance(x, Slot) and x.name == "arguments")
            items = [x for k, x in enumerate(items) if k != at + 1]
        if self.lp.bare and self.lp.response_schema is not None and items and isinstance(items[0], Lit) and \
                len(items[0].text) > 1:
            # Beside a JSON answer, the opening character on its own, as the
            # answer's object opens: llguidance's lexer does not go back to a
            # shorter match once a longer one fails (beside free text, the
            # whole opening is one literal, which the text never spells).
            parts.append(self.lit(items[0].text[0]))
            items[0] = Lit(items[0].text[1:])
        for item in items:
            if isinstance(item, Lit):
                text.append(item.text)
            elif isinstance(item, Tok):
                flush()
                parts.append(self.tok(item.token))
            elif isinstance(item, Slot) and item.name == "name":
                text.append(t.name)
            elif isinstance(item, Slot) and item.name == "id":
                for piece in self.lp.id_items:
                    if isinstance(piece, Lit):
                        text.append(piece.text)
                    elif isinstance(piece, Slot) and piece.name == "name":
                        text.append(t.name)
                    elif k is not None:
                        text.append(str(k))
                    else:
                        flush()
                        parts.append(self.numeral())
            else:
                flush()
                parts.append(f"args_t{i}")
        flush()
        return " ".join(parts)

    def numeral(self) -> str:
        """An index the model writes: decimal digits."""
        if "numeral" not in self.defined:
            self.defined.add("numeral")
            self.rule("numeral", "[0-9]+")
        return "numeral"

    def layout_header(self) -> str:
        c = self.comment
        p = self.lp
        lines = [f"{c} xtml completion grammar ({self.syntax}): {p.summary}"]
        if p.text_tokens:
            lines.append(f"{c} Tokens this vocabulary spells as text ({', '.join(p.text_tokens)}) are text here; "
                         "free text spells none of them.")
        lines.append(f"{c} The {'other ' if p.text_tokens else ''}tokens of the format are token references; text "
                     "never matches them.")
        lines += list(self.layout_load)
        lines += [f"{c} limit: {x}" for x in dict.fromkeys(self.notes)]
        return "\n".join(lines) + "\n"

    def layout_write(self) -> str:
        start = self.structure()
        tail = self.finish()
        return self.preamble + self.layout_header() + "\n".join(
            [self.spell(self.start, start), *self.rules, *tail]) + "\n"


# Every character Python's str.strip takes for whitespace, as a class.
_WS_CLASS = "[" + "".join(f"\\x{ord(c):02x}" if ord(c) < 0x80 else c
                          for c in map(chr, range(0x3001)) if c.isspace()) + "]"


def _rx(s: str) -> str:
    """``s`` inside a llguidance regular expression."""
    out = []
    for ch in s:
        if ch in "\\.+*?()|[]{}^$&~#-/\"":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


class _LayoutLark(_Layout, PairsLark, ArrayLark, MessagesAnswer, _Lark):
    layout_load = _Lark.load

    def __init__(self, plan: LayoutPlan) -> None:
        self.setup(plan)
        self.terminals: dict[str, str] = {}
        self.nested = False
        self.uses_json = False
        self.json_rules: dict[str, str] = {}
        self.spelled = "|".join(_rx(t) for t in sorted(plan.text_tokens, key=len, reverse=True))

    def spells_none(self) -> str:
        """What keeps a terminal from spelling a text token."""
        return f" & ~/(?s:.*)({self.spelled})(?s:.*)/" if self.spelled else ""

    def text(self) -> str:
        self.terminals["TEXT"] = "/(?s:.+)/" + self.spells_none() + self.guarded()
        return "TEXT"

    def guarded(self) -> str:
        """What keeps free text from reading as a bare call: it never spells
        a call's opening, nor is a JSON object's shape (``{`` … ``}``
        between whitespace, as Python's ``str.strip`` takes it)."""
        if not self.lp.guards:
            return ""
        ws = _WS_CLASS
        return (f" & ~/(?s:.*)({'|'.join(_rx(g) for g in self.lp.guards)})(?s:.*)/"
                f" & ~/{ws}*\\{{(?s:.*)\\}}{ws}*/")

    def builtin_key(self) -> str:
        self.terminals["BKEY"] = "/[A-Za-z_][A-Za-z0-9_]*/"
        return "BKEY"

    def builtin_value(self) -> str:
        self.terminals["BVALUE"] = '/[^"]*/' + self.spells_none()
        return "BVALUE"

    def text_then(self, t: str) -> str:
        if t in self.lp.refs or not self.spelled:
            return super().text_then(t)
        # One terminal for the text and the token's spelling: llguidance's
        # lexer is greedy, so a text terminal would take the spelling's start.
        name = f"TEXT_THEN_{len(self.terminals)}"
        others = "|".join(_rx(x) for x in self.lp.text_tokens if x != t)
        self.terminals[name] = (f"/(?s:.*){_rx(t)}/ & ~/(?s:.*)({self.spelled})(?s:.+)/"
                                + (f" & ~/(?s:.*)({others})/" if others else ""))
        return name

    def newlines(self) -> str:
        self.terminals["NEWLINES"] = "/\\n+/"
        return "NEWLINES?"

    def text_ending(self, lead: str, end: str) -> str:
        if not end:
            return super().text_ending(lead, end)
        # One terminal: the lexer would not give back the end a text
        # terminal took.
        name = f"TEXT_ENDING_{len(self.terminals)}"
        self.terminals[name] = f"/(?s:.*){_rx(end)}/" + self.spells_none()
        return f"{self.lit(lead)} {name}" if lead else name

    def numeral(self) -> str:
        self.terminals["NUMERAL"] = "/[0-9]+/"
        return "NUMERAL"

    def json_answer(self) -> str:
        self.terminals["WS"] = "/[ \\t\\r\\n]+/"
        return f"WS? {self.json_ref(self.lp.response_schema)}"

    def object_value(self, schema: Any) -> str:
        return self.json_schema(schema, schema, 0, "object")

    def llg_json(self, s: Any, root: Any, whole: bool = False, only: str | None = None) -> str:
        lengths = {k: v for k, v in s.items() if k != "type"} if isinstance(s, Mapping) else None
        if not self.spelled or lengths is None or s.get("type") != "string" or \
                not set(lengths) <= {"minLength", "maxLength"} or \
                any(type(v) is not int or v < 0 for v in lengths.values()):
            return super().llg_json(s, root, whole, only)
        # A string of lengths as its own terminal, which can then be kept
        # from spelling a token (llguidance's %json cannot): each unit of
        # the JSON string is one character of its value.
        lo, hi = lengths.get("minLength", 0), lengths.get("maxLength")
        name = f"JSTRING_{lo}_{'N' if hi is None else hi}"
        self.terminals[name] = f'/"({_JSON_STRING[3:-4]}){{{lo},{"" if hi is None else hi}}}"/'
        return name

    def finish(self) -> list[str]:
        if self.spelled:
            for k in list(self.terminals):
                if k.startswith(("JSTRING", "JKEY_")):
                    self.terminals[k] += self.spells_none()
            if self.uses_json:
                self.notes.append("strings that llguidance's %json writes (with patterns or formats, enums) may "
                                  "spell a token this vocabulary writes as text")
        return _Lark.finish(self)


class _LayoutGbnf(_Layout, PairsEbnf, ArrayEbnf, MessagesAnswer, _Gbnf):
    layout_load: ClassVar[tuple[str, ...]] = (
        "# Load: llama.cpp's grammar sampler (the /completion field \"grammar\", or --grammar-file).",
            "# GBNF cannot express: string lengths, patterns and formats, number bounds and allOf/not/if in",
            "#   JSON values; free text and JSON strings spell no token of the format (GBNF negates one token id",
            "#   at a time, so tokens are kept out by their spelling); special tokens of the vocabulary that are",
            "#   not the format's are admitted as text.")

    def __init__(self, plan: LayoutPlan) -> None:
        self.setup(plan)
        self.specials = plan.specials
        self.used: set[str] = set()
        self.schemas: dict[str, str] = {}
        # Text spells no token of the format: llama.cpp matches a grammar's
        # characters against a control token's text too. Nor does it spell
        # what a parse reads as a bare call's start.
        self.markers = sorted({*plan.d.tokens, *plan.guards})
        self.safe_done: dict[tuple[str, tuple[str, ...], bool], str] = {}
        self.safe_start: dict[str, tuple[list[tuple[str, str]], str]] = {}

    def lit(self, s: str) -> str:
        if s in self.lp.text_tokens or not any(t in s for t in self.lp.d.tokens):
            return _Ebnf.lit(self, s)  # text here, not a control token's spelling: no note
        return super().lit(s)

    def text_opt(self) -> str:
        if not self.lp.guards:
            return super().text_opt()
        # Whitespace, then text whose first other character is not "{" (a
        # parse would read a JSON object there as a call).
        self.safe("text")
        if "guarded" not in self.used:
            self.used.add("guarded")
            spaces = [c for c in map(chr, range(0x3001)) if c.isspace()]
            ws = "".join(_class_char(c) for c in spaces)
            steps, cls = self.safe_start["text"]
            lead = [alt for ch, alt in steps if ch != "{" and not ch.isspace()]
            lead.append(f"[^{cls}{_class_char('{')}{ws}] text-s0")
            self.rules.append(f"guarded ::= [{ws}]* ({' | '.join(lead)})?")
        return "guarded"

    def builtin_value(self) -> str:
        return self.safe("bval", '"')

    def json_answer(self) -> str:
        return f"json_ws {self.json_schema(self.lp.response_schema, self.lp.response_schema, None)}"

    def object_value(self, schema: Any) -> str:
        return self.json_schema(schema, schema, "object")

    def attr_values(self) -> tuple[str, str]:
        return self.safe("attr", '"&', _ENTITIES), "attr-1"


class _LayoutEbnf(_LayoutGbnf):
    """xgrammar's EBNF: the GBNF writer's rules (xgrammar reads GBNF's
    rule names and classes), tokens as ``Token(ID)``, and free text by tokens
    where the vocabulary spells no token of the format as text."""

    syntax = "xgrammar"
    layout_load: ClassVar[tuple[str, ...]] = ("# Load: xgrammar.Grammar.from_ebnf(this text) (root rule: root).",
            "# xgrammar's EBNF cannot express: string lengths, patterns and formats, number bounds and",
            "#   allOf/not/if in JSON values; JSON strings spell no token of the format; where the vocabulary",
            "#   spells a token of the format as text, free text is character-level too: whether a special",
            "#   token's text can match it depends on how the engine's TokenizerInfo lists special tokens.")

    def text_opt(self) -> str:
        if self.lp.text_tokens or self.lp.guards:
            return super().text_opt()
        if "text" not in self.used:
            self.used.add("text")
            ids = ", ".join(map(str, self.specials))
            self.rules.append(f"text ::= (ExcludeToken({ids}))*")
        return "text"


def _tag(plan: LayoutPlan) -> str:
    """The structural tag: the reasoning block and the stop tokens as
    xgrammar's token-level formats where the vocabulary has the tokens as
    ids, the answer as one EBNF ``grammar`` format (the calls and JSON need
    named rules); everything in that format where some token is text."""
    # A bare format's stops differ by what the answer is, and messages close
    # each their own way: all in the grammar.
    token_level = not plan.bare and not plan.opened and not plan.led and plan.messages is None and (
        plan.reasoning is None or all(t in plan.token_ids for t in plan.reasoning))
    w = _LayoutEbnf(plan)
    parts: list[dict[str, Any]] = []
    if token_level and plan.reasoning is not None:
        o, c = plan.reasoning
        block = {"type": "sequence", "elements": [
            {"type": "token", "token": plan.token_ids[o]},
            {"type": "any_tokens", "exclude_tokens": plan.specials},
            {"type": "token", "token": plan.token_ids[c]}]}
        parts.append(block if plan.exact else {"type": "optional", "content": block})
        # The answer's grammar starts where the block ended (or where it
        # would have), as the EBNF after_reasoning form writes it.
        plan_after = LayoutPlan(**{**plan.__dict__, "reasoning": None, "after_reasoning": True})
        w = _LayoutEbnf(plan_after)
    answer = w.answer() if token_level else w.structure()
    if token_level and (plan.reasoning is not None or plan.after_reasoning) and not plan.exact:
        answer = f"{w.newlines()} {answer}"
    grammar = "\n".join([w.spell("root", answer), *w.rules, *w.finish()]) + "\n"
    parts.append({"type": "grammar", "syntax": "ebnf", "grammar": grammar})
    if token_level:
        stops = [{"type": "token", "token": plan.token_ids[s]} for s in plan.stops if s in plan.token_ids]
        if stops:
            parts.append({"type": "optional", "content": stops[0] if len(stops) == 1 else
                          {"type": "or", "elements": stops}})
    fmt = parts[0] if len(parts) == 1 else {"type": "sequence", "elements": parts}
    tag = {"type": "structural_tag", "format": fmt,
           "xtml": {"summary": f"xtml completion grammar (xgrammar structural tag): {plan.summary}",
                    "limits": list(dict.fromkeys(w.notes))}}
    return json.dumps(tag, ensure_ascii=False)
