"""The completion grammar as GBNF, llama.cpp's grammar syntax (root rule
``root``), for a llama.cpp built without llguidance.

GBNF references a token by id (``<[ID]>``) and negates one id at a time
(``!<[ID]>``): there is no "any token but these", and llama.cpp matches every
other grammar element against a token's text, a control token's spelling
included. So text bodies, attribute values and JSON strings are written at
the character level as text in which no marker is spelled (an automaton over
the markers' spellings): the marker tokens can never be generated there, nor
can text spell a marker with ordinary tokens. The markers the message's
structure needs are token references by id.

Arguments and JSON values are typed as the xgrammar export types them (the
same JSON-schema rules, one rule per subset of tracked keys); what GBNF
cannot express is listed in the grammar's header.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .plan import Plan
from .plan import marker_id as _marker_id
from .xgrammar import _JSON_RULES, ATTR_TEXT, TRACKED, _Ebnf

__all__ = ["TRACKED", "write"]


def write(plan: Plan) -> str:
    """The plan (made for ``gbnf``, with a tokenizer) as GBNF."""
    return _Gbnf.grammar(plan)


# GBNF rule names are letters, digits and "-" (llama-grammar.cpp's
# is_word_char); the shared writer names rules with "_". Literals, character
# classes and token references are matched first so that nothing inside
# them is renamed.
_PIECE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|!?<\[\d+\]>|[A-Za-z0-9_]+|.', re.S)
_ENTITIES = ('"&amp;"', '"&quot;"')
# The JSON rules' \u escape (json_u) pairs surrogates.
_JSON_ESCAPES = ('"\\\\" ["\\\\/bfnrt]', "json_u")


def _names(body: str) -> str:
    return "".join(m.group().replace("_", "-") if m.group()[0] not in '"[<!' else m.group()
                   for m in _PIECE.finditer(body))


def _class_char(ch: str) -> str:
    """``ch`` inside a GBNF character class."""
    if ch in "\\]-[^\"":
        return "\\" + ch if ch != "^" else "\\x5e"
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{ord(ch):02x}"
    return ch


class _Gbnf(_Ebnf):
    syntax = "gbnf"
    load = (
        "# Load: llama.cpp's grammar sampler (the /completion field \"grammar\", or --grammar-file).",
        "# GBNF cannot express, so this grammar admits more or less than the llguidance export:",
        "#   text bodies, attribute values and JSON strings spell no marker (GBNF negates one token id",
        "#   at a time, so markers are kept out by their spelling): text that spells one is refused;",
        "#   special tokens of the vocabulary that are not the template's markers are admitted as text;",
        "#   keys an argument schema does not list are not told apart from listed ones;",
        f"#   more than {TRACKED} arguments of one tool are not all tracked (each key once, required ones present);",
        "#   string lengths, patterns and formats, number bounds and allOf/not/if in JSON values.",
    )

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        # GBNF's spelling of a marker's id is ``<[ID]>``.
        for attr, key in (("o", "open"), ("c", "close"), ("s", "sep"), ("e", "end")):
            setattr(self, attr, f"<[{_marker_id(plan, key, 'gbnf')}]>")
        self.markers = sorted({m for m in plan.d.markers.all() if m})
        self.safe_done: dict[tuple[str, tuple[str, ...], bool], str] = {}
        self.safe_start: dict[str, tuple[list[tuple[str, str]], str]] = {}

    def spell(self, name: str, body: str) -> str:
        return f"{_names(name)} ::= {_names(body)}"

    def lit(self, s: str) -> str:
        if any(m in s for m in self.markers):
            # llama.cpp matches a literal against a control token's text too.
            self.notes.append("a fixed string (an enum value, a key, a tool name) that spells a marker may be "
                              "generated as the marker's token")
        return super().lit(s)

    # -- text in which no marker is spelled -------------------------------------------

    def safe(self, name: str, excluded: str = "", escapes: tuple[str, ...] = (), controls: bool = True) -> str:
        """Rules for any text that spells no marker, of characters outside
        ``excluded`` (and control characters unless ``controls``) and of
        the ``escapes`` (GBNF expressions, which spell no marker's start);
        returns the rule of the text, the empty one included. ``NAME-1`` is
        the text that is not empty."""
        key = (excluded, escapes, controls)
        got = self.safe_done.get(key)
        if got is not None:
            return got
        self.safe_done[key] = f"{name}-0"
        # The automaton's states are the proper prefixes of markers (the
        # longest one the text ends with); a character that completes a
        # marker has no transition.
        prefixes = sorted({m[:k] for m in self.markers for k in range(len(m))}, key=lambda p: (len(p), p))
        index = {p: k for k, p in enumerate(prefixes)}
        chars = sorted({ch for m in self.markers for ch in m} - set(excluded))

        def step(p: str, ch: str) -> str | None:
            t = p + ch
            if any(t.endswith(m) for m in self.markers):
                return None
            return next(t[k:] for k in range(len(t) + 1) if t[k:] in index)

        for p, k in index.items():
            alts, own = [], []
            for ch in chars:
                nxt = step(p, ch)
                if nxt != "":
                    own.append(ch)
                    if nxt is not None:
                        alts.append(f"{self.lit(ch)} {name}-s{index[nxt]}")
            cls = "".join(_class_char(c) for c in [*excluded, *own]) + ("" if controls else "\\x00-\\x1f")
            alts.append(f"[^{cls}] {name}-s0")
            alts += [f"{e} {name}-s0" for e in escapes]
            self.rule(f"{name}-s{k}", '"" | ' + " | ".join(alts))
            if k == 0:
                self.rule(f"{name}-1", " | ".join(alts))
                # Where the text starts: for rules that keep some first
                # characters out (the characters that step somewhere, with
                # the step, and the class of the others).
                self.safe_start[name] = ([(ch, f"{self.lit(ch)} {name}-s{index[nxt]}") for ch in own
                                          if (nxt := step(p, ch)) is not None], cls)
        self.rule(f"{name}-0", f"{name}-s0")
        return f"{name}-0"

    def text_opt(self) -> str:
        return self.safe("text")

    def attr_values(self) -> tuple[str, str]:
        return self.safe("attr", '"&', _ENTITIES), "attr-1"

    def fragment_body(self, body: list[str]) -> str:
        # A plugin's literals are JSON strings: GBNF knows fewer escapes.
        return " ".join(self.lit(json.loads(t)) if t.startswith('"') else t for t in body)

    def argument(self, rule: str, key_expr: str, v: Any) -> None:
        # The xgrammar writer spells a key the schema does not list as
        # attribute characters, which here must not spell a marker either.
        free = f"{ATTR_TEXT}*"
        if free in key_expr:
            key_expr = key_expr.replace(free, self.safe("attr", '"&', _ENTITIES))
        super().argument(rule, key_expr, v)

    def json_base(self) -> None:
        if "json" not in self.used:
            self.used.add("json")
            for k, v in _JSON_RULES.items():
                if k == "json_char":
                    continue
                if k == "json_string":
                    inner = self.safe("jstr", '"\\', _JSON_ESCAPES, controls=False)
                    v = f'"\\"" {inner} "\\""'
                self.rule(k, v)
