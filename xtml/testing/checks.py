"""The properties a template must have, as functions that raise
:class:`AssertionError` with a message saying what differed and where.

* :func:`check_round_trip` — ``parse(encode(x)) == normalize(x)`` (or through
  the text form), and the normal form is a fixed point;
* :func:`check_injection_free` — no text becomes a marker or special token;
* :func:`check_stream_equals_batch` — a streamed completion gives the batch
  parser's message (:func:`completion_case` builds the completion);
* :func:`check_never_crash` — arbitrary ids or text end in a result or an
  :class:`~xtml.XtmlError`, and lenient parsing never raises;
* :func:`check_markup_parses` — well-formed markup parses, and the parser
  agrees with the reference grammar.

Each takes the template, the input (from :mod:`xtml.testing.strategies` or
your own) and, for token ids, the tokenizer; the checks themselves draw
nothing, so they also run on inputs collected elsewhere.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..codec.stream import StreamEvent
from ..errors import ParseError, XtmlError, shown
from ..markup.markers import OPEN
from ..markup.parse import MAX_DEPTH, build, lex_text
from ..markup.reference import parse_lexemes
from ..markup.segments import Segment
from ..template import Template, TokenizerLike

__all__ = [
    "check_injection_free",
    "check_markup_parses",
    "check_never_crash",
    "check_round_trip",
    "check_stream_equals_batch",
    "completion_case",
]

_V = TypeVar("_V")


# -- comparing ------------------------------------------------------------------


def _shown(x: Any) -> str:
    # Longer than an error's quote: a failing property shows enough to compare.
    return shown(x, 300)

def _difference(want: Any, got: Any, path: str = "") -> str | None:
    """Where two JSON-like values first differ, or None if they are equal."""
    if type(want) is not type(got) and not (isinstance(want, int | float) and isinstance(got, int | float)):
        return f"{path or 'the value'}: expected {_shown(want)}, got {_shown(got)}"
    if isinstance(want, dict):
        for k in want:
            if k not in got:
                return f"{path}.{k}: missing (expected {_shown(want[k])})" if path else f"{k}: missing"
        for k in got:
            if k not in want:
                return f"{path}.{k}: unexpected {_shown(got[k])}" if path else f"{k}: unexpected {_shown(got[k])}"
        for k in want:
            diff = _difference(want[k], got[k], f"{path}.{k}" if path else str(k))
            if diff is not None:
                return diff
        return None
    if isinstance(want, list):
        for i, (a, b) in enumerate(zip(want, got)):
            diff = _difference(a, b, f"{path}[{i}]")
            if diff is not None:
                return diff
        if len(want) != len(got):
            return f"{path or 'the list'}: expected {len(want)} items, got {len(got)}"
        return None
    if want != got or type(want) is not type(got):
        return f"{path or 'the value'}: expected {_shown(want)}, got {_shown(got)}"
    return None


def _assert_equal(want: Any, got: Any, what: str) -> None:
    if want != got:
        raise AssertionError(f"{what}: {_difference(want, got) or f'{_shown(want)} != {_shown(got)}'}")


def _call(what: str, fn: Callable[..., _V], *args: Any, **kwargs: Any) -> _V:
    """``fn(*args, **kwargs)``; any exception becomes an AssertionError naming ``what``."""
    try:
        return fn(*args, **kwargs)
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}") from e


# -- the checks ------------------------------------------------------------------

def _text_form_ambiguous(template: Template, segments: Sequence[Segment]) -> bool:
    """Whether some marker literal in the text form comes from text rather
    than from a special segment (the text form then reads back otherwise)."""
    splitter = template.markers.splitter()
    whole = len(splitter.findall("".join(s.text for s in segments)))
    return whole != sum(len(splitter.findall(s.text)) for s in segments if s.special)


def _spells_text_mark(template: Template, segments: Sequence[Segment], tokenizer: TokenizerLike) -> bool:
    """Whether text spells a marker that the vocabulary has no id for (an
    optional marker): decoded, it reads as the marker, as the model's own
    processor reads it, so such a request does not round-trip by design."""
    marks = template.bind(tokenizer).text_marks
    if not marks:
        return False
    runs: list[str] = []
    run: list[str] = []
    for seg in segments:
        if seg.special:
            runs.append("".join(run))
            run = []
        else:
            run.append(seg.text)
    runs.append("".join(run))
    return any(m in r for r in runs for m in marks)


def check_round_trip(template: Template, request: Any, tokenizer: TokenizerLike | None = None) -> None:
    """``parse(encode(request)) == normalize(request)``, strictly and leniently
    (with no diagnostics); render and normalize leave the request unchanged;
    the normal form is a fixed point of normalize and renders to the same
    text.

    With ``tokenizer=None`` the text form is checked instead, where it is
    unambiguous (no marker literal in body text; otherwise only the fixed
    point is checked). Likewise, where the vocabulary spells an optional
    marker as text, a request holding a literal of it in text is not parsed
    back (it would read as the marker, by design)."""
    before = copy.deepcopy(request)
    expected = _call("normalize", template.normalize, request)
    rendered = _call("render", template.render, request)
    if tokenizer is None:
        if not _text_form_ambiguous(template, rendered.segments):
            got = _call("parse of the rendered text", template.parse, rendered.text)
            _assert_equal(expected, got, "parse(render(x).text) differs from normalize(x)")
    else:
        ids = _call("encode", template.encode, request, tokenizer)
        if not _spells_text_mark(template, rendered.segments, tokenizer):
            got = _call("parse of the encoded ids", template.parse, ids, tokenizer)
            _assert_equal(expected, got, "parse(encode(x)) differs from normalize(x)")
            lenient = _call("lenient parse of the encoded ids", template.parse, ids, tokenizer, lenient=True)
            diags = lenient.pop("diagnostics", None)
            if diags:
                raise AssertionError(f"lenient parse of valid ids reports diagnostics: {_shown(diags)}")
            _assert_equal(expected, lenient, "lenient parse(encode(x)) differs from normalize(x)")
    _assert_equal(before, request, "render or normalize changed the request it was given")
    again = _call("normalize of the normal form", template.normalize, expected)
    _assert_equal(expected, again, "the normal form is not a fixed point of normalize")
    text = _call("render of the normal form", template.render, expected).text
    if text != rendered.text:
        at = next((i for i, (a, b) in enumerate(zip(text, rendered.text)) if a != b),
                  min(len(text), len(rendered.text)))
        raise AssertionError(f"the normal form renders differently from the request, from character {at}: "
                             f"{_shown(rendered.text[at:at + 80])} became {_shown(text[at:at + 80])}")


def check_injection_free(template: Template, request: Any, tokenizer: TokenizerLike) -> None:
    """No text becomes a marker: each marker id occurs in ``encode(request)``
    exactly as often as its marker in the special segments of
    ``render(request)``; no other special token of the vocabulary occurs at
    all; and the ids are those of encoding the segments one by one."""
    b = template.bind(tokenizer)
    segments = _call("render", template.render, request).segments
    ids = _call("encode", template.encode, request, b.vocab)
    splitter = template.markers.splitter()
    want: Counter[int] = Counter()
    for seg in segments:
        if seg.special:
            for mt in splitter.finditer(seg.text):
                mid = b.marker_ids.get(mt.group())
                if mid is not None:
                    want[mid] += 1
    got = Counter(i for i in ids if i in b.kind_of_id)
    for mid in sorted(set(want) | set(got)):
        if want[mid] != got[mid]:
            marker = b.kind_of_id[mid][1]
            raise AssertionError(f"marker {marker!r} (id {mid}) occurs {got[mid]} times in the ids but "
                                 f"{want[mid]} times in the special segments: text became a marker"
                                 if got[mid] > want[mid] else
                                 f"marker {marker!r} (id {mid}) occurs {got[mid]} times in the ids but "
                                 f"{want[mid]} times in the special segments: a marker was lost")
    special = b.vocab.special_ids()
    for k, i in enumerate(ids):
        if i in special and i not in b.kind_of_id:
            raise AssertionError(f"special token {b.vocab.id_to_token(i)!r} (id {i}) at token {k}: text became "
                                 f"a special token of the vocabulary")
    segmentwise = _call("encode_segments", b.encode_segments, segments)
    if ids != segmentwise:
        at = next((k for k, (x, y) in enumerate(zip(ids, segmentwise)) if x != y), min(len(ids), len(segmentwise)))
        raise AssertionError(f"encode() differs from encoding the segments one by one, from token {at}: "
                             f"{ids[at:at + 8]} vs {segmentwise[at:at + 8]}")


def completion_case(template: Template, request: Any,
                    tokenizer: TokenizerLike) -> tuple[list[int], dict[str, Any], bool] | None:
    """The request's last assistant message as a model would generate it:
    (the ids after the generation prompt, the message as the batch parser
    should return it, thinking mode), or None when there is no assistant
    message.

    The history is the messages before it, with the request's options but
    those rendered after the history (``tool_choice``, ``response_format``)
    and ``image_prompts``; the message loses its ``name`` (the generation
    prompt has none) and its call ids become ``call_0_K``."""
    d = template.dialect
    if isinstance(request, dict):
        body = dict(request)
        messages = list(body.get("messages") or ())
    else:
        body, messages = {}, list(request)
    drop = ("tool_choice", "response_format", "image_prompts", "add_generation_prompt")
    for key in drop:
        body.pop(key, None)
    if isinstance(body.get("chat_template_kwargs"), dict):
        body["chat_template_kwargs"] = {k: v for k, v in body["chat_template_kwargs"].items() if k not in drop}

    def is_assistant(m: Any) -> bool:
        role = m.get("role") if isinstance(m, dict) else None
        return isinstance(role, str) and d.role_aliases.get(role, role) == "assistant"

    last = next((i for i in range(len(messages) - 1, -1, -1) if is_assistant(messages[i])), None)
    if last is None:
        return None
    m = {k: v for k, v in messages[last].items() if k != "name"}
    history = {**body, "messages": messages[:last]}
    whole = {**body, "messages": [*messages[:last], m]}
    b = template.bind(tokenizer)
    full = _call("encode", template.encode, whole, b.vocab, add_generation_prompt=False)
    prefix = _call("encode", template.encode, history, b.vocab, add_generation_prompt=True)
    if full[: len(prefix)] != prefix:
        raise AssertionError("the generation prompt is not a prefix of the rendered assistant message")
    normal = _call("normalize", template.normalize, whole, add_generation_prompt=False)
    expected = normal["messages"][-1]
    for k, c in enumerate(expected.get("tool_calls", ()), start=1):
        c["id"] = f"call_0_{k}"
    return full[len(prefix):], expected, bool(normal["thinking"])


def _stream(template: Template, tokenizer: TokenizerLike, ids: list[int], thinking: bool,
            chunks: Sequence[int] | None, *, keep: bool = True, lenient: bool = True) -> list[StreamEvent]:
    sp = template.stream(tokenizer, thinking=thinking, keep=keep, lenient=lenient)
    events: list[StreamEvent] = []
    if not chunks:
        for t in ids:
            events += sp.feed(t)
    else:
        i = k = 0
        while i < len(ids):
            n = max(1, chunks[k % len(chunks)])
            events += sp.feed_many(ids[i : i + n])
            i += n
            k += 1
    events += sp.close()
    return events


def _message_end(events: list[StreamEvent], what: str) -> StreamEvent:
    """The one message_end event; only diagnostics (trailing output) may follow it."""
    ends = [k for k, e in enumerate(events) if e.type == "message_end"]
    if len(ends) != 1:
        raise AssertionError(f"{what}: {len(ends)} message_end events, expected exactly one")
    after = [e.type for e in events[ends[0] + 1 :] if e.type != "diagnostic"]
    if after:
        raise AssertionError(f"{what}: events after message_end: {after[:5]}")
    return events[ends[0]]


def check_stream_equals_batch(template: Template, request: Any, tokenizer: TokenizerLike,
                              chunks: Sequence[int] | None = None) -> None:
    """Streaming a completion gives what the batch parser gives.

    The request's last assistant message is rendered as a completion after
    the generation prompt (see :func:`completion_case`; nothing is checked
    when there is none). With and without the stop token: the batch parse,
    strict and lenient, is the message's normal form; streamed token by token
    (or in ``chunks``: sizes of successive ``feed_many`` calls), the
    ``message_end`` message is the batch parse, the stop reason fits, no
    diagnostic is reported, the text deltas of each channel add up to the
    reasoning and the content, the ``tool_call_end`` calls are the message's
    calls, and a strict stream and one with ``keep=False`` agree."""
    if _spells_text_mark(template, _call("render", template.render, request).segments, tokenizer):
        return  # text that reads as a marker, by design (see check_round_trip)
    case = completion_case(template, request, tokenizer)
    if case is None:
        return
    comp, expected, thinking = case
    stops = set(template.bind(tokenizer).stop_ids)
    if comp and comp[-1] in stops:
        _check_stream(template, tokenizer, comp, expected, thinking, chunks, "with the stop token")
        _check_stream(template, tokenizer, comp[:-1], expected, thinking, chunks, "without the stop token")
    else:
        _check_stream(template, tokenizer, comp, expected, thinking, chunks, "(no stop token)")


def _check_stream(template: Template, tokenizer: TokenizerLike, ids: list[int], expected: dict[str, Any],
                  thinking: bool, chunks: Sequence[int] | None, what: str) -> None:
    d = template.dialect
    batch = _call("strict completion parse", template.parse, ids, tokenizer, completion=True, thinking=thinking)
    _assert_equal(expected, batch, f"completion parse {what} differs from the normal form")
    lenient = _call("lenient completion parse", template.parse, ids, tokenizer, completion=True,
                    thinking=thinking, lenient=True)
    diags = lenient.pop("diagnostics", None)
    if diags:
        raise AssertionError(f"lenient completion parse {what} reports diagnostics: {_shown(diags)}")
    events = _call("streaming", _stream, template, tokenizer, ids, thinking, chunks)
    bad = [e.diagnostic for e in events if e.type == "diagnostic"]
    if bad:
        raise AssertionError(f"the stream {what} reports diagnostics: {_shown(bad)}")
    end = _message_end(events, f"the stream {what}")
    _assert_equal(batch, end.message, f"the streamed message {what} differs from the batch parse")
    reason = "tool_calls" if batch.get("tool_calls") else "stop"
    if end.stop_reason != reason:
        raise AssertionError(f"stop_reason {end.stop_reason!r} {what}, expected {reason!r}")
    think = "".join(e.text or "" for e in events if e.type == "text" and e.channel == d.channel_tag("reasoning"))
    if think != batch.get("reasoning_content", ""):
        raise AssertionError(f"the think deltas {what} add up to {_shown(think)}, "
                             f"the reasoning is {_shown(batch.get('reasoning_content', ''))}")
    if isinstance(batch.get("content"), str):
        response = "".join(e.text or "" for e in events
                           if e.type == "text" and e.channel == d.channel_tag("content"))
        if response != batch["content"]:
            raise AssertionError(f"the response deltas {what} add up to {_shown(response)}, "
                                 f"the content is {_shown(batch['content'])}")
    calls = [e.call for e in events if e.type == "tool_call_end"]
    _assert_equal(batch.get("tool_calls", []), calls, f"the tool_call_end calls {what}")
    strict = _call("a strict stream", _stream, template, tokenizer, ids, thinking, chunks, lenient=False)
    _assert_equal(batch, _message_end(strict, f"the strict stream {what}").message,
                  f"the strict stream's message {what}")
    light = _call("a stream with keep=False", _stream, template, tokenizer, ids, thinking, chunks, keep=False)
    want = {"role": "assistant", **({"tool_calls": batch["tool_calls"]} if batch.get("tool_calls") else {})}
    _assert_equal(want, _message_end(light, f"the keep=False stream {what}").message,
                  f"the keep=False stream's message {what}")


def _check_diagnostics(out: Any, length: int, what: str) -> None:
    if not isinstance(out, dict):
        raise AssertionError(f"{what} returned {type(out).__name__}, not a dict")
    diags = out.get("diagnostics")
    if not isinstance(diags, list):
        raise AssertionError(f"{what}: 'diagnostics' is {_shown(diags)}, not a list")
    for x in diags:
        if not isinstance(x, dict) or set(x) != {"kind", "offset", "message"}:
            raise AssertionError(f"{what}: malformed diagnostic {_shown(x)}")
        if not isinstance(x["offset"], int) or not 0 <= x["offset"] <= length:
            raise AssertionError(f"{what}: diagnostic offset outside the input (length {length}): {_shown(x)}")


def check_never_crash(template: Template, ids_or_text: Sequence[int] | str,
                      tokenizer: TokenizerLike | None = None) -> None:
    """Arbitrary input never crashes a parser.

    For each of a conversation parse and completion parses in thinking and
    non-thinking mode: a strict parse returns a dict or raises
    :class:`xtml.XtmlError` (a :class:`~xtml.ParseError` with its offset
    inside the input); a lenient parse returns a dict with well-formed
    diagnostics (offsets inside the input) and, where the strict parse
    succeeded, the same result with no diagnostics. Token ids (which need
    ``tokenizer``) are also streamed: a lenient stream never raises and ends
    with one ``message_end``; a strict one raises only XtmlError. Ids
    outside the vocabulary may make the batch parsers raise XtmlError."""
    is_text = isinstance(ids_or_text, str)
    if not is_text and tokenizer is None:
        raise TypeError("checking token ids needs their tokenizer")
    data: Any = ids_or_text if is_text else list(ids_or_text)
    tok = None if is_text else tokenizer
    if is_text:
        valid = True
        opens = lex_text(data, template.markers).kinds.count(OPEN)
    else:
        b = template.bind(tokenizer)
        valid = all(type(i) is int and 0 <= i < b.vocab.size for i in data)
        opens = sum(1 for i in data if b.kind_of_id.get(i, ("",))[0] == OPEN) if valid else 0
    # Nesting deeper than the limit is refused in lenient mode too (spec 3.6);
    # a completion starts two elements deep.
    too_deep = opens + 2 > MAX_DEPTH
    for completion, thinking in ((False, None), (True, True), (True, False)):
        what = "completion parse (thinking)" if thinking else (
            "completion parse (no thinking)" if completion else "parse")
        strict: dict[str, Any] | None = None
        try:
            strict = template.parse(data, tok, completion=completion, thinking=thinking)
        except ParseError as e:
            if not 0 <= e.offset <= len(data):
                raise AssertionError(f"strict {what}: ParseError offset {e.offset} outside the input "
                                     f"(length {len(data)}): {e}") from e
        except XtmlError:
            pass
        except Exception as e:
            raise AssertionError(f"strict {what} raised {type(e).__name__} (not an XtmlError): {e}") from e
        else:
            if not isinstance(strict, dict):
                raise AssertionError(f"strict {what} returned {type(strict).__name__}, not a dict")
        try:
            lenient = template.parse(data, tok, completion=completion, thinking=thinking, lenient=True)
        except XtmlError as e:
            if valid and not (too_deep and isinstance(e, ParseError)):
                raise AssertionError(f"lenient {what} raised {type(e).__name__}: {e}") from e
            continue
        except Exception as e:
            raise AssertionError(f"lenient {what} raised {type(e).__name__}: {e}") from e
        _check_diagnostics(lenient, len(data), f"lenient {what}")
        if completion and lenient.get("role") != "assistant":
            raise AssertionError(f"lenient {what}: role {lenient.get('role')!r}, not 'assistant'")
        if strict is not None:
            _assert_equal({**strict, "diagnostics": []}, lenient,
                          f"lenient {what} differs from the strict one (which succeeded)")
    if is_text or tokenizer is None:
        return
    for thinking in (True, False):
        try:
            events = _stream(template, tokenizer, data, thinking, None)
        except Exception as e:
            raise AssertionError(f"a lenient stream (thinking={thinking}) raised {type(e).__name__}: {e}") from e
        end = _message_end(events, f"the lenient stream (thinking={thinking})")
        if not isinstance(end.message, dict) or end.message.get("role") != "assistant":
            raise AssertionError(f"the lenient stream (thinking={thinking}) ended with {_shown(end.message)}")
        try:
            _stream(template, tokenizer, data, thinking, None, lenient=False)
        except XtmlError:
            pass
        except Exception as e:
            raise AssertionError(f"a strict stream (thinking={thinking}) raised {type(e).__name__} "
                                 f"(not an XtmlError): {e}") from e


def check_markup_parses(template: Template, text: str) -> None:
    """Well-formed markup (from :func:`~xtml.testing.strategies.markup`)
    parses strictly, and the fast driver and the reference grammar build the
    same tree."""
    lx = lex_text(text, template.markers)
    doc = _call("build", build, lx)
    ref = _call("the reference grammar", parse_lexemes, lex_text(text, template.markers), source=text)
    if doc.nodes != ref.nodes:
        raise AssertionError("the parser and the reference grammar build different trees")
