"""The completion grammar as an xgrammar **structural tag**: the JSON that
``xgrammar.Grammar.from_structural_tag`` and ``GrammarCompiler.compile_structural_tag``
take, and that vLLM (``structured_outputs={"structural_tag": ...}``) and
SGLang (``response_format={"type": "structural_tag", ...}``) pass through to
xgrammar.

The message's structure is written in the structural tag's own formats, at
the token level: every marker is a ``token`` by id, reasoning and answer
text are ``any_tokens`` that exclude the vocabulary's special tokens, the
channels follow in the dialect's order (``sequence``, ``optional``, ``or``
for the request's variants), and a JSON answer under ``response_format`` is
a ``json_schema`` format, which xgrammar's own JSON-schema compiler enforces.
A structural tag has no named rules, so what needs them is one ``grammar``
format each, in xgrammar's EBNF (written as :mod:`.xgrammar` writes it,
markers as ``Token(ID)``): the calls of a message (indexes counted from 1,
each tool's arguments typed and tracked by key) and an answer that holds
plugins' elements.

A structural tag has no comments; what the EBNF export says in its header
is a top-level ``"xtml"`` member here (``summary``, and ``limits``: what
this grammar cannot express), which xgrammar and the engines' structural-tag
models ignore as they ignore any member they do not know.
"""

from __future__ import annotations

import json
from typing import Any

from .plan import Plan, marker_id
from .writer import writing
from .xgrammar import TRACKED, _Ebnf

__all__ = ["write"]

Format = dict[str, Any]


def write(plan: Plan) -> str:
    """The plan (made for ``xgrammar-tag``, with a tokenizer) as a structural
    tag, JSON text."""
    with writing(plan, "xgrammar-tag"):
        w = _Tag(plan)
        tag = w.tag()
        tag["xtml"] = {"summary": f"xtml completion grammar (xgrammar structural tag): {plan.summary}",
                       "limits": w.limits()}
        return json.dumps(tag, ensure_ascii=False)


def _seq(parts: list[Format]) -> Format:
    flat = [x for p in parts for x in (p["elements"] if p["type"] == "sequence" else [p])]
    return flat[0] if len(flat) == 1 else {"type": "sequence", "elements": flat}


class _Tag:
    def __init__(self, plan: Plan) -> None:
        self.p = plan
        self.n = plan.d.names
        self.holds = {ch.key: ch.holds for ch in plan.d.assistant_channels}
        self.ids = {key: marker_id(plan, key, "xgrammar-tag") for key in ("open", "close", "sep", "end")}
        self.notes = list(plan.notes)
        self.json_answer = False

    def token(self, key: str) -> Format:
        return {"type": "token", "token": self.ids[key]}

    def text(self) -> Format:
        # Free text at the token level: any token but the vocabulary's special
        # ones, so text never becomes a marker.
        return {"type": "any_tokens", "exclude_tokens": self.p.specials}

    def marked(self, marker: str, tag: str) -> list[Format]:
        return [self.token(marker), {"type": "const_string", "value": tag}, self.token("sep")]

    def tag(self) -> Format:
        alts = []
        for variant in self.p.variants:
            parts: list[Format] = []
            for key in self.p.order:
                kind = variant.get(key, "text")
                if self.holds[key] == "tool_calls" and kind == "no":
                    continue
                ch = self.channel(key, kind, opened=key == self.p.first)
                parts.append({"type": "optional", "content": ch} if kind == "opt" and key != self.p.first else ch)
            alts.append(_seq(parts))
        body = alts[0] if len(alts) == 1 else {"type": "or", "elements": alts}
        # As in every format: the grammar may end at the message's close, so
        # the end marker may be the engine's stop token or a token of its own.
        end = [*self.marked("close", self.n["message"]), {"type": "optional", "content": self.token("end")}]
        return {"type": "structural_tag", "format": _seq([body, *end])}

    def channel(self, key: str, kind: str, opened: bool) -> Format:
        tag = self.n[key]
        holds = self.holds[key]
        body: list[Format]
        if holds == "reasoning":
            body = [self.text()]
        elif holds == "content":
            body = self.response(kind)
        else:
            body = [self.rules("calls")]
        return _seq([*([] if opened else self.marked("open", tag)), *body, *self.marked("close", tag)])

    def response(self, kind: str) -> list[Format]:
        if kind == "empty":
            return []
        if kind == "json":
            self.json_answer = True
            return [{"type": "json_schema", "json_schema": self.p.response_schema, "style": "json"}]
        if not self.p.elements:
            return [self.text()]
        return [self.rules("elements")]

    def rules(self, what: str) -> Format:
        """A ``grammar`` format for the calls of a message or an answer with
        elements: xgrammar EBNF, as the xgrammar export writes it."""
        w = _Ebnf(self.p)
        w.notes = []
        start = w.calls() if what == "calls" else w.response("text")
        self.notes += w.notes
        return {"type": "grammar", "syntax": "ebnf", "grammar": w.listing(start)}

    def limits(self) -> list[str]:
        out = list(dict.fromkeys(self.notes))
        if self.p.tools:
            out += [
                "keys an argument schema does not list are not told apart from listed ones",
                f"more than {TRACKED} arguments of one tool are not all tracked (each key once, required ones present)",
                "string lengths, patterns and formats, number bounds and allOf/not/if in argument values",
                "argument keys and JSON inside calls are character-level: whether a special token's text can match "
                "them depends on how the engine's TokenizerInfo lists special tokens",
            ]
        if self.json_answer:
            out += ["the JSON answer is xgrammar's own json_schema format: it enforces what xgrammar's JSON-schema "
                    "compiler enforces, and admits numbers past what JSON parsers keep (1e400)"]
        return list(dict.fromkeys(out))
