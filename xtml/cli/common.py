"""Argument types and help shared by the command-line modules."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from ..errors import CallerError
from ..plugins.jsonfmt import BadInput, input_json
from ..template import LayoutTemplate, Template


class InputError(CallerError):
    """An input file (or standard input) that cannot be read as what the
    command expects."""


def added_tokens(tpl: Template) -> tuple[str, ...]:
    """What ``--add-markers`` adds to a tokenizer as special tokens: an XTML
    template's markers, or the tokens a layout dialect declares (its special
    and added ones)."""
    if isinstance(tpl, LayoutTemplate):
        return tpl.layout.tokens
    return tpl.markers.all()


def refuse_layout(tpl: Template, what: str) -> None:
    """Refuse, in one line at the template's file, what layout dialects do
    not have yet."""
    if isinstance(tpl, LayoutTemplate):
        raise InputError(f"{what} is not yet available for layout dialects ({tpl.name!r} is one)",
                         location=tpl.path or tpl.name)


def read_input(path: str) -> str:
    """A file, or standard input for ``-``, as text: strict UTF-8 either way,
    line ends as they are, so both read the same bytes the same way."""
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            if sys.stdin is None:  # the process was started with it closed
                raise InputError("cannot read standard input: it is closed")
            binary = getattr(sys.stdin, "buffer", None)
            if binary is None:  # a text stream put in place by the caller
                return str(sys.stdin.read())
            # Not sys.stdin.read(): its error handler (surrogateescape under
            # a C or POSIX locale) would let bytes through that a file is
            # refused for.
            data = binary.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return str(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{name} is not UTF-8 text (byte {e.start})") from None


def json_input(text: str, source: str) -> Any:
    """JSON text read from ``source``, or one line saying why not."""
    try:
        return input_json(text)
    except BadInput as e:
        raise InputError(f"{source}: {e}") from None


def boolean(s: str) -> bool:
    """An argparse type: true or false, as people write them."""
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {s!r}")


def at_least(minimum: int, most: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer not below ``minimum`` (nor above
    ``most``, for the reason ``why``)."""
    what = "a positive integer" if minimum == 1 else "a whole number" if minimum == 0 else f"an integer ≥ {minimum}"

    def convert(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, not {s!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, not {s!r}")
        if most is not None and v > most:
            raise argparse.ArgumentTypeError(f"expected at most {most:,}{why}, not {s}")
        return v

    return convert


class MissingExtra(CallerError):
    """A command whose optional dependencies are not installed."""


def require(command: str, extra: str, *modules: str) -> None:
    """Import ``modules``, or raise :class:`MissingExtra` naming the extra
    of ``pyproject.toml`` that installs them, in one line: the index form
    for a pip install, the editable form for a clone (an index does not
    know the clone's version)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            if (e.name or "").partition(".")[0] == "xtml":
                raise  # a fault of xtml's own, not a missing extra
            raise MissingExtra(extra_missing(command, extra, e.name or name)) from None


def extra_missing(command: str, extra: str, module: str) -> str:
    """The one line that says what to install for ``command``."""
    return (f"{command} needs the {extra} extra ({module} is not installed): pip install 'xtml[{extra}]' "
            f"(from a clone: pip install -e '.[{extra}]')")


TOKENIZER_HELP = ("tokenizer.json, a tiktoken BPE file, a GGUF model file, or a model folder (tokenizer.json, "
                  "or a tiktoken vocabulary with tokenizer_config.json)")
