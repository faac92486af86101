"""A dialect: how chat requests map to XTML, read from a data file.

The file (TOML) holds every model-specific fact: marker strings, element and
attribute names, roles, thinking efforts, image settings and the prose of the
internal system messages. Loading one never runs code.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import TemplateError
from ..markup.header import is_name
from ..markup.markers import Markers
from ..plugins import get as get_plugin
from ..plugins.api import ChannelExtension, ContentExtension
from ..plugins.image import ImageExtension

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")

POSITIONS = ("global", "inline", "one-shot")


@dataclass(frozen=True, slots=True)
class Body:
    """An internal message body with ``{name}`` placeholders."""

    source: str
    """The body as written in the file."""
    names: tuple[str, ...]
    """Placeholder names in order."""
    pattern: re.Pattern[str]
    """Matches a rendered body and captures the placeholders."""
    plain: str = ""
    """The rendered body, for a body without placeholders."""
    literals: tuple[str, ...] = ("",)
    """The text around the placeholders (one more than ``names``), braces
    unescaped."""

    @classmethod
    def compile(cls, source: str, where: str) -> Body:
        names: list[str] = []
        rx: list[str] = []
        literals = [""]
        pos = 0
        for m in _PLACEHOLDER.finditer(source):
            rx.append(re.escape(source[pos : m.start()]))
            literals[-1] += source[pos : m.start()]
            tok = m.group(0)
            if tok == "{{":
                rx.append(re.escape("{"))
                literals[-1] += "{"
            elif tok == "}}":
                rx.append(re.escape("}"))
                literals[-1] += "}"
            else:
                literals.append("")
                name = m.group(1)
                if name in names:
                    raise TemplateError(f"placeholder {{{name}}} is used twice", location=where)
                names.append(name)
                rx.append(f"(?P<{name}>.*)")
            pos = m.end()
        rest = source[pos:]
        if "{" in rest.replace("{{", "") or "}" in rest.replace("}}", ""):
            raise TemplateError("a lone brace in a body; write {{ or }} for a literal one", location=where)
        rx.append(re.escape(rest))
        literals[-1] += rest
        pattern = re.compile("".join(rx), re.DOTALL)
        plain = _PLACEHOLDER.sub(lambda m: m.group(0)[0], source).strip()
        return cls(source, tuple(names), pattern, plain, tuple(literals))

    def render(self, **values: str) -> str:
        if not self.names:
            return self.plain
        lits = self.literals
        if len(lits) != len(self.names) + 1:  # made directly, not by compile()
            lits = Body.compile(self.source, "").literals
        out = [lits[0]]
        for name, lit in zip(self.names, lits[1:]):
            out.append(values[name])
            out.append(lit)
        return "".join(out).strip()

    def match(self, text: str) -> dict[str, str] | None:
        m = self.pattern.fullmatch(text)
        if m is None:
            # The rendered body was stripped: retry against the stripped form.
            m = self.pattern.fullmatch(text.strip()) if text != text.strip() else None
        return None if m is None else m.groupdict()


@dataclass(frozen=True, slots=True)
class SystemMessage:
    """An internal system message: an option or a declaration, as prose."""

    key: str
    """The entry's name in the file."""
    type: str
    """The value of the ``type`` attribute."""
    position: str
    """``global`` (before the history), ``inline`` (in place of a message) or
    ``one-shot`` (after the history, before the generation prompt)."""
    body: Body


