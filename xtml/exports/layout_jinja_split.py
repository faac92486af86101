"""What the Jinja chat template of a layout dialect writes for a format that
writes one request message as several of its own (spec.md §12, gpt-oss's
harmony), as :func:`~xtml.chat.layout_split_render.render_split` writes it:
the system turn with its list options (a condition per list and per value it
holds) and the tools the value syntax declares, a later message of a role
written only first left out, an answer's reasoning where the history policy
(or the end of the render) shows it, the content beside calls written as the
reasoning, the first calls only, a tool result's frame naming the call it
answers, content kept as a list and written as JSON.

Each message is refused, before its content is read, where the format's
template raises, in xtml's order: reasoning given under two names with other
text, a text the format refuses in content or reasoning, an empty list of
calls, content and reasoning both given beside calls, a tool result after no
call; then, where the format reads content as missing only beside calls, a
message without calls and without content. The tools are declared by the
value syntax's own Jinja macros (:mod:`.layout_jinja_fold`), refused first
where one spells a token.
"""

from __future__ import annotations

import dataclasses

from ..chat.layout import EACH, HISTORY, LayoutDialect
from ..chat.layout_split import CALL_NAME, ENDS, SOME_TOOLS, SYSTEM_TEXT, SplitLayout
from ..chat.layout_turn import KEEP
from ..errors import TemplateError, shown
from .jinja_text import quote as _q
from .layout_jinja_base import _Code, _Kept, _Value, _Writer
from .layout_jinja_fold import PREFIX

__all__ = ["SplitWriter"]

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
"""Where a message's reasoning is, in the order transformers aliases them."""

_MISSING = (None, "refuse", "empty", "with_calls")

_TRUTHY = (
    # Python's truth of a JSON value.
    "{%- macro x_truthy(v) -%}"
    "{{ '' if v is none or (v is boolean and not v) or (v is number and v == 0) or ((v is string or v is mapping or "
    "(v is iterable and v is not string)) and (v | length) == 0) else 'y' }}"
    "{%- endmacro -%}"
)


def _raise(message: str) -> str:
    return "{{ raise_exception(" + message + ") }}"


def _at(path: str) -> str:
    """`` (at messages[i].path)``, ``path`` a Jinja expression."""
    return "' (at messages[' ~ x_i ~ '].' ~ " + path + " ~ ')'"


def _list(xs: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_q(x) for x in xs) + "]"


