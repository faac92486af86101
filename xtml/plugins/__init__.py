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
"""

from __future__ import annotations

from importlib.metadata import entry_points

from ..errors import TemplateError
from .api import (
    ATTRIBUTE_TYPES,
    CallView,
    ChannelExtension,
    ContentExtension,
    Context,
    MessageView,
    Plugin,
    ReadView,
    RenderView,
    check_attributes,
)

GROUP = "xtml.plugins"

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
            if ep.name not in _broken:
                found[ep.name] = obj
        for name in _broken:
            found.pop(name, None)
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


__all__ = ["ATTRIBUTE_TYPES", "GROUP", "CallView", "ChannelExtension", "ContentExtension", "Context", "MessageView",
           "Plugin", "ReadView", "RenderView", "check_attributes", "get", "installed", "use"]
