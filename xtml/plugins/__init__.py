"""Plugins: elements and modalities a template enables by name.

There is one door: the ``xtml.plugins`` entry-point group. An installed
distribution declares ``name = "module:object"`` there; a template enables the
plugin with a ``[plugins.NAME]`` table holding its settings. Built-in plugins
come through the same group (see this package's ``pyproject.toml``), and
:func:`use` registers one from Python code without installing anything
(:func:`unuse` takes it back; :func:`using` does both around a block).

A plugin is an object with:

``name``
    The key templates enable it by.
``configure(settings, where)``
    Checks the plugin's settings table (a dict parsed from TOML) and returns
    the configuration the chat layer will use. It raises
    :class:`~xtml.errors.TemplateError` with a location under ``where`` for a
    setting that is unknown, missing or of the wrong type.

What ``configure`` returns is the plugin's *extension* for that template.
An extension that adds content (a modality, an element inside messages)
subclasses :class:`ContentExtension` and says which content-part ``type``s,
element names and embeds it owns, how a part renders to markup events, how
markup reads back to a part, the part's normal form and a hypothesis strategy
for its parts. The chat layer calls it through these methods only.

What a plugin may touch: its own settings; the markup events of the parts it
owns (elements and embeds inside a message body, through the sink it is
given, balanced); the per-request :class:`Context` (its own state, the
request's options read-only, problems it reports); the parts it reads back
and, at the end of a parse, the request dict. It cannot add markers, roles or
messages, or change how other parts render. Loading a template never runs
anything of a plugin but ``configure``.

Only the plugins a template names are imported: an installed package's code
runs when a template enables it (or :func:`installed` lists them all), not
before. The names of xtml's own plugins are xtml's: another distribution
declaring one is ignored, with a :class:`PluginWarning` when the name is
used. Every error about a plugin names the distribution it comes from.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import EntryPoint, EntryPoints, entry_points
from typing import Any

from ..errors import TemplateError
from .api import (
    ATTRIBUTE_TYPES,
    ContentExtension,
    Context,
    Plugin,
    check_attributes,
)
from .values import GROUP as VALUE_SYNTAX_GROUP
from .values import NoOperation, ValueReader, ValueSyntax, load_value_syntax, value_syntaxes

GROUP = "xtml.plugins"
BUILTIN = "xtml"
"""The distribution whose plugins' names no other may take."""


class PluginWarning(UserWarning):
    """An installed plugin is ignored: its name is one of xtml's own."""


_explicit: dict[str, Plugin] = {}
_loaded: dict[str, tuple[Plugin, str]] = {}
"""Plugins imported so far, with their distributions."""
_broken: dict[str, str] = {}
"""Why a plugin could not be loaded, by name."""
_points: EntryPoints | None = None


def use(plugin: Plugin) -> Plugin:
    """Register ``plugin`` for templates loaded after this call. A name that
    is already taken by a different plugin is an error."""
    if not isinstance(plugin, Plugin) or not isinstance(plugin.name, str) or not plugin.name:
        raise TemplateError(f"{plugin!r} is not a plugin (it needs a name and configure())")
    have: Plugin | None = _explicit.get(plugin.name)
    origin = f"{_origin(have)}, given to use()"
    if have is None and plugin.name in _names():
        try:
            have, dist = _resolve(plugin.name)
        except TemplateError:
            have = None  # what cannot be loaded takes no name
        else:
            origin = f"{_origin(have)} of distribution {dist!r}"
    if have is not None and have is not plugin:
        raise TemplateError(f"plugin name {plugin.name!r} is already taken by {origin}")
    _explicit[plugin.name] = plugin
    return plugin


def unuse(plugin: Plugin | str) -> None:
    """Take back a plugin given to :func:`use` (the plugin, or its name), as
    if it had never been registered: templates loaded afterwards cannot
    enable it, and its name is free again. Templates already loaded keep
    what it configured for them. Installed plugins cannot be taken back."""
    name = plugin if isinstance(plugin, str) else getattr(plugin, "name", None)
    have = _explicit.get(name) if isinstance(name, str) else None
    if have is None or (not isinstance(plugin, str) and have is not plugin):
        raise TemplateError(f"{plugin!r} was not given to use()" if have is None else
                            f"plugin name {name!r} was given to use() by another plugin, {_origin(have)}")
    del _explicit[have.name]


@contextmanager
def using(*plugins: Plugin) -> Iterator[tuple[Plugin, ...]]:
    """:func:`use` each plugin for the ``with`` block, then :func:`unuse`
    those that were not registered before it (tests, one-off scripts)."""
    added: list[Plugin] = []
    try:
        for p in plugins:
            name = getattr(p, "name", None)
            before = _explicit.get(name) if isinstance(name, str) else None
            use(p)
            if before is not p:
                added.append(p)
        yield plugins
    finally:
        for p in reversed(added):
            if _explicit.get(p.name) is p:
                del _explicit[p.name]