@dataclass(frozen=True, slots=True)
class Training:
    """Which parts of a rendered request a loss mask trains by default."""

    roles: tuple[str, ...] = ("assistant",)
    """Messages of these roles are trained."""
    channels: tuple[str, ...] = ()
    """Names of the channel elements of a trained message that are trained,
    tags included. Empty: the whole message body."""
    exclude: tuple[str, ...] = ()
    """Element names never trained, even inside a trained channel."""
    end: bool = True
    """Whether a trained message's end-of-message marker is trained."""
    budgets: dict[str, int] = field(default_factory=dict)
    """Token budget of the think channel per thinking effort."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """Everything the chat layer needs to know about one model's format."""

    name: str
    description: str
    markers: Markers
    names: dict[str, str]
    roles: tuple[str, ...]
    role_aliases: dict[str, str]
    thinking_default: bool
    efforts: tuple[str, ...]
    default_effort: str
    thinking_off: tuple[str, ...]
    image_placeholder: str
    """Empty when the template has no images."""
    image_part_types: tuple[str, ...]
    image_prompt: re.Pattern[str]
    json_fallback_type: str
    system: dict[str, SystemMessage]
    path: str
    channel_order: tuple[str, ...] = ("think", "response", "tools")
    """Keys (in ``names``) of an assistant message's channels, in the order
    they are written."""
    prompt_channel: tuple[str, str] = ("response", "think")
    """Keys of the channel the generation prompt opens without and with
    thinking; empty: none."""
    plugins: dict[str, Any] = field(default_factory=dict)
    """Enabled plugins: name → the configuration the plugin made of its
    settings (for content plugins, their extension)."""
    part_owner: dict[str, ContentExtension] = field(default_factory=dict)
    """Content-part type → the extension that renders it."""
    element_owner: dict[str, ContentExtension] = field(default_factory=dict)
    """Element name inside a message body → the extension that reads it."""
    embed_readers: tuple[ContentExtension, ...] = ()
    """Extensions that read embeds back, in the file's order."""
    content: tuple[ContentExtension, ...] = ()
    """Every content extension, in the file's order."""
    grammar: str = ""
    """The reference grammar with the plugins' fragments."""
    channel_exts: tuple[ChannelExtension, ...] = ()
    """The channel plugins of ``channel_order``, in that order."""
    training: Training = field(default_factory=lambda: Training())

    def n(self, key: str) -> str:
        """An element or attribute name by its role (``message``, ``role`` ...)."""
        return self.names[key]

    def channels(self) -> tuple[str, ...]:
        """Element names of the assistant channels, in order."""
        return tuple(self.names[k] for k in self.channel_order)

    def prompt_tag(self, thinking: bool) -> str:
        """The element name the generation prompt opens, or ``""``."""
        key = self.prompt_channel[thinking]
        return self.names[key] if key else ""


SECTIONS = ("template", "markers", "names", "roles", "channels", "generation", "thinking", "plugins",
            "json_fallback", "system", "training")
_CHANNELS = ("think", "response", "tools")
NAME_KEYS = ("message", "think", "response", "tools", "call", "argument", "json",
             "role", "name", "type", "tool", "index", "key")
# The values each internal message body is given.
PLACEHOLDERS = {
    "tool-declare": frozenset({"tools"}),
    "tool-declare-dynamic": frozenset({"tools"}),
    "thinking-effort": frozenset({"effort"}),
    "response-format-json-schema": frozenset({"schema"}),
}
SYSTEM_KEYS = ("tool-declare", "tool-declare-dynamic", "thinking-effort", "tool-choice-required",
               "tool-choice-none", "response-format-json-object", "response-format-json-schema")
_MARKER_KEYS = ("open", "close", "sep", "end", "embed_begin", "embed_inner", "embed_end", "embed_mark",
                "optional", "stop")
