"""The generation prompt: the assistant message a prompt ends with, left
open with the channel the model writes first.

Built here once; rendering writes it, parsing recognises it, and the parsers
of a completion start from it.
"""

from __future__ import annotations

from ..markup.nodes import Element
from ..markup.sink import MarkupSink
from .dialect import Dialect


def generation_prompt(d: Dialect, thinking: bool) -> Element:
    """The open assistant message (and the open channel it starts with)."""
    n = d.names
    tag = d.prompt_tag(thinking)
    channel = (Element(tag, (), (), closed=False),) if tag else ()
    return Element(n["message"], ((n["role"], "assistant"),), channel, closed=False)


def write_prompt(d: Dialect, thinking: bool, sink: MarkupSink) -> None:
    """The generation prompt, written into ``sink``: open tags only."""
    el: Element | None = generation_prompt(d, thinking)
    while el is not None:
        sink.open(el.tag, el.attrs)
        el = el.children[0] if el.children and isinstance(el.children[0], Element) else None


def is_generation_prompt(d: Dialect, el: Element, thinking: bool) -> bool:
    """Whether a parsed element is :func:`generation_prompt` of ``thinking``
    (read without building one: a parse asks this of every message)."""
    n = d.names
    if el.closed or el.tag != n["message"] or el.attrs != ((n["role"], "assistant"),):
        return False
    tag = d.prompt_tag(thinking)
    if not tag:
        return not el.children
    if len(el.children) != 1:
        return False
    ch = el.children[0]
    return type(ch) is Element and ch.tag == tag and not ch.closed and not ch.children and not ch.attrs