def _origin(p: object) -> str:
    return f"{type(p).__module__}.{type(p).__qualname__}"


def _entry_points() -> EntryPoints:
    # Read once: the installed packages' metadata, none of their code.
    global _points
    if _points is None:
        _points = entry_points(group=GROUP)
    return _points


def _names() -> set[str]:
    return {ep.name for ep in _entry_points()}


def _dist(ep: EntryPoint) -> str:
    name = getattr(getattr(ep, "dist", None), "name", None)
    return name if isinstance(name, str) and name else f"unknown (entry point {ep.value})"


def _canonical(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _resolve(name: str) -> tuple[Plugin, str]:
    """The installed plugin ``name`` and its distribution, importing that
    entry point alone. Raises :class:`TemplateError` naming the distribution
    when it cannot be had, :class:`KeyError` when nothing declares it."""
    hit = _loaded.get(name)
    if hit is not None:
        return hit
    if name in _broken:
        raise TemplateError(_broken[name])
    eps = list(_entry_points().select(name=name))
    if not eps:
        raise KeyError(name)
    own = [ep for ep in eps if _canonical(_dist(ep)) == BUILTIN]
    others = list(dict.fromkeys(_dist(ep) for ep in eps if _canonical(_dist(ep)) != BUILTIN))
    if own:
        ep = own[0]
        if others:
            warnings.warn(PluginWarning(
                f"plugin {name!r} of distribution {', '.join(map(repr, others))} is ignored: {name!r} is the name "
                "of one of xtml's own plugins"), stacklevel=3)
    elif len(others) > 1:
        why = f"plugin {name!r} is installed by two distributions ({', '.join(map(repr, others))}); uninstall one"
        _broken[name] = why
        raise TemplateError(why)
    else:
        ep = eps[0]
    dist = _dist(ep)
    try:
        obj = ep.load()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit at import too: one package must not end every command
        why = f"plugin {name!r} of distribution {dist!r} failed to load: {type(e).__name__}: {e}"
        _broken[name] = why
        raise TemplateError(why) from None
    if not isinstance(obj, Plugin) or getattr(obj, "name", None) != name:
        why = f"plugin {name!r} of distribution {dist!r}: entry point {ep.value!r} is not a plugin named {name!r}"
        _broken[name] = why
        raise TemplateError(why)
    _loaded[name] = (obj, dist)
    return obj, dist


def installed() -> dict[str, Plugin]:
    """Every plugin a template may enable: installed ones, then those given to
    :func:`use`. This imports every installed plugin; :func:`broken` then
    says which could not be."""
    out: dict[str, Plugin] = {}
    for name in sorted(_names()):
        try:
            out[name] = _resolve(name)[0]
        except TemplateError:
            continue
    return {**out, **_explicit}


def broken() -> dict[str, str]:
    """Why each installed plugin that failed to load did, by name (of those
    tried so far)."""
    return dict(_broken)


def get(name: str, where: str) -> Plugin:
    """The plugin ``name``, or a :class:`TemplateError` saying why not."""
    p = _explicit.get(name)
    if p is not None:
        return p
    try:
        return _resolve(name)[0]
    except TemplateError as e:
        raise TemplateError(e.msg, location=where) from None
    except KeyError:
        have = ", ".join(sorted(_names() | set(_explicit))) or "none"
        raise TemplateError(f"plugin {name!r} is not installed (installed: {have})", location=where) from None


def configure(name: str, settings: Mapping[str, Any], where: str) -> Any:
    """What the plugin ``name``'s ``configure`` returns for ``settings``. An
    error of the plugin's own, even ``SystemExit``, becomes a
    :class:`TemplateError` naming its distribution."""
    plugin = get(name, where)
    try:
        return plugin.configure(settings, where)
    except (TemplateError, KeyboardInterrupt):
        raise
    except BaseException as e:
        hit = _loaded.get(name)
        dist = f"distribution {hit[1]!r}" if hit is not None and hit[0] is plugin else "given to use()"
        raise TemplateError(f"plugin {name!r} ({dist}) failed on its settings: {type(e).__name__}: {e}",
                            location=where) from None


__all__ = ["ATTRIBUTE_TYPES", "BUILTIN", "GROUP", "VALUE_SYNTAX_GROUP", "ContentExtension", "Context", "NoOperation",
           "Plugin", "PluginWarning", "ValueReader", "ValueSyntax", "broken", "check_attributes", "configure", "get",
           "installed", "load_value_syntax", "unuse", "use", "using", "value_syntaxes"]