_NEVER = re.compile("(?!)")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a template file."""

    message: str
    key: str
    """Dotted key path of the offending value (``markers.open``), or ``""``
    for the file as a whole."""
    hint: str = ""
    line: int | None = None
    column: int | None = None

    def where(self, file: str) -> str:
        pos = f"{file}:{self.line}:{self.column}" if self.line is not None else file
        return f"{pos}: {self.key}" if self.key else pos


class _Stop(Exception):
    """A section is too broken to read further; its problem is recorded."""


class _Check:
    """Collects problems so a file's every mistake is reported at once; the
    loader raises the first, ``xtml validate`` lists them all."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, message: str, key: str, hint: str = "") -> None:
        self.problems.append(Problem(message, key, hint))

    def keys(self, d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for k in d:
            if k not in allowed:
                close = difflib.get_close_matches(k, allowed, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed here: {', '.join(allowed)}"
                self.add(f"unknown key {k!r}", _join(where, k), hint)

    def table(self, d: dict[str, Any], key: str, where: str, *, required: bool = True) -> dict[str, Any]:
        if key not in d:
            if required:
                full = _join(where, key)
                self.add(f"missing [{full}] table", full, f"add a [{full}] table")
            return {}
        v = d[key]
        if not isinstance(v, dict):
            self.add(f"{key!r} must be a table, not {_toml_type(v)}", _join(where, key))
            return {}
        return v

    def value(self, d: dict[str, Any], key: str, typ: type, where: str, default: Any = _Stop) -> Any:
        here = _join(where, key)
        if key not in d:
            if default is _Stop:
                self.add(f"missing key {key!r}", here, f"add {key} = <{_toml_name(typ)}>")
                raise _Stop
            return default
        v = d[key]
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            self.add(f"{key!r} must be {_toml_name(typ)}, not {_toml_type(v)}", here)
            raise _Stop
        return v

    def strings(self, d: dict[str, Any], key: str, where: str, default: list[str] | None = None) -> tuple[str, ...]:
        v = self.value(d, key, list, where, default=default if default is not None else _Stop)
        if not all(isinstance(x, str) for x in v):
            self.add(f"{key!r} must be a list of strings", _join(where, key))
            raise _Stop
        return tuple(v)

    def section(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self, *args)
        except _Stop:
            return None
        except TemplateError as e:
            self.add(e.msg, e.location or "")
            return None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _toml_name(typ: type) -> str:
    return {str: "a string", list: "an array", dict: "a table", bool: "true or false", int: "an integer"}.get(
        typ, typ.__name__)


def _toml_type(v: Any) -> str:
    for typ in (bool, str, list, dict, int, float):
        if isinstance(v, typ):
            return _toml_name(typ).removeprefix("a ").removeprefix("an ")
    return type(v).__name__


def _markers(c: _Check, data: dict[str, Any]) -> Markers:
    mk = c.table(data, "markers", "")
    c.keys(mk, _MARKER_KEYS, "markers")
    single = {k: c.section(lambda c, k=k: c.value(mk, k, str, "markers")) for k in ("open", "close", "sep", "end")}
    groups = {k: c.section(lambda c, k=k: c.strings(mk, k, "markers", [])) or ()
              for k in ("embed_begin", "embed_inner", "embed_end", "embed_mark", "optional", "stop")}
    if any(v is None for v in single.values()):
        raise _Stop
    where: dict[str, str] = {}
    keyed = [(f"markers.{k}", v) for k, v in single.items()]
    for k in ("embed_begin", "embed_inner", "embed_end", "embed_mark"):
        keyed += [(f"markers.{k}[{j}]", v) for j, v in enumerate(groups[k])]
    for key, v in keyed:
        if v in where:
            c.add(f"marker {v!r} is used twice ({where[v]} and {key})", key, "every marker needs its own string")
        where.setdefault(v, key)
    for v, key in where.items():
        if not v:
            c.add("a marker string is empty", key)
    for a, ka in where.items():
        for b, kb in where.items():
            if a and a != b and a in b:
                c.add(f"marker {a!r} ({ka}) is contained in marker {b!r} ({kb}), so text could not be split",
                      ka, "choose strings where neither is part of the other")
    for k in ("optional", "stop"):
        for v in groups[k]:
            if v not in where:
                c.add(f"{v!r} is not one of the markers", f"markers.{k}", "list marker strings defined above")
    stop = groups["stop"] or (single["end"],)
    if c.problems:
        raise _Stop
    return Markers(open=single["open"], close=single["close"], sep=single["sep"], end=single["end"],
                   embed_begin=groups["embed_begin"], embed_inner=groups["embed_inner"],
                   embed_end=groups["embed_end"], embed_mark=groups["embed_mark"],
                   optional=frozenset(groups["optional"]), stop=stop)


def _names(c: _Check, data: dict[str, Any]) -> dict[str, str]:
    nm = c.table(data, "names", "")
    c.keys(nm, NAME_KEYS, "names")
    names: dict[str, str] = {}
    for k in NAME_KEYS:
        v = c.section(lambda c, k=k: c.value(nm, k, str, "names"))
        if v is None:
            continue
        if not is_name(v):
            c.add(f"{v!r} is not a valid tag or attribute name", f"names.{k}",
                  "a name starts with a letter or _ and holds letters, digits, _ - . :")
        names[k] = v
    elements = [k for k in ("message", "think", "response", "tools", "call", "argument", "json") if k in names]
    seen: dict[str, str] = {}
    for k in elements:
        if names[k] in seen:
            c.add(f"element name {names[k]!r} is used for both {seen[names[k]]} and {k}", f"names.{k}",
                  "each element needs its own name")
        seen.setdefault(names[k], k)
    if len(names) != len(NAME_KEYS):
        raise _Stop
    # Attributes that stand together on one element need distinct names, or
    # parse would read one as the other given twice.
    together = {"message": ("role", "name", "type", "tool", "index"), "call": ("tool", "index"),
                "argument": ("key", "type")}
    for element, keys in together.items():
        used: dict[str, str] = {}
        for k in keys:
            if names[k] in used:
                c.add(f"attribute name {names[k]!r} is used for both {used[names[k]]} and {k}, which stand "
                      f"together on a {element} element", f"names.{k}", "give each attribute its own name")
            used.setdefault(names[k], k)
    return names


def _roles(c: _Check, data: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, str]]:
    ro = c.table(data, "roles", "")
    c.keys(ro, ("accepted", "aliases"), "roles")
    roles = c.strings(ro, "accepted", "roles")
    for r in ("system", "user", "assistant", "tool"):
        if r not in roles:
            c.add(f"roles.accepted must include {r!r}", "roles.accepted")
    aliases = c.value(ro, "aliases", dict, "roles", default={})
    for k, v in aliases.items():
        if not isinstance(v, str) or v not in roles:
            c.add(f"alias {k!r} must name an accepted role", f"roles.aliases.{k}")
    return roles, dict(aliases)


def _thinking(c: _Check, data: dict[str, Any]) -> tuple[bool, tuple[str, ...], str, tuple[str, ...]]:
    th = c.table(data, "thinking", "")
    c.keys(th, ("default", "efforts", "default_effort", "off"), "thinking")
    default = c.value(th, "default", bool, "thinking", default=True)
    efforts = c.strings(th, "efforts", "thinking")
    if not efforts:
        c.add("efforts must not be empty", "thinking.efforts")
        raise _Stop
    effort = c.value(th, "default_effort", str, "thinking")
    if effort not in efforts:
        c.add(f"default_effort {effort!r} is not one of efforts", "thinking.default_effort",
              f"pick one of {', '.join(efforts)}")
    off = c.strings(th, "off", "thinking", [])
    return default, efforts, effort, off


def _channels(c: _Check, data: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, str],
                                                     tuple[ChannelExtension, ...]]:
    ch = c.table(data, "channels", "", required=False)
    c.keys(ch, ("order",), "channels")
    order = c.strings(ch, "order", "channels", list(_CHANNELS))
    if sorted(order) != sorted(_CHANNELS):
        c.add(f"order must list each of {', '.join(_CHANNELS)} once", "channels.order")
    exts: list[ChannelExtension] = []
    for name in order:
        # The channels come through the plugin door like every element.
        try:
            ext = get_plugin(name, "channels.order").configure({}, "channels.order")
        except TemplateError as e:
            close = difflib.get_close_matches(name, _CHANNELS, n=1)
            c.add(e.msg, "channels.order", f"did you mean {close[0]!r}?" if close else "")
            continue
        if not isinstance(ext, ChannelExtension):
            c.add(f"plugin {name!r} is not a channel", "channels.order")
            continue
        exts.append(ext)
    gen = c.table(data, "generation", "", required=False)
    c.keys(gen, ("plain", "thinking"), "generation")
    picked: list[str] = []
    for mode, default in (("plain", "response"), ("thinking", "think")):
        v = c.value(gen, mode, str, "generation", default=default)
        if v and v not in _CHANNELS:
            c.add(f"{mode} must be one of {', '.join(_CHANNELS)}, or \"\" to open none", f"generation.{mode}")
        picked.append(v)
    if sorted(order) == sorted(_CHANNELS):
        for mode, p in (("plain", picked[0]), ("thinking", picked[1])):
            # What the prompt opens is where the model starts writing: a
            # channel before it in the order could never follow.
            if p and order.index("response") < order.index(p):
                c.add(f"the {mode} generation prompt opens {p!r}, which the order puts after 'response': "
                      "a completion could never hold a response", f"generation.{mode}",
                      "put the opened channel before response in [channels] order")
    return order, (picked[0], picked[1]), tuple(exts)


