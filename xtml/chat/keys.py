"""Where a key path is written in a template file's TOML text: the line
and column a problem of the checker (:mod:`.template_file`) is reported at."""

from __future__ import annotations

import re
from typing import Any

# Table headers and keys, line by line. Each pattern reads a line one way
# only (no nested or overlapping repeats), so a hostile line costs time
# linear in its length.
_HEADER = re.compile(r"^\s*\[\[?([^\]]*)\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+))*)\s*=""")
_DOTTED = re.compile(r"""\"[^\"]*\"|'[^']*'|[^.\s]+""")
# A problem's key path split at dots, a bracketed part kept whole.
_PART = re.compile(r"(?:[^.\[]|\[[^\]]*(?:\]|$))+")
_INDEX = re.compile(r"\[\d+\]")


def _dotted(s: str) -> list[str]:
    return [p.strip().strip("\"'") for p in _DOTTED.findall(s)]


class KeyIndex:
    """Where each key path is written in a TOML text, read in one pass: a
    file's problems are all located against it, not by reading the file
    again for each one."""

    def __init__(self, text: str) -> None:
        # A trie of key paths: part → (position of its first appearance,
        # children).
        self._root: dict[str, tuple[list[tuple[int, int] | None], dict[str, Any]]] = {}
        table: list[str] = []
        for ln, line in enumerate(text.splitlines(), start=1):
            m = _HEADER.match(line)
            if m and not _KEY.match(line):
                table = _dotted(m.group(1))
                path, col = table, line.index("[") + 1
            else:
                m = _KEY.match(line)
                if not m:
                    continue
                path, col = table + _dotted(m.group(1)), m.start(1) + 1
            node = self._root
            entry = None
            for part in path:
                entry = node.get(part)
                if entry is None:
                    entry = node[part] = ([None], {})
                node = entry[1]
            if entry is not None and entry[0][0] is None:
                entry[0][0] = (ln, col)

    def locate(self, key: str) -> tuple[int, int] | None:
        """Line and column (1-based) of a dotted key path (list indexes
        ignored): the key itself, else the nearest enclosing table or key."""
        best = None
        node = self._root
        for part in _PART.findall(_INDEX.sub("", key)):
            entry = node.get(part)
            if entry is None:
                break
            if entry[0][0] is not None:
                best = entry[0][0]
            node = entry[1]
        return best


_last_index: list[tuple[str, KeyIndex]] = []


def locate(text: str, key: str) -> tuple[int, int] | None:
    """Line and column (1-based) where a dotted key path is written in TOML
    text: the key itself, else the nearest enclosing table or key. (The
    index of the last text asked about is kept.)"""
    if _last_index and _last_index[0][0] is text:
        index = _last_index[0][1]
    else:
        index = KeyIndex(text)
        _last_index[:] = [(text, index)]
    return index.locate(key)
