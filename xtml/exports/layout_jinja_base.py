"""What the Jinja chat template of every layout dialect holds, whichever
writer writes its render (:mod:`.layout_jinja` for a framed format,
:mod:`.layout_jinja_turns` for a format of ``[turns]``): the refusal of a
dialect the writers do not know, at its file, before any Jinja is written;
each pattern of the dialect as Jinja; the header comment; the reading and
the checks of the options and of the messages as
:func:`~xtml.chat.layout_request.read_request` reads them; and the Jinja
macros that stand in for Python's string and JSON functions. Both renders
rely on the entries the reading leaves, so it is written once, here.

The Jinja is the subset the three engines share, as for the XTML export
(:mod:`.jinja`): every output character is written by an expression, every
string of the dialect is a string literal cut at braces (:func:`.jinja._q`),
names and prose in the header comment cannot end it (:func:`.jinja._comment`).
A dialect that uses what the writers do not know (a field they have not
learnt, a policy they cannot write) is refused at its file, never written
half-right.
"""

from __future__ import annotations

import dataclasses
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from ..chat.layout import DROP, EACH, HISTORY, LAST_USER, REFUSE, SYNTAX, SYSTEM, TURN, LayoutDialect
from ..chat.layout_pattern import Cond, Item, Lit, Pattern, Slot, Tok
from ..chat.layout_turn import KEEP, STRING, STRINGS, TURNS, TurnLayout
from ..errors import TemplateError
from . import layout_jinja_fold as _fold
from . import layout_jinja_pairs as _pairs
from . import layout_jinja_system as _sys
from .jinja_text import comment as _comment
from .jinja_text import quote as _q

# -- what the writer knows of a dialect ----------------------------------------------------------

_KNOWN = {
    # Read by the writer.
    "name", "description", "path", "reference", "roles", "frame_open", "frame_close", "prompt", "default_system",
    "content_parts", "content_missing", "calls", "tools", "reasoning", "options", "missing_by_role", "role_frames",
    "tools_each", "tools_block", "system_with_tools", "reasoning_show", "query_excludes", "reasoning_last",
    "reasoning_split", "calls_each", "role_names", "tools_turn", "calls_section", "call_ids", "call_id", "arguments",
    "parts_by_role", "image", "header_turns", "role_aliases",
    # What text the template writes does not depend on them: tokens are
    # text to a Jinja template, stops and the serving layer's answers are
    # the engine's, parseable is the parser's.
    "special", "added", "stops", "parseable", "thinking_default", "efforts", "default_effort", "thinking_off",
    # Read by the parse only (the render writes the reasoning by the
    # assistant's body).
    "reasoning_block", "reasoning_opened",
    # Read by the writer where the format has them.
    "system_hoist", "system_join", "flags", "message_conds", "content_cut", "option_aliases",
    "head", "tools_turn_each", "content_suffix", "call_pair",
    # What no reader of answers reads back yet: each thing it names is a
    # field or a condition the writer checks itself.
    "render_only",
    # A system turn of the format's own and what comes with it (.layout_jinja_system).
    *_sys.KNOWN,
    # Results folded into the calling turn, values of a value syntax (.layout_jinja_fold).
    *_fold.KNOWN,
}
"""The fields of :class:`LayoutDialect` this writer reads or knows it may
leave alone. A field it does not know (the language grows) is refused unless
it holds its default."""

_CHOICES: dict[str, tuple[object, ...]] = {
    "content_parts": (REFUSE, "join"),
    "content_missing": (REFUSE, "empty"),
    "calls": (DROP, REFUSE, EACH),
    "tools": (DROP, REFUSE, SYSTEM, TURN, TURNS, LAST_USER, SYNTAX),
    "calls_content": ("keep", DROP),
    "reasoning": (DROP, HISTORY),
    "reasoning_show": ("never", "after_last_query", "after_last_answer", "after_last_user"),
    "call_ids": ("absent", "given", "generated"),
    "arguments": ("as_given", "tojson", "string", "pairs", SYNTAX),
}

_CODECS = {"strip_nl": "x_strip({}, true, true)", "lstrip_nl": "x_strip({}, true, false)",
           "rstrip_nl": "x_strip({}, false, true)", "trim": "x_trim({})", "tojson": "x_json({})"}
"""The codecs of a slot as macros of this template: the engines' string
methods do not agree (``@huggingface/jinja``'s ``strip``, ``lstrip`` and
``rstrip`` take no characters and strip JavaScript's white space)."""

# What str.strip() strips: every character str.isspace() is true of.
_SPACES = "".join(chr(i) for i in range(0x3001) if chr(i).isspace())

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
"""Where a message's reasoning is, in the order transformers aliases them."""