def _plugins(c: _Check, data: dict[str, Any]) -> dict[str, Any]:
    pl = c.table(data, "plugins", "", required=False)
    out: dict[str, Any] = {}
    for name, settings in pl.items():
        here = f"plugins.{name}"
        if not isinstance(settings, dict):
            c.add(f"[{here}] must be a table of settings", here)
            continue
        try:
            out[name] = get_plugin(name, here).configure(settings, here)
        except TemplateError as e:
            hint = "pip install the package that provides it" if "not installed" in e.msg else ""
            c.add(e.msg, e.location or here, hint)
        except Exception as e:  # a plugin's own bug must not pass for a valid template
            c.add(f"plugin {name!r} failed on its settings: {type(e).__name__}: {e}", here)
    images = out.get("image")
    if images is not None and not isinstance(images, ImageExtension):
        c.add("the plugin named 'image' must configure images", "plugins.image")
        del out["image"]
    return out


def _content(c: _Check, plugins: dict[str, Any], names: dict[str, str], marker_strings: frozenset[str]) -> tuple[
        dict[str, ContentExtension], dict[str, ContentExtension], str]:
    """Who owns each part type and element; the combined grammar. Two
    plugins claiming one name, or fragments that conflict, fail here."""
    from ..plugins.grammar import combine

    parts: dict[str, tuple[str, ContentExtension]] = {}
    elements: dict[str, tuple[str, ContentExtension]] = {}
    reserved = {v: k for k, v in names.items() if k in ("message", "think", "response", "tools", "call",
                                                          "argument", "json")}
    fragments: list[tuple[str, str]] = []
    for pname, ext in plugins.items():
        if not isinstance(ext, ContentExtension):
            continue
        for t in ext.part_types:
            if t in ("text", "input_text"):
                c.add(f"plugin {pname!r} claims the text part type {t!r}", f"plugins.{pname}")
            elif t in parts:
                c.add(f"content part type {t!r} is claimed by plugins {parts[t][0]!r} and {pname!r}",
                      f"plugins.{pname}", "enable only one of them, or change one's part_types")
            else:
                parts[t] = (pname, ext)
        for e, spec in ext.attributes.items():
            bad = [k for k in spec if not is_name(k)] + [f"{k} ({t!r})" for k, t in spec.items()
                                                         if t not in (str, int, float, bool)]
            if e not in ext.elements or bad:
                c.add(f"plugin {pname!r} declares attributes badly for {e!r}: "
                      f"{'not one of its elements' if e not in ext.elements else ', '.join(bad)}",
                      f"plugins.{pname}")
        for e in ext.elements:
            if not is_name(e):
                c.add(f"plugin {pname!r} owns {e!r}, which is not a valid element name", f"plugins.{pname}")
            elif e in reserved:
                c.add(f"plugin {pname!r} owns element {e!r}, which this template uses for {reserved[e]}",
                      f"plugins.{pname}")
            elif e in elements:
                c.add(f"element {e!r} is claimed by plugins {elements[e][0]!r} and {pname!r}", f"plugins.{pname}")
            else:
                elements[e] = (pname, ext)
        for mk in ext.markers:
            if mk not in marker_strings:
                c.add(f"plugin {pname!r} writes {mk!r} as a marker, but it is not one of the template's markers",
                      f"plugins.{pname}", "add it to [markers] (embed_inner or embed_mark)")
        if ext.grammar:
            fragments.append((pname, ext.grammar))
    grammar = ""
    try:
        grammar = combine(fragments)
    except TemplateError as e:
        c.add(e.msg, "plugins", "plugins whose grammar fragments conflict cannot be enabled together")
    return ({k: v for k, (_, v) in parts.items()}, {k: v for k, (_, v) in elements.items()}, grammar)


