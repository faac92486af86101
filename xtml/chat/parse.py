"""Markup tree → request (or, for a completion, one assistant message).

The output is the normal form of :mod:`.render`: ``parse(render(x)) ==
normalize(x)``. Strict parses raise :class:`ParseError` at the first element
that is not of the dialect; lenient parses keep going, record a
:class:`~xtml.markup.nodes.Diagnostic` per repair and never raise.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ParseError, shown
from ..markup.nodes import Diagnostic, Document, Element, Embed, EndOfMessage, Node, Text
from ..plugins.api import Context, call_id, check_attributes, jsonfmt
from .dialect import Dialect, SystemMessage
from .prompt import is_generation_prompt


class Reader:
    """Reads a markup tree as the dialect's requests; channel and content
    plugins read their elements with its helpers."""

    def __init__(self, d: Dialect, lenient: bool) -> None:
        self.d = d
        self.n = self.names = d.names
        self.lenient = lenient
        self.diags: list[Diagnostic] = []
        self.ctx = Context(None, lambda message, kind: self.problem(None, message, kind))
        self.fields = sorted(d.channel_exts, key=lambda ch: ch.field_order)
        n = self.n
        # Which attributes each element may carry, by role.
        self.a_msg = frozenset((n["role"], n["name"]))
        self.a_internal = frozenset((n["role"], n["type"]))
        self.a_tool = frozenset((n["role"], n["tool"], n["index"]))
        self.a_call = frozenset((n["tool"], n["index"]))
        self.a_arg = frozenset((n["key"], n["type"]))
        self.order = {tag: k for k, tag in enumerate(d.channels())}

    def problem(self, el: Element | None, msg: str, kind: str, path: str = "") -> None:
        off = el.offset if el is not None and el.offset >= 0 else 0
        if not self.lenient:
            raise ParseError(msg, offset=off, path=path)
        self.diags.append(Diagnostic(kind, off, f"{msg} (in {path})" if path else msg))

    # -- pieces ----------------------------------------------------------------

    def attrs(self, el: Element, allowed: frozenset[str], path: str) -> dict[str, str]:
        out = dict(el.attrs)
        if len(out) == len(el.attrs) and out.keys() <= allowed:
            return out
        out = {}
        for k, v in el.attrs:
            if k not in allowed:
                self.problem(el, f"unexpected attribute {shown(k)} on {shown(el.tag)}", "unknown-attribute", path)
                continue
            if k in out:
                self.problem(el, f"attribute {shown(k)} given twice", "duplicate-attribute", path)
            out[k] = v
        return out

    def text(self, el: Element, path: str) -> str:
        """Body text of an element that may hold only text."""
        ch = el.children
        if not ch:
            return ""
        if len(ch) == 1 and type(ch[0]) is Text:
            return ch[0].text
        parts: list[str] = []
        for c in el.children:
            if isinstance(c, Text):
                parts.append(c.text)
            elif isinstance(c, Embed):
                self.problem(el, f"an embed inside {shown(el.tag)}, where only text may stand", "unexpected-embed",
                             path)
                parts.append(c.raw)
            elif isinstance(c, Element):
                self.problem(c, f"element {shown(c.tag)} inside {shown(el.tag)}, where only text may stand",
                             "unexpected-element", path)
                parts.append(self.flatten(c))
        return "".join(parts)

    def flatten(self, node: Node) -> str:
        if isinstance(node, Text):
            return node.text
        if isinstance(node, Embed):
            return node.raw
        if isinstance(node, Element):
            return "".join(self.flatten(c) for c in node.children)
        return ""

    def content(self, el: Element, path: str) -> str | list[dict[str, Any]]:
        """Text and images, as in the normal form."""
        ch = el.children
        if not ch:
            return ""
        if len(ch) == 1 and type(ch[0]) is Text:
            return ch[0].text
        out: list[dict[str, Any]] = []
        # Text pieces of the text part being built, joined once it ends: a
        # body split into many pieces (stray markers in a lenient parse) must
        # not be copied again for each one.
        pieces: list[str] = []

        def flush() -> None:
            if pieces:
                out.append({"type": "text", "text": "".join(pieces)})
                pieces.clear()

        plain = True
        for c in el.children:
            if isinstance(c, Text):
                if c.text:
                    pieces.append(c.text)
            elif isinstance(c, Embed):
                part = self.embed(c.raw, el, path)
                if part is not None:
                    plain = False
                    flush()
                    out.append(part)
            elif isinstance(c, Element):
                owner = self.d.element_owner.get(c.tag)
                got: dict[str, Any] | None = None
                if owner is None:
                    self.problem(c, f"element {shown(c.tag)} inside message content", "unexpected-element", path)
                else:
                    why = check_attributes(owner, c.tag, c.attrs)
                    try:
                        if why is not None:
                            raise ValueError(why)
                        got = owner.read_element(c, self.ctx)
                    except ValueError as e:
                        self.problem(c, f"{shown(c.tag)}: {e}", "bad-element", path)
                if got is not None:
                    plain = False
                    flush()
                    out.append(got)
                    continue
                text = self.flatten(c)
                if text:
                    pieces.append(text)
        flush()
        if plain:
            return "".join(p["text"] for p in out)
        return out

    def embed(self, raw: str, el: Element, path: str) -> dict[str, Any] | None:
        """The part an embed stands for, from the first plugin that reads it."""
        for ext in self.d.embed_readers:
            try:
                part = ext.read_embed(raw, self.ctx)
            except ValueError as e:
                self.problem(el, f"embed {raw[:60]!r}: {e}", "bad-embed", path)
                return None
            if part is not None:
                return part
        self.problem(el, f"embed {raw[:60]!r} is not one this template knows", "unknown-embed", path)
        return None

    def finish(self, req: dict[str, Any]) -> None:
        for ext in self.d.content:
            ext.finish_parse(req, self.ctx)

    # -- assistant -------------------------------------------------------------

    def assistant(self, el: Element, pos: int, thinking: bool | None, path: str) -> dict[str, Any]:
        n = self.n
        a = self.attrs(el, self.a_msg, path)
        msg: dict[str, Any] = {"role": "assistant"}
        if a.get(n["name"]):
            msg["name"] = a[n["name"]]
        order = self.order
        seen: dict[str, Element] = {}
        last = -1
        children = self._hoist(el.children, order, path) if self.lenient else el.children
        for c in children:
            if isinstance(c, Element) and c.tag in order:
                if c.tag in seen:
                    self.problem(c, f"channel {shown(c.tag)} appears twice", "duplicate-channel", path)
                elif order[c.tag] < last:
                    self.problem(c, f"channel {shown(c.tag)} is out of order", "channel-order", path)
                last = max(last, order[c.tag])
                seen.setdefault(c.tag, c)
            elif isinstance(c, Text) and not c.text.strip() and self.lenient:
                continue
            else:
                what = f"element {shown(c.tag)}" if isinstance(c, Element) else "text"
                self.problem(c if isinstance(c, Element) else el,
                             f"{what} in an assistant message, outside any channel", "stray-content", path)
                if isinstance(c, Text | Embed):
                    seen.setdefault("_stray", Element(n["response"], (), (c,)))
        think = seen.get(n["think"])
        if thinking is True and think is None and not self.lenient:
            self.problem(el, "assistant message without a think channel in thinking mode", "missing-channel",
                         path)
        if thinking is False and think is not None:
            self.problem(think, "think channel in non-thinking mode", "unexpected-channel", path)
        if n["response"] not in seen and not self.lenient:
            self.problem(el, "assistant message without a response channel", "missing-channel", path)
        if n["response"] not in seen and "_stray" in seen:
            seen[n["response"]] = seen["_stray"]
        for ch in self.fields:
            ch.read(seen.get(n[ch.name]), msg, self, pos, path)
        return msg

    def _hoist(self, children: tuple[Node, ...], order: dict[str, int], path: str,
               seen: set[str] | None = None) -> tuple[Node, ...]:
        """A model that forgets to close a channel before the next one opens
        writes the later channel inside the earlier: read it as the sibling
        it was meant to be, with a diagnostic, so a tool call is not lost as
        stray text of the response. What follows it inside the earlier
        channel is at the message's level too (stray content)."""
        out: list[Node] = []
        # Only the first of a channel is read, so only it is looked into.
        seen = set() if seen is None else seen
        for c in children:
            if isinstance(c, Element) and c.tag in order and c.tag not in seen:
                seen.add(c.tag)
                k = next((j for j, x in enumerate(c.children)
                          if isinstance(x, Element) and order.get(x.tag, -1) > order[c.tag]), -1)
                if k >= 0:
                    inner = c.children[k]
                    tag = inner.tag if isinstance(inner, Element) else ""
                    self.problem(c, f"channel {shown(tag)} opened inside channel {shown(c.tag)}, which was not closed "
                                 "first", "unclosed-channel", path)
                    # The later channel, and all written after it, stand at
                    # the message's level.
                    out.append(Element(c.tag, c.attrs, c.children[:k], False, c.offset))
                    out.extend(self._hoist(c.children[k:], order, path, seen))
                    continue
            out.append(c)
        return tuple(out)

    # -- documents -------------------------------------------------------------

    def internal(self, el: Element, typ: str, path: str) -> tuple[SystemMessage, dict[str, str]] | None:
        body = self.text(el, path)
        for sm in self.d.system.values():
            if sm.type != typ:
                continue
            got = sm.body.match(body)
            if got is not None:
                return sm, got
        self.problem(el, f"system message of type {shown(typ)} has a body this template does not know",
                     "unknown-system-message", path)
        return None

    def conversation(self, doc: Document) -> dict[str, Any]:
        n = self.n
        d = self.d
        elements = [x for x in doc.nodes if isinstance(x, Element)]
        options: dict[str, Any] = {}
        msgs: list[dict[str, Any]] = []
        agp = False
        # Thinking mode shows in the thinking-effort message; look ahead for it
        # so assistant messages can be checked against the mode.
        thinking = any(
            e.attr(n["role"]) == "system" and e.attr(n["type"]) == d.system["thinking-effort"].type
            for e in elements)
        prior_pos: int | None = None
        prior_calls = 0
        tool_count = 0
        for k, el in enumerate(elements):
            path = f"{n['message']}[{k}]"
            if el.tag != n["message"]:
                self.problem(el, f"top-level element {shown(el.tag)} is not a {shown(n['message'])}", "unknown-element",
                             path)
                continue
            role = el.attr(n["role"])
            if not el.closed and k == len(elements) - 1 and is_generation_prompt(self.d, el, thinking):
                agp = True
                continue
            if role == "system" and el.attr(n["type"]) is not None:
                self.attrs(el, self.a_internal, path)
                hit = self.internal(el, el.attr(n["type"]) or "", path)
                if hit is None:
                    continue
                sm, values = hit
                self._option(el, sm, values, options, msgs, path)
                continue
            if role == "assistant":
                msgs.append(self.assistant(el, len(msgs), thinking, path))
                prior_pos = len(msgs) - 1
                prior_calls = len(msgs[-1].get("tool_calls", ()))
                tool_count = 0
                continue
            if role == "tool":
                a = self.attrs(el, self.a_tool, path)
                tool_count += 1
                got = a.get(n["index"])
                if got != str(tool_count):
                    self.problem(el, f"tool result index {shown(got)}, expected {str(tool_count)!r}", "bad-index",
                                 path)
                tm: dict[str, Any] = {"role": "tool", "name": a.get(n["tool"], "")}
                if prior_pos is not None and tool_count <= prior_calls:
                    call = msgs[prior_pos]["tool_calls"][tool_count - 1]
                    if call["function"]["name"] == tm["name"]:
                        tm["tool_call_id"] = call_id(prior_pos, tool_count)
                tm["content"] = self.content(el, path)
                msgs.append(tm)
                continue
            if role in ("system", "user") or (role in d.roles and role not in ("assistant", "tool")):
                a = self.attrs(el, self.a_msg, path)
                m: dict[str, Any] = {"role": role}
                if a.get(n["name"]):
                    m["name"] = a[n["name"]]
                m["content"] = self.content(el, path)
                msgs.append(m)
                continue
            self.problem(el, f"unknown role {shown(role)}", "unknown-role", path)
        req: dict[str, Any] = {"messages": msgs}
        if "tools" in options:
            req["tools"] = options["tools"]
        req["thinking"] = "thinking_effort" in options
        for key in ("thinking_effort", "tool_choice", "response_format"):
            if key in options:
                req[key] = options[key]
        req["add_generation_prompt"] = agp
        self.finish(req)
        return req

    def _option(self, el: Element, sm: SystemMessage, values: dict[str, str], options: dict[str, Any],
                msgs: list[dict[str, Any]], path: str) -> None:
        def once(key: str, value: Any) -> None:
            if key in options:
                self.problem(el, f"option {shown(key)} is given twice", "duplicate-option", path)
            options[key] = value

        def load(text: str, what: str) -> Any:
            # Standard JSON only (no NaN, no 1e999, no integer Python cannot
            # convert): what a parse returns must render again.
            try:
                return jsonfmt.loads(text)
            except jsonfmt.NotStandard as e:
                self.problem(el, f"the {what} in this system message is not standard JSON: {e}", "bad-json", path)
            except (json.JSONDecodeError, RecursionError):
                self.problem(el, f"the {what} in this system message is not JSON", "bad-json", path)
            return None

        if sm.key == "tool-declare":
            once("tools", load(values["tools"], "tool list"))
        elif sm.key == "tool-declare-dynamic":
            msgs.append({"role": "system", "content": "", "tools": load(values["tools"], "tool list")})
        elif sm.key == "thinking-effort":
            effort = values["effort"]
            if effort not in self.d.efforts:
                self.problem(el, f"unknown thinking effort {shown(effort)}", "bad-option", path)
            once("thinking_effort", effort)
        elif sm.key.startswith("tool-choice-"):
            once("tool_choice", sm.key.removeprefix("tool-choice-"))
        elif sm.key == "response-format-json-object":
            once("response_format", {"type": "json_object"})
        elif sm.key == "response-format-json-schema":
            once("response_format",
                 {"type": "json_schema", "json_schema": {"schema": load(values["schema"], "schema")}})

    def completion(self, doc: Document, thinking: bool, truncated_already: bool) -> dict[str, Any]:
        """The last message of a document made of the generation prompt and
        what the model wrote after it."""
        n = self.n
        elements = [x for x in doc.nodes if isinstance(x, Element)]
        if not elements:
            self.problem(None, "no assistant message in the completion", "empty")
            return {"role": "assistant", "content": ""}
        el = elements[-1]
        if len(elements) > 1:
            self.problem(elements[1], "output continues after the end of the message", "trailing-output")
            el = elements[0]
        if not el.closed and truncated_already is False and is_generation_prompt(self.d, el, thinking):
            # Only the generation prompt, with nothing after it.
            self.problem(None, "the completion is empty", "truncated")
        return self.assistant(el, 0, thinking, n["message"])


def parse_conversation(d: Dialect, doc: Document, *, lenient: bool) -> tuple[dict[str, Any], list[Diagnostic]]:
    r = Reader(d, lenient)
    req = r.conversation(doc)
    return req, list(doc.diagnostics) + r.diags


def parse_completion(
    d: Dialect, doc: Document, *, thinking: bool, lenient: bool, shift: int
) -> tuple[dict[str, Any], list[Diagnostic]]:
    r = Reader(d, lenient)
    msg = r.completion(doc, thinking, any(x.kind == "truncated" for x in doc.diagnostics))
    r.finish(msg)
    # Offsets count from the start of the completion, not of the prompt
    # prepended to it.
    diags = [Diagnostic(x.kind, max(0, x.offset - shift), x.message) for x in [*doc.diagnostics, *r.diags]]
    return msg, diags


__all__ = ["EndOfMessage", "parse_completion", "parse_conversation"]
