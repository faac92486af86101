"""Value syntaxes: how a chat format writes tool declarations and call
arguments when it writes them as code rather than JSON.

A layout dialect is data, but some formats spell values in a syntax of their
own: Gemma 4 writes ``{city:<|"|>Paris<|"|>,days:3}`` and declares tools in
the same key:value notation; harmony declares tools as a TypeScript
namespace. Such a syntax is a plugin of the kind :class:`ValueSyntax`, found
through the ``xtml.value_syntaxes`` entry-point group (:data:`GROUP`) by
:func:`load_value_syntax`; the core names none of them.

A syntax says which operations it has in :attr:`ValueSyntax.operations`
(``jinja``, its writer as Jinja macros, lets a dialect that names it be
exported as a Jinja chat template);
asking one for another raises :class:`NoOperation`, located at the syntax
and the operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

from ..errors import CallerError, TemplateError

__all__ = [
    "GROUP",
    "OPERATIONS",
    "NoOperation",
    "ValueReader",
    "ValueSyntax",
    "load_value_syntax",
    "value_syntaxes",
]

GROUP = "xtml.value_syntaxes"
"""The entry-point group value syntaxes are installed under."""

OPERATIONS = frozenset({"declare", "declared", "write", "read", "grammar", "reader", "jinja"})
"""Every operation a value syntax may have."""


class NoOperation(CallerError):
    """A value syntax was asked for an operation it does not have (a
    syntax that appears in prompts only has no reading or grammar), or for
    a grammar syntax it does not write."""


@runtime_checkable
class ValueReader(Protocol):
    """An incremental reader of one arguments text: fed chunks, it gives
    each top-level ``(key, value)`` pair as soon as the pair is complete;
    ``dict`` of all the pairs it gives, through :meth:`close`, equals
    :meth:`ValueSyntax.read` of the joined chunks, and bad text raises the
    error ``read`` raises, at the same offset."""

    def feed(self, chunk: str) -> list[tuple[str, Any]]:
        """The pairs ``chunk`` completes."""

    def close(self) -> list[tuple[str, Any]]:
        """The pairs left at the end of the text; raises if the text is not
        a whole arguments text."""


class ValueSyntax:
    """What a ``xtml.value_syntaxes`` entry point names. Subclasses set
    :attr:`name` and :attr:`operations` and override those operations;
    the others raise :class:`NoOperation`.

    ``tools`` are OpenAI-style tools (``{"type": "function", "function":
    {"name", "description", "parameters"}}``); ``schema`` is a tool's
    ``parameters`` (a JSON schema of an object); ``arguments`` a call's
    arguments as a dict. Bad input raises a located
    :class:`~xtml.errors.CallerError`: a :class:`~xtml.errors.RequestError`
    at the path of a bad tool or value, a :class:`~xtml.errors.ParseError`
    at the character offset of bad text."""

    name: str = ""
    operations: frozenset[str] = frozenset()
    """The operations of :data:`OPERATIONS` this syntax has."""

    def declare(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """The tools' declarations, as the format writes them in a prompt."""
        raise self.missing("declare")

    def declared(self, text: str) -> Sequence[Mapping[str, Any]]:
        """The tools a declaration :meth:`declare` wrote reads back as."""
        raise self.missing("declared")

    def write(self, arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
        """A call's arguments as the format writes them."""
        raise self.missing("write")

    def read(self, text: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments ``text`` holds, read against the tool's schema."""
        raise self.missing("read")

    def grammar(self, schema: Mapping[str, Any], syntax: str = "llguidance", rule: str = "arguments",
                tokens: Mapping[str, str] | None = None) -> str:
        """Grammar rules, in ``syntax``, of the arguments as this syntax
        writes them for ``schema``: the rule ``rule`` and helper rules and
        terminals whose names start with it. ``tokens``: how the grammar
        references each special token of the format the vocabulary has as
        one id (text the syntax writes that is such a token is the
        reference, and free text never spells it); a token absent is text."""
        raise self.missing("grammar")

    def reader(self, schema: Mapping[str, Any] | None = None) -> ValueReader:
        """A :class:`ValueReader` of one arguments text (read against
        ``schema``, the tool's, when given)."""
        raise self.missing("reader")

    def jinja_macros(self, prefix: str) -> str:
        """The writer as Jinja macros, for a chat template exported from a
        dialect that names this syntax (``xtml export jinja``): source that
        defines ``{prefix}declare(tools)``, writing what :meth:`declare`
        writes of a list of tools, and ``{prefix}write(arguments, at)``,
        writing what :meth:`write` writes of an object, and helper macros
        whose names start with ``prefix``. Where :meth:`declare` or
        :meth:`write` raise, the macros call ``raise_exception`` with the
        same message and location: ``tools[…]…`` for the declarations, ``at``
        (the Jinja string of where the arguments are, such as
        ``messages[1].tool_calls[0].function.arguments``) followed by the
        path inside them for the arguments. They use the Jinja that
        transformers' jinja2, ``@huggingface/jinja`` and llama.cpp's engine
        share, or raise where an engine cannot write what Python writes;
        the template defines, before them, ``x_py`` (true in jinja2, whose
        ``string`` filter is Python's ``str()``), ``x_ascii(s)`` (``'y'`` when
        ``s`` holds only printable ASCII, tab, line feed and carriage
        return), ``x_repr(s)`` (``shown()`` of a string) and ``x_pfloat(v)``
        (a float as Python's ``repr()``, or a raise where the engine's digits
        read back as another number)."""
        raise self.missing("jinja")

    def missing(self, operation: str) -> NoOperation:
        """The error for an operation this syntax does not have."""
        have = ", ".join(sorted(self.operations)) or "none"
        return NoOperation(f"value syntax {self.name!r} has no {operation!r} operation (it has: {have})",
                           location=f"value syntax {self.name!r}, operation {operation!r}")

    def no_grammar(self, syntax: str, written: Iterable[str]) -> NoOperation:
        """The error for a grammar syntax this value syntax does not write."""
        return NoOperation(f"value syntax {self.name!r} writes no {syntax!r} grammar (it writes: "
                           f"{', '.join(written)})", location=f"value syntax {self.name!r}, operation 'grammar'")


_loaded: dict[str, ValueSyntax] = {}


def value_syntaxes() -> list[str]:
    """The names of the installed value syntaxes (none is imported)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def _dist(ep: EntryPoint) -> str:
    name = getattr(getattr(ep, "dist", None), "name", None)
    return name if isinstance(name, str) and name else "unknown"


def load_value_syntax(name: str) -> ValueSyntax:
    """The value syntax installed as ``name``, importing its entry point
    alone. Every error is a :class:`~xtml.errors.TemplateError` located at
    the entry point (``xtml.value_syntaxes:NAME``) and naming what it
    points at and its distribution."""
    hit = _loaded.get(name)
    if hit is not None:
        return hit
    where = f"entry point {GROUP}:{name}"
    eps = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not eps:
        have = ", ".join(value_syntaxes()) or "none"
        raise TemplateError(f"value syntax {name!r} is not installed (installed: {have})", location=where)
    points = sorted({(ep.value, _dist(ep)) for ep in eps})
    if len(points) > 1:
        both = "; ".join(f"{v!r} of distribution {d!r}" for v, d in points)
        raise TemplateError(f"value syntax {name!r} is declared twice ({both}); uninstall one", location=where)
    ep = eps[0]
    what = f"value syntax {name!r} ({ep.value!r} of distribution {_dist(ep)!r})"
    try:
        obj = ep.load()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit at import too: one package must not end the caller
        raise TemplateError(f"{what} failed to load: {type(e).__name__}: {e}", location=where) from None
    if not isinstance(obj, ValueSyntax) or obj.name != name:
        raise TemplateError(f"{what} is not a ValueSyntax named {name!r}", location=where)
    unknown = set(obj.operations) - OPERATIONS
    if unknown:
        raise TemplateError(f"{what} declares unknown operations {sorted(unknown)} (known: "
                            f"{', '.join(sorted(OPERATIONS))})", location=where)
    _loaded[name] = obj
    return obj