def _system(c: _Check, data: dict[str, Any]) -> dict[str, SystemMessage]:
    sysd = c.table(data, "system", "")
    c.keys(sysd, SYSTEM_KEYS, "system")
    system: dict[str, SystemMessage] = {}
    for key in SYSTEM_KEYS:
        sm = c.section(_system_entry, sysd, key)
        if sm is not None:
            system[key] = sm
    if len(system) != len(SYSTEM_KEYS):
        raise _Stop
    # Parse finds an internal message by its type and body: a body another
    # entry of the same type also matches would be read as that one.
    for key, sm in system.items():
        sample = sm.body.render(**dict.fromkeys(sm.body.names, "x"))
        for other, om in system.items():
            if other != key and om.type == sm.type and om.body.match(sample) is not None:
                c.add(f"the body of system.{key} also reads as system.{other} (both of type {sm.type!r}), so "
                      f"parse could not tell them apart", f"system.{key}.body",
                      "make the two bodies differ, or give them different types")
                break
    return system


def _system_entry(c: _Check, sysd: dict[str, Any], key: str) -> SystemMessage:
    where = f"system.{key}"
    entry = c.table(sysd, key, "system")
    if not entry:
        raise _Stop
    c.keys(entry, ("type", "position", "body"), where)
    pos = c.value(entry, "position", str, where)
    if pos not in POSITIONS:
        c.add(f"position {pos!r} is not one of {', '.join(POSITIONS)}", f"{where}.position")
    body = Body.compile(c.value(entry, "body", str, where), f"{where}.body")
    want = PLACEHOLDERS.get(key, frozenset())
    takes = ", ".join("{" + n + "}" for n in sorted(want)) or "no placeholder"
    for name in body.names:
        if name not in want:
            c.add(f"unknown placeholder {{{name}}}", f"{where}.body", f"this body takes {takes}")
    for name in sorted(want - set(body.names)):
        c.add(f"missing placeholder {{{name}}}", f"{where}.body", f"this body takes {takes}")
    typ = c.value(entry, "type", str, where, default=key)
    return SystemMessage(key, typ, pos, body)


