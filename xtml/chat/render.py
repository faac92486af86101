"""Resolved request → markup tree, and → its normal form.

Both walk the same resolved messages (:mod:`.request`), so what render puts
in the tree and what the normal form says it means cannot disagree; parse
(:mod:`.parse`) reads trees back into the normal form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import OptionError, TemplateError
from ..markup.nodes import Node
from ..markup.sink import Attrs, MarkupSink, TreeSink
from ..plugins.api import ContentExtension, Context, call_id, check_attributes
from . import channels as chan
from .dialect import Dialect
from .json_values import deep_sort, json_compact
from .options import Options
from .prompt import write_prompt
from .request import Msg, Part


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
    tb = TreeSink()
    render(d, o, msgs, tb)
    return tb.finish()


class RenderState:
    """What the channels and content plugins render with: the dialect, the
    resolved options, the sink and the per-request plugin context."""

    __slots__ = ("ctx", "d", "o", "sink")

    def __init__(self, d: Dialect, o: Options, sink: MarkupSink | None) -> None:
        self.d = d
        self.o = o
        self.sink: MarkupSink = sink if sink is not None else TreeSink()
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
    s = RenderState(d, o, sink)
    # With continue_final_message the last message is written after the
    # one-shot options, open, as the generation prompt would be.
    final = final_message(msgs) if o.continue_final else None
    render_head(s)
    message = message_renderer(s)
    for m in msgs if final is None else msgs[:-1]:
        message(m)
    render_tail(s, final)


# A render is three parts, and what each reads is all that it reads, so that
# a conversation (xtml.codec.conversation) can keep the markup of each
# message and write only what changes:
#
# * the head (render_head): the global internal messages, from the options
#   tools, thinking and effort only;
# * each message (message_renderer): from the message as resolved, the
#   thinking option, and what content plugins read (all options, through
#   their Context, and the Context state the messages before it left: the
#   image plugin counts image prompts). A message is resolved (request.py)
#   from itself and from the messages since the latest assistant message
#   before it: tool results take their index, name and order from that
#   assistant's calls and from the rest of their run;
# * the tail (render_tail): the one-shot options, the final message of
#   continue_final_message or the generation prompt, and the plugins' checks
#   over the whole request.


def _internal(s: RenderState, key: str, **values: str) -> None:
    n = s.d.names
    sm = s.d.system[key]
    s.sink.element(n["message"], ((n["role"], "system"), (n["type"], sm.type)), sm.body.render(**values), True)
    s.sink.end()


def render_head(s: RenderState) -> None:
    """The internal messages that come before every message."""
    o = s.o
    if o.tools:
        _internal(s, "tool-declare", tools=o.tools_json)
    if o.thinking:
        _internal(s, "thinking-effort", effort=o.effort)


def message_renderer(s: RenderState) -> Callable[[Msg], None]:
    """A function that emits one resolved message (with its end marker) into
    ``s.sink``, read at each call."""
    d = s.d
    n = d.names
    msg_tag, role, tool_attr, index_attr, name_attr = n["message"], n["role"], n["tool"], n["index"], n["name"]
    channels = d.assistant_channels

    def message(m: Msg) -> None:
        sink = s.sink
        if m.tools is not None:
            _internal(s, "tool-declare-dynamic", tools=m.tools_json)
            return
        if m.role == "tool":
            attrs: Attrs = ((role, "tool"), (tool_attr, m.name or ""), (index_attr, str(m.tool_index)))
        else:
            attrs = ((role, m.role), (name_attr, m.name)) if m.name else ((role, m.role),)
        if m.role == "assistant":
            sink.open(msg_tag, attrs)
            for ch in channels:
                chan.render(ch, m, s)
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

    return message


def render_tail(s: RenderState, final: Msg | None) -> None:
    """What follows the messages: the one-shot options, then the open final
    message (``final``, for continue_final_message) or the generation
    prompt; then the content plugins' checks of the whole request."""
    d, o, sink = s.d, s.o, s.sink
    n = d.names
    msg_tag, role = n["message"], n["role"]
    if o.tool_choice is not None:
        _internal(s, f"tool-choice-{o.tool_choice}")
    if o.response_format is not None:
        if o.response_format["type"] == "json_object":
            _internal(s, "response-format-json-object")
        else:
            schema = o.response_format["json_schema"]["schema"]
            _internal(s, "response-format-json-schema", schema=json_compact(schema, "response_format"))
    if final is not None:
        sink.open(msg_tag, ((role, "assistant"), (n["name"], final.name)) if final.name else ((role, "assistant"),))
        s.sink = held = _HoldLastClose(sink)
        for ch in d.assistant_channels:
            chan.render(ch, final, s)
        held.finish()
        s.sink = sink
    elif o.add_generation_prompt:
        write_prompt(d, o.thinking, sink)
    for ext in d.content:
        ext.finish_render(s.ctx)


