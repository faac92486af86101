"""A dialect: how chat requests map to XTML, read from a data file.

The file (TOML) holds every model-specific fact: marker strings, element and
attribute names, roles, thinking efforts, image settings and the prose of the
internal system messages. Loading one never runs code.
"""

from __future__ import annotations

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
from ..plugins.image import ImageSettings

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

    @classmethod
    def compile(cls, source: str, where: str) -> Body:
        names: list[str] = []
        rx: list[str] = []
        pos = 0
        for m in _PLACEHOLDER.finditer(source):
            rx.append(re.escape(source[pos : m.start()]))
            tok = m.group(0)
            if tok == "{{":
                rx.append(re.escape("{"))
            elif tok == "}}":
                rx.append(re.escape("}"))
            else:
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
        pattern = re.compile("".join(rx), re.DOTALL)
        plain = _PLACEHOLDER.sub(lambda m: m.group(0)[0], source).strip()
        return cls(source, tuple(names), pattern, plain)

    def render(self, **values: str) -> str:
        if not self.names:
            return self.plain
        def sub(m: re.Match[str]) -> str:
            tok = m.group(0)
            if tok == "{{":
                return "{"
            if tok == "}}":
                return "}"
            return values[m.group(1)]

        return _PLACEHOLDER.sub(sub, self.source).strip()

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
    settings."""
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
_NAME_KEYS = ("message", "think", "response", "tools", "call", "argument", "json",
              "role", "name", "type", "tool", "index", "key")
# The values each internal message body is given.
_PLACEHOLDERS = {
    "tool-declare": frozenset({"tools"}),
    "tool-declare-dynamic": frozenset({"tools"}),
    "thinking-effort": frozenset({"effort"}),
    "response-format-json-schema": frozenset({"schema"}),
}
_SYSTEM_KEYS = ("tool-declare", "tool-declare-dynamic", "thinking-effort", "tool-choice-required",
                "tool-choice-none", "response-format-json-object", "response-format-json-schema")


def _take(d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise TemplateError(f"missing key {key!r}", location=where)
    v = d[key]
    if not isinstance(v, typ):
        raise TemplateError(f"key {key!r} has the wrong type ({type(v).__name__})", location=where)
    return v


def _strs(v: Any, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise TemplateError("expected a list of strings", location=where)
    return tuple(v)


def _no_extra(d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise TemplateError(f"unknown key {k!r}", location=where)


def from_dict(data: dict[str, Any], path: str) -> Dialect:
    """Build and check a dialect from parsed TOML."""
    if not isinstance(data, dict):
        raise TemplateError("a template is a table of sections", location=path)
    try:
        return _from_dict(data, path)
    except TemplateError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        # A value of the wrong shape the explicit checks did not foresee.
        raise TemplateError(f"invalid template: {type(e).__name__}: {e}", location=path) from None


def _from_dict(data: dict[str, Any], path: str) -> Dialect:
    _no_extra(data, SECTIONS, path)
    tpl = _take(data, "template", dict, path)
    _no_extra(tpl, ("name", "description"), f"{path}: template")
    mk = _take(data, "markers", dict, path)
    w = f"{path}: markers"
    _no_extra(mk, ("open", "close", "sep", "end", "embed_begin", "embed_inner", "embed_end", "embed_mark",
                   "optional", "stop"), w)
    markers = Markers(
        open=_take(mk, "open", str, w),
        close=_take(mk, "close", str, w),
        sep=_take(mk, "sep", str, w),
        end=_take(mk, "end", str, w),
        embed_begin=_strs(mk.get("embed_begin", []), f"{w}.embed_begin"),
        embed_inner=_strs(mk.get("embed_inner", []), f"{w}.embed_inner"),
        embed_end=_strs(mk.get("embed_end", []), f"{w}.embed_end"),
        embed_mark=_strs(mk.get("embed_mark", []), f"{w}.embed_mark"),
        optional=frozenset(_strs(mk.get("optional", []), f"{w}.optional")),
        stop=_strs(mk.get("stop", [mk.get("end", "")]), f"{w}.stop"),
    )
    nm = _take(data, "names", dict, path)
    _no_extra(nm, _NAME_KEYS, f"{path}: names")
    names = {}
    for k in _NAME_KEYS:
        v = _take(nm, k, str, f"{path}: names")
        if not is_name(v):
            raise TemplateError(f"{v!r} is not a valid tag or attribute name", location=f"{path}: names.{k}")
        names[k] = v
    ro = _take(data, "roles", dict, path)
    _no_extra(ro, ("accepted", "aliases"), f"{path}: roles")
    roles = _strs(_take(ro, "accepted", list, f"{path}: roles"), f"{path}: roles.accepted")
    aliases = dict(ro.get("aliases", {}))
    th = _take(data, "thinking", dict, path)
    _no_extra(th, ("default", "efforts", "default_effort", "off"), f"{path}: thinking")
    efforts = _strs(_take(th, "efforts", list, f"{path}: thinking"), f"{path}: thinking.efforts")
    default_effort = _take(th, "default_effort", str, f"{path}: thinking")
    if default_effort not in efforts:
        raise TemplateError("default_effort is not one of efforts", location=f"{path}: thinking")
    channel_order, prompt_channel = _channels(data, path)
    plugins = _plugins(data.get("plugins", {}), f"{path}: plugins")
    images = plugins.get("image")
    if images is not None and not isinstance(images, ImageSettings):
        raise TemplateError("the plugin named 'image' must configure images", location=f"{path}: plugins.image")
    jf = data.get("json_fallback", {"type": "object"})
    sysd = _take(data, "system", dict, path)
    system: dict[str, SystemMessage] = {}
    for key in _SYSTEM_KEYS:
        where = f"{path}: system.{key}"
        entry = _take(sysd, key, dict, f"{path}: system")
        _no_extra(entry, ("type", "position", "body"), where)
        pos = _take(entry, "position", str, where)
        if pos not in POSITIONS:
            raise TemplateError(f"position must be one of {', '.join(POSITIONS)}", location=where)
        body = Body.compile(_take(entry, "body", str, where), where)
        want = _PLACEHOLDERS.get(key, frozenset())
        if set(body.names) != want:
            unknown = sorted(set(body.names) - want)
            missing = sorted(want - set(body.names))
            what = (f"unknown placeholder {{{unknown[0]}}}" if unknown else f"missing placeholder {{{missing[0]}}}")
            raise TemplateError(f"{what}; this body takes {', '.join('{' + n + '}' for n in sorted(want)) or 'none'}",
                                location=where)
        typ = entry.get("type", key)
        if not isinstance(typ, str):
            raise TemplateError("type must be a string", location=where)
        system[key] = SystemMessage(key, typ, pos, body)
    _no_extra(sysd, _SYSTEM_KEYS, f"{path}: system")
    return Dialect(
        name=_take(tpl, "name", str, f"{path}: template"),
        description=tpl.get("description", ""),
        markers=markers,
        names=names,
        roles=roles,
        role_aliases=aliases,
        thinking_default=bool(th.get("default", True)),
        efforts=efforts,
        default_effort=default_effort,
        thinking_off=_strs(th.get("off", []), f"{path}: thinking.off"),
        image_placeholder=images.placeholder if images else "",
        image_part_types=images.part_types if images else (),
        image_prompt=images.prompt if images else _NEVER,
        json_fallback_type=str(jf.get("type", "object")),
        system=system,
        path=path,
        training=_training(data.get("training", {}), efforts, f"{path}: training"),
        channel_order=channel_order,
        prompt_channel=prompt_channel,
        plugins=plugins,
    )


_NEVER = re.compile("(?!)")


def _channels(data: dict[str, Any], path: str) -> tuple[tuple[str, ...], tuple[str, str]]:
    ch = data.get("channels", {})
    where = f"{path}: channels"
    if not isinstance(ch, dict):
        raise TemplateError("channels must be a table", location=where)
    _no_extra(ch, ("order",), where)
    order = _strs(ch.get("order", list(_CHANNELS)), f"{where}.order")
    if sorted(order) != sorted(_CHANNELS):
        raise TemplateError(f"order must list each of {', '.join(_CHANNELS)} once", location=f"{where}.order")
    gen = data.get("generation", {})
    where = f"{path}: generation"
    if not isinstance(gen, dict):
        raise TemplateError("generation must be a table", location=where)
    _no_extra(gen, ("thinking", "plain"), where)
    picked: list[str] = []
    for mode, default in (("plain", "response"), ("thinking", "think")):
        v = gen.get(mode, default)
        if not isinstance(v, str) or (v and v not in _CHANNELS):
            raise TemplateError(f"{mode} must be one of {', '.join(_CHANNELS)}, or \"\" to open none",
                                location=f"{where}.{mode}")
        picked.append(v)
    return order, (picked[0], picked[1])


def _plugins(pl: Any, where: str) -> dict[str, Any]:
    if not isinstance(pl, dict):
        raise TemplateError("plugins must be a table of [plugins.NAME] tables", location=where)
    out: dict[str, Any] = {}
    for name, settings in pl.items():
        here = f"{where}.{name}"
        if not isinstance(settings, dict):
            raise TemplateError(f"[plugins.{name}] must be a table of settings", location=here)
        out[name] = get_plugin(name, here).configure(settings, here)
    return out


def _training(tr: Any, efforts: tuple[str, ...], where: str) -> Training:
    if not isinstance(tr, dict):
        raise TemplateError("training must be a table", location=where)
    _no_extra(tr, ("roles", "channels", "exclude", "end", "budgets"), where)
    budgets = tr.get("budgets", {})
    if not isinstance(budgets, dict):
        raise TemplateError("budgets must be a table of effort = tokens", location=f"{where}.budgets")
    for k, v in budgets.items():
        if k not in efforts:
            raise TemplateError(f"budget for unknown effort {k!r}; efforts are {', '.join(efforts)}",
                                location=f"{where}.budgets")
        if type(v) is not int or v <= 0:
            raise TemplateError(f"budget {k!r} must be a positive integer", location=f"{where}.budgets.{k}")
    end = tr.get("end", True)
    if type(end) is not bool:
        raise TemplateError("end must be true or false", location=f"{where}.end")
    return Training(
        roles=_strs(tr.get("roles", ["assistant"]), f"{where}.roles"),
        channels=_strs(tr.get("channels", []), f"{where}.channels"),
        exclude=_strs(tr.get("exclude", []), f"{where}.exclude"),
        end=end,
        budgets=dict(budgets),
    )


BUILTIN = {"kimi-k3": "kimi-k3.toml", "k3": "kimi-k3.toml"}


def load_dialect(name_or_path: str | Path) -> Dialect:
    """A built-in dialect by name, or a dialect file by path."""
    key = str(name_or_path)
    if key in BUILTIN:
        text = resources.files("xtml.dialects").joinpath(BUILTIN[key]).read_text(encoding="utf-8")
        where = BUILTIN[key]
    else:
        p = Path(key)
        if not p.is_file():
            raise TemplateError(
                f"no template named {key!r} (built-in: {', '.join(sorted(set(BUILTIN)))}) and no such file"
            )
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TemplateError(f"cannot read template: {e}", location=key) from None
        where = key
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TemplateError(f"invalid TOML: {e}", location=where) from None
    return from_dict(data, where)