def _training(c: _Check, data: dict[str, Any], efforts: tuple[str, ...], names: dict[str, str]) -> Training:
    where = "training"
    tr = c.table(data, "training", "", required=False)
    c.keys(tr, ("roles", "channels", "exclude", "end", "budgets"), where)
    budgets = c.value(tr, "budgets", dict, where, default={})
    for k, v in budgets.items():
        if efforts and k not in efforts:
            c.add(f"budget for unknown effort {k!r}", f"{where}.budgets.{k}", f"efforts are {', '.join(efforts)}")
        if type(v) is not int or v <= 0:
            c.add(f"budget {k!r} must be a positive integer", f"{where}.budgets.{k}")
    channels = c.strings(tr, "channels", where, [])
    exclude = c.strings(tr, "exclude", where, [])
    elements = {names[k] for k in ("think", "response", "tools", "call", "argument", "json") if k in names}
    for k, group in (("channels", channels), ("exclude", exclude)):
        for v in group:
            if names and v not in elements:
                c.add(f"{v!r} is not an element of this template", f"{where}.{k}",
                      f"elements: {', '.join(sorted(elements))}")
    return Training(roles=c.strings(tr, "roles", where, ["assistant"]), channels=channels, exclude=exclude,
                    end=c.value(tr, "end", bool, where, default=True), budgets=dict(budgets))


