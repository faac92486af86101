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

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import TemplateError

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..markup.nodes import Element
    from ..markup.sink import MarkupSink

GROUP = "xtml.plugins"


@runtime_checkable
class Plugin(Protocol):
    """What a template's ``[plugins.NAME]`` table is handed to."""

    name: str

    def configure(self, settings: Mapping[str, Any], where: str) -> Any:
        """The checked configuration for ``settings``."""


class Context:
    """Per-request state, for one render, normal form or parse."""

    __slots__ = ("options", "problem", "state")

    def __init__(self, options: Any = None, problem: Callable[[str, str], None] | None = None) -> None:
        self.options = options
        """The resolved request options (render and normal form), or None (parse)."""
        self.state: dict[str, Any] = {}
        """Plugin-owned state, keyed by plugin name."""
        self.problem = problem or _raise
        """Report a problem found while reading: ``problem(message, kind)``.
        Strict parses raise, lenient ones record a diagnostic."""

    def of(self, name: str) -> Any:
        """The state of plugin ``name`` (a dict made on first use)."""
        st = self.state.get(name)
        if st is None:
            st = self.state[name] = {}
        return st


def _raise(message: str, kind: str) -> None:
    raise ValueError(message)


ATTRIBUTE_TYPES: dict[type, str] = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def check_attributes(ext: ContentExtension, tag: str, attrs: tuple[tuple[str, str], ...]) -> str | None:
    """Why ``attrs`` do not fit what ``ext`` declares for ``tag``, or None."""
    spec = ext.attributes.get(tag)
    if spec is None:
        return None
    seen: set[str] = set()
    for k, v in attrs:
        typ = spec.get(k)
        if typ is None:
            return f"{tag!r} takes no attribute {k!r} (it takes {', '.join(spec) or 'none'})"
        if k in seen:
            return f"attribute {k!r} given twice"
        seen.add(k)
        if not _fits(v, typ):
            return f"attribute {k!r} of {tag!r} must be {ATTRIBUTE_TYPES.get(typ, typ.__name__)}, not {v!r}"
    return None


def _fits(v: str, typ: type) -> bool:
    if typ is str:
        return True
    if typ is bool:
        return v in ("true", "false")
    try:
        typ(v)
    except ValueError:
        return False
    return typ is not float or v.strip().lower() not in ("nan", "inf", "-inf", "infinity", "-infinity")


class ContentExtension:
    """What a content plugin's ``configure`` returns. Override what applies;
    the defaults own nothing."""

    name: str = ""
    part_types: tuple[str, ...] = ()
    """Content-part ``type`` values this extension renders (the first is
    the type parse gives back)."""
    elements: tuple[str, ...] = ()
    """Element names it owns inside a message body."""
    attributes: Mapping[str, Mapping[str, type]] = {}
    """For each owned element, the attributes it may carry and the type of
    each value (``str``, ``int``, ``float`` or ``bool``). Checked when the
    plugin renders one and before :meth:`read_element` sees one."""
    embeds: bool = False
    """Whether it reads embeds back (see :meth:`read_embed`)."""
    markers: tuple[str, ...] = ()
    """Strings it writes as markers (a pad, a placeholder): each must be one
    of the template's markers, so a tokenizer gives it one special id."""
    grammar: str | None = None
    """A Lark fragment added to the reference grammar (``%extend`` a rule or
    terminal of ``grammar/xtml.lark``); the combined grammar must build as a
    strict LALR parser."""

    def prepare(self, part: Mapping[str, Any]) -> Any:
        """Check an input part and resolve what rendering needs; raise
        ValueError with a message for a bad part."""
        return dict(part)

    def render(self, value: Any, out: MarkupSink, ctx: Context) -> None:
        """Emit the markup of one prepared part."""
        raise NotImplementedError(f"plugin {self.name!r} renders no parts")

    def normal(self, value: Any, ctx: Context) -> dict[str, Any]:
        """The part as parse will give it back."""
        return {"type": self.part_types[0]} if self.part_types else {}

    def read_element(self, el: Element, ctx: Context) -> dict[str, Any] | None:
        """The part an owned element stands for (raise ValueError if malformed)."""
        return None

    def read_embed(self, raw: str, ctx: Context) -> dict[str, Any] | None:
        """The part an embed stands for, or None if it is not this plugin's."""
        return None

    def finish_render(self, ctx: Context) -> None:
        """After a request is rendered: check what spans parts (counts)."""

    def finish_normal(self, request: dict[str, Any], ctx: Context) -> None:
        """After the normal form is built: request-level rewrites."""

    def finish_parse(self, request: dict[str, Any], ctx: Context) -> None:
        """After a parse: request-level results (an option, say)."""

    def strategy(self) -> SearchStrategy[dict[str, Any]] | None:
        """Hypothesis strategy for parts this extension renders."""
        return None


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


__all__ = ["GROUP", "ContentExtension", "Context", "Plugin", "get", "installed", "use"]
