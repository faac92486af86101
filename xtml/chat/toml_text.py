"""TOML text read with one failure type: every text Python's reader cannot
read, nested past its recursion limit too, is a ``ValueError``."""

from __future__ import annotations

import tomllib
from typing import Any

__all__ = ["TomlTooDeep", "read_toml"]


class TomlTooDeep(ValueError):
    """TOML text nested deeper than Python's reader goes (its recursion
    limit): text that cannot be read, as any other."""


def read_toml(text: str) -> Any:
    """``tomllib.loads(text)``, with nesting past Python's recursion limit a
    :class:`TomlTooDeep`."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise TomlTooDeep("nested too deeply") from None
