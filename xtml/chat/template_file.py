"""Template files: reading one (a built-in or a path) and checking it into
a :class:`~.dialect.Dialect`.

The checker collects every problem of a file at once, each with the dotted
key path of the offending value; :func:`check_text` locates them at a line
and column (:mod:`.keys`). The loader raises the first, ``xtml validate``
lists them all. Loading a template never runs code but the ``configure`` of
the plugins it enables.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from ..errors import TemplateError, line_column
from ..markup.header import is_name
from ..markup.markers import Markers
from ..markup.parse import QUOTE_LIMIT, excerpt
from ..plugins import configure as configure_plugin
from ..plugins.api import ContentExtension
from .dialect import HOLDS, POSITIONS, Body, Channel, Dialect, SystemMessage, Training
from .keys import KeyIndex
from .toml_text import TomlTooDeep, read_toml

SECTIONS = ("template", "markers", "names", "roles", "channels", "generation", "thinking", "plugins",
            "json_fallback", "system", "training")
_CHANNELS = ("think", "response", "tools")
DEFAULT_HOLDS = {"think": "reasoning", "response": "content", "tools": "tool_calls"}
"""What each channel holds when ``[channels.holds]`` is absent."""
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
_D = TypeVar("_D")


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
        key = self.key if len(self.key) <= 2 * QUOTE_LIMIT else self.key[: 2 * QUOTE_LIMIT - 1] + "…"
        return f"{pos}: {key}" if key else pos


class _Stop(Exception):
    """A section is too broken to read further; its problem is recorded."""


# A file with more problems than this lists these and counts the rest: a
# generated file with a million bad keys must not make a million messages.
MAX_PROBLEMS = 200


class _Check:
    """Collects problems so a file's every mistake is reported at once; the
    loader raises the first, ``xtml validate`` lists them all."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.unlisted = 0
        """Problems past :data:`MAX_PROBLEMS`, counted but not kept."""

    @property
    def full(self) -> bool:
        return len(self.problems) >= MAX_PROBLEMS

    def add(self, message: str, key: str, hint: str = "") -> None:
        if self.full:
            self.unlisted += 1
            return
        self.problems.append(Problem(message, key, hint))

    def keys(self, d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for k in d:
            if k not in allowed:
                if self.full:
                    self.unlisted += 1
                    continue
                close = difflib.get_close_matches(k, allowed, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed here: {', '.join(allowed)}"
                self.add(f"unknown key {excerpt(k)}", _join(where, k), hint)

    def table(self, d: dict[str, Any], key: str, where: str, *, required: bool = True) -> dict[str, Any]:
        if key not in d:
            if required:
                full = _join(where, key)
                self.add(f"missing [{full}] table", full, f"add a [{full}] table")
            return {}
        v = d[key]
        if not isinstance(v, dict):
            self.add(f"{excerpt(key)} must be a table, not {_toml_type(v)}", _join(where, key))
            return {}
        return v

    def value(self, d: dict[str, Any], key: str, typ: type, where: str, default: Any = _Stop) -> Any:
        here = _join(where, key)
        if key not in d:
            if default is _Stop:
                self.add(f"missing key {excerpt(key)}", here, f"add {key} = <{_toml_name(typ)}>")
                raise _Stop
            return default
        v = d[key]
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            self.add(f"{excerpt(key)} must be {_toml_name(typ)}, not {_toml_type(v)}", here)
            raise _Stop
        return v

    def strings(self, d: dict[str, Any], key: str, where: str, default: list[str] | None = None) -> tuple[str, ...]:
        v = self.value(d, key, list, where, default=default if default is not None else _Stop)
        if not all(isinstance(x, str) for x in v):
            self.add(f"{excerpt(key)} must be a list of strings", _join(where, key))
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
            c.add(f"marker {excerpt(v)} is used twice ({where[v]} and {key})", key, "every marker needs its own string")
        where.setdefault(v, key)
    for v, key in where.items():
        if not v:
            c.add("a marker string is empty", key)
    for a, ka in where.items():
        for b, kb in where.items():
            if a and a != b and a in b:
                c.add(f"marker {excerpt(a)} ({ka}) is contained in marker {excerpt(b)} ({kb}), so text could "
                      "not be split", ka, "choose strings where neither is part of the other")
    for k in ("optional", "stop"):
        for v in groups[k]:
            if v not in where:
                c.add(f"{excerpt(v)} is not one of the markers", f"markers.{k}", "list marker strings defined above")
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
            c.add(f"{excerpt(v)} is not a valid tag or attribute name", f"names.{k}",
                  "a name starts with a letter or _ and holds letters, digits, _ - . :")
        names[k] = v
    elements = [k for k in ("message", "think", "response", "tools", "call", "argument", "json") if k in names]
    seen: dict[str, str] = {}
    for k in elements:
        if names[k] in seen:
            c.add(f"element name {excerpt(names[k])} is used for both {seen[names[k]]} and {k}", f"names.{k}",
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
                c.add(f"attribute name {excerpt(names[k])} is used for both {used[names[k]]} and {k}, which stand "
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
            c.add(f"alias {excerpt(k)} must name an accepted role", f"roles.aliases.{k}")
    return roles, dict(aliases)


def _thinking(c: _Check, data: dict[str, Any]) -> tuple[bool, tuple[str, ...], str, tuple[str, ...], bool]:
    th = c.table(data, "thinking", "")
    c.keys(th, ("default", "efforts", "default_effort", "off", "off_wins"), "thinking")
    default = c.value(th, "default", bool, "thinking", default=True)
    efforts = c.strings(th, "efforts", "thinking")
    if not efforts:
        c.add("efforts must not be empty", "thinking.efforts")
        raise _Stop
    effort = c.value(th, "default_effort", str, "thinking")
    if effort not in efforts:
        c.add(f"default_effort {excerpt(effort)} is not one of efforts", "thinking.default_effort",
              f"pick one of {', '.join(efforts)}")
    off = c.strings(th, "off", "thinking", [])
    return default, efforts, effort, off, c.value(th, "off_wins", bool, "thinking", default=False)


def _channels(c: _Check, data: dict[str, Any]) -> tuple[tuple[tuple[str, str], ...], tuple[str, str]]:
    """The channels as (key, kind held) in writing order, and the keys of
    the channels the generation prompt opens without and with thinking."""
    ch = c.table(data, "channels", "", required=False)
    c.keys(ch, ("order", "holds"), "channels")
    order = c.strings(ch, "order", "channels", list(_CHANNELS))
    for j, key in enumerate(order):
        if key in order[:j]:
            c.add(f"channel {excerpt(key)} is listed twice", "channels.order", "list each channel once")
        elif key not in _CHANNELS:
            c.add(f"unknown channel {excerpt(key)}", "channels.order", _did_you_mean(key, _CHANNELS, "channels"))
    missing = [k for k in _CHANNELS if k not in order]
    if missing:
        c.add(f"the order leaves out {', '.join(map(repr, missing))}", "channels.order",
              f"list each of {', '.join(_CHANNELS)} once")
    holds = _holds(c, ch)
    gen = c.table(data, "generation", "", required=False)
    c.keys(gen, ("plain", "thinking"), "generation")
    picked: list[str] = []
    for mode, default in (("plain", "response"), ("thinking", "think")):
        v = c.value(gen, mode, str, "generation", default=default)
        if v and v not in _CHANNELS:
            c.add(f"{mode} must be one of {', '.join(_CHANNELS)}, or \"\" to open none", f"generation.{mode}")
        picked.append(v)
    if missing or len(order) != len(_CHANNELS) or holds is None:
        raise _Stop
    content = next(k for k, kind in holds.items() if kind == "content")
    for mode, p in (("plain", picked[0]), ("thinking", picked[1])):
        # What the prompt opens is where the model starts writing: a
        # channel before it in the order could never follow.
        if p in order and order.index(content) < order.index(p):
            c.add(f"the {mode} generation prompt opens {excerpt(p)}, which the order puts after {content!r}, the "
                  "channel holding content: a completion could never hold content", f"generation.{mode}",
                  f"put the opened channel before {content} in [channels] order")
    return tuple((k, holds[k]) for k in order), (picked[0], picked[1])


def _holds(c: _Check, ch: dict[str, Any]) -> dict[str, str] | None:
    """``[channels.holds]``: channel key → the kind it holds, each kind held
    once; the defaults when the table is absent. None after a problem."""
    given = c.value(ch, "holds", dict, "channels", default=None)
    if given is None:
        return dict(DEFAULT_HOLDS)
    holds: dict[str, str] = {}
    for key, kind in given.items():
        here = f"channels.holds.{key}"
        if key not in _CHANNELS:
            c.add(f"unknown channel {excerpt(key)}", here, _did_you_mean(key, _CHANNELS, "channels"))
        elif not isinstance(kind, str):
            c.add(f"{excerpt(key)} must be a string, not {_toml_type(kind)}", here,
                  f"one of {', '.join(map(repr, HOLDS))}")
        elif kind not in HOLDS:
            c.add(f"unknown channel kind {excerpt(kind)}", here, _did_you_mean(kind, HOLDS, "kinds"))
        elif kind in holds.values():
            other = next(k for k, v in holds.items() if v == kind)
            c.add(f"{excerpt(kind)} is held by both {other!r} and {key!r}", here,
                  "each kind is held by exactly one channel")
        else:
            holds[key] = kind
    bad = len(holds) != len(given)
    for key in _CHANNELS:
        if key not in given:
            free = [k for k in HOLDS if k not in holds.values()]
            c.add(f"channel {key!r} is not given a kind", "channels.holds",
                  f"add {key} = {free[0]!r}" if len(free) == 1 else f"one of {', '.join(map(repr, free))}")
            bad = True
    return None if bad else holds


def _did_you_mean(word: str, choices: tuple[str, ...], what: str) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"did you mean {close[0]!r}?" if close else f"{what}: {', '.join(choices)}"


def _plugins(c: _Check, data: dict[str, Any]) -> dict[str, Any]:
    pl = c.table(data, "plugins", "", required=False)
    out: dict[str, Any] = {}
    for name, settings in pl.items():
        here = f"plugins.{name}"
        if not isinstance(settings, dict):
            c.add(f"[{here}] must be a table of settings", here)
            continue
        try:
            out[name] = configure_plugin(name, settings, here)
        except TemplateError as e:
            hint = "pip install the package that provides it" if "not installed" in e.msg else ""
            c.add(e.msg, e.location or here, hint)
        except Exception as e:  # a plugin's own bug must not pass for a valid template
            c.add(f"plugin {excerpt(name)} failed on its settings: {type(e).__name__}: {_clip(str(e))}", here)
    images = out.get("image")
    if images is not None and not (isinstance(images, ContentExtension) and images.placeholder is not None
                                   and images.prompt_pattern is not None):
        c.add("the plugin named 'image' must configure images (a content extension with a placeholder and a "
              "prompt pattern)", "plugins.image")
        del out["image"]
    return out


def _content(c: _Check, plugins: dict[str, Any], names: dict[str, str], marker_strings: frozenset[str]) -> tuple[
        dict[str, ContentExtension], dict[str, ContentExtension], str]:
    """Who owns each part type and element; the combined grammar. Two
    plugins claiming one name, or fragments that conflict, fail here."""
    from ..plugins.fragments import combine

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
                c.add(f"plugin {excerpt(pname)} claims the text part type {excerpt(t)}", f"plugins.{pname}")
            elif t in parts:
                c.add(f"content part type {excerpt(t)} is claimed by plugins {excerpt(parts[t][0])} and "
                      f"{excerpt(pname)}",
                      f"plugins.{pname}", "enable only one of them, or change one's part_types")
            else:
                parts[t] = (pname, ext)
        for e, spec in ext.attributes.items():
            bad = [k for k in spec if not is_name(k)] + [f"{k} ({t!r})" for k, t in spec.items()
                                                         if t not in (str, int, float, bool)]
            if e not in ext.elements or bad:
                c.add(f"plugin {excerpt(pname)} declares attributes badly for {excerpt(e)}: "
                      f"{'not one of its elements' if e not in ext.elements else ', '.join(bad)}",
                      f"plugins.{pname}")
        for e in ext.elements:
            if not is_name(e):
                c.add(f"plugin {excerpt(pname)} owns {excerpt(e)}, which is not a valid element name",
                      f"plugins.{pname}")
            elif e in reserved:
                c.add(f"plugin {excerpt(pname)} owns element {excerpt(e)}, which this template uses for "
                      f"{reserved[e]}",
                      f"plugins.{pname}")
            elif e in elements:
                c.add(f"element {excerpt(e)} is claimed by plugins {excerpt(elements[e][0])} and "
                      f"{excerpt(pname)}", f"plugins.{pname}")
            else:
                elements[e] = (pname, ext)
        for mk in ext.markers:
            if mk not in marker_strings:
                c.add(f"plugin {excerpt(pname)} writes {excerpt(mk)} as a marker, but it is not one of the "
                      "template's markers",
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
                c.add(f"the body of system.{key} also reads as system.{other} (both of type {excerpt(sm.type)}), so "
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
        c.add(f"position {excerpt(pos)} is not one of {', '.join(POSITIONS)}", f"{where}.position")
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
            c.add(f"budget for unknown effort {excerpt(k)}", f"{where}.budgets.{k}",
                  f"efforts are {', '.join(efforts)}")
        if type(v) is not int or v <= 0:
            c.add(f"budget {excerpt(k)} must be a positive integer", f"{where}.budgets.{k}")
    channels = c.strings(tr, "channels", where, [])
    exclude = c.strings(tr, "exclude", where, [])
    elements = {names[k] for k in ("think", "response", "tools", "call", "argument", "json") if k in names}
    for k, group in (("channels", channels), ("exclude", exclude)):
        for v in group:
            if names and v not in elements:
                c.add(f"{excerpt(v)} is not an element of this template", f"{where}.{k}",
                      f"elements: {', '.join(sorted(elements))}")
    return Training(roles=c.strings(tr, "roles", where, ["assistant"]), channels=channels, exclude=exclude,
                    end=c.value(tr, "end", bool, where, default=True), budgets=dict(budgets))


def _build(c: _Check, data: dict[str, Any], path: str) -> Dialect | None:
    c.keys(data, SECTIONS, "")
    tpl = c.table(data, "template", "")
    c.keys(tpl, ("name", "description", "engine"), "template")
    if tpl.get("engine", "xtml") != "xtml":
        c.add("engine must be \"xtml\" or \"layout\"", "template.engine")
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
    images: ContentExtension | None = plugins.get("image")
    content = tuple(x for x in plugins.values() if isinstance(x, ContentExtension))
    return Dialect(
        name=name, description=description, markers=markers, names=names, roles=roles[0],
        role_aliases=roles[1], thinking_default=thinking[0], efforts=thinking[1], default_effort=thinking[2],
        thinking_off=thinking[3], off_wins=thinking[4],
        image_placeholder=(images.placeholder or "") if images else "",
        image_part_types=images.part_types if images else (),
        image_prompt=(images.prompt_pattern or _NEVER) if images else _NEVER,
        json_fallback_type=jf_type, system=system, path=path, training=training,
        assistant_channels=tuple(Channel(k, names[k], kind) for k, kind in channels[0]),
        prompt_channel=channels[1], plugins=plugins,
        part_owner=part_owner, element_owner=element_owner, embed_readers=tuple(x for x in content if x.embeds),
        content=content, grammar=grammar,
    )


def is_layout(data: Any) -> bool:
    """Whether parsed TOML is a layout dialect (``[template] engine = "layout"``)."""
    tpl = data.get("template") if isinstance(data, dict) else None
    return isinstance(tpl, dict) and tpl.get("engine") == "layout"


def check(data: Any, path: str = "") -> tuple[Dialect | None, list[Problem]]:
    """The XTML dialect of parsed TOML and every problem found in it."""
    if is_layout(data):
        return None, [Problem("this is a layout dialect (engine = \"layout\"), not an XTML one: load it with "
                              "xtml.load", "template.engine")]
    return run_checks(data, path, _build)


def run_checks(data: Any, path: str, build: Callable[[_Check, dict[str, Any], str], _D | None]) -> tuple[
        _D | None, list[Problem]]:
    """The dialect ``build`` makes of parsed TOML (its problems added to the
    checker it is given) and every problem found in it."""
    c = _Check()
    if not isinstance(data, dict):
        return None, [Problem("a template is a table of sections", "")]
    d: _D | None
    try:
        d = build(c, data, path)
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as e:
        # A value of a shape the checks above did not foresee.
        c.add(f"invalid template: {type(e).__name__}: {_clip(str(e))}", "")
        d = None
    if d is None and not c.problems:
        c.add("invalid template", "")
    if c.unlisted:
        c.problems.append(Problem(f"{c.unlisted:,} more problems not listed", ""))
    return (d if not c.problems else None), c.problems


def _clip(text: str, limit: int = 4 * QUOTE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def from_dict(data: dict[str, Any], path: str) -> Dialect:
    """Build and check a dialect from parsed TOML; the first problem raises."""
    return first_or(*check(data, path), path)


def first_or(d: _D | None, problems: list[Problem], file: str) -> _D:
    """The dialect, or its first problem raised."""
    if d is None:
        p = problems[0]
        hint = f"; {p.hint}" if p.hint else ""
        raise TemplateError(p.message + hint, location=p.where(file))
    return d


BUILTIN = {"kimi-k3": "kimi-k3.toml", "k3": "kimi-k3.toml", "xtml-base": "xtml-base.toml"}
"""The built-in XTML dialects."""
LAYOUT_BUILTIN = {"smollm2": "smollm2.toml", "qwen3": "qwen3.toml", "llama-3.1": "llama-3.1.toml",
                  "deepseek-v3.1": "deepseek-v3.1.toml", "kimi-k2": "kimi-k2.toml",
                  "kimi-k2-thinking": "kimi-k2-thinking.toml", "glm-4.6": "glm-4.6.toml",
                  "mistral-small-3.1": "mistral-small-3.1.toml", "gemma-4": "gemma-4.toml", "gpt-oss": "gpt-oss.toml"}
"""The built-in layout dialects (other model families' formats): loaded by
name as the XTML ones are, listed apart while the edges that walk every
built-in (the playground, the adversarial strategies) read XTML only."""


def builtin_files(*, layout: bool = False) -> dict[str, Path]:
    """Built-in dialect names (aliases included) and their files: the XTML
    ones, or with ``layout`` the layout ones."""
    root = resources.files("xtml.dialects")
    return {name: Path(str(root.joinpath(file))) for name, file in (LAYOUT_BUILTIN if layout else BUILTIN).items()}


def read_template(name_or_path: str | Path) -> tuple[str, str]:
    """The text of a built-in dialect or a template file, and the name to
    report it by."""
    key = str(name_or_path)
    file = BUILTIN.get(key) or LAYOUT_BUILTIN.get(key)
    if file is not None:
        return resources.files("xtml.dialects").joinpath(file).read_text(encoding="utf-8"), file
    p = Path(key)
    if not p.is_file():
        if p.is_dir():
            raise TemplateError(f"{excerpt(key)} is a folder: name a template file (.toml) or a built-in "
                                f"({', '.join(sorted({*BUILTIN, *LAYOUT_BUILTIN}))})")
        if p.exists():
            raise TemplateError(f"{excerpt(key)} is not a regular file (a device, a pipe or a socket): name a "
                                "template file (.toml)")
        raise TemplateError(
            f"no template named {excerpt(key)} (built-in: {', '.join(sorted({*BUILTIN, *LAYOUT_BUILTIN}))}) and no "
            "such file"
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


# What a template file may be. Real ones are a few kilobytes with values a
# few levels deep; these bounds keep a hostile file from costing more than a
# second to refuse (the TOML reader recurses on nesting and takes time
# quadratic in the parts of one dotted key).
MAX_TEMPLATE_BYTES = 1 << 20
MAX_STRING_CHARS = 64 << 10
MAX_NESTING = 32

# One TOML token: a string's opening quotes, a comment, a line end, a bracket
# or brace, "=", ",", ".", or a run of anything else.
_TOKEN = re.compile(r'"""' + r"|'''|" + r'''"|'|#[^\n]*|\n|[\[\]{}=,.]|[^"'#\n\[\]{}=,.]+''')
_STRING_END = {
    '"': re.compile(r'(?:[^"\\\n]|\\.)*"'),
    "'": re.compile(r"[^'\n]*'"),
    '"""': re.compile(r'(?:[^"\\]|\\[\s\S]|"(?!""))*"""(?:"{0,2})'),
    "'''": re.compile(r"(?:[^']|'(?!''))*'''(?:'{0,2})"),
}


def _toml_bounds(text: str) -> Problem | None:
    """The first place where ``text`` breaks :data:`MAX_NESTING` or
    :data:`MAX_STRING_CHARS`, found in one linear pass (strings and comments
    skipped, keys told from values) before the TOML reader sees it. Text
    that is not TOML is left to the reader's own error."""
    table = 0  # parts of the current [table] header
    stack: list[tuple[str, int, int]] = []  # open [ and {: (kind, depth, key base)
    mode = "key"  # reading a key, a value, a [table] header, or what follows one
    base = 0  # depth the current key's parts add to
    dots = 0  # dots in the current key or header
    depth = 0  # depth of the value being read
    pos = 0
    n = len(text)

    def problem(at: int, message: str) -> Problem:
        return Problem(message, "", "", *line_column(text, at))

    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:  # pragma: no cover - the last alternative takes any other character
            break
        tok = m.group()
        end = m.end()
        if tok in _STRING_END:
            close = _STRING_END[tok].match(text, end)
            if close is None:
                return None  # an unterminated string: the TOML reader says where
            if close.end() - end > MAX_STRING_CHARS + 2 * len(tok):
                return problem(pos, f"a string longer than {MAX_STRING_CHARS:,} characters")
            end = close.end()
        elif tok == "\n":
            if not stack:
                mode, dots, base = "key", 0, table
        elif tok[0] == "#":
            pass
        elif tok == "[" and mode == "key" and not stack:
            mode, dots = "header", 0
            if text.startswith("[", end):
                end += 1
        elif tok == "]" and mode == "header":
            table = base = dots + 1
            if table > MAX_NESTING:
                return problem(pos, f"a table nested more than {MAX_NESTING} deep")
            mode = "after"
            if text.startswith("]", end):
                end += 1
        elif tok == "." and (mode == "key" or mode == "header"):
            dots += 1
            if base + dots > MAX_NESTING:
                return problem(pos, f"a key with more than {MAX_NESTING} dotted parts")
        elif tok == "=" and mode == "key":
            depth = base + dots + 1
            mode = "value"
        elif (tok == "[" or tok == "{") and mode == "value":
            stack.append((tok, depth, base))
            if depth + 1 > MAX_NESTING:
                return problem(pos, f"a value nested more than {MAX_NESTING} deep")
            if tok == "[":
                depth += 1
            else:
                mode, base, dots = "key", depth, 0
        elif (tok == "]" or tok == "}") and stack:
            _, depth, base = stack.pop()
            mode = "value"
        elif tok == "," and stack:
            if stack[-1][0] == "{":
                mode, base, dots = "key", stack[-1][1], 0
            else:
                depth = stack[-1][1] + 1
        elif (mode == "key" or mode == "header") and len(tok) > MAX_STRING_CHARS and tok.strip():
            return problem(pos, f"a key longer than {MAX_STRING_CHARS:,} characters")
        pos = end
    return None


_LONG_DIGITS = re.compile(r"[0-9_]{4300,}")


def _long_integer_at(text: str) -> tuple[int | None, int | None]:
    m = _LONG_DIGITS.search(text)
    if m is None:
        return None, None
    return line_column(text, m.start())


def check_text(text: str, where: str) -> tuple[Dialect | None, list[Problem]]:
    """Parse and check template text; problems carry line and column."""
    return check_toml(text, where, check)


def check_toml(text: str, where: str, check_data: Callable[[Any, str], tuple[_D | None, list[Problem]]]) -> tuple[
        _D | None, list[Problem]]:
    """Parse template text within the bounds of a template file and check
    it with ``check_data``; problems carry line and column."""
    if len(text) > MAX_TEMPLATE_BYTES:
        return None, [Problem(f"the template is {len(text):,} characters long, more than {MAX_TEMPLATE_BYTES:,}",
                              "")]
    bound = _toml_bounds(text)
    if bound is not None:
        return None, [bound]
    try:
        data = read_toml(text)
    except TomlTooDeep:
        return None, [Problem(f"invalid TOML: nested too deeply (at most {MAX_NESTING} levels)", "")]
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POS.search(msg)
        line = col = None
        if m and m.group(1):
            line, col = int(m.group(1)), int(m.group(2))
        elif m:
            line, col = line_column(text, len(text))
        return None, [Problem(f"invalid TOML: {_TOML_POS.sub('', msg).strip()}", "", "", line, col)]
    except ValueError:
        # tomllib converts integers with int(), which refuses more digits
        # than sys.get_int_max_str_digits(); the value is found to locate it.
        line, col = _long_integer_at(text)
        return None, [Problem(f"invalid TOML: an integer has more than {sys.get_int_max_str_digits():,} digits, "
                              "more than Python reads", "", "", line, col)]
    d, problems = check_data(data, where)
    index = KeyIndex(text) if any(p.key for p in problems) else None
    located = []
    for p in problems:
        pos = index.locate(p.key) if index is not None and p.key else None
        located.append(Problem(p.message, p.key, p.hint, *(pos or (None, None))))
    return d, located


def load_dialect(name_or_path: str | Path) -> Dialect:
    """A built-in XTML dialect by name, or an XTML dialect file by path."""
    text, where = read_template(name_or_path)
    return first_or(*check_text(text, where), where)
