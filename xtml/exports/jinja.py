"""A dialect as a Jinja chat template, for the engines that only speak
Jinja: transformers' ``apply_chat_template``, llama.cpp ``--jinja``, vLLM
``--chat-template``, the Hugging Face hub.

The template is written from the dialect (any dialect: markers, names,
roles, channels, options and the prose of its internal messages are read
from it), and renders what :meth:`xtml.Template.render` renders, byte for
byte, or raises (``raise_exception``) where xtml refuses the request or
where Jinja cannot do what xtml does (it cannot parse JSON, read an image's
size or compute a media prompt). It reads the variables the engines pass:
``messages``, ``tools``, ``add_generation_prompt``, and the dialect's
options as template keyword arguments, with xtml's defaults and precedence.

Written for three engines at once (Python's Jinja2 in transformers,
``@huggingface/jinja``, llama.cpp's own engine): only the syntax, filters
and tests all three have, every output character written by an expression
(so no engine's whitespace handling touches it), and JSON written by a
macro (key order, separators) with ``tojson`` used for strings and numbers
only. What the engines change before the template sees it (numbers,
object key order) is in docs/exports.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from importlib.resources import files

from ..chat.dialect import Dialect
from ..chat.layout import LayoutDialect
from ..errors import TemplateError
from .jinja_text import comment as _comment
from .jinja_text import quote as _q
from .layout_jinja import layout_jinja_template

__all__ = ["jinja_template"]

# A placeholder of the skeleton: «NAME».
_PLACEHOLDER = re.compile("«[A-Z_]+»")


def _fill(text: str, values: dict[str, str]) -> str:
    """``text`` with each placeholder replaced by its value, in one pass: a
    value is never read again, so the dialect's text in it (which may spell
    a placeholder) stays what it is."""
    def one(m: re.Match[str]) -> str:
        got = values.get(m.group())
        if got is None:
            raise TemplateError(f"the Jinja skeleton names {m.group()}, which the export does not fill",
                                location="xtml/exports/chat_template.jinja")
        return got

    return _PLACEHOLDER.sub(one, text)


# What str.strip() strips: every character str.isspace() is true of.
_SPACES = "".join(chr(i) for i in range(0x3001) if chr(i).isspace())


def _blank_chain() -> str:
    """Filters that remove every white-space character, each written as
    itself in the literal (llama.cpp's engine reads no ``\\u`` escape),
    the three that Jinja2 would normalise as line ends escaped."""
    out = []
    for ch in _SPACES:
        lit = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(ch, ch)
        out.append(f"| replace('{lit}', '')")
    return " ".join(out)


def _list(xs: Iterable[str]) -> str:
    return "[" + ", ".join(_q(x) for x in xs) + "]"


def _dict(d: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_q(k)}: {_q(v)}" for k, v in d.items()) + "}"


def _err(message: str) -> str:
    """A ``raise_exception`` call; ``message`` is a Jinja expression."""
    return "{{ raise_exception(" + message + ") }}"


class _Writer:
    def __init__(self, d: Dialect) -> None:
        self.d = d
        n = d.names
        self.n = n
        m = d.markers
        self.o, self.c, self.s, self.e = m.open, m.close, m.sep, m.end

    # -- pieces of markup, as Jinja expressions ---------------------------------------

    def open_tag(self, tag: str, attrs: str = "") -> str:
        """An open tag; ``attrs``: Jinja output of its attributes."""
        return "{{ " + _q(self.o + tag) + " }}" + attrs + "{{ " + _q(self.s) + " }}"

    def close_tag(self, tag: str) -> str:
        return "{{ " + _q(self.c + tag + self.s) + " }}"

    def attr(self, key: str, value_expr: str) -> str:
        return "{{ " + _q(f' {key}="') + " }}{{ x_attr(" + value_expr + ") }}{{ '\"' }}"

    def fixed_attr(self, key: str, value: str) -> str:
        esc = value.replace("&", "&amp;").replace('"', "&quot;")
        return "{{ " + _q(f' {key}="{esc}"') + " }}"

    def internal(self, key: str, values: dict[str, str]) -> str:
        """An internal system message; ``values``: placeholder → Jinja expression."""
        sm = self.d.system[key]
        body = sm.body
        n = self.n
        head = self.open_tag(n["message"], self.fixed_attr(n["role"], "system") + self.fixed_attr(n["type"], sm.type))
        if not body.names:
            text = "{{ " + _q(body.plain) + " }}"
        else:
            lits = list(body.pieces())
            # The rendered body is stripped: its values never start or end
            # with white space, so stripping the literals is the same.
            lits[0] = lits[0].lstrip()
            lits[-1] = lits[-1].rstrip()
            parts = []
            for k, name in enumerate(body.names):
                if name not in values:
                    raise TemplateError(f"system message {key!r} uses the placeholder {{{name}}}, which the Jinja "
                                        "export does not fill", location=f"system.{key}")
                if lits[k]:
                    parts.append("{{ " + _q(lits[k]) + " }}")
                parts.append("{{ " + values[name] + " }}")
            if lits[-1]:
                parts.append("{{ " + _q(lits[-1]) + " }}")
            text = "".join(parts)
        return head + text + self.close_tag(n["message"]) + "{{ " + _q(self.e) + " }}"

    # -- the template ----------------------------------------------------------------

    def write(self) -> str:
        d, n = self.d, self.n
        # The built-in image element is written here (it reads the
        # image_prompts option and counts images across the request); every
        # other plugin gives its own Jinja form.
        forms: list[tuple[list[str], str]] = []
        for ext in d.content:
            if ext.name == "image" and ext is d.plugins.get("image"):
                continue
            form = ext.jinja()
            if form is None:
                raise TemplateError(f"plugin {ext.name!r} has no Jinja form: the Jinja export cannot render its "
                                    "parts", location=f"plugins.{ext.name}")
            forms.append(([t for t, owner in d.part_owner.items() if owner is ext], form))
        image = d.plugins.get("image")
        grid = getattr(image, "grid", None) if image is not None else None
        images = [t for t, ext in d.part_owner.items() if ext.name == "image" and ext is image]
        embeds_begin = list(d.markers.embed_begin)
        embeds_end = list(d.markers.embed_end)
        prompt = {True: d.prompt_tag(True), False: d.prompt_tag(False)}
        ch_tags = [(ch.tag, ch.holds) for ch in d.assistant_channels]
        role_keys = {
            "system": ["role", "content", "name", "tools", "id"],
            "user": ["role", "content", "name", "id"],
            "assistant": ["role", "content", "name", "reasoning_content", "reasoning", "thinking", "tool_calls",
                          "id", "annotations"],
            "tool": ["role", "content", "name", "tool", "tool_call_id", "id"],
        }
        message_keys = ["role", "content", "name", "reasoning_content", "reasoning", "thinking", "tool_calls",
                        "tool_call_id", "tool", "tools", "id"]
        api_fields = ["refusal", "annotations", "audio", "function_call"]
        sub = {
            "«BLANK_CHAIN»": _blank_chain(),
            "«THINK»": "true" if d.thinking_default else "false",
            "«EFFORT»": _q(d.default_effort),
            "«EFFORTS»": _list(d.efforts),
            "«EFFORTS_TEXT»": _q(", ".join(d.efforts)),
            "«OFF»": _list(d.thinking_off),
            "«OFF_TEXT»": _q(f" (or {', '.join(d.thinking_off)} to switch thinking off)" if d.thinking_off else ""),
            "«OFF_WINS»": "true" if d.off_wins else "false",
            "«ALIASES»": _dict(d.role_aliases),
            "«ROLES»": _list(d.roles),
            "«ROLES_TEXT»": _q(", ".join(d.roles)),
            "«ROLE_KEYS»": "{" + ", ".join(f"{_q(r)}: {_list(ks)}" for r, ks in role_keys.items()) + "}",
            "«USER_KEYS»": _list(role_keys["user"]),
            "«MESSAGE_KEYS»": _list(message_keys),
            "«API_FIELDS»": _list(api_fields),
            "«IMAGES»": _list(images),
            "«PLUGIN_MACROS»": "".join(f"{{%- macro x_part_{k}(part, mi, where) -%}}{form}{{%- endmacro -%}}"
                                       for k, (_, form) in enumerate(forms)),
            "«PLUGIN_PARTS»": "".join(f"{{%- elif part.type is string and part.type in {_list(types)} -%}}"
                                      f"{{{{ x_part_{k}(part, mi, where) }}}}" for k, (types, _) in enumerate(forms)),
            "«MARKUP_MACROS»": self.markup_macros(),
            "«SUPPORTED»": _q(", ".join(["text", "input_text", *d.part_owner])),
            "«PLACEHOLDER»": _q(d.image_placeholder),
            "«HAS_IMAGES»": "true" if d.image_part_types else "false",
            "«GRID»": "true" if grid is not None else "false",
            "«EMBED_BEGIN»": _list(embeds_begin),
            "«EMBED_END»": _list(embeds_end),
            "«END»": "{{ " + _q(self.e) + " }}",
            "«MSG_CLOSE»": self.close_tag(n["message"]),
            "«TOOL_DECLARE»": self.internal("tool-declare", {"tools": "x_json(x.tools, true, [',', ':'], 'tools')"}),
            "«TOOL_DECLARE_DYNAMIC»": self.internal(
                "tool-declare-dynamic", {"tools": "x_json(m.tools, true, [',', ':'], 'messages[' ~ mi ~ '].tools')"}),
            "«EFFORT_MSG»": self.internal("thinking-effort", {"effort": "x.effort"}),
            "«CHOICE_REQUIRED»": self.internal("tool-choice-required", {}),
            "«CHOICE_NONE»": self.internal("tool-choice-none", {}),
            "«RF_OBJECT»": self.internal("response-format-json-object", {}),
            "«RF_SCHEMA»": self.internal("response-format-json-schema",
                                         {"schema": "x_json(x.schema, true, [',', ':'], 'response_format')"}),
            "«OPEN_TOOL»": self.open_tag(n["message"], self.fixed_attr(n["role"], "tool")
                                         + self.attr(n["tool"], "e[2]")
                                         + "{{ " + _q(f' {n["index"]}="') + " }}{{ e[1] }}{{ '\"' }}"),
            "«OPEN_MSG»": self.open_tag(n["message"], self.attr(n["role"], "role")
                                        + "{%- if name -%}" + self.attr(n["name"], "name") + "{%- endif -%}"),
            "«CHANNELS»": self.channels(ch_tags, self.calls()),
            "«PROMPT_ON»": self.prompt(prompt[True]),
            "«PROMPT_OFF»": self.prompt(prompt[False]),
        }
        sub["«ONESHOT»"] = ("{%- if x.tc == 'required' -%}" + sub["«CHOICE_REQUIRED»"]
                            + "{%- elif x.tc == 'none' -%}" + sub["«CHOICE_NONE»"] + "{%- endif -%}"
                            + "{%- if x.rf == 'json_object' -%}" + sub["«RF_OBJECT»"]
                            + "{%- elif x.rf == 'json_schema' -%}" + sub["«RF_SCHEMA»"] + "{%- endif -%}")
        header = _fill(_sections()["header"], {"«NAME»": _comment(d.name), "«DESCRIPTION»": _comment(d.description)})
        return header + _fill(_sections()["main"], sub)

    def calls(self) -> str:
        """The tools channel's body: each call of the message (``calls``)
        with its arguments."""
        n = self.n
        return _fill(_sections()["calls"], {
            "«CALL_OPEN»": self.open_tag(n["call"], self.attr(n["tool"], "fname")
                                         + "{{ " + _q(f' {n["index"]}="') + " }}{{ loop.index }}{{ '\"' }}"),
            "«CALL_CLOSE»": self.close_tag(n["call"]),
            "«ARG»": self.open_tag(n["argument"], self.attr(n["key"], "k") + self.attr(n["type"], "x_type(v)"))
            + "{%- if v is string -%}{{ v }}{%- else -%}{{ x_json(v, false, [', ', ': '], '') }}{%- endif -%}"
            + self.close_tag(n["argument"]),
        })

    def markup_macros(self) -> str:
        """``x_element``, ``x_open`` and ``x_close``: markup for plugins'
        Jinja forms, in this dialect's markers."""
        o, c, sp = _q(self.o), _q(self.c), _q(self.s)
        attrs = "{%- for a in attrs -%}{{ ' ' ~ a[0] ~ '=\"' }}{{ x_attr(a[1]) }}{{ '\"' }}{%- endfor -%}"
        return (f"{{%- macro x_open(tag, attrs) -%}}{{{{ {o} ~ tag }}}}{attrs}{{{{ {sp} }}}}{{%- endmacro -%}}"
                f"{{%- macro x_close(tag) -%}}{{{{ {c} ~ tag ~ {sp} }}}}{{%- endmacro -%}}"
                "{%- macro x_element(tag, attrs, text) -%}{{ x_open(tag, attrs) }}{{ text }}{{ x_close(tag) }}"
                "{%- endmacro -%}")

    def prompt(self, tag: str) -> str:
        n = self.n
        out = self.open_tag(n["message"], self.fixed_attr(n["role"], "assistant"))
        return out + (self.open_tag(tag) if tag else "")

    def channels(self, tags: list[tuple[str, str]], calls: str) -> str:
        """The channels of assistant message ``m`` (its reasoning in
        ``reasoning``, its calls in ``calls``); with ``hold`` the last
        channel written is left open (continue_final_message)."""
        out = []
        for tag, holds in tags:
            # Written open; closed at once unless held, and then by the next
            # channel, so that only the last one stays open.
            held = "{%- set c.last = " + _q(tag) + " -%}{%- if not hold -%}" + self.close_tag(tag) + "{%- endif -%}"
            if holds == "reasoning":
                body = "{%- if x.thinking -%}" + self.open_tag(tag) + "{{ reasoning }}" + held + "{%- endif -%}"
            elif holds == "content":
                body = self.open_tag(tag) + "{{ x_content(m.content if 'content' in m else none, mi) }}" + held
            else:
                body = "{%- if calls -%}" + self.open_tag(tag) + calls + held + "{%- endif -%}"
            # Each channel closes the one before it, held open until it is
            # known not to be the last.
            out.append("{%- if hold and c.last -%}" + "{{ " + _q(self.c) + " ~ c.last ~ " + _q(self.s) + " }}"
                       + "{%- set c.last = '' -%}{%- endif -%}" + body)
        return "".join(out)


@cache
def _sections() -> dict[str, str]:
    """The skeleton's sections (``chat_template.jinja`` beside this module)."""
    text = files(__package__).joinpath("chat_template.jinja").read_text(encoding="utf-8")
    parts = re.split(r"\{#- section: (\w+)\b.*?-#\}\n?", text, flags=re.S)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def jinja_template(d: Dialect | LayoutDialect) -> str:
    """The Jinja chat template of dialect ``d`` (see the module's doc; a
    layout dialect's is :mod:`.layout_jinja`'s). Raises
    :class:`~xtml.TemplateError` for a dialect it cannot write (a plugin
    with no Jinja form), at the plugin, or text no engine reads alike (a
    control character), at the dialect's file."""
    if isinstance(d, LayoutDialect):
        return layout_jinja_template(d)
    try:
        return _Writer(d).write()
    except TemplateError as e:
        if e.location is not None:
            raise
        raise TemplateError(e.msg, location=d.path) from None
