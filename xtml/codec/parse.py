"""Parsing in one go: token ids (with their binding) or text back to a
request, or a completion back to the assistant message.

Ids take the binding's one-pass builder when the input is well formed and
the general driver otherwise; text is lexed and built by the same driver,
strict text conversations by the reference grammar (for its expected-token
messages). A completion is read after the generation prompt (or the open
final message of a ``continue_final_message`` render), and errors count
from the start of the caller's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..chat.dialect import Dialect
from ..chat.parse import parse_completion, parse_conversation
from ..chat.prompt import generation_prompt
from ..chat.render import render
from ..chat.request import prepare
from ..errors import ParseError
from ..markup.markers import CLOSE, END, SEP, TEXT
from ..markup.nodes import Diagnostic, Element
from ..markup.parse import Lexemes, build, check_size, lex_text
from ..markup.reference import parse_lexemes
from ..markup.segments import Segment, to_segments
from ..markup.sink import TreeSink
from ..vocab.binding import Binding
from ..vocab.ids import skip_bad_ids

__all__ = ["parse", "prefill_element", "reasoning_length"]


def prefill_element(d: Dialect, message: Any, thinking: bool, max_chars: int | None) -> Element:
    """The final message of a ``continue_final_message`` render, left open:
    what a completion after such a prompt continues."""
    o, msgs = prepare(d, {"messages": [message], "thinking": thinking, "continue_final_message": True},
                      {"max_chars": max_chars})
    tb = TreeSink()
    render(d, o, msgs, tb)
    last = tb.finish()[-1]
    assert isinstance(last, Element)
    return last


def reasoning_length(d: Dialect, binding: Binding, ids: Sequence[int], thinking: bool | None = None) -> int:
    """How many of a completion's ids are its reasoning (OpenAI's
    ``reasoning_tokens``): those up to and with the close of the reasoning
    channel the generation prompt opened, or all of them when the completion
    never closes it; none when the prompt opened no reasoning channel. The
    same count as a stream's ``channel_end`` of that channel (its offset,
    plus one)."""
    tag = d.channel_tag("reasoning")
    if tag is None or not (d.thinking_default if thinking is None else thinking):
        return 0
    m = d.markers
    end = [binding.marker_ids[m.close], *binding.encode_segments([Segment(tag, False)]), binding.marker_ids[m.sep]]
    first, n = end[0], len(end)
    for k in range(len(ids) - n + 1):
        if ids[k] == first and list(ids[k:k + n]) == end:
            return k + n
    return len(ids)


def parse(d: Dialect, binding: Binding | None, data: Sequence[Any] | str, *, completion: bool = False,
          lenient: bool = False, thinking: bool | None = None, prefill: Any = None,
          max_chars: int | None = None, repaired_calls: bool = False) -> dict[str, Any]:
    """Token ids (``binding`` given) or text back to a request; with
    ``completion``, what a model generated after the generation prompt back
    to one assistant message. A lenient parse of text withholds the tool
    calls that exist only because of a repair unless ``repaired_calls``
    (:mod:`xtml.chat.parse` says which); ids keep every call. See
    :meth:`xtml.Template.parse`."""
    check_size(data, max_chars)
    kept: list[int] | None = None
    skipped: list[Diagnostic] = []
    if lenient and binding is not None and not isinstance(data, str | bytes | bytearray) \
            and isinstance(data, Sequence):
        data, kept, skipped = skip_bad_ids(data, binding.vocab.size)
    try:
        result, diags = _parse(d, binding, data, completion, lenient, thinking, prefill, max_chars,
                               lenient and not repaired_calls and isinstance(data, str))
    except RecursionError:
        raise ParseError("input nested too deeply", offset=0) from None
    if lenient:
        if kept is not None:
            # Offsets count in the caller's ids, the skipped ones too.
            n = len(kept) + len(skipped)
            diags = sorted([*skipped, *(Diagnostic(x.kind, kept[x.offset] if x.offset < len(kept) else n,
                                                   x.message) for x in diags)], key=lambda x: x.offset)
        result["diagnostics"] = [x.as_dict() for x in diags]
    return result


def _parse(d: Dialect, binding: Binding | None, data: Sequence[Any] | str, completion: bool, lenient: bool,
           thinking: bool | None, prefill: Any, max_chars: int | None,
           withhold: bool) -> tuple[dict[str, Any], list[Diagnostic]]:
    on = d.thinking_default if thinking is None else thinking
    if prefill is not None and not completion:
        raise TypeError("prefill= is the start of a completion: pass completion=True")
    prompt = generation_prompt(d, on) if prefill is None else prefill_element(d, prefill, on, max_chars)
    shift = 0
    source: str | None = None
    if isinstance(data, str):
        text = data
        if completion:
            prefix = "".join(s.text for s in to_segments([prompt], d.markers))
            shift = len(prefix)
            text = prefix + text
        lx = lex_text(text, d.markers)
        source = text
    else:
        if binding is None:
            raise TypeError("parsing token ids needs their tokenizer (or pass text)")
        if not isinstance(data, Sequence) or isinstance(data, bytes | bytearray):
            raise TypeError("expected a sequence of token ids or a string")
        ids: list[int] = list(data)  # type: ignore[arg-type]  # a str went the other way
        if not completion:
            doc = binding.document(ids, lenient=lenient)
            return parse_conversation(d, doc, lenient=lenient)
        prefix_ids = binding.encode([prompt])
        shift = len(prefix_ids)
        ids = prefix_ids + ids
        # A whole completion (the usual case) takes the one-pass tree
        # builder; the end marker an engine strips is put back first.
        end = binding.end_after_close(ids, d.names["message"])
        whole = binding.well_formed(ids if end is None else [*ids, end])
        try:
            if whole is not None:
                return parse_completion(d, whole, thinking=on, lenient=lenient, shift=shift)
            lx = binding.lex(ids)
        except ParseError as e:
            raise e.moved(shift) from None
    if completion:
        _end_if_closed(lx, d.names["message"])
    try:
        if source is not None and not lenient and not completion:
            doc = parse_lexemes(lx, source=source)
        else:
            doc = build(lx, lenient=lenient, source=source)
        if completion:
            return parse_completion(d, doc, thinking=on, lenient=lenient, shift=shift, withhold_repaired=withhold)
        return parse_conversation(d, doc, lenient=lenient, withhold_repaired=withhold)
    except ParseError as e:
        raise e.moved(shift, source) from None


def _end_if_closed(lx: Lexemes, message_tag: str) -> None:
    """A completion may stop right before the stop token (engines strip it):
    supply the end marker after a closed message."""
    k = lx.kinds
    if len(k) >= 3 and k[-3] == CLOSE and k[-2] == TEXT and k[-1] == SEP and lx.texts[-2] == message_tag:
        k.append(END)
        lx.texts.append("")
        lx.offsets.append(lx.end)