class SplitWriter(_Writer):
    """The writer of a format that writes a message as several."""

    def __init__(self, d: LayoutDialect) -> None:
        sp = d.split
        if sp is None:
            raise TemplateError("the split writer writes a format that writes a message as several")
        self.sp: SplitLayout = sp
        super().__init__(d)

    # -- what cannot be written -----------------------------------------------------------------

    def _check(self) -> None:
        d, sp = self.d, self.sp
        # What the other writers share is checked on the dialect without the
        # keys only this kind has, which are checked here.
        self.d = dataclasses.replace(
            d, split=None, calls_content="keep",
            missing_by_role={r: m for r, m in d.missing_by_role.items() if m != "with_calls"},
            parts_by_role={r: p for r, p in d.parts_by_role.items() if p != KEEP})
        try:
            super()._check()
        finally:
            self.d = d
        used = {"a system turn of the format's own": d.system_turn is None,
                "calls other than rendered each": d.calls != EACH or d.calls_each is None,
                "a content cut": d.content_cut is not None,
                "reasoning split out of content": d.reasoning_split is not None, "message flags": bool(d.flags),
                "names as role text": d.role_names, "an image placeholder": d.image is not None,
                "a content suffix": d.content_suffix is not None, "arguments as pairs": d.call_pair is not None,
                "a calls section": d.calls_section is not None, "a hoisted system prompt": d.system_hoist is not None,
                "a default system prompt": d.default_system is not None, "cut ids": bool(d.id_tail),
                "roles written only first (refused)": bool(d.first_only), "tools in a turn of their own":
                    d.tools_turn is not None, "a tool declared key by key": d.tools_pair is not None,
                "results folded into the calling turn": d.call_result is not None,
                "arguments by a value syntax": bool(d.calls_syntax)}
        bad = [k for k, v in used.items() if v]
        if bad:
            raise TemplateError("the Jinja export writes a format that writes a message as several with a system "
                                "turn of its own and calls rendered each, without " + ", ".join(bad))
        for role, missing in d.missing_by_role.items():
            if missing not in _MISSING or (missing == "with_calls" and role != "assistant"):
                raise TemplateError(f"the Jinja export does not write content.missing.{role} = {missing!r} here")
        if d.content_missing == "with_calls":
            raise TemplateError("the Jinja export reads content as missing beside calls for the assistant only")
        for role, parts in d.parts_by_role.items():
            if parts == KEEP and (role == "assistant" or role not in d.roles):
                raise TemplateError(f"the Jinja export keeps a list of parts as JSON for a role other than the "
                                    f"assistant only, not {role!r}")
        if d.calls_content not in ("keep", "reasoning"):
            raise TemplateError(f"the Jinja export does not write calls.content = {d.calls_content!r} here")
        if (d.calls_content == "reasoning") != sp.content_reasoning:
            raise TemplateError("the Jinja export writes the content beside calls as the reasoning where "
                                "calls.content says so")
        for role in (*sp.drop_later, *sp.forbid):
            if role not in d.roles:
                raise TemplateError(f"the Jinja export knows no role {role!r} of the format")
        for name in sp.lists:
            self._check_name(name)

    # -- the template ----------------------------------------------------------------------------

    def format_macros(self) -> str:
        return _TRUTHY

    def read_options(self) -> str:
        return super().read_options() + "{%- set x_sp = namespace(last=none, names=[]) -%}"

    def message_checks(self) -> str:
        """The refusals of message ``x_m`` in xtml's order (see the module's
        doc); the name of the call a tool result answers, into
        ``x_sp.names``."""
        d, sp = self.d, self.sp
        out = ["{%- set x_g = namespace(ks=[], vs=[], bad=false, nm='', islist=false) -%}"]
        for k in _REASONING_KEYS:
            out.append("{%- if " + _q(k) + " in x_m and x_m[" + _q(k) + "] is not none -%}{%- set x_g.ks = x_g.ks "
                       "+ [" + _q(k) + "] -%}{%- set x_g.vs = x_g.vs + [x_m[" + _q(k) + "]] -%}{%- endif -%}")
        out += [
            # Templates read one of the names, the serving layers another.
            "{%- for x_v in x_g.vs[1:] -%}",
            "{%- set x_a = x_g.vs[0] -%}",
            "{%- if (x_a is string and x_v is string and x_a != x_v) or ((x_a is not string or x_v is not string) "
            "and x_json(x_a) != x_json(x_v)) -%}{%- set x_g.bad = true -%}{%- endif -%}",
            "{%- endfor -%}",
            "{%- if x_g.bad -%}",
            _raise("'reasoning is given as ' ~ x_g.ks[0] ~ ' and as ' ~ x_g.ks[1] ~ "
                   "', with other text: give it under one name' ~ " + _at("x_g.ks[1]")),
            "{%- endif -%}"]
        for n, (role, texts) in enumerate(sp.forbid.items()):
            out.append(("{%- if " if n == 0 else "{%- elif ") + "x_r == " + _q(role) + " -%}")
            for text in texts:
                out += ["{%- if 'content' in x_m and x_m.content is string and " + _q(text) + " in x_m.content -%}",
                        _raise(_q(f"the {d.name} format refuses {shown(text)} in content (the template raises on "
                                  "it)") + " ~ " + _at("'content'")),
                        "{%- endif -%}",
                        "{%- for x_v in x_g.vs -%}{%- if x_v is string and " + _q(text) + " in x_v -%}",
                        _raise(_q(f"the {d.name} format refuses {shown(text)} in reasoning (the template raises on "
                                  "it)") + " ~ " + _at("x_g.ks[loop.index0]")),
                        "{%- endif -%}{%- endfor -%}"]
        if sp.forbid:
            out.append("{%- endif -%}")
        names_call = any(CALL_NAME in f.open.slots() or CALL_NAME in f.close.slots()
                         for f in d.role_frames.values()) or CALL_NAME in d.frame_open.slots()
        both = ""
        if sp.content_reasoning:
            both = "".join([
                "{%- if 'content' in x_m and x_truthy(x_m.content) == 'y' and x_g.ks | length > 0 and "
                "x_truthy(x_g.vs[0]) == 'y' -%}",
                _raise(_q(f"the {d.name} format writes the content beside calls as the reasoning: give content or ")
                       + " ~ x_g.ks[0] ~ ', not both (the template raises)' ~ " + _at("x_g.ks[0]")),
                "{%- endif -%}"])
        out += [
            "{%- set x_g.nm = '' -%}",
            "{%- if x_r == 'assistant' and 'tool_calls' in x_m and x_m.tool_calls is not none -%}",
            "{%- set x_tc = x_m.tool_calls -%}",
            "{%- set x_g.islist = x_tc is not string and x_tc is not mapping and x_tc is iterable -%}",
            "{%- if x_g.islist and x_tc | length == 0 -%}",
            _raise(_q(f"the {d.name} format writes an assistant message with tool_calls as its calls: give at least "
                      "one, or no tool_calls") + " ~ " + _at("'tool_calls'")),
            "{%- endif -%}",
            both,
            "{%- set x_sp.last = none -%}",
            "{%- if x_g.islist -%}",
            "{%- set x_c0 = x_tc[0] -%}",
            "{%- set x_fn = (x_c0['function'] if 'function' in x_c0 else x_c0) if x_c0 is mapping else none -%}",
            "{%- if x_fn is mapping and 'name' in x_fn and x_fn.name is string -%}{%- set x_sp.last = x_fn.name -%}"
            "{%- endif -%}",
            "{%- endif -%}",
            # An answer ends the run of results.
            "{%- elif x_r == 'assistant' -%}{%- set x_sp.last = none -%}"]
        if names_call:
            out += ["{%- elif x_r == 'tool' -%}",
                    "{%- if x_sp.last is none -%}",
                    _raise(_q(f"the {d.name} format names a tool result by the call it answers: there is no "
                              "assistant message with calls before it, since the last answer (the template raises)")
                           + " ~ " + _at("'role'")),
                    "{%- endif -%}",
                    "{%- set x_g.nm = x_sp.last -%}"]
        out += ["{%- endif -%}", "{%- set x_sp.names = x_sp.names + [x_g.nm] -%}"]
        with_calls = [r for r, m in d.missing_by_role.items() if m == "with_calls"]
        if with_calls:
            out += ["{%- if x_r in " + _list(with_calls) + " and ('content' not in x_m or x_m.content is none) and "
                    "not ('tool_calls' in x_m and x_truthy(x_m.tool_calls) == 'y') -%}",
                    _raise(_q(f"the {d.name} format needs content on a message without calls") + " ~ "
                           + _at("'content'")),
                    "{%- endif -%}"]
        return "".join(out)

    def render(self) -> str:
        d, sp = self.d, self.sp
        opts = dict(self.options)
        out: list[str] = []
        # The list options, read after the messages, as xtml reads them.
        for k, (name, values) in enumerate(sp.lists.items()):
            var = f"x_l{k}"
            out += ["{%- set " + var + " = " + name + " if " + name + " is defined and " + name + " is not none "
                    "else none -%}",
                    "{%- if " + var + " is not none -%}",
                    "{%- set x_ok = namespace(v=" + var + " is not string and " + var + " is not mapping and " + var
                    + " is iterable) -%}",
                    "{%- if x_ok.v -%}{%- for x_v in " + var + " -%}{%- if x_v is not string -%}"
                    "{%- set x_ok.v = false -%}{%- endif -%}{%- endfor -%}{%- endif -%}",
                    "{%- if not x_ok.v -%}",
                    _raise(_q(f"{name} must be a list of names (at option {name!r})")),
                    "{%- endif -%}",
                    "{%- endif -%}"]
            opts[name] = f"{var} is not none and ({var} | length) > 0"
            opts.update({f"{name}_{v}": f"{var} is not none and {_q(v)} in {var}" for v in values})
        given = "tools is defined and tools is not none"
        out += ["{%- if " + given + " and (tools is string or tools is mapping or tools is not iterable) -%}",
                _raise(_q("tools must be a list of tool schemas (at option 'tools')")),
                "{%- endif -%}",
                "{%- set x_tl = tools if " + given + " else [] -%}"]
        if d.head is not None:
            out.append(self.pattern(d.head, {}, opts))
        out.append(self.system_turn(opts))
        out += ["{%- set x_p = namespace(prev='') -%}",
                "{%- for x_e in x.entries -%}",
                "{%- set x_k = loop.index0 -%}",
                "{%- set x_last = loop.last -%}",
                "{%- if x_k >= x.start and not (x_k > 0 and x_e[0] in " + _list(sp.drop_later) + ") -%}",
                "{%- set x_m = messages[x_k] -%}"]
        mc = {**opts, "after_user": "x_p.prev == 'user'", "after_tool": "x_p.prev == 'tool'",
              "has_calls": "x_e[3] | length > 0", ENDS: "not x.agp and x_last"}
        for n, role in enumerate(d.roles):
            r = d.roles[role]
            frame = d.role_frames.get(role)
            opening, closing = (d.frame_open, d.frame_close) if frame is None else (frame.open, frame.close)
            named = {"role": _q(r.text), CALL_NAME: "x_sp.names[x_k]"}
            if role == "assistant":
                body = self.answer(mc)
            else:
                content: _Value = "x_e[1]"
                if d.parts_by_role.get(role) == KEEP:
                    content = _Kept("(x_m.content if 'content' in x_m and x_m.content is not none and x_m.content is "
                                    "not string else none)", "x_e[1]")
                body = self.pattern(r.body, {"content": content, "tool_call_id": "x_e[5]"}, mc)
            out.append(("{%- if " if n == 0 else "{%- elif ") + "x_e[0] == " + _q(role) + " -%}"
                       + self.pattern(opening, named, mc) + body + self.pattern(closing, named, mc))
        out += ["{%- endif -%}" if d.roles else "",
                "{%- set x_p.prev = x_e[0] -%}",
                "{%- endif -%}",
                "{%- endfor -%}",
                "{%- if x.agp -%}",
                self.pattern(d.prompt, {}, {**opts, "after_user": "x_p.prev == 'user'",
                                            "after_tool": "x_p.prev == 'tool'"}),
                "{%- endif -%}"]
        return "".join(out)

    def system_turn(self, opts: dict[str, str]) -> str:
        """The format's system turn, holding the first message when it is a
        system message; ``x.start`` past it."""
        d = self.d
        turn = d.system_turn
        assert turn is not None
        declared: _Value = "''"
        if d.tools_syntax:
            spelled = _q(f"a tool's text spells one of the {d.name} format's tokens, which its declaration writes "
                         "as tokens")
            declared = _Code("".join([
                "{%- if x_tl | length > 0 -%}",
                "{%- for x_t in x_tl -%}",
                "{%- set x_at = x_spelled(x_t, '') ~ '' -%}",
                "{%- if x_at != '' -%}",
                _raise(spelled + " ~ ' (at tools[' ~ loop.index0 ~ ']' ~ x_at[1:] ~ ')'"),
                "{%- endif -%}",
                "{%- endfor -%}",
                "{{ " + PREFIX + "declare(x_tl) }}",
                "{%- endif -%}"]))
        values: dict[str, _Value] = {"system": "x.entries[0][1] if x.has_system else ''", "tools": declared}
        values.update({name: f"x_to.t{k}" for k, name in enumerate(d.text_options)})
        conds = {**opts, "has_system": "x.has_system", "has_tools": "tools is defined and tools is not none",
                 SOME_TOOLS: "x_tl | length > 0",
                 SYSTEM_TEXT: "x.has_system and 'content' in messages[0] and x_truthy(messages[0].content) == 'y'"}
        return "".join(["{%- set x.has_system = x.entries[0][0] == 'system' -%}",
                        self.pattern(turn, values, conds),
                        "{%- set x.start = 1 if x.has_system else 0 -%}"])

    def answer(self, mc: dict[str, str]) -> str:
        """Answer ``x_e``: its reasoning where shown (the content beside calls,
        where the format writes it so), its content, its first calls."""
        d, sp = self.d, self.sp
        each = d.calls_each
        assert each is not None
        kept = f"x_e[3][:{sp.keep_calls}]" if sp.keep_calls else "x_e[3]"
        given = "(x_e[2] if x_e[2] is not none else '')" if d.reasoning == HISTORY else "''"
        out = ["{%- set x_y = namespace(content=x_e[1], text='', show=false, calls=" + kept + ") -%}"]
        branch = "{%- if "
        if sp.content_reasoning:
            # Both given were refused: the one given is the reasoning.
            out += [branch + "x_y.calls | length > 0 -%}",
                    "{%- set x_y.text = x_e[1] if x_e[1] != '' else " + given + " -%}",
                    "{%- set x_y.content = '' -%}",
                    "{%- set x_y.show = x_y.text != '' and x_k > x.last_query -%}"]
            branch = "{%- elif "
        if sp.ending_given and d.reasoning == HISTORY:
            out += [branch + "not x.agp and x_last -%}",
                    "{%- set x_y.text = " + given + " -%}",
                    "{%- set x_y.show = x_e[2] is not none -%}"]
            branch = "{%- elif "
        rest = ["{%- set x_y.text = " + given + " -%}", "{%- set x_y.show = x_y.text != '' and x_k > x.last_query -%}"]
        out += (["{%- else -%}", *rest, "{%- endif -%}"] if branch != "{%- if " else rest)
        calls = _Code("{%- for x_call in x_y.calls -%}{%- set x_w = namespace(first=loop.first) -%}"
                      + self.pattern(each, {"name": "x_call[0]", "arguments": "x_call[1]", "id": "''"},
                                     {**mc, "first": "x_w.first", "has_content": "x_y.content != ''"})
                      + "{%- endfor -%}")
        out.append(self.pattern(d.roles["assistant"].body,
                                {"content": "x_y.content", "reasoning": "x_y.text", "calls": calls},
                                {**mc, "show_reasoning": "x_y.show", "has_text": "(x_trim(x_y.content) ~ '') != ''"}))
        return "".join(out)
