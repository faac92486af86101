"""The plugin API: everything a plugin, built-in or third-party, may use.

The chat layer calls plugins only through what is declared here, and hands
them only what is declared here: a content extension renders parts into a
:class:`~xtml.markup.sink.MarkupSink` and reads elements back with a
:class:`Context`. Call ids and the JSON spelling of argument values are
conventions the chat layer and plugins share, so they live here too. The
built-in image, audio and video plugins use nothing else (the test of this
API: each of them could live in a package of its own).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..markup.header import int_value, number_value
from . import jsonfmt
from .values import NoOperation, ValueReader, ValueSyntax

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..markup.nodes import Element
    from ..markup.sink import MarkupSink

__all__ = [
    "ATTRIBUTE_TYPES",
    "ContentExtension",
    "Context",
    "NoOperation",
    "Plugin",
    "ValueReader",
    "ValueSyntax",
    "call_id",
    "check_attributes",
    "ebnf_literal",
    "jsonfmt",
]


def call_id(pos: int, k: int) -> str:
    """The id the normal form gives call ``k`` (1-based) of the assistant
    message at position ``pos``: ids are not in the tokens, so they are made
    up the same way on both sides."""
    return f"call_{pos}_{k}"


def ebnf_literal(s: str, wide: bool = True) -> str:
    """``s`` as a quoted literal. ``wide``: a control character as ``\\u``
    of four digits, for xgrammar, which reads ``\\x`` as greedily as C does
    (a hex letter after it would join the escape: ``\\x01a`` is one
    character); else as ``\\x`` of two, which llama.cpp reads and
    llguidance's GBNF converter keeps."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}" if wide else f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


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
    if typ is int:
        return int_value(v) is not None
    if typ is float:
        return number_value(v) is not None
    try:
        typ(v)
    except ValueError:
        return False
    return True


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
    plugin renders one and before :meth:`read_element` sees one; numbers
    are JSON's number syntax in ASCII digits (spec.md §3.2), so ``int(v)``
    and ``float(v)`` of a checked value are finite and what was written."""
    embeds: bool = False
    """Whether it reads embeds back (see :meth:`read_embed`)."""
    markers: tuple[str, ...] = ()
    """Strings it writes as markers (a pad, a placeholder): each must be one
    of the template's markers, so a tokenizer gives it one special id."""
    placeholder: str | None = None
    """A text that stands for one part of this plugin wherever it appears in
    a message's text, and what such a part renders as when the request gives
    no prompt for it (K3's image placeholder); None: no such text."""
    prompt_pattern: re.Pattern[str] | None = None
    """Matches one whole prompt a processor made for a part (the request's
    ``image_prompts``, for the plugin named ``image``), anchored at both ends;
    None: requests give no prompts for this plugin's parts."""
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

    def completion_grammar(self, names: Mapping[str, str]) -> str | None:
        """The grammar of the elements a model may write with this plugin
        inside a response channel, for constrained decoding (see
        :meth:`xtml.Template.completion_grammar`); None (the default):
        the exported grammar admits none of them.

        Rules ``name: expression`` in the subset of Lark every export shares:
        string literals (JSON escapes), rule names, grouping, ``|``, ``?``,
        ``*``, ``+``. ``names`` gives the rules to use: ``start``, the rule to
        define (one alternative per element); ``open``, ``close``, ``sep``,
        the markers; ``text``, body text (maybe empty, never a marker);
        ``value`` and ``nonempty_value``, an attribute value as the markup
        escapes it. Other lowercase names are the fragment's own rules."""
        return None

    def jinja(self) -> str | None:
        """How ``xtml export jinja`` renders a part of this extension's
        ``part_types`` in a Jinja chat template: Jinja statements and
        expressions, run with the part in ``part`` (as the engine hands it
        over), the message's index in ``mi`` and the part's path in
        ``where`` (``content[2]``); None (the default): the plugin has no
        Jinja form, and the export refuses a template that enables it.

        It writes markup only through ``x_element(tag, attrs, text)``,
        ``x_open(tag, attrs)`` and ``x_close(tag)`` (``attrs`` a list of
        ``[name, value]`` pairs, values escaped for you; the markers are the
        template's), and refuses a part it cannot render with
        ``raise_exception(message)``, as :meth:`prepare` would, so that the
        template renders what :meth:`render` renders or raises. Every engine
        must read it: transformers' jinja2, ``@huggingface/jinja`` and
        llama.cpp's engine (no ``\\u`` escapes, no ``in`` on a None)."""
        return None
