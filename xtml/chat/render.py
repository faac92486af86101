"""Resolved request → markup tree, and → its normal form.

Both walk the same resolved messages (:mod:`.request`), so what render puts
in the tree and what the normal form says it means cannot disagree; parse
(:mod:`.parse`) reads trees back into the normal form.
"""

from __future__ import annotations

from typing import Any

from ..errors import TemplateError
from ..markup.nodes import Node
from ..markup.sink import Attrs, MarkupSink, TreeBuilder
from ..plugins.api import ContentExtension, Context, call_id, check_attributes
from .dialect import Dialect
from .request import Msg, Options, Part, deep_sort, json_compact


class _Guard:
    """The sink a plugin renders a part into: what it opens it must close,
    and it cannot end the message."""

    __slots__ = ("depth", "ext", "sink")

    def __init__(self, sink: MarkupSink, ext: ContentExtension) -> None:
        self.sink = sink
        self.ext = ext
        self.depth = 0

    def _check(self, tag: str, attrs: Attrs) -> None:
        for k, v in attrs:
            if not isinstance(k, str) or not isinstance(v, str):
                raise TemplateError(f"plugin {self.ext.name!r} gave {tag!r} the attribute {k!r}={v!r}: attribute "
                                    "names and values are strings (format numbers with str())")
        why = check_attributes(self.ext, tag, attrs)
        if why is not None:
            raise TemplateError(f"plugin {self.ext.name!r} rendered an element its declaration refuses: {why}")

    def open(self, tag: str, attrs: Attrs = ()) -> None:
        self._check(tag, attrs)
        self.depth += 1
        self.sink.open(tag, attrs)

    def close(self) -> None:
        if self.depth == 0:
            raise TemplateError(f"plugin {self.ext.name!r} closed an element it did not open")
        self.depth -= 1
        self.sink.close()

    def text(self, text: str, stable: bool = False) -> None:
        self.sink.text(text, stable)

    def element(self, tag: str, attrs: Attrs, text: str, stable: bool = False) -> None:
        self._check(tag, attrs)
        self.sink.element(tag, attrs, text, stable)

    def embed(self, raw: str) -> None:
        self.sink.embed(raw)

    def end(self) -> None:
        raise TemplateError(f"plugin {self.ext.name!r} tried to end the message")

    def done(self) -> None:
        if self.depth:
            raise TemplateError(f"plugin {self.ext.name!r} left {self.depth} element(s) open")


def render_tree(d: Dialect, o: Options, msgs: list[Msg]) -> list[Node]:
    """The markup of a resolved request, top-level nodes in order."""
    tb = TreeBuilder()
    render(d, o, msgs, tb)
    return tb.finish()


class RenderState:
    """What the channel and content plugins render with: the dialect, the
    resolved options, the sink and the per-request plugin context."""

    __slots__ = ("ctx", "d", "o", "sink")

    def __init__(self, d: Dialect, o: Options, sink: MarkupSink | None) -> None:
        self.d = d
        self.o = o
        self.sink: MarkupSink = sink if sink is not None else TreeBuilder()
        self.ctx = Context(o)

    @property
    def names(self) -> dict[str, str]:
        return self.d.names

    @property
    def thinking(self) -> bool:
        return self.o.thinking

    @property
    def json_fallback_type(self) -> str:
        return self.d.json_fallback_type

    def body(self, parts: list[Part]) -> None:
        """Text and plugin parts, in order."""
        sink, ctx = self.sink, self.ctx
        for p in parts:
            if type(p) is str:
                sink.text(p)
            else:
                guard = _Guard(sink, p.ext)  # type: ignore[union-attr]
                p.ext.render(p.value, guard, ctx)  # type: ignore[union-attr]
                guard.done()

    def content(self, parts: list[Part]) -> str | list[dict[str, Any]]:
        return content_value(parts, self.ctx)


