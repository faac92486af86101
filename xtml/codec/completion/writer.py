"""What the grammar syntaxes share: a completion's plan walked channel by
channel, call by call and argument by argument, each syntax's writer
(:mod:`.llguidance`, :mod:`.xgrammar`) spelling the rules, literals, text
and JSON values its own way."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from ...errors import OptionError
from ...markup.header import escape
from .plan import FRAGMENT_NAMES, Plan, deep_schemas_refused, fragment_rules
from .schema import TEXT_TYPES, StringForm, Tool, Value

__all__ = ["GrammarWriter", "writing"]


@contextmanager
def writing(plan: Plan, syntax: str) -> Iterator[None]:
    """Where a plan is written in ``syntax``: refuses a plan whose markers
    are spelled for another, and schemas nested too deeply to write."""
    if plan.format != syntax:
        raise OptionError(f"this plan's markers are spelled for {plan.format}, not {syntax}", option="format")
    with deep_schemas_refused():
        yield


class GrammarWriter(ABC):
    """What the syntaxes share: the plan walked channel by channel, and the
    grammar's text laid out as header, start rule, rules."""

    syntax: ClassVar[str]
    """The plan format this writer spells (``Plan.format``)."""
    comment: ClassVar[str] = "//"
    start: ClassVar[str]
    """The name of the rule a grammar starts from in this syntax."""
    preamble: ClassVar[str] = ""
    """What the text starts with, before the header."""
    load: ClassVar[tuple[str, ...]] = ()
    """Header lines after the summary: how to load the grammar, what the syntax cannot express."""

    @classmethod
    def grammar(cls, plan: Plan) -> str:
        """The plan as this syntax's grammar text."""
        with writing(plan, cls.syntax):
            return cls(plan).write()

    def __init__(self, plan: Plan) -> None:
        self.p = plan
        self.n = plan.d.names
        self.holds = {ch.key: ch.holds for ch in plan.d.assistant_channels}
        refs = plan.refs
        self.o, self.c, self.s, self.e = refs["open"], refs["close"], refs["sep"], refs["end"]
        self.rules: list[str] = []
        self.defined: set[str] = set()
        self.notes = list(plan.notes)
        self.calls_ref = ""
        self.elements_ref = ""

    def rule(self, name: str, body: str) -> None:
        """Define rule ``name`` as ``body``."""
        self.rules.append(self.spell(name, body))

    @abstractmethod
    def spell(self, name: str, body: str) -> str:
        """The definition of rule ``name`` as ``body``, one line."""

    @abstractmethod
    def lit(self, s: str) -> str:
        """``s`` as a string literal."""

    def open_tag(self, tag: str) -> str:
        return f"{self.o} {self.lit(tag)} {self.s}"

    def close_tag(self, tag: str) -> str:
        return f"{self.c} {self.lit(tag)} {self.s}"

    def write(self) -> str:
        """The grammar's text: header, start rule, rules, then what
        :meth:`finish` adds."""
        start = self.channels()
        tail = self.finish()
        return self.preamble + self.header() + self.listing(start, tail)

    def listing(self, start: str, tail: Iterable[str] = ()) -> str:
        """The rules, the start rule (of expression ``start``) first."""
        return "\n".join([self.spell(self.start, start), *self.rules, *tail]) + "\n"

    def finish(self) -> list[str]:
        """Called once the rules are written: adds the last notes, and
        returns the lines that follow the rules."""
        return []

    def header(self) -> str:
        c = self.comment
        lines = [f"{c} xtml completion grammar ({self.syntax}): {self.p.summary}",
                 f"{c} Markers are special-token references; text never matches them.", *self.load]
        lines += [f"{c} limit: {x}" for x in dict.fromkeys(self.notes)]
        return "\n".join(lines) + "\n"

    def channels(self) -> str:
        """The body of the start rule: the channels, then the close of the
        message and its end marker."""
        alts = []
        for variant in self.p.variants:
            parts = []
            for key in self.p.order:
                kind = variant.get(key, "text")
                if self.holds[key] == "tool_calls" and kind == "no":
                    continue
                ref = self.channel(key, kind, opened=key == self.p.first)
                parts.append(f"{ref}?" if kind == "opt" and key != self.p.first else ref)
            alts.append(" ".join(parts))
        body = alts[0] if len(alts) == 1 else "(" + " | ".join(f"({a})" for a in alts) + ")"
        # The grammar may end at the message's close, before the end marker:
        # an engine whose end-of-sequence token is the end marker (llama.cpp
        # hands llguidance the model's end-of-turn token) allows that token
        # only where the grammar may end, and never consumes it as a grammar
        # token; an engine with an end-of-sequence token of its own takes
        # the end marker here, then its own token. A completion cut before
        # the end marker parses the same (engines strip their stop token).
        return f"{body} {self.close_tag(self.n['message'])} ({self.e})?"

    def channel(self, key: str, kind: str, opened: bool) -> str:
        name = f"ch_{key}_{kind}" + ("_opened" if opened else "")
        if name in self.defined:
            return name
        self.defined.add(name)
        tag = self.n[key]
        holds = self.holds[key]
        if holds == "reasoning":
            body = self.text_opt()
        elif holds == "content":
            body = self.response(kind)
        elif "calls" in self.defined:
            body = self.calls_ref
        else:
            self.defined.add("calls")
            body = self.calls_ref = self.calls()
        inner = f"{body} {self.close_tag(tag)}".strip()
        self.rule(name, inner if opened else f"{self.open_tag(tag)} {inner}")
        return name

    def response(self, kind: str) -> str:
        if kind == "empty":
            return ""
        if kind == "json":
            return self.json_response()
        if not self.p.elements:
            return self.text_opt()
        if "elements" in self.defined:
            return self.elements_ref
        self.defined.add("elements")
        names = []
        for k, (plugin, frag) in enumerate(self.p.elements):
            for name, body in fragment_rules(plugin, k, frag):
                self.rule(name, self.fragment_body(body))
            names.append(f"x{k}_{FRAGMENT_NAMES['start']}")
        self.fragment_support()
        els = names[0] if len(names) == 1 else "(" + " | ".join(names) + ")"
        self.elements_ref = f"{self.text_opt()} ({els} {self.text_opt()})*"
        return self.elements_ref

    def fragment_body(self, body: list[str]) -> str:
        return " ".join(body)

    @abstractmethod
    def text_opt(self) -> str:
        """An expression for any text, the empty text included."""

    @abstractmethod
    def json_response(self) -> str:
        """An expression for the response's JSON answer, of ``response_schema``."""

    def fragment_support(self) -> None:
        """Define the shared rules plugins' fragments use (:data:`FRAGMENT_NAMES`)."""
        self.rule("m_open", self.o)
        self.rule("m_close", self.c)
        self.rule("m_sep", self.s)
        self.rule("body_text", self.text_opt())
        any_value, some_value = self.attr_values()
        self.rule("attr_value", any_value)
        self.rule("attr_value1", some_value)

    @abstractmethod
    def attr_values(self) -> tuple[str, str]:
        """Expressions for an attribute's value (escaped as a header
        escapes it): any, and one that is not empty."""

    @abstractmethod
    def calls(self) -> str:
        """An expression for the calls of one message, its rules defined."""

    # -- arguments (shared shape) -------------------------------------------------------

    def call_open(self) -> str:
        return f'{self.o} {self.lit(self.n["call"] + " " + self.n["tool"] + "=" + chr(34))}'

    def name_then_index(self, t: Tool) -> str:
        """The tool name and the index attribute up to its value."""
        return self.lit(escape(t.name) + f'" {self.n["index"]}="')

    def indexed(self, t: Tool, k: int) -> str:
        """The tool name and index ``k``, to the end of the header."""
        return self.lit(escape(t.name) + f'" {self.n["index"]}="{k}"')

    def call_close(self) -> str:
        return self.close_tag(self.n["call"])

    def tracked(self, t: Tool, limit: int) -> list[int]:
        """Indexes (into ``t.args``) of the keys tracked exactly."""
        if len(t.args) <= limit:
            return list(range(len(t.args)))
        req = [k for k, a in enumerate(t.args) if a.required]
        self.notes.append(f"tool {t.name!r}: {len(t.args)} arguments are more than {limit}; "
                          + ("optional ones may repeat" if len(req) <= limit else "keys may repeat or be missing"))
        return req if len(req) <= limit else []

    def argument(self, rule: str, key_expr: str, v: Value) -> None:
        alts = []
        for attr in TEXT_TYPES:
            if attr == "string":
                if v.strings:
                    alts.append(f"{self.lit('string' + chr(34))} {self.s} {self.strings(v.strings)}".rstrip())
                continue
            jt = dict(v.others).get(attr)
            if jt:
                alts.append(f"{self.lit(attr + chr(34))} {self.s} {self.json_value(v, jt)}")
        body = alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
        head = self.lit(f'{self.n["argument"]} {self.n["key"]}="')
        self.rule(rule, f"{self.o} {head} {key_expr} {body} {self.close_tag(self.n['argument'])}")

    def key_literal(self, key: str) -> str:
        return self.lit(escape(key) + f'" {self.n["type"]}="')

    @abstractmethod
    def strings(self, alts: list[StringForm]) -> str:
        """An expression for a string argument written any of the ``alts``
        ways (``""`` when there is none)."""

    def tool_body(self, i: int, t: Tool, args: str) -> None:
        """A call's body: its typed arguments (rule ``args``), or, where the
        dialect allows it, the json block holding the arguments' object."""
        body = args
        if self.p.json_fallback:
            head = self.lit(f'{self.n["json"]} {self.n["type"]}="{escape(self.p.d.json_fallback_type)}"')
            params = t.params if isinstance(t.params, Mapping) and t.params else {"type": "object"}
            self.rule(f"json_t{i}", f"{self.o} {head} {self.s} {self.json_object_value(params)} "
                                    f"{self.close_tag(self.n['json'])}")
            body += f" | json_t{i} {self.call_close()}"
        self.rule(f"body_t{i}", body)

    @abstractmethod
    def json_object_value(self, schema: Any) -> str:
        """An expression for a JSON object matching ``schema``."""

    @abstractmethod
    def json_value(self, v: Value, jtype: str) -> str:
        """An expression for ``v`` as JSON of type ``jtype``."""
