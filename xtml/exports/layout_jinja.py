"""A layout dialect as a Jinja chat template (``xtml export jinja`` of a
``[template] engine = "layout"`` file), for the engines that only speak
Jinja: transformers' ``apply_chat_template``, llama.cpp ``--jinja``, vLLM
``--chat-template``, the Hugging Face hub.

The template is written from the dialect's data, never from a text per
family: each of its patterns (:mod:`~xtml.chat.layout_pattern`) becomes
Jinja where it is used (literal text and tokens as string literals, slots as
the values the render gives them, ``{?cond}…{/}`` as ``if``), and the steps
of :func:`~xtml.chat.layout_render.render` over the request as
:func:`~xtml.chat.layout_request.read_request` reads it (options, declared
refusals, tools in the system turn, grouped frames, the reasoning history
policy, calls, the default system prompt, a hoisted system prompt, what a
message's frame asks of the messages before it and of its flags, a content
cut, a head, tools declared one by one in a turn of their own, a suffix
added to content, arguments as key/value pairs (:mod:`.layout_jinja_pairs`),
the generation prompt) are written as Jinja around them. This module
holds that render of a framed format and picks the writer; a format with
``[turns]`` is written by :mod:`.layout_jinja_turns`, and what both share
(the checks of the dialect, its patterns, the reading of the request, the
macros) is in :mod:`.layout_jinja_base`. The template renders what
:meth:`xtml.Template.render` renders, byte for byte, or raises
(``raise_exception``, with xtml's message) where xtml refuses the request.
What xtml drops with a diagnostic the template leaves out silently: Jinja
has no channel for diagnostics.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..chat.layout import EACH, HISTORY, SYSTEM, TURN, LayoutDialect
from ..chat.layout_pattern import Pattern
from ..errors import TemplateError
from . import layout_jinja_fold as _fold
from . import layout_jinja_pairs as _pairs
from . import layout_jinja_system as _sys
from .jinja_text import quote as _q
from .layout_jinja_base import _Code, _Parts, _Value, _Writer
from .layout_jinja_split import SplitWriter
from .layout_jinja_turns import _TurnsWriter

__all__ = ["layout_jinja_template"]


class _FramedWriter(_Writer):
    """The writer of a framed format: each message in its frame."""

    def render(self) -> str:
        d = self.d
        opts = dict(self.options)
        out: list[str] = []
        if d.head is not None:
            out.append(self.pattern(d.head, {}, opts))
        # The format's own system turn, then the tools checked where they are
        # declared before the last user message.
        out.append(_sys.system_turn(d, self.pattern, opts, _fold.tools_value(d, _Code)))
        if d.call_result is not None:
            # Results written in the turn that called for them: a loop of its own.
            out.append(_fold.render(d, self.pattern, opts, _Code))
            return "".join(out)
        prepare, declaration = _sys.declared_tools(d, self.pattern, opts, _Code)
        out.append(prepare)
        if d.tools == TURN:
            # The declaration's own turn, first; the system turn is then as
            # without tools.
            turn_ = d.tools_turn
            if turn_ is None:
                raise TemplateError("tools in their own turn need tools.turn")
            declared: _Value = "x_json(tools)"
            if d.tools_turn_each is not None:
                one = self.pattern(d.tools_turn_each, {"tool": "x_json(x_t)"}, opts)
                declared = _Code("{%- for x_t in tools -%}" + one + "{%- endfor -%}")
            out += ["{%- if x.tools -%}", self.pattern(turn_, {"tools": declared}, opts), "{%- endif -%}"]
        if d.tools == SYSTEM:
            each, block, turn = d.tools_each, d.tools_block, d.system_with_tools
            if each is None or block is None or turn is None:
                raise TemplateError("tools in the system turn need tools.each, tools.block and system.with_tools")
            each_tool = _Code("{%- for x_t in tools -%}" + self.pattern(each, {"tool": "x_json(x_t)"}, opts)
                              + "{%- endfor -%}")
            in_system = _Code(self.pattern(block, {"tools": each_tool}, opts))
            out += ["{%- if x.tools -%}",
                    "{%- set x.has_system = x.entries[0][0] == 'system' -%}",
                    self.pattern(turn, {"system": "x.entries[0][1] if x.has_system else ''", "tools": in_system},
                                 {**opts, "has_system": "x.has_system"}),
                    "{%- set x.start = 1 if x.has_system else 0 -%}"]
            if d.default_system is not None:
                out.append("{%- elif x.entries[0][0] != 'system' -%}" + self.frame("system", _q(d.default_system)))
            out.append("{%- endif -%}")
        elif d.default_system is not None:
            out += ["{%- if x.entries[0][0] != 'system' -%}", self.frame("system", _q(d.default_system)),
                    "{%- endif -%}"]
        if d.system_hoist is not None:
            # Every system message, joined, where the format writes them.
            out += ["{%- set x_h = namespace(v='', n=0) -%}",
                    "{%- for x_e in x.entries -%}{%- if x_e[0] == 'system' -%}",
                    "{%- set x_h.v = x_h.v ~ (" + _q(d.system_join) + " if x_h.n > 0 else '') ~ x_e[1] -%}",
                    "{%- set x_h.n = x_h.n + 1 -%}",
                    "{%- endif -%}{%- endfor -%}",
                    self.pattern(d.system_hoist, {"system": "x_h.v"}, opts)]
        out += ["{%- set x_p = namespace(prev='') -%}",
                "{%- for x_e in x.entries -%}",
                "{%- set x_k = loop.index0 -%}",
                "{%- set x_last = loop.last -%}",
                "{%- if x_k >= x.start -%}"]
        roles = [r for r in d.roles if not (d.system_hoist is not None and r == "system")]
        for n, role in enumerate(roles):
            out.append(("{%- if " if n == 0 else "{%- elif ") + f"x_e[0] == {_q(role)} -%}}"
                       + (_sys.declaration_before(declaration) if role == "user" else "") + self.message(role))
        if roles:
            out.append("{%- endif -%}")
        # The role of the message before the next, system messages aside.
        out += ["{%- if x_e[0] != 'system' -%}{%- set x_p.prev = x_e[0] -%}{%- endif -%}",
                "{%- endif -%}", "{%- endfor -%}"]
        if d.message_conds:
            opts.update({"after_user": "x_p.prev == 'user'", "after_tool": "x_p.prev == 'tool'"})
        out += ["{%- if x.agp -%}", self.pattern(d.prompt, {}, opts), "{%- endif -%}"]
        return "".join(out)

    def message_conds(self) -> dict[str, str]:
        """The conditions of message ``x_e``: the options, and where the
        format asks, what came before it, its calls and its flags."""
        d = self.d
        if not d.message_conds:
            return dict(self.options)
        return {**self.options, "after_user": "x_p.prev == 'user'", "after_tool": "x_p.prev == 'tool'",
                "has_calls": "x_e[3] | length > 0", **{f: f"x_e[7][{k}]" for k, f in enumerate(d.flags)}}

    def frame(self, role: str, content: str) -> str:
        """A message of ``role`` in the dialect's own frame (the default
        system prompt); ``content``: a Jinja expression."""
        d, opts = self.d, self.options
        r = d.roles[role]
        return (self.pattern(d.frame_open, {"role": _q(r.text)}, opts)
                + self.pattern(r.body, {"content": content}, opts) + self.pattern(d.frame_close, {}, opts))

    def message(self, role: str) -> str:
        """Message ``x_e`` (index ``x_k``) of ``role``."""
        d, opts = self.d, self.message_conds()
        r = d.roles[role]
        frame = d.role_frames.get(role)
        if frame is None:
            opening, closing, group = d.frame_open, d.frame_close, False
        else:
            opening, closing, group = frame.open, frame.close, frame.group
        # A name, where the format writes names, is written as the role text.
        who = f"(x_e[4] if x_e[4] != '' else {_q(r.text)})" if d.role_names else _q(r.text)
        head = self.pattern(opening, {"role": who}, opts)
        tail = self.pattern(closing, {}, opts)
        if group:
            # Messages of the role in a row share one frame.
            head = ("{%- if (x.entries[x_k - 1][0] if x_k > 0 else '') != x_e[0] -%}" + head
                    + "{%- endif -%}")
            tail = ("{%- if (x.entries[x_k + 1][0] if not x_last else '') != x_e[0] -%}" + tail
                    + "{%- endif -%}")
        if role == "assistant" and (d.reasoning == HISTORY or d.calls == EACH):
            body = self.assistant(r.body, opts)
        else:
            content = self.suffixed(role, "x_e[1]", opts)
            if role == "assistant":
                # Read without a history policy: no reasoning shown.
                opts = {**opts, "show_reasoning": "false", "has_text": self.has_text(content)}
            body = self.pattern(r.body, {"content": _Parts(content, "x_e[6]"), "tool_call_id": "x_e[5]"}, opts)
        return head + body + tail

    def suffixed(self, role: str, content: str, opts: Mapping[str, str]) -> str:
        """Message ``x_e``'s ``content`` (an expression) with the format's
        suffix added where the format adds it: the role's messages, the
        condition holding, no image parts, not already ending with it."""
        sx = self.d.content_suffix
        if sx is None or sx[0] != role:
            return content
        when = "(" + self.cond(sx[2], opts) + ") and " if sx[2] else ""
        return (f"({content} ~ {_q(sx[1])} if {when}x_e[6] | length == 0 and not {content}.endswith({_q(sx[1])}) "
                f"else {content})")

    @staticmethod
    def has_text(content: str) -> str:
        """Whether ``content`` (an expression) holds more than white space,
        as Python's str.strip() reads it."""
        return f"(x_trim({content}) ~ '') != ''"

    def assistant(self, body: Pattern, opts: Mapping[str, str]) -> str:
        """An assistant message: its content cut where the format cuts it,
        reasoning taken out of content when none is given, shown as the
        history policy says, then its calls."""
        d = self.d
        out = ["{%- set x_y = namespace(content=" + self.suffixed("assistant", "x_e[1]", opts)
               + ", reasoning=x_e[2], show=false) -%}"]
        if d.content_cut is not None:
            at, unless = d.content_cut
            keep = "not (" + self.cond(unless, opts) + ") and " if unless else ""
            out += ["{%- if " + keep + _q(at) + " in x_y.content -%}",
                    "{%- set x_y.content = x_y.content.split(" + _q(at) + ")[1:] | join(" + _q(at) + ") -%}",
                    "{%- endif -%}"]
        if d.reasoning_split is not None:
            opening, closing = d.reasoning_split
            out += ["{%- if x_y.reasoning is none and " + _q(closing) + " in x_y.content -%}",
                    "{%- set x_parts = x_y.content.split(" + _q(closing) + ") -%}",
                    "{%- set x_y.content = x_strip(x_parts[-1], true, false) ~ '' -%}",
                    "{%- set x_y.reasoning = x_strip(x_parts[0], false, true) ~ '' -%}",
                    "{%- set x_y.reasoning = x_strip(x_y.reasoning.split(" + _q(opening) + ")[-1], true, false) ~ '' "
                    "-%}",
                    "{%- endif -%}"]
        out.append("{%- set x_y.reasoning = x_y.reasoning if x_y.reasoning is not none else '' -%}")
        if d.reasoning == HISTORY:
            last = "x_last or " if d.reasoning_last else ""
            out.append("{%- set x_y.show = x_k > x.last_query and (" + last + "x_y.reasoning != '') -%}")
        calls: _Value = "''"
        if d.calls == EACH:
            each = d.calls_each
            if each is None:
                raise TemplateError("calls rendered each need calls.each")
            arguments: _Value = "x_call[1]"
            if d.call_pair is not None:
                arguments = _Code(_pairs.pairs(self.pattern(d.call_pair, _pairs.pair_values(), opts)))
            code = ("{%- for x_call in x_e[3] -%}{%- set x_w = namespace(first=loop.first) -%}"
                    + self.pattern(each, {"name": "x_call[0]", "arguments": arguments, "id": "x_call[2]"},
                                   {**opts, "first": "x_w.first", "has_content": "x_y.content != ''"})
                    + "{%- endfor -%}")
            section = d.calls_section
            if section is not None:
                # The section is written when the message has calls.
                code = ("{%- if x_e[3] | length > 0 -%}" + self.pattern(section, {"calls": _Code(code)}, opts)
                        + "{%- endif -%}")
            calls = _Code(code)
        out.append(self.pattern(body, {"content": _Parts("x_y.content", "x_e[6]"), "reasoning": "x_y.reasoning",
                                       "calls": calls},
                                  {**opts, "show_reasoning": "x_y.show", "has_text": self.has_text("x_y.content")}))
        return "".join(out)



def layout_jinja_template(d: LayoutDialect) -> str:
    """The Jinja chat template of layout dialect ``d`` (see the module's
    doc). Raises :class:`~xtml.TemplateError`, located at the dialect's
    file, for a dialect it cannot write: a field or policy it does not know
    yet, an option name that cannot be a Jinja variable, text no engine
    reads alike (a control character)."""
    try:
        writer: _Writer = (SplitWriter(d) if d.split is not None else _FramedWriter(d) if d.header_turns is None
                           else _TurnsWriter(d))
        return writer.write()
    except TemplateError as e:
        if e.location is not None:
            raise
        raise TemplateError(e.msg, location=d.path or d.name) from None