def render(d: Dialect, o: Options, msgs: list[Msg], sink: MarkupSink) -> None:
    """Emit the markup of a resolved request into ``sink``, in order."""
    n = d.names
    msg_tag, role, type_ = n["message"], n["role"], n["type"]
    s = RenderState(d, o, sink)
    channels = d.channel_exts

    def internal(key: str, **values: str) -> None:
        sm = d.system[key]
        sink.element(msg_tag, ((role, "system"), (type_, sm.type)), sm.body.render(**values), True)
        sink.end()

    if o.tools:
        internal("tool-declare", tools=o.tools_json)
    if o.thinking:
        internal("thinking-effort", effort=o.effort)
    for m in msgs:
        if m.tools is not None:
            internal("tool-declare-dynamic", tools=m.tools_json)
            continue
        if m.role == "tool":
            attrs: Attrs = ((role, "tool"), (n["tool"], m.name or ""), (n["index"], str(m.tool_index)))
        else:
            attrs = ((role, m.role), (n["name"], m.name)) if m.name else ((role, m.role),)
        if m.role == "assistant":
            sink.open(msg_tag, attrs)
            for ch in channels:
                ch.render(m, s)
            sink.close()
        else:
            parts = m.parts
            if not parts or (len(parts) == 1 and type(parts[0]) is str):
                # The common case in one event: what open, text, close give.
                sink.element(msg_tag, attrs, parts[0] if parts else "")  # type: ignore[arg-type]
            else:
                sink.open(msg_tag, attrs)
                s.body(parts)
                sink.close()
        sink.end()
    if o.tool_choice is not None:
        internal(f"tool-choice-{o.tool_choice}")
    if o.response_format is not None:
        if o.response_format["type"] == "json_object":
            internal("response-format-json-object")
        else:
            schema = o.response_format["json_schema"]["schema"]
            internal("response-format-json-schema", schema=json_compact(schema, "response_format"))
    if o.add_generation_prompt:
        sink.open(msg_tag, ((role, "assistant"),))
        channel = d.prompt_tag(o.thinking)
        if channel:
            sink.open(channel)
    for ext in d.content:
        ext.finish_render(s.ctx)


def content_value(parts: list[Part], ctx: Context) -> str | list[dict[str, Any]]:
    """Content in normal form: a string when it is all text, else parts
    with adjacent text merged."""
    if all(type(p) is str for p in parts):
        return "".join(parts)  # type: ignore[arg-type]
    out: list[dict[str, Any]] = []
    for p in parts:
        if type(p) is not str:
            out.append(p.ext.normal(p.value, ctx))  # type: ignore[union-attr]
        elif out and out[-1]["type"] == "text":
            out[-1]["text"] += p
        elif p:
            out.append({"type": "text", "text": p})
    return out


def normal_form(d: Dialect, o: Options, msgs: list[Msg]) -> dict[str, Any]:
    """What :func:`render_tree` means, as a request: what parse returns."""
    s = RenderState(d, o, None)
    ctx = s.ctx
    fields = sorted(d.channel_exts, key=lambda ch: ch.field_order)
    out_msgs: list[dict[str, Any]] = []
    for pos, m in enumerate(msgs):
        if m.tools is not None:
            tools = deep_sort(m.tools, f"messages[{m.index}].tools")
            out_msgs.append({"role": "system", "content": "", "tools": tools})
            continue
        if m.role == "tool":
            tm: dict[str, Any] = {"role": "tool", "name": m.name or ""}
            if m.call_ref is not None:
                tm["tool_call_id"] = call_id(*m.call_ref)
            tm["content"] = content_value(m.parts, ctx)
            out_msgs.append(tm)
            continue
        msg: dict[str, Any] = {"role": m.role}
        if m.name:
            msg["name"] = m.name
        if m.role == "assistant":
            for ch in fields:
                ch.normal(m, pos, s, msg)
        else:
            msg["content"] = content_value(m.parts, ctx)
        out_msgs.append(msg)
    req: dict[str, Any] = {"messages": out_msgs}
    if o.tools:
        req["tools"] = deep_sort(o.tools)
    req["thinking"] = o.thinking
    if o.thinking:
        req["thinking_effort"] = o.effort
    if o.tool_choice is not None:
        req["tool_choice"] = o.tool_choice
    if o.response_format is not None:
        rf = o.response_format
        if rf["type"] == "json_schema":
            schema = deep_sort(rf["json_schema"]["schema"], "response_format")
            rf = {"type": "json_schema", "json_schema": {"schema": schema}}
        req["response_format"] = rf
    req["add_generation_prompt"] = o.add_generation_prompt
    if o.image_prompts:
        req["image_prompts"] = list(o.image_prompts)
    for ext in d.content:
        ext.finish_normal(req, ctx)
    return req