_DROPPED_KEYS = ("name", "tool_call_id", "id", "tool", "tools", "annotations", "refusal", "audio")
"""Message fields the formats leave out (a declared drop), as
:func:`~xtml.chat.layout_request.read_request` lists them."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED = frozenset({
    # Jinja's words and the names every engine defines.
    "and", "or", "not", "in", "is", "if", "else", "elif", "endif", "for", "endfor", "set", "endset", "macro",
    "endmacro", "call", "endcall", "filter", "endfilter", "raw", "endraw", "block", "endblock", "extends",
    "include", "import", "from", "as", "with", "without", "context", "recursive", "true", "false", "none",
    "True", "False", "None", "loop", "self", "super", "caller", "varargs", "kwargs", "namespace", "range",
    "raise_exception", "cycler", "joiner", "lipsum", "dict",
    # The variables the engines hand a template, which mean what they mean.
    "messages", "tools", "add_generation_prompt", "continue_final_message", "documents",
})
"""Names an option cannot have: the template reads an option as the
variable of its name, and these are Jinja's or the engines' own."""


@dataclass(frozen=True, slots=True)
class _Code:
    """A slot's value that writes output (Jinja statements and output),
    where a plain value is a Jinja expression of a string."""

    code: str


@dataclass(frozen=True, slots=True)
class _Parts:
    """Content that may hold images: its text (an expression), or, when
    ``parts`` (an expression of a list) is not empty, each part, an image
    (none) as the format's placeholder. As in the render, a codec applies
    to the text only."""

    text: str
    parts: str


@dataclass(frozen=True, slots=True)
class _Kept:
    """Content a role keeps as a list of parts where one is given (``kept``,
    an expression of a list or none), written as JSON in place of the
    slot; else ``text`` (an expression) through the slot's codec."""

    kept: str
    text: str


_Value = str | _Code | _Parts | _Kept


def _out(expr: str) -> str:
    return "{{ " + expr + " }}"


def _raise(message: str) -> str:
    """``raise_exception`` of a message; ``message`` is a Jinja expression."""
    return "{{ raise_exception(" + message + ") }}"


def _at_message(path: str) -> str:
    """`` (at messages[i].path)`` as a Jinja expression, ``x_i`` the index."""
    return "' (at messages[' ~ x_i ~ ']" + (("." + path) if path else "") + ")'"


def _message_error(text: str, path: str, middle: str = "") -> str:
    """A raise with xtml's MessageError message: ``text`` (dialect text,
    made a literal) then ``middle`` (a Jinja expression, or nothing)."""
    return _raise(_q(text) + (" ~ " + middle if middle else "") + " ~ " + _at_message(path))


def _option_error(text: str, option: str) -> str:
    return _raise(_q(f"{text} (at option {option!r})"))