def _build(c: _Check, data: dict[str, Any], path: str) -> Dialect | None:
    c.keys(data, SECTIONS, "")
    tpl = c.table(data, "template", "")
    c.keys(tpl, ("name", "description"), "template")
    name = c.section(lambda c: c.value(tpl, "name", str, "template"))
    description = c.section(lambda c: c.value(tpl, "description", str, "template", default=""))
    markers = c.section(_markers, data)
    names = c.section(_names, data) or {}
    roles = c.section(_roles, data)
    thinking = c.section(_thinking, data)
    channels = c.section(_channels, data)
    plugins = c.section(_plugins, data) or {}
    jf = c.table(data, "json_fallback", "", required=False)
    c.keys(jf, ("type",), "json_fallback")
    jf_type = c.section(lambda c: c.value(jf, "type", str, "json_fallback", default="object"))
    system = c.section(_system, data)
    training = c.section(_training, data, thinking[1] if thinking else (), names)
    if c.problems or None in (name, markers, roles, thinking, channels, jf_type, system, training):
        return None
    part_owner, element_owner, grammar = _content(c, plugins, names, frozenset(markers.all()))
    if c.problems:
        return None
    images: ImageExtension | None = plugins.get("image")
    content = tuple(x for x in plugins.values() if isinstance(x, ContentExtension))
    return Dialect(
        name=name, description=description, markers=markers, names=names, roles=roles[0],
        role_aliases=roles[1], thinking_default=thinking[0], efforts=thinking[1], default_effort=thinking[2],
        thinking_off=thinking[3],
        image_placeholder=images.placeholder if images else "",
        image_part_types=images.input_types if images else (),
        image_prompt=images.prompt if images else _NEVER,
        json_fallback_type=jf_type, system=system, path=path, training=training,
        channel_order=channels[0], prompt_channel=channels[1], plugins=plugins,
        part_owner=part_owner, element_owner=element_owner, embed_readers=tuple(x for x in content if x.embeds),
        content=content, grammar=grammar, channel_exts=channels[2],
    )


def check(data: Any, path: str = "") -> tuple[Dialect | None, list[Problem]]:
    """The dialect of parsed TOML and every problem found in it."""
    c = _Check()
    if not isinstance(data, dict):
        return None, [Problem("a template is a table of sections", "")]
    try:
        d = _build(c, data, path)
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as e:
        # A value of a shape the checks above did not foresee.
        c.add(f"invalid template: {type(e).__name__}: {e}", "")
        d = None
    if d is None and not c.problems:
        c.add("invalid template", "")
    return (d if not c.problems else None), c.problems


def from_dict(data: dict[str, Any], path: str) -> Dialect:
    """Build and check a dialect from parsed TOML; the first problem raises."""
    return _first_or(*check(data, path), path)


def _first_or(d: Dialect | None, problems: list[Problem], file: str) -> Dialect:
    """The dialect, or its first problem raised."""
    if d is None:
        p = problems[0]
        hint = f"; {p.hint}" if p.hint else ""
        raise TemplateError(p.message + hint, location=p.where(file))
    return d


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+))*)\s*=""")


def _dotted(s: str) -> list[str]:
    return [p.strip().strip("\"'") for p in re.findall(r"""\"[^\"]*\"|'[^']*'|[^.\s]+""", s)]