def final_message(msgs: list[Msg]) -> Msg:
    m = msgs[-1] if msgs else None
    if m is None or m.role != "assistant":
        raise OptionError("continue_final_message continues the last message, which must be an assistant "
                          "message", option="continue_final_message")
    return m


class _HoldLastClose:
    """The sink an open final message's channels render into: everything
    passes, except that the last channel is not closed (its last top-level
    close, or its last top-level element written open)."""

    __slots__ = ("depth", "held", "sink")

    def __init__(self, sink: MarkupSink) -> None:
        self.sink = sink
        self.depth = 0
        self.held: tuple[str, Attrs, str, bool] | None = None
        """A top-level element or close waiting to see if it is the last:
        (tag, attrs, text, stable) for an element, ("", (), "", False) for a
        close."""

    def _flush(self) -> None:
        held, self.held = self.held, None
        if held is None:
            return
        tag, attrs, text, stable = held
        if tag:
            self.sink.element(tag, attrs, text, stable)
        else:
            self.sink.close()

    def open(self, tag: str, attrs: Attrs = ()) -> None:
        self._flush()
        self.depth += 1
        self.sink.open(tag, attrs)

    def close(self) -> None:
        self._flush()
        self.depth -= 1
        if self.depth == 0:
            self.held = ("", (), "", False)
        else:
            self.sink.close()

    def text(self, text: str, stable: bool = False) -> None:
        self._flush()
        self.sink.text(text, stable)

    def element(self, tag: str, attrs: Attrs, text: str, stable: bool = False) -> None:
        self._flush()
        if self.depth == 0:
            self.held = (tag, attrs, text, stable)
        else:
            self.sink.element(tag, attrs, text, stable)

    def embed(self, raw: str) -> None:
        self._flush()
        self.sink.embed(raw)

    def end(self) -> None:
        raise TemplateError("a channel tried to end the message")

    def finish(self) -> None:
        held, self.held = self.held, None
        if held is not None and held[0]:
            self.sink.open(held[0], held[1])
            if held[2]:
                self.sink.text(held[2], held[3])


def content_value(parts: list[Part], ctx: Context) -> str | list[dict[str, Any]]:
    """Content in normal form: a string when it is all text, else parts
    with adjacent text merged."""
    if all(type(p) is str for p in parts):
        return "".join(parts)  # type: ignore[arg-type]
    out: list[dict[str, Any]] = []
    # Adjacent text is joined once per run, not copied again for each piece.
    run: list[str] = []
    for p in parts:
        if type(p) is str:
            if p:
                run.append(p)
            continue
        if run:
            out.append({"type": "text", "text": "".join(run)})
            run = []
        out.append(p.ext.normal(p.value, ctx))  # type: ignore[union-attr]
    if run:
        out.append({"type": "text", "text": "".join(run)})
    return out


def normal_form(d: Dialect, o: Options, msgs: list[Msg]) -> dict[str, Any]:
    """What :func:`render_tree` means, as a request: what parse returns."""
    s = RenderState(d, o, None)
    ctx = s.ctx
    fields = tuple(ch.holds for ch in chan.in_field_order(d.assistant_channels))
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
            for holds in fields:
                chan.normal(holds, m, pos, s, msg)
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
    if o.continue_final:
        req["continue_final_message"] = True
    if o.image_prompts:
        req["image_prompts"] = list(o.image_prompts)
    for ext in d.content:
        ext.finish_normal(req, ctx)
    return req