class _Writer(ABC):
    def __init__(self, d: LayoutDialect) -> None:
        self.d = d
        self._check()
        self.options = {name: f"x.o{k}" for k, name in enumerate(d.options)}

    # -- what cannot be written -----------------------------------------------------------------

    def _check(self) -> None:
        d = self.d
        for f in dataclasses.fields(d):
            if f.name in _KNOWN:
                continue
            value = getattr(d, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is dataclasses.MISSING or value != default:
                raise TemplateError(f"the Jinja export does not write the layout field {f.name!r} yet "
                                    f"(its value here: {value!r:.60}): render with xtml")
        for key, allowed in _CHOICES.items():
            value = getattr(d, key)
            if value not in allowed:
                raise TemplateError(f"the Jinja export does not write {key} = {value!r} yet: render with xtml")
        for role, missing in d.missing_by_role.items():
            if missing not in _CHOICES["content_missing"]:
                raise TemplateError(f"the Jinja export does not write content.missing.{role} = {missing!r} yet")
        for role, parts in d.parts_by_role.items():
            if parts not in _CHOICES["content_parts"] and not (parts == KEEP and d.header_turns is not None
                                                                and role in d.roles) and parts not in _sys.PARTS:
                raise TemplateError(f"the Jinja export does not write content.parts.{role} = {parts!r} yet")
        if (d.tools == TURNS) != (d.header_turns is not None):
            raise TemplateError("the Jinja export writes [tools] render = \"turns\" with a [turns] section only")
        for alias, role in d.role_aliases.items():
            if role not in d.roles or alias in d.roles:
                raise TemplateError(f"the Jinja export cannot write the role alias {alias!r} = {role!r}")
        if d.header_turns is not None:
            self._check_turns(d.header_turns)
            if d.flags or d.message_conds or d.system_hoist is not None or d.content_cut is not None:
                raise TemplateError("the Jinja export does not write message conditions, a hoisted system prompt "
                                    "or a content cut with a [turns] section yet")
        for name, alias in d.option_aliases.items():
            if name not in d.options:
                raise TemplateError(f"the Jinja export writes aliases of boolean options only, not of {name!r}")
            self._check_name(alias)
        if d.flags and not d.message_conds:
            raise TemplateError("the Jinja export reads message flags as conditions only")
        if d.content_cut is not None and not (d.calls == EACH or d.reasoning == HISTORY):
            raise TemplateError("the Jinja export cuts an assistant's content only where it writes its calls or "
                                "reasoning")
        if (d.arguments == "pairs") != (d.call_pair is not None) or (d.call_pair is not None and d.calls != EACH):
            raise TemplateError("the Jinja export writes arguments as pairs with calls.pair and calls rendered each "
                                "only")
        if d.tools_turn_each is not None and d.tools != TURN:
            raise TemplateError("the Jinja export writes tools one by one with tools in their own turn only")
        if d.system_hoist is not None and d.tools == SYSTEM:
            raise TemplateError("the Jinja export does not write a hoisted system prompt with tools in the system "
                                "turn yet")
        for name, default in d.options.items():
            if not isinstance(default, bool):
                raise TemplateError(f"the Jinja export writes only boolean options yet, not option {name!r}")
            self._check_name(name)
        for name in _sys.check(d):
            self._check_name(name)
        _fold.check(d)

    def _check_name(self, name: str) -> None:
        d = self.d
        if not _IDENT.fullmatch(name) or name in _RESERVED or name == "x" or name.startswith("x_"):
            raise TemplateError(f"option {name!r} cannot be a Jinja template's variable (the template reads "
                                "an option as the variable of its name): a name of letters, digits and _ that "
                                "is not one of Jinja's or the engines' own, nor x or x_…",
                                location=f"{d.path}: options.{name}" if d.path else f"options.{name}")

    def _check_turns(self, t: TurnLayout) -> None:
        """What of ``[turns]`` the writer writes: text options, the calls'
        policies it knows."""
        for name, o in t.options.items():
            if o.type not in (STRING, STRINGS) or name in self.d.options:
                raise TemplateError(f"the Jinja export does not write the option {name!r} of type {o.type!r} yet")
            self._check_name(name)
        c = t.calls
        if c.content != DROP or c.arguments not in ("tojson", "text"):
            raise TemplateError(f"the Jinja export does not write calls with content = {c.content!r} and "
                                f"arguments = {c.arguments!r} yet")
        if c.builtin is not None and (c.builtin_argument is None or c.builtin_when not in t.options
                                      or t.options[c.builtin_when].type != STRINGS):
            raise TemplateError("the Jinja export writes built-in calls with builtin_argument, and builtin_when "
                                "a list option, only")
        if t.tools_user is not None and t.tools_user_when not in self.d.options:
            raise TemplateError("the Jinja export writes tools in the user message under a boolean option only")

    # -- patterns --------------------------------------------------------------------------------

    def pattern(self, p: Pattern, values: Mapping[str, _Value], conds: Mapping[str, str]) -> str:
        return "".join(self.item(i, values, conds) for i in p.items)

    def item(self, i: Item, values: Mapping[str, _Value], conds: Mapping[str, str]) -> str:
        if isinstance(i, Lit | Tok):
            text = i.text if isinstance(i, Lit) else i.token
            return _out(_q(text)) if text else ""
        if isinstance(i, Slot):
            v = values.get(i.name)
            if v is None:
                raise TemplateError(f"the Jinja export gives no value to the slot {{{i.name}}} where the dialect "
                                    "uses it")
            if isinstance(v, _Parts):
                image = self.d.image
                text = _out(self.codec(i.codec, v.text) if i.codec else v.text)
                if image is None:
                    return text
                return ("{%- if " + v.parts + " | length > 0 -%}{%- for x_q in " + v.parts + " -%}"
                        "{%- if x_q is none -%}" + self.pattern(image, {}, self.options) + "{%- else -%}{{ x_q }}"
                        "{%- endif -%}{%- endfor -%}{%- else -%}" + text + "{%- endif -%}")
            if isinstance(v, _Kept):
                text = _out(self.codec(i.codec, v.text) if i.codec else v.text)
                return ("{%- if " + v.kept + " is not none -%}" + _out("x_json(" + v.kept + ")") + "{%- else -%}"
                        + text + "{%- endif -%}")
            if isinstance(v, _Code):
                if i.codec:
                    raise TemplateError(f"the Jinja export cannot apply {i.codec!r} to the slot {{{i.name}}}")
                return v.code
            if not i.codec:
                return _out(v)
            return _out(self.codec(i.codec, v))
        assert isinstance(i, Cond)
        test = self.cond(i.name, conds)
        body = "".join(self.item(j, values, conds) for j in i.body)
        return "{%- if " + ("not (" + test + ")" if i.negate else test) + " -%}" + body + "{%- endif -%}"

    @staticmethod
    def codec(name: str, value: str) -> str:
        form = _CODECS.get(name)
        if form is None:
            raise TemplateError(f"the Jinja export does not write the codec {name!r} yet")
        return form.format(value)

    @staticmethod
    def cond(expr: str, conds: Mapping[str, str]) -> str:
        """A condition expression in Jinja (``not`` binds tighter than
        ``and``, ``and`` than ``or``, in Jinja as in :func:`holds`)."""
        out = []
        for w in expr.split(" "):
            if w in ("and", "or", "not"):
                out.append(w)
            elif w in conds:
                out.append("(" + conds[w] + ")")
            else:
                raise TemplateError(f"the Jinja export knows no condition {w!r} where the dialect uses it")
        return " ".join(out)

    # -- the template ----------------------------------------------------------------------------

    def write(self) -> str:
        return (self.header() + _MACROS + _STRIP + (_pairs.MACROS if _sys.needs_json(self.d) else "")
                + _sys.macros(self.d) + _fold.macros(self.d, self.helpers()) + self.format_macros() + self.macros()
                + self.read_options() + self.read_messages() + self.render())

    def helpers(self) -> dict[str, bool]:
        """Which of the helper macros a value syntax calls the template
        already defines."""
        d = self.d
        py = "str" in d.parts_by_role.values() or bool(d.id_tail)
        return {"x_pfloat": _sys.needs_json(d), "x_ascii": py, "x_py": py}

    def format_macros(self) -> str:
        """Macros the format's own render calls, written before the
        dialect's."""
        return ""

    def message_checks(self) -> str:
        """The format's own refusals of message ``x_m`` (role ``x_r``, index
        ``x_i``), before its content is read."""
        return ""

    @abstractmethod
    def render(self) -> str:
        """The messages written, after they are read into ``x.entries``."""

    def header(self) -> str:
        d = self.d
        ref = d.reference
        source = f"{ref.get('template', '')} (sha256 {ref.get('sha256', '?')})" if ref else "none named"
        opts = ", ".join([*(f"{k} (default {'true' if v else 'false'}"
                            + (f"; read as {d.option_aliases[k]} when not given)" if k in d.option_aliases else ")")
                            for k, v in d.options.items()),
                          *(f"{k} ({o.type}" + (f", default {o.default!r})" if o.default is not None else ")")
                            for k, o in (d.header_turns.options if d.header_turns else {}).items())]) or "none"
        text = (f"A Jinja chat template for the {d.name} chat format, written by `xtml export jinja` from the "
                f"layout dialect file; do not edit: export it again. {d.description}\n\n"
                f"It mirrors: {source}.\n\n"
                "Variables: messages, tools, add_generation_prompt, and the format's options as keyword "
                f"arguments: {opts}. It renders what xtml renders, byte for byte, or raises where xtml refuses "
                "the request; what xtml drops with a diagnostic, it leaves out.\n\n"
                "What a Jinja template cannot give: it makes text, and the engine then tokenizes the text, so "
                "a token's spelling inside user text becomes the token (xtml encodes text and tokens apart).")
        return "{#- " + _comment(text) + " -#}\n"

    def read_options(self) -> str:
        d = self.d
        init = ", ".join(["agp=true", "tools=false", "has_system=false", "start=0", "last_query=-1", "entries=[]",
                          *(f"o{k}={'true' if v else 'false'}" for k, v in enumerate(d.options.values()))])
        out = ["{%- set x = namespace(" + init + ") -%}",
               "{%- if add_generation_prompt is defined and add_generation_prompt is not none and "
               "add_generation_prompt is not boolean -%}",
               _option_error("add_generation_prompt must be true or false", "add_generation_prompt"),
               "{%- endif -%}",
               # As xtml reads it: absent is true, none is false.
               "{%- set x.agp = add_generation_prompt is not defined or add_generation_prompt == true -%}",
               "{%- if continue_final_message is defined and continue_final_message -%}",
               _option_error(f"continue_final_message is not yet available for the layout dialect {d.name!r}",
                             "continue_final_message"),
               "{%- endif -%}"]
        for name, var in self.options.items():
            # Read under its alias when not given itself.
            alias = d.option_aliases.get(name)
            given = name + " if " + name + " is defined and " + name + " is not none else " + (
                "(" + alias + " if " + alias + " is defined else none)" if alias else "none")
            out += ["{%- set x_v = " + given + " -%}",
                    "{%- if x_v is not none -%}",
                    "{%- if x_v is not boolean -%}",
                    _option_error(f"{name} must be true or false", name),
                    "{%- endif -%}",
                    "{%- set " + var + " = x_v -%}",
                    "{%- endif -%}"]
        out.append(_sys.read_text_options(d))
        if d.tools == REFUSE:
            out += ["{%- if tools is defined and x_given(tools) == 'y' -%}",
                    _option_error(f"the {d.name} format has no place for tools", "tools"),
                    "{%- endif -%}"]
        return "".join(out)

    def read_messages(self) -> str:
        """Each message read and checked as xtml reads it, into
        ``x.entries``: [role, content, reasoning or none, [[name, arguments], …]]."""
        d = self.d
        roles = list(d.roles)
        refusing = [r for r in roles if d.missing_by_role.get(r, d.content_missing) == REFUSE]
        out = ["{%- if messages | length == 0 -%}",
               _raise(_q("messages must hold at least one message (at messages)")),
               "{%- endif -%}",
               "{%- for x_m in messages -%}",
               "{%- set x_i = loop.index0 -%}",
               "{%- if x_m is not mapping -%}",
               _message_error("a message must be an object, not ", "", "x_pytype(x_m)"),
               "{%- endif -%}",
               "{%- if 'role' not in x_m or x_m.role is not string -%}",
               _message_error("a message needs a role (a string)", "role"),
               "{%- endif -%}",
               # A role read as another (its alias) is the other from here on.
               "{%- set x_r = " + (f"{_dict(d.role_aliases)}[x_m.role] if x_m.role in {_list(list(d.role_aliases))}"
                                   " else " if d.role_aliases else "") + "x_m.role -%}",
               "{%- if x_r not in " + _list(roles) + " -%}",
               _raise("'role ' ~ x_repr(x_r) ~ " + _q(f" is not one of this format's: {', '.join(roles)}")
                      + " ~ " + _at_message("role")),
               "{%- endif -%}",
               _sys.message_checks(d),
               self.message_checks(),
               "{%- set x_y = namespace(content='', reasoning=none, calls=[], name='', call_id='', parts=[], "
               "images=false, kept=none) -%}",
               "{%- set x_c = " + _sys.content_of(d) + " -%}",
               "{%- if x_c is none -%}",
               "{%- if x_r in " + _list(refusing) + " -%}",
               "{%- if 'tool_calls' in x_m and x_m.tool_calls -%}",
               _message_error(f"the {d.name} format needs content on every message (an assistant's tool calls are "
                              "not written by this format; give content, even \"\")", "content"),
               "{%- endif -%}",
               _message_error(f"the {d.name} format needs content on every message", "content"),
               "{%- endif -%}",
               "{%- elif x_c is string -%}",
               "{%- set x_y.content = x_c -%}",
               "{%- elif x_c is mapping or x_c is not iterable -%}",
               _message_error("content must be a string, not ", "content", "x_pytype(x_c)"),
               "{%- else -%}"]
        policy = _dict({r: d.parts_by_role.get(r, d.content_parts) for r in roles}) + "[x_r]"
        with_calls = d.parts_by_role.get("with_calls")
        if with_calls:
            policy = (f"({_q(with_calls)} if x_r == 'assistant' and 'tool_calls' in x_m and x_m.tool_calls "
                      f"else {policy})")
        here = " here" if d.content_parts != REFUSE else ""
        out += ["{%- if " + policy + " == 'refuse' -%}",
                _message_error(f"the {d.name} format writes content as one string: a list of parts is not read"
                               + here, "content"),
                # Kept as given, for a body that writes the list as JSON.
                "{%- elif " + policy + " == 'keep' -%}{%- set x_y.kept = x_c -%}",
                _sys.part_policies(d, policy),
                "{%- endif -%}",
                "{%- for x_p in (x_c if x_y.kept is none"
                + (" and " + policy + " not in " + _list(_sys.PARTS) if _sys.part_policies(d, policy) else "")
                + " else []) -%}"]
        if d.image is not None:
            # An image is written as the format's placeholder.
            out += ["{%- if x_p is mapping and (x_p.type == 'image' or 'image' in x_p or 'image_url' in x_p) -%}",
                    "{%- set x_y.parts = x_y.parts + [none] -%}",
                    "{%- set x_y.images = true -%}",
                    "{%- elif x_p is string -%}",
                    "{%- set x_y.parts = x_y.parts + [x_p] -%}",
                    "{%- set x_y.content = x_y.content ~ x_p -%}",
                    "{%- elif x_p is mapping and x_p.type is string and x_p.type in ['text', 'input_text'] "
                    "and x_p.text is string -%}",
                    "{%- set x_y.parts = x_y.parts + [x_p.text] -%}",
                    "{%- set x_y.content = x_y.content ~ x_p.text -%}",
                    "{%- else -%}",
                    _raise(_q("only text and image parts are written by this format")
                           + " ~ ' (at messages[' ~ x_i ~ '].content[' ~ loop.index0 ~ '])'"),
                    "{%- endif -%}"]
        else:
            out += ["{%- if x_p is string -%}",
                    "{%- set x_y.content = x_y.content ~ x_p -%}",
                    "{%- elif x_p is mapping and x_p.type is string and x_p.type in ['text', 'input_text'] "
                    "and x_p.text is string -%}",
                    "{%- set x_y.content = x_y.content ~ x_p.text -%}",
                    "{%- else -%}",
                    _raise(_q("only text parts are written by this format")
                           + " ~ ' (at messages[' ~ x_i ~ '].content[' ~ loop.index0 ~ '])'"),
                    "{%- endif -%}"]
        out.append("{%- endfor -%}")
        out.append("{%- endif -%}")
        if d.reasoning == HISTORY:
            given = "none"
            for key in reversed(_REASONING_KEYS):
                given = f"(x_m.{key} if '{key}' in x_m and x_m.{key} is not none else {given})"
            out += ["{%- if x_r == 'assistant' -%}",
                    "{%- set x_y.reasoning = " + given + " -%}",
                    "{%- if x_y.reasoning is not none and x_y.reasoning is not string -%}",
                    _message_error("reasoning must be a string", "reasoning_content"),
                    "{%- endif -%}",
                    "{%- endif -%}"]
        if d.calls == EACH:
            out += ["{%- if x_r == 'assistant' and 'tool_calls' in x_m and x_m.tool_calls -%}",
                    "{%- if x_m.tool_calls is string or x_m.tool_calls is mapping or x_m.tool_calls is not "
                    "iterable -%}",
                    _message_error("tool_calls must be a list", "tool_calls"),
                    "{%- endif -%}",
                    _pairs.pair_arguments(d) if d.arguments == "pairs" else "",
                    "{%- for x_call in x_m.tool_calls -%}",
                    "{%- set x_at = ' (at messages[' ~ x_i ~ '].tool_calls[' ~ loop.index0 ~ ']' -%}",
                    "{%- if x_call is not mapping -%}",
                    _raise("'a tool call must be an object' ~ x_at ~ ')'"),
                    "{%- endif -%}",
                    "{%- set x_f = x_call.function if 'function' in x_call else x_call -%}",
                    "{%- if x_f is not mapping -%}",
                    _raise("\"a tool call's function must be an object\" ~ x_at ~ '.function)'"),
                    "{%- endif -%}",
                    "{%- if 'name' not in x_f or x_f.name is not string -%}",
                    _raise("'a tool call needs a name (a string)' ~ x_at ~ '.function.name)'"),
                    "{%- endif -%}",
                    _pairs.read_arguments() if d.arguments == "pairs"
                    else "{%- set x_a = x_f.arguments if 'arguments' in x_f else none -%}",
                    "{%- if x_a is not string and x_a is not mapping -%}",
                    _raise("'arguments must be a JSON object or a string' ~ x_at ~ '.function.arguments)'"),
                    "{%- endif -%}",
                    # Through tojson (numbers as Python's json.dumps spells
                    # them), or as given (a string as it is); pairs keep the
                    # object, written pair by pair.
                    "{%- set x_a = x_pjson(x_a, false) ~ '' -%}" if d.arguments == "tojson" else
                    "" if d.arguments in ("pairs", SYNTAX)
                    else "{%- set x_a = x_json(x_a) ~ '' if x_a is mapping else x_a -%}",
                    "{%- set x_y.calls = x_y.calls + [[x_f.name, x_a, '']] -%}",
                    "{%- endfor -%}",
                    self.string_arguments(),
                    self.call_ids(),
                    "{%- endif -%}"]
        if d.role_names:
            out.append("{%- if 'name' in x_m and x_m.name is string -%}{%- set x_y.name = x_m.name -%}{%- endif -%}")
        reading = [r for r, layout in d.roles.items() if "tool_call_id" in layout.body.slots()]
        if reading:
            out += ["{%- if x_r in " + _list(reading) + " and 'tool_call_id' in x_m and x_m.tool_call_id is not "
                    "none -%}",
                    "{%- if x_m.tool_call_id is not string -%}",
                    _message_error("tool_call_id must be a string", "tool_call_id"),
                    "{%- endif -%}",
                    "{%- set x_y.call_id = x_m.tool_call_id -%}",
                    "{%- endif -%}",
                    _sys.result_id_tail(d, reading)]
        # The fields the format does not read: dropped (the template leaves
        # them out), refused, or unknown.
        for f in d.flags:
            out += ["{%- if " + _q(f) + " in x_m and x_m[" + _q(f) + "] is not none and x_m[" + _q(f) + "] is not "
                    "boolean -%}",
                    _message_error(f"{f} must be true or false", f),
                    "{%- endif -%}"]
        skip = ["(x_k == 'tool_calls' and x_y.calls | length > 0)", "(x_k == 'name' and x_y.name != '')",
                "(x_k == 'tool_call_id' and x_y.call_id != '')"]
        if d.reasoning == HISTORY:
            skip.append(f"(x_k in {_list(_REASONING_KEYS)} and x_y.reasoning is not none)")
        if d.flags:
            skip.append(f"x_k in {_list(d.flags)}")
        out += ["{%- for x_k, x_v in x_m.items() -%}",
                "{%- if x_k not in ['role', 'content'] and x_given(x_v) == 'y' and not (" + " or ".join(skip) + ") -%}"]
        if d.calls == REFUSE:
            out += ["{%- if x_k == 'tool_calls' -%}",
                    _message_error(f"the {d.name} format has no tool calls", "tool_calls"),
                    "{%- endif -%}"]
        out += ["{%- if x_k not in " + _list(("tool_calls", *_REASONING_KEYS, *_DROPPED_KEYS)) + " -%}",
                _raise("'unknown message field ' ~ x_repr(x_k) ~ ' (at messages[' ~ x_i ~ '].' ~ x_k ~ ')'"),
                "{%- endif -%}",
                "{%- endif -%}",
                "{%- endfor -%}",
                "{%- set x.entries = x.entries + [[x_r, x_y.content, x_y.reasoning, x_y.calls, x_y.name, "
                "x_y.call_id, x_y.parts if x_y.images else []"
                # A format of turns reads the calls as given, and whether the
                # message has the field at all (an empty list is refused).
                + (", x_y.kept, x_m.tool_calls if 'tool_calls' in x_m and x_m.tool_calls is not none else none"
                   if d.header_turns is not None else "")
                # The message's flags, each true or false.
                + (", [" + ", ".join(f"({_q(f)} in x_m and x_m[{_q(f)}] == true)" for f in d.flags) + "]"
                   if d.flags else "") + "]] -%}",
                "{%- endfor -%}"]
        if d.reasoning == HISTORY and d.reasoning_show == "after_last_query":
            # The last user message that is a query, not tool results
            # dressed as a user message; the last message when there is none.
            query = "x_e[0] == 'user'"
            if d.query_excludes is not None:
                a, b = d.query_excludes
                query += f" and not (x_e[1].startswith({_q(a)}) and x_e[1].endswith({_q(b)}))"
            out += ["{%- set x.last_query = x.entries | length - 1 -%}",
                    "{%- set x_z = namespace(found=-1) -%}",
                    "{%- for x_e in x.entries -%}",
                    "{%- if " + query + " -%}{%- set x_z.found = loop.index0 -%}{%- endif -%}",
                    "{%- endfor -%}",
                    "{%- if x_z.found >= 0 -%}{%- set x.last_query = x_z.found -%}{%- endif -%}"]
        elif d.reasoning == HISTORY and d.reasoning_show == "after_last_user":
            # The last user message, whatever it holds; none: -1 (every answer).
            out += ["{%- set x_z = namespace(found=-1) -%}",
                    "{%- for x_e in x.entries -%}",
                    "{%- if x_e[0] == 'user' -%}{%- set x_z.found = loop.index0 -%}{%- endif -%}",
                    "{%- endfor -%}",
                    "{%- set x.last_query = x_z.found -%}"]
        elif d.reasoning == HISTORY and d.reasoning_show == "after_last_answer":
            # The last assistant message without calls; none: -1.
            out += ["{%- set x_z = namespace(found=-1) -%}",
                    "{%- for x_e in x.entries -%}",
                    "{%- if x_e[0] == 'assistant' and x_e[3] | length == 0 -%}{%- set x_z.found = loop.index0 -%}"
                    "{%- endif -%}",
                    "{%- endfor -%}",
                    "{%- set x.last_query = x_z.found -%}"]
        else:
            out.append("{%- set x.last_query = x.entries | length - 1 -%}")
        if d.tools in (SYSTEM, TURN):
            out += ["{%- if tools is defined and tools -%}",
                    "{%- if tools is string or tools is mapping or tools is not iterable -%}",
                    _option_error("tools must be a list of tool schemas", "tools"),
                    "{%- endif -%}",
                    "{%- set x.tools = true -%}",
                    "{%- endif -%}"]
        return "".join(out)

    def string_arguments(self) -> str:
        """With ``arguments = "string"`` (the template adds them to
        strings): arguments given as an object are refused."""
        if self.d.arguments != "string":
            return ""
        return "".join([
            "{%- for x_call in x_m.tool_calls -%}",
            "{%- set x_f = x_call.function if 'function' in x_call else x_call -%}",
            "{%- if x_f.arguments is not string -%}",
            _raise(_q(f"the {self.d.name} format writes arguments as given: give them as a JSON string")
                   + " ~ ' (at messages[' ~ x_i ~ '].tool_calls[' ~ loop.index0 ~ '].function.arguments)'"),
            "{%- endif -%}",
            "{%- endfor -%}"])

    def call_ids(self) -> str:
        """Each call's id (``x_y.calls[j][2]``), as the format writes ids:
        none, the request's (each must be a string), or its own spelling
        of the name and the call's index in its message."""
        d = self.d
        if d.call_ids == "absent" and d.arguments == "as_given" and d.call_id is None:
            return ""
        ident = {"absent": "''", "given": "x_g", "generated": "x_call_id(x_y.calls[loop.index0][0], loop.index0)"}
        return "".join([
            "{%- set x_w = namespace(calls=[]) -%}",
            "{%- for x_call in x_m.tool_calls -%}",
            "{%- set x_g = x_call.id if 'id' in x_call and x_call.id is not none else '' -%}",
            "{%- if x_g is not string -%}",
            _raise("\"a call's id must be a string (at messages[\" ~ x_i ~ '].tool_calls[' ~ loop.index0 ~ '].id)'"),
            "{%- endif -%}",
            "{%- set x_w.calls = x_w.calls + [[x_y.calls[loop.index0][0], x_y.calls[loop.index0][1], "
            + ident[d.call_ids] + " ~ '']] -%}",
            "{%- endfor -%}",
            "{%- set x_y.calls = x_w.calls -%}",
            _sys.id_tails(d)])

    def macros(self) -> str:
        """The dialect's own macros: the spelling of a generated call id."""
        d = self.d
        if d.call_id is None:
            return ""
        return ("{%- macro x_call_id(name, index) -%}"
                + self.pattern(d.call_id, {"name": "name", "index": "index | string"}, {})
                + "{%- endmacro -%}")


def _list(xs: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_q(x) for x in xs) + "]"


def _dict(d: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{_q(k)}: {_q(v)}" for k, v in d.items()) + "}"


def _spaces_literal() -> str:
    """Python's white space as a list of one-character string literals, each
    character written as itself (llama.cpp's engine reads no ``\\u``
    escape), the line ends escaped."""
    return "[" + ", ".join("'" + {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(ch, ch) + "'" for ch in _SPACES) + "]"


_STRIP = (
    # str.strip("\n") and its sides, by lines: the text between the first
    # and the last line that is not empty.
    "{%- macro x_strip(s, left, right) -%}"
    "{%- set p = s.split('\\n') -%}"
    "{%- set n = namespace(a=-1, b=-1) -%}"
    "{%- for q in p -%}{%- if q != '' -%}{%- if n.a < 0 -%}{%- set n.a = loop.index0 -%}{%- endif -%}"
    "{%- set n.b = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- if not left and not right -%}{{ s }}"
    "{%- elif n.b < 0 -%}{{ '' }}"
    "{%- else -%}{{ p[(n.a if left else 0):((n.b + 1) if right else (p | length))] | join('\\n') }}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    # str.strip(): Python's white space, a character at a time off either
    # end by startswith and endswith (the engines' trim filters strip other
    # characters, and llama.cpp's engine indexes a string by its bytes,
    # where a test of one character at a time would cut one in two;
    # @huggingface/jinja's length counts UTF-16 units where its slices
    # count characters, so the end is cut by a negative index).
    "{%- macro x_trim(s) -%}"
    "{%- set w = «SPACES» -%}"
    "{%- set n = namespace(s=s, a=true, b=true) -%}"
    "{%- for i in range(s | length) -%}"
    "{%- if n.a -%}{%- set n.a = false -%}{%- for c in w -%}{%- if not n.a and n.s.startswith(c) -%}"
    "{%- set n.s = n.s[c | length:] -%}{%- set n.a = true -%}{%- endif -%}{%- endfor -%}"
    "{%- elif n.b -%}{%- set n.b = false -%}{%- for c in w -%}{%- if not n.b and n.s.endswith(c) -%}"
    "{%- set n.s = n.s[:0 - (c | length)] -%}{%- set n.b = true -%}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{ n.s }}"
    "{%- endmacro -%}"
).replace("«SPACES»", _spaces_literal())


_MACROS = "".join((
    # shown() of a string: repr's quotes and escapes for what requests hold.
    "{%- macro x_repr(s) -%}",
    "{%- if s is not string -%}{{ s | string }}{%- else -%}",
    "{%- set t = s[:40] if s | length > 40 else s -%}",
    "{%- set t = t | replace('\\\\', '\\\\\\\\') | replace('\\n', '\\\\n') | replace('\\r', '\\\\r') "
    "| replace('\\t', '\\\\t') -%}",
    "{%- if \"'\" in t and '\"' not in t -%}{{ '\"' ~ t ~ '\"' }}",
    "{%- else -%}{{ \"'\" ~ (t | replace(\"'\", \"\\\\'\")) ~ \"'\" }}{%- endif -%}",
    "{%- if s | length > 40 -%}{{ '… (' ~ (s | length) ~ ' characters)' }}{%- endif -%}",
    "{%- endif -%}",
    "{%- endmacro -%}",
    "{%- macro x_pytype(v) -%}",
    "{%- if v is none -%}{{ 'NoneType' }}",
    "{%- elif v is boolean -%}{{ 'bool' }}",
    "{%- elif v is integer -%}{{ 'int' }}",
    "{%- elif v is number -%}{{ 'float' }}",
    "{%- elif v is string -%}{{ 'str' }}",
    "{%- elif v is mapping -%}{{ 'dict' }}",
    "{%- else -%}{{ 'list' }}",
    "{%- endif -%}",
    "{%- endmacro -%}",
    # Not none, "", [] or {}: what a request gives (read_request's test).
    "{%- macro x_given(v) -%}",
    "{{- '' if v is none or (v is string and v == '') or ((v is mapping or (v is iterable and v is not string)) "
    "and v | length == 0) else 'y' -}}",
    "{%- endmacro -%}",
    # JSON as transformers' tojson writes it (json.dumps with
    # ensure_ascii=False): keys in their order, ", " and ": ". tojson is
    # used for strings and numbers only, whose spelling the engines share.
    "{%- macro x_json(v) -%}",
    "{%- if v is none -%}{{ 'null' }}",
    "{%- elif v is boolean -%}{{ 'true' if v else 'false' }}",
    "{%- elif v is number and v != v -%}{{ 'NaN' }}",
    "{%- elif v is number and v * 0 != 0 -%}{{ 'Infinity' if v > 0 else '-Infinity' }}",
    "{%- elif v is string or v is number -%}{{ v | tojson }}",
    "{%- elif v is mapping -%}",
    "{{ '{' }}",
    "{%- for k, y in v.items() -%}",
    "{%- if k is string -%}{{ k | tojson }}",
    "{%- elif k is none -%}{{ '\"null\"' }}",
    "{%- elif k is boolean -%}{{ '\"true\"' if k else '\"false\"' }}",
    "{%- else -%}{{ '\"' ~ k ~ '\"' }}",
    "{%- endif -%}",
    "{{ ': ' }}{{ x_json(y) }}{%- if not loop.last -%}{{ ', ' }}{%- endif -%}",
    "{%- endfor -%}",
    "{{ '}' }}",
    "{%- else -%}",
    "{{ '[' }}",
    "{%- for y in v -%}{{ x_json(y) }}{%- if not loop.last -%}{{ ', ' }}{%- endif -%}{%- endfor -%}",
    "{{ ']' }}",
    "{%- endif -%}",
    "{%- endmacro -%}",
))
