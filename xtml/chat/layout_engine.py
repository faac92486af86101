"""The layout engine's entry points: which writer and reader a layout
dialect takes. Formats framed message by message are written by
:mod:`.layout_render` and read by :mod:`.layout_parse`; formats with a head
and a system turn of their own (a ``[turns]`` section) by
:mod:`.layout_turns`, which builds on both; formats with a system turn of
their own and calls as one JSON array by :mod:`.layout_system_turn` and
:mod:`.layout_call_array`; formats that fold tool results into the calling
turn by :mod:`.layout_fold_read` and :mod:`.layout_fold_answer`; formats that
write a message as several by :mod:`.layout_split_render`, read by
:mod:`.layout_harmony_prompt` and :mod:`.layout_harmony`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import (
    layout_call_array,
    layout_fold_answer,
    layout_fold_read,
    layout_harmony,
    layout_harmony_prompt,
    layout_open,
    layout_parse,
    layout_render,
    layout_split_render,
    layout_system_turn,
    layout_turns,
)
from .layout import LayoutDialect
from .layout_parse import Lexed
from .layout_render import Rendering

__all__ = ["normal_form", "parse_completion", "parse_prompt", "render"]


def render(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> Rendering:
    if d.header_turns is not None:
        return layout_turns.render_turns(d, request, options)
    if d.split is not None:
        r = layout_split_render.render_split(d, request, options)
        more = [x for x in layout_harmony_prompt.harmony_drops(d, request, options)
                if (x.message, x.field) not in {(y.message, y.field) for y in r.dropped}]
        return r._replace(dropped=(*r.dropped, *more)) if more else r
    r = layout_render.render(d, request, options)
    more = layout_open.open_drops(d, request, options) if d.open_turns else \
        layout_system_turn.system_turn_drops(d, request, options) if d.system_turns else \
        layout_fold_read.fold_drops(d, request, options) if d.folded_turns else []
    if more:
        r = r._replace(dropped=(*r.dropped, *more))
    return r


def normal_form(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as a parse of its render returns it."""
    if d.split is not None:
        return layout_harmony_prompt.normal_form_harmony(d, request, options)
    if d.header_turns is not None:
        return layout_turns.normal_form_turns(d, request, options)
    if d.open_turns:
        return layout_open.normal_form_open(d, request, options)
    if d.system_turns:
        return layout_system_turn.normal_form_system_turn(d, request, options)
    if d.folded_turns:
        return layout_fold_read.normal_form_fold(d, request, options)
    return layout_render.normal_form(d, request, options)


def parse_prompt(d: LayoutDialect, lx: Lexed) -> dict[str, Any]:
    """A whole rendered request back to its normal form."""
    if d.split is not None:
        return layout_harmony_prompt.parse_prompt_harmony(d, lx)
    if d.header_turns is not None:
        return layout_turns.parse_prompt_turns(d, lx)
    if d.open_turns:
        return layout_open.parse_prompt_open(d, lx)
    if d.system_turns:
        return layout_system_turn.parse_prompt_system_turn(d, lx)
    if d.folded_turns:
        return layout_fold_read.parse_prompt_fold(d, lx)
    return layout_parse.parse_prompt(d, lx)


def parse_completion(d: LayoutDialect, lx: Lexed, *, lenient: bool, tools: Any = None) -> dict[str, Any]:
    """What a model generated after the generation prompt, as one assistant
    message; ``tools`` (the request's) type the arguments of a format that
    writes them untyped."""
    if d.split is not None:
        return layout_harmony.parse_completion_harmony(d, lx, lenient=lenient)
    if d.open_turns:
        return layout_open.parse_completion_open(d, lx, lenient=lenient, tools=tools)
    if d.system_turns:
        return layout_call_array.parse_completion_array(d, lx, lenient=lenient)
    if d.folded_turns:
        return layout_fold_answer.parse_completion_fold(d, lx, lenient=lenient, tools=tools)
    if d.header_turns is not None:
        return layout_turns.parse_completion_turns(d, lx, lenient=lenient)
    return layout_parse.parse_completion(d, lx, lenient=lenient)
