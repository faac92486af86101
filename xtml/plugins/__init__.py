"""Plugins: elements and modalities a template enables by name.

There is one door: the ``xtml.plugins`` entry-point group. An installed
distribution declares ``name = "module:object"`` there; a template enables the
plugin with a ``[plugins.NAME]`` table holding its settings. Built-in plugins
come through the same group (see this package's ``pyproject.toml``), and
:func:`use` registers one from Python code without installing anything.

A plugin is an object with:

``name``
    The key templates enable it by.
``configure(settings, where)``
    Checks the plugin's settings table (a dict parsed from TOML) and returns
    the configuration the chat layer will use. It raises
    :class:`~xtml.errors.TemplateError` with a location under ``where`` for a
    setting that is unknown, missing or of the wrong type.

What a plugin may touch is its own settings and the configuration it returns;
loading a template never runs anything else of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from ..errors import TemplateError

GROUP = "xtml.plugins"


@runtime_checkable
class Plugin(Protocol):
    """What a template's ``[plugins.NAME]`` table is handed to."""

    name: str

    def configure(self, settings: Mapping[str, Any], where: str) -> Any:
        """The checked configuration for ``settings``."""


_explicit: dict[str, Plugin] = {}
_found: dict[str, Plugin] | None = None
_broken: dict[str, str] = {}


def use(plugin: Plugin) -> Plugin:
    """Register ``plugin`` for templates loaded after this call. A name that
    is already taken by a different plugin is an error."""
    if not isinstance(plugin, Plugin) or not isinstance(plugin.name, str) or not plugin.name:
        raise TemplateError(f"{plugin!r} is not a plugin (it needs a name and configure())")
    have = installed().get(plugin.name)
    if have is not None and have is not plugin:
        raise TemplateError(f"plugin name {plugin.name!r} is already taken by {_origin(have)}")
    _explicit[plugin.name] = plugin
    return plugin


def _origin(p: object) -> str:
    return f"{type(p).__module__}.{type(p).__qualname__}"


def _discover() -> dict[str, Plugin]:
    global _found
    if _found is None:
        found: dict[str, Plugin] = {}
        for ep in entry_points(group=GROUP):
            try:
                obj = ep.load()
            except Exception as e:  # a broken third-party package must not break every template
                _broken[ep.name] = f"{type(e).__name__}: {e}"
                continue
            if not isinstance(obj, Plugin) or obj.name != ep.name:
                _broken[ep.name] = f"entry point {ep.value!r} is not a plugin named {ep.name!r}"
                continue
            other = found.get(ep.name)
            if other is not None and other is not obj:
                _broken[ep.name] = f"two installed plugins are named {ep.name!r} ({_origin(other)}, {ep.value})"
                continue
            found[ep.name] = obj
        _found = found
    return _found


def installed() -> dict[str, Plugin]:
    """Every plugin a template may enable: installed ones, then those given to
    :func:`use`."""
    return {**_discover(), **_explicit}


def get(name: str, where: str) -> Plugin:
    """The plugin ``name``, or a :class:`TemplateError` saying why not."""
    p = installed().get(name)
    if p is not None:
        return p
    if name in _broken:
        raise TemplateError(f"plugin {name!r} failed to load: {_broken[name]}", location=where)
    have = ", ".join(sorted(installed())) or "none"
    raise TemplateError(f"plugin {name!r} is not installed (installed: {have})", location=where)


__all__ = ["GROUP", "Plugin", "get", "installed", "use"]
