"""Formats that write one request message as several of their own
(spec.md §12): an answer as its reasoning, then its call or its final text,
each a message with its own header; tool results named by the call they
answer. What such a file says, read into
a :class:`SplitLayout`; render is :mod:`.layout_split_render`'s, the parse
of a prompt and the normal form :mod:`.layout_harmony_prompt`'s, the parse
of an answer and its stream :mod:`.layout_harmony`'s.

A file is of this kind when it uses any of the keys only it reads
(:func:`split_mode`); the conditions and slots those keys bring are known to
its patterns then, and to no other file's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .layout_pattern import Pattern
from .layout_turn import STRINGS

__all__ = ["CALL_NAME", "ENDS", "SOME_TOOLS", "SYSTEM_TEXT", "SplitLayout", "build_split",
           "split_mode", "split_names"]

ENDS = "ends"
"""Condition of a message's body: it is the last message and no generation
prompt follows it."""
SOME_TOOLS = "some_tools"
"""Condition of the system turn: tools are given and the list is not empty."""
SYSTEM_TEXT = "system_text"
"""Condition of the system turn: the first message is a system message whose
content is not empty (a string or a list, as the template tests it)."""
CALL_NAME = "call_name"
"""Slot of a tool result's frame: the name of the call it answers."""


@dataclass(frozen=True, slots=True)
class SplitLayout:
    """What a format that writes a message as several of its own does that
    the other layout formats do not."""

    drop_later: tuple[str, ...]
    """Roles written only as the first message: a later one is left out
    (and reported)."""
    keep_calls: int
    """How many of an assistant's calls are written (the first ones); the
    others are reported. 0: all."""
    content_reasoning: bool
    """The content beside calls is written as the message's reasoning; both
    given (neither empty) is refused."""
    forbid: Mapping[str, tuple[str, ...]]
    """Role → texts refused in its content and reasoning (where the template
    raises on them)."""
    ending_given: bool
    """The answer that ends the render (last, no generation prompt after it)
    shows its reasoning wherever it is given, even empty."""
    lists: Mapping[str, tuple[str, ...]]
    """List options → the values each has a condition for
    (``NAME_VALUE``: the list holds it); ``NAME`` is itself a condition: the
    list is given and not empty."""


class _Checker(Protocol):
    """The checker the file reader passes (``template_file._Check``)."""

    def add(self, message: str, key: str, hint: str = "") -> None: ...


_SPLIT_KEYS = (("roles", "drop_later"), ("calls", "keep"), ("content", "forbid"),
               ("reasoning", "ending"))


_NOT_WRITTEN = {
    ("system", "hoist"): "every system message written first", ("system", "with_tools"): "a system turn with tools",
    ("system", "default"): "a default system message",
    ("system", "roles"): "system roles (read a role as another: [roles] alias)",
    ("content", "suffix"): "a suffix added to content", ("content", "cut"): "content cut",
    ("content", "image"): "an image placeholder", ("content", "trim"): "content trimmed",
    ("content", "strip"): "text cut out of content", ("roles", "name"): "names as role text",
    ("roles", "flags"): "message flags", ("roles", "continue"): "a turn continued by the next message",
    ("calls", "section"): "a section of calls", ("calls", "id_tail"): "ids cut",
    ("calls", "pair"): "arguments as pairs",
    ("calls", "result"): "results folded into the calling turn", ("calls", "pending"): "a close for pending calls",
    ("calls", "leave_open"): "a turn left open", ("reasoning", "split"): "reasoning split out of content",
    ("reasoning", "block"): "a reasoning block", ("reasoning", "opened"): "a reasoning block the prompt opens",
    ("reasoning", "keys"): "reasoning read under chosen names"}
"""What the other layout formats write and this kind's render does not."""


