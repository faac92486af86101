"""Markup tree → request (or, for a completion, one assistant message).

The output is the normal form of :mod:`.render`: ``parse(render(x)) ==
normalize(x)``. Strict parses raise :class:`ParseError` at the first element
that is not of the dialect; lenient parses keep going, record a
:class:`~xtml.markup.nodes.Diagnostic` per repair and never raise.

A lenient parse of *text* may be asked to withhold the tool calls that exist
only because of a repair (``withhold_repaired``): in text, a marker may be a
literal the model quoted (a web page it echoes), and a repair is how quoted
markup turns into structure. A call of an assistant message is withheld when

* its tools channel was opened inside another channel of the message that
  was never closed (read out of it, with an ``unclosed-channel``
  diagnostic), or
* anything in its message was repaired before the call opened: a
  diagnostic at an offset from the message's open tag up to the call's
  (markup repairs such as a stray or mismatched marker, a channel opened
  inside another, twice or out of order, a bad value in an earlier call;
  text outside any channel is noted at the message's open tag, so it
  counts before every call of the message; an element never closed counts
  where it was closed for it, not where it opened);

and every call after a withheld one of the same message is withheld too.
Each gets a ``withheld-call`` diagnostic and is left out of ``tool_calls``;
the calls before it keep their ids. Repairs after a call opened do not
withhold it: a completion cut off inside its last call keeps it here (the
OpenAI shapes withhold a cut-off call, text or ids). Markup that is well
formed needs no repair, so quoted text that spells a whole call in the
right place is not caught: parse ids when it matters.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ParseError, shown
from ..markup.nodes import Diagnostic, Document, Element, Embed, EndOfMessage, Node, Text
from ..plugins.api import Context, call_id, check_attributes, jsonfmt
from . import channels as chan
from .dialect import Dialect, SystemMessage
from .fields import tool_problem
from .prompt import is_generation_prompt


class Reader:
    """Reads a markup tree as the dialect's requests; the channels and
    content plugins read their elements with its helpers."""

    def __init__(self, d: Dialect, lenient: bool, repairs: list[Diagnostic] | None = None) -> None:
        self.d = d
        self.n = self.names = d.names
        self.lenient = lenient
        self.diags: list[Diagnostic] = []
        self.repairs = repairs
        """The markup's repairs, when calls that exist only because of a
        repair are to be withheld (the module's docstring says which); None
        keeps every call."""
        self.hoisted: set[int] = set()
        """Ids of the channel elements read out of a channel left open."""
        self.ctx = Context(None, lambda message, kind: self.problem(None, message, kind))
        self.fields = chan.in_field_order(d.assistant_channels)
        self.reasoning_tag = d.channel_tag("reasoning")
        self.content_tag = d.channel_tag("content") or ""
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
                    seen.setdefault("_stray", Element(self.content_tag, (), (c,)))
        think = seen.get(self.reasoning_tag) if self.reasoning_tag is not None else None
        if thinking is True and think is None and not self.lenient:
            self.problem(el, "assistant message without a think channel in thinking mode", "missing-channel",
                         path)
        if thinking is False and think is not None:
            self.problem(think, "think channel in non-thinking mode", "unexpected-channel", path)
        content = self.content_tag
        if content not in seen and not self.lenient:
            self.problem(el, f"assistant message without a {content} channel", "missing-channel", path)
        if content not in seen and "_stray" in seen:
            seen[content] = seen["_stray"]
        for ch in self.fields:
            chan.read(ch, seen.get(ch.tag), msg, self, pos, path)
        if self.repairs is not None and msg.get("tool_calls"):
            self._withhold(el, seen.get(self.d.channel_tag("tool_calls") or ""), msg)
        return msg

    def _withhold(self, el: Element, tools: Element | None, msg: dict[str, Any]) -> None:
        """Take out of ``msg`` the calls that exist only because of a repair
        (the module's docstring says which), each with a diagnostic."""
        assert self.repairs is not None
        if tools is None:
            return
        calls = [c for c in tools.children if isinstance(c, Element) and c.tag == self.n["call"]]
        start = max(el.offset, 0)
        # An element never closed is reported where it opened, but repaired
        # where it was closed for it (a mismatched close, an early end,
        # reported there): that is where the repair stands.
        first = min((x.offset for x in [*self.repairs, *self.diags] if x.offset >= start and x.kind != "unclosed"),
                    default=None)
        if id(tools) in self.hoisted:
            cut, why = 0, "its tools channel was opened inside a channel that was never closed"
        else:
            # Calls stand in input order, so those after the first repair are
            # the calls from some point on.
            cut = next((k for k, c in enumerate(calls) if first is not None and first < c.offset), len(calls))
            why = "the message was repaired before it"
        found: list[dict[str, Any]] = msg["tool_calls"]
        for k in range(cut, len(found)):
            name = found[k]["function"]["name"]
            reason = why if k == cut else f"it follows call {cut + 1}, which is withheld"
            self.diags.append(Diagnostic(
                "withheld-call", max(calls[k].offset, 0),
                f"tool call {k + 1} ({name!r}) exists only because of a repair ({reason}); in text a marker may "
                "come from quoted text, so the call is withheld and must not run (parse ids, or pass "
                "repaired_calls=True to keep it)"))
        if cut:
            msg["tool_calls"] = found[:cut]
        else:
            del msg["tool_calls"]

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
                    self.hoisted.update(id(x) for x in c.children[k:] if isinstance(x, Element))
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
            except json.JSONDecodeError:
                self.problem(el, f"the {what} in this system message is not JSON", "bad-json", path)
            return None

        def tools(text: str) -> Any:
            # Render refuses a list holding anything but tool schemas, so a
            # parse keeps only the tools in it: what it returns renders again.
            value = load(text, "tool list")
            if value is None:
                return None
            if not isinstance(value, list):
                self.problem(el, "the tool list in this system message is not a list", "bad-tool", path)
                return None
            kept = []
            for j, tool in enumerate(value):
                bad = tool_problem(tool)
                if bad is None:
                    kept.append(tool)
                else:
                    self.problem(el, f"tools[{j}]{bad[0]}: {bad[1]}", "bad-tool", path)
            return kept

        if sm.key == "tool-declare":
            once("tools", tools(values["tools"]))
        elif sm.key == "tool-declare-dynamic":
            msgs.append({"role": "system", "content": "", "tools": tools(values["tools"])})
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


def parse_conversation(d: Dialect, doc: Document, *, lenient: bool,
                       withhold_repaired: bool = False) -> tuple[dict[str, Any], list[Diagnostic]]:
    """The request ``doc`` holds; ``withhold_repaired``: calls that exist
    only because of a repair are withheld (see the module's docstring)."""
    r = Reader(d, lenient, list(doc.diagnostics) if withhold_repaired else None)
    req = r.conversation(doc)
    return req, list(doc.diagnostics) + r.diags


def parse_completion(
    d: Dialect, doc: Document, *, thinking: bool, lenient: bool, shift: int, withhold_repaired: bool = False
) -> tuple[dict[str, Any], list[Diagnostic]]:
    r = Reader(d, lenient, list(doc.diagnostics) if withhold_repaired else None)
    msg = r.completion(doc, thinking, any(x.kind == "truncated" for x in doc.diagnostics))
    r.finish(msg)
    # Offsets count from the start of the completion, not of the prompt
    # prepended to it.
    diags = [Diagnostic(x.kind, max(0, x.offset - shift), x.message) for x in [*doc.diagnostics, *r.diags]]
    return msg, diags


__all__ = ["EndOfMessage", "parse_completion", "parse_conversation"]