def locate(text: str, key: str) -> tuple[int, int] | None:
    """Line and column (1-based) where a dotted key path is written in TOML
    text: the key itself, else the nearest enclosing table or key."""
    want = [p for p in re.split(r"\.(?![^\[]*\])", re.sub(r"\[\d+\]", "", key)) if p]
    best: tuple[int, tuple[int, int]] | None = None
    table: list[str] = []
    for ln, line in enumerate(text.splitlines(), start=1):
        m = _HEADER.match(line)
        if m and not _KEY.match(line):
            table = _dotted(m.group(1))
            path, col = table, line.index("[") + 1
        else:
            m = _KEY.match(line)
            if not m:
                continue
            path, col = table + _dotted(m.group(1)), m.start(1) + 1
        k = 0
        while k < min(len(path), len(want)) and path[k] == want[k]:
            k += 1
        if k == len(path) and k > 0 and (best is None or k > best[0]):
            best = (k, (ln, col))
    return None if best is None else best[1]


BUILTIN = {"kimi-k3": "kimi-k3.toml", "k3": "kimi-k3.toml", "xtml-base": "xtml-base.toml"}


def builtin_files() -> dict[str, Path]:
    """Built-in dialect names (aliases included) and their files."""
    root = resources.files("xtml.dialects")
    return {name: Path(str(root.joinpath(file))) for name, file in BUILTIN.items()}


def read_template(name_or_path: str | Path) -> tuple[str, str]:
    """The text of a built-in dialect or a template file, and the name to
    report it by."""
    key = str(name_or_path)
    if key in BUILTIN:
        return resources.files("xtml.dialects").joinpath(BUILTIN[key]).read_text(encoding="utf-8"), BUILTIN[key]
    p = Path(key)
    if not p.is_file():
        raise TemplateError(
            f"no template named {key!r} (built-in: {', '.join(sorted(set(BUILTIN)))}) and no such file"
        )
    try:
        return p.read_text(encoding="utf-8"), key
    except (OSError, UnicodeDecodeError) as e:
        raise TemplateError(f"cannot read template: {e}", location=key) from None


def starter_template(name: str) -> str:
    """A commented template file for a new model, named ``name``: the
    xtml-base dialect, which documents every section it uses."""
    text = resources.files("xtml.dialects").joinpath(BUILTIN["xtml-base"]).read_text(encoding="utf-8")
    body = text[text.index("[template]"):]
    body = body.replace('name = "xtml-base"', f"name = {json.dumps(name)}", 1)
    body = re.sub(r'(?m)^description = ".*"$', f"description = {json.dumps(name + ' chat format (XTML)')}", body,
                  count=1)
    head = (f"# {name}: an XTML chat template.\n#\n# Edit the markers, names and prose for your model, then run\n"
            f"#   xtml validate {name}.toml --tokenizer path/to/model\n# Reference: docs/templates.md\n\n")
    return head + body


_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)|\(at end of document\)")


def check_text(text: str, where: str) -> tuple[Dialect | None, list[Problem]]:
    """Parse and check template text; problems carry line and column."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POS.search(msg)
        line = col = None
        if m and m.group(1):
            line, col = int(m.group(1)), int(m.group(2))
        elif m:
            line, col = text.count("\n") + 1, 1
        return None, [Problem(f"invalid TOML: {_TOML_POS.sub('', msg).strip()}", "", "", line, col)]
    d, problems = check(data, where)
    located = []
    for p in problems:
        pos = locate(text, p.key) if p.key else None
        located.append(Problem(p.message, p.key, p.hint, *(pos or (None, None))))
    return d, located


def load_dialect(name_or_path: str | Path) -> Dialect:
    """A built-in dialect by name, or a dialect file by path."""
    text, where = read_template(name_or_path)
    return _first_or(*check_text(text, where), where)