def _tab(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = data.get(key)
    return v if isinstance(v, Mapping) else {}


def _list_options(data: Mapping[str, Any]) -> dict[str, Any]:
    if "turns" in data:
        return {}  # a [turns] format's list options are its own
    return {k: v for k, v in _tab(data, "options").items()
            if isinstance(v, Mapping) and v.get("type") == STRINGS and "values" in v}


def split_mode(data: Mapping[str, Any]) -> bool:
    """Whether a layout file's parsed TOML uses a key only this kind of
    format reads."""
    return (any(key in _tab(data, section) for section, key in _SPLIT_KEYS)
            or _tab(data, "calls").get("content") == "reasoning" or bool(_list_options(data)))


def split_names(data: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The conditions of the system turn, the conditions of a message's body
    and the slots of a role's frame that this kind of format adds (none for
    any other file)."""
    if not split_mode(data):
        return frozenset(), frozenset(), frozenset()
    lists = _list_options(data)
    turn = {SOME_TOOLS, SYSTEM_TEXT, *lists}
    for name, v in lists.items():
        values = v.get("values")
        if isinstance(values, list):
            turn.update(f"{name}_{x}" for x in values if isinstance(x, str))
    return frozenset(turn), frozenset({ENDS}), frozenset({CALL_NAME})


def build_split(c: _Checker, data: Mapping[str, Any], accepted: Sequence[str],
                patterns: Sequence[Pattern]) -> SplitLayout | None:
    """The :class:`SplitLayout` of a file of this kind (None for any other),
    problems added to ``c``; ``patterns``: the file's bodies and frames."""
    if not split_mode(data):
        return None
    for (section, key), what in _NOT_WRITTEN.items():
        if key in _tab(data, section):
            c.add(f"{what} is not written by a format that writes a message as several (one that uses "
                  f"{', '.join(f'{s}.{k}' for s, k in _SPLIT_KEYS)}, calls.content = \"reasoning\" or a list "
                  "option)", f"{section}.{key}")
    if "turns" in data:
        c.add("a format with a [turns] section does not write a message as several", "turns")
    for section, key, ok in (("tools", "render", ("syntax", "drop")), ("calls", "ids", ("absent",)),
                             ("calls", "arguments", ("as_given", "tojson"))):
        v = _tab(data, section).get(key)
        if v is not None and v not in ok:
            c.add(f"{key} is one of {', '.join(map(repr, ok))} in a format that writes a message as several",
                  f"{section}.{key}")
    for r, tab in _tab(_tab(data, "roles"), "frame").items():
        if isinstance(tab, Mapping) and tab.get("group", "none") != "none":
            c.add("frames of a format that writes a message as several are not shared", f"roles.frame.{r}.group")

    drop_later = _tab(data, "roles").get("drop_later", [])
    if not isinstance(drop_later, list) or not all(isinstance(r, str) and r in accepted for r in drop_later):
        c.add("drop_later lists accepted roles written only first (a later one left out)", "roles.drop_later")
        drop_later = []
    keep = _tab(data, "calls").get("keep", 0)
    if type(keep) is not int or not 0 <= keep <= 64:
        c.add("keep is how many of a message's calls are written, 1 to 64 (0: all)", "calls.keep")
        keep = 0
    forbid: dict[str, tuple[str, ...]] = {}
    given = _tab(data, "content").get("forbid", {})
    if not isinstance(given, Mapping):
        given = {"": None}
    for r, texts in given.items():
        if r not in accepted or not isinstance(texts, list) or not all(isinstance(t, str) and t for t in texts):
            c.add("forbid is { role = [\"text\", …] }: texts refused in an accepted role's content and reasoning",
                  f"content.forbid.{r}" if r else "content.forbid")
        else:
            forbid[r] = tuple(texts)
    ending = _tab(data, "reasoning").get("ending", "")
    if ending not in ("", "given"):
        c.add("ending is \"given\": the answer that ends the render shows its reasoning wherever given",
              "reasoning.ending")
    lists: dict[str, tuple[str, ...]] = {}
    for name, v in _list_options(data).items():
        values = v.get("values")
        if set(v) - {"type", "values"} or not isinstance(values, list) or \
                not all(isinstance(x, str) and x.isidentifier() for x in values):
            c.add("a list option is { type = \"strings\", values = [\"name\", …] }: a condition of its own (given, "
                  "not empty) and one per value (NAME_VALUE: the list holds it)", f"options.{name}")
        else:
            lists[name] = tuple(values)
    content_reasoning = _tab(data, "calls").get("content") == "reasoning"
    return SplitLayout(drop_later=tuple(drop_later), keep_calls=keep,
                       content_reasoning=content_reasoning, forbid=forbid, ending_given=ending == "given",
                       lists=lists)
