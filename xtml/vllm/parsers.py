"""The ``xtml`` tool-call and reasoning parsers for vLLM, on token ids.

vLLM composes a reasoning parser and a tool parser into one ``Parser``
(``vllm.parser.ParserManager.get_parser``): the reasoning parser reads up to
the end of the reasoning, then the tool parser reads the rest. Both are
registered through vLLM's public parser managers (:mod:`.plugin`), so they
combine as vLLM combines any pair, with no private hook:

* streamed, vLLM hands each parser the generated ids (``delta_token_ids``,
  ``current_token_ids``): they are fed to xtml's streaming parser
  (:meth:`xtml.Template.stream`), so however the ids are grouped (one id a
  delta, or sixteen under speculative decoding) the deltas join to the same
  message; a tool call is sent whole, with its index, when its element
  closes, so a call cut off by ``max_tokens`` is never sent;
* whole, on the generated ids too: vLLM 0.33's ``DelegatingParser.parse``
  drops ``model_output_token_ids``, so :mod:`.plugin` wraps it (within the
  vLLM range it was written for) to hand them to both parsers
  (``set_model_output_token_ids``), which read them as a stream reads them;
* whole, where the ids do not come (another vLLM, another reasoning parser
  beside the tool parser), the text is encoded back to ids
  (:meth:`xtml.Template.completion_ids`), which gives the generated ids
  whenever the text was decoded with the special tokens kept
  (``adjust_request`` asks for that) and the model spelled no marker with
  ordinary tokens. A model's text that spells a marker is the one case text
  cannot tell apart: read from text, it is the marker. vLLM's server hands
  the ids to ``count_reasoning_tokens`` right after the parse: there the
  reasoning parser compares them with the ids it read back, and a
  difference is reported (a warning with the first token that differs;
  :attr:`XtmlReasoningParser.ambiguous_at`), never passed over in silence
  (docs/vllm.md).

The reasoning ends at the first close of the reasoning channel, whole and
streamed alike: a second reasoning channel after the answer is the answer's
(``Template.parse`` reads it so).

The reasoning ends where the reasoning channel closes: its close marker, the
channel's name, the separator, as ids (``is_reasoning_end`` and
``is_reasoning_end_streaming`` look at those few ids only, so the engine's
per-step check is constant work).
"""

from __future__ import annotations

import logging
import re
import weakref
from codecs import utf_8_decode as _utf8
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.reasoning import ReasoningParser
from vllm.sampling_params import StructuredOutputsParams
from vllm.tool_parsers.abstract_tool_parser import ToolParser

from ..chat.options import resolve_options
from ..codec.stream import StreamParser
from ..errors import TokenizerError, XtmlError
from ..template import Template
from ..vocab.vocabulary import Vocabulary
from .plugin import template

__all__ = ["XtmlReasoningParser", "XtmlToolParser"]

log = logging.getLogger(__name__)


class _Setup:
    """What both parsers need of one tokenizer: made once per tokenizer
    (vLLM builds the parsers anew for every request)."""

    def __init__(self, tpl: Template, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError(f"the xtml parsers read a Hugging Face fast tokenizer; this one is a "
                                 f"{type(tokenizer).__name__}")
        self.tpl = tpl
        self.vocab = Vocabulary(backend)
        d = tpl.dialect
        binding = tpl.bind(self.vocab)
        ids = binding.marker_ids
        m, n = d.markers, d.names
        self.open, self.close, self.sep = ids[m.open], ids[m.close], ids[m.sep]
        think = d.channel_tag("reasoning") or n["think"]
        response = d.channel_tag("content") or n["response"]
        name_ids = self.vocab.ids_of([think, response])
        # The ids that close the reasoning, and those that open the answer.
        self.think_end = [self.close, *name_ids[0], self.sep]
        self.think_open = [self.open, *name_ids[0], self.sep]
        self.response_open = [self.open, *name_ids[1], self.sep]
        self.reasoning_tag, self.content_tag = think, response
        # The bytes of each id, where a character cut across ids can be told
        # on bytes: a byte-level vocabulary's ordinary ids (None for the
        # markers), or else a byte-fallback vocabulary's byte ids.
        self.text_bytes = binding.text_table()
        self.byte_ids: dict[int, bytes] = {} if self.text_bytes else _byte_fallback(tokenizer)

    def bytes_of(self, token_id: int) -> bytes | None:
        """The bytes of an id of ordinary text, None when they cannot end
        a character cut across ids (a marker, an added token, an id past
        the vocabulary, a whole piece of a vocabulary that is not
        byte-level)."""
        table = self.text_bytes
        if table:
            return table[token_id] if 0 <= token_id < len(table) else None
        return self.byte_ids.get(token_id)

    def incomplete_tail(self, ids: Sequence[int]) -> int:
        """How many of the last ``ids`` hold the start of a character whose
        last bytes have not come yet (0 to 3: UTF-8 holds at most four
        bytes, each id at least one), as the stream parser decides it: on
        bytes. Invalid bytes are no tail: they stream (as U+FFFD) at once."""
        raw = b""
        sizes: list[int] = []
        for t in reversed(ids[-4:]):
            b = self.bytes_of(t)
            if not b:
                break
            raw = b + raw
            sizes.append(len(b))
            if len(raw) >= 4:
                break
        if not raw:
            return 0
        held = len(raw) - _utf8(raw, "replace", False)[1]
        k = 0
        while held > 0:
            held -= sizes[k]
            k += 1
        return k

    def stream(self, thinking: bool) -> StreamParser:
        return self.tpl.stream(self.vocab, thinking=thinking)


_SETUPS: weakref.WeakKeyDictionary[Any, _Setup] = weakref.WeakKeyDictionary()


def _setup(tokenizer: Any) -> _Setup:
    try:
        hit = _SETUPS.get(tokenizer)
    except TypeError:  # not weakly referable: made each time
        return _Setup(template(), tokenizer)
    if hit is None:
        hit = _SETUPS[tokenizer] = _Setup(template(), tokenizer)
    return hit


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_fallback(tokenizer: Any) -> dict[int, bytes]:
    """The byte ids (``<0xE6>``) of a byte-fallback vocabulary and their
    bytes (none for another kind)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if not callable(get_vocab):
        return {}
    found: dict[int, bytes] = {}
    for s, i in get_vocab().items():
        m = _BYTE_TOKEN.fullmatch(s)
        if m is not None:
            found[i] = bytes([int(m[1], 16)])
    return found


def _find_first(ids: Sequence[int], seq: list[int], start: int = 0) -> int:
    """Where the first ``seq`` in ``ids[start:]`` starts, or -1."""
    n = len(seq)
    for k in range(start, len(ids) - n + 1):
        if ids[k] == seq[0] and list(ids[k:k + n]) == seq:
            return k
    return -1


def _find_last(ids: Sequence[int], seq: list[int], start: int = 0) -> int:
    """Where the last ``seq`` in ``ids[start:]`` starts, or -1."""
    n = len(seq)
    for k in range(len(ids) - n, start - 1, -1):
        if ids[k] == seq[0] and list(ids[k:k + n]) == seq:
            return k
    return -1


def _thinking(tpl: Template, options: dict[str, Any]) -> bool:
    """Whether the prompt opened the reasoning channel, as the template
    reads the request's options."""
    try:
        return resolve_options(tpl.dialect, {k: v for k, v in options.items() if v is not None}).thinking
    except XtmlError:
        return tpl.dialect.thinking_default


_THINKING = ("thinking", "enable_thinking", "reasoning_effort")


def _request_options(request: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    effort = getattr(request, "reasoning_effort", None)
    if effort is not None:
        opts["reasoning_effort"] = effort
    opts.update(getattr(request, "chat_template_kwargs", None) or {})
    return {k: opts[k] for k in _THINKING if k in opts}


def _keep_special_tokens(request: Any) -> Any:
    # Both parsers read markers: decoded text must keep them, unspaced.
    if hasattr(request, "skip_special_tokens"):
        request.skip_special_tokens = False
    if hasattr(request, "spaces_between_special_tokens"):
        request.spaces_between_special_tokens = False
    return request


class XtmlReasoningParser(ReasoningParser):
    """The reasoning: what the model writes in the template's reasoning
    channel, up to its close."""

    # Engine-based: vLLM hands the new ids of each step and asks whether the
    # reasoning ended (has_engine_confirmed_reasoning_end), instead of
    # re-reading everything generated so far.
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.x = _setup(tokenizer)
        # The server passes chat_template_kwargs; the engine's structured
        # output passes their items themselves.
        options = kwargs.get("chat_template_kwargs") or {k: v for k, v in kwargs.items() if k in _THINKING}
        self.thinking = _thinking(self.x.tpl, dict(options))
        self.content_ids: list[int] | None = None
        self.done = 0
        self.ids: list[int] = []
        self.scanned = 0
        self.ended = False
        # The ids a whole answer's text read back to, until vLLM hands the
        # generated ones (count_reasoning_tokens) to compare them with.
        self.read_back: list[int] | None = None
        #: Where a whole answer's text and its ids first differed (the
        #: token offset in the answer), or None.
        self.ambiguous_at: int | None = None
        # A whole answer's generated ids, when vLLM hands them (.plugin).
        self.generated: list[int] | None = None

    def set_model_output_token_ids(self, token_ids: Sequence[int] | None) -> None:
        """The generated ids of the whole answer :meth:`extract_reasoning`
        reads next (None: none)."""
        self.generated = None if token_ids is None else list(token_ids)

    @property
    def reasoning_end_str(self) -> str | None:
        return self.x.vocab.decode(self.x.think_end)

    def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
        self.thinking = not self.is_reasoning_end(prompt_token_ids)

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        # Ended when no reasoning channel was opened after the last close of
        # one (a prompt's history holds closed ones; its generation prompt
        # opens the current one, or does not).
        opened = _find_last(input_ids, self.x.think_open)
        return opened < 0 or _find_last(input_ids, self.x.think_end, opened) >= 0

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Sequence[int]) -> bool:
        n = len(self.x.think_end)
        window = input_ids[max(0, len(input_ids) - len(delta_ids) - n + 1):]
        return _find_last(window, self.x.think_end) >= 0

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        # vLLM hands the last delta only when the reasoning ends in it; the
        # ids after the close were kept when the streaming saw it (the close
        # may have begun in an earlier delta, and a later one follow in this).
        if self.content_ids is not None:
            return list(self.content_ids)
        at = _find_first(input_ids, self.x.think_end)
        return input_ids[at + len(self.x.think_end):] if at >= 0 else input_ids

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        if self.read_back is not None:
            self._compare(self.read_back, list(token_ids))
            self.read_back = None
        at = _find_first(token_ids, self.x.think_end)
        return at if at >= 0 else len(token_ids)

    def adjust_request(self, request: Any) -> Any:
        return _keep_special_tokens(super().adjust_request(request))

    def _compare(self, read: list[int], generated: list[int]) -> None:
        n = len(read)
        # vLLM leaves the stop token's text out of the answer's (a special
        # token ending it: the end marker, the tokenizer's end of sequence).
        if generated[:n] == read and set(generated[n:]) <= self.x.vocab.special_ids():
            return
        at = next((k for k, (a, b) in enumerate(zip(read, generated)) if a != b), min(len(read), len(generated)))
        self.ambiguous_at = at
        log.warning("xtml: this whole answer was read from its text (vLLM hands a whole answer's parsers no "
                    "ids), and the text does not read back to the generated ids from token %d on: a marker the "
                    "model spelled with ordinary tokens was read as the marker. Streamed answers are read on "
                    "their ids.", at)

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        generated, self.generated = self.generated, None
        if generated is not None and (generated or not model_output):
            return self._whole(generated)
        ids = self.x.tpl.completion_ids(model_output, self.x.vocab)
        self.read_back = ids
        if not self.thinking:
            return None, model_output
        at = _find_first(ids, self.x.think_end)
        if at < 0:
            return model_output, None  # cut off while reasoning
        msg = self.x.tpl.parse(ids, self.x.vocab, completion=True, lenient=True, thinking=True)
        # The markup after the reasoning goes to the tool parser, which reads
        # the answer and the calls from it.
        return msg.get("reasoning_content") or "", self.x.vocab.decode(ids[at + len(self.x.think_end):])

    def _whole(self, ids: list[int]) -> tuple[str | None, str | None]:
        """A whole answer read on its generated ids. The content handed on
        is the text of the ids after the reasoning, which the tool parser
        checks against the same ids (:func:`_answer_ids`)."""
        if not self.thinking:
            return None, self.x.vocab.decode(ids)
        msg = self.x.tpl.parse(ids, self.x.vocab, completion=True, lenient=True, thinking=True)
        reasoning = msg.get("reasoning_content") or ""
        at = _find_first(ids, self.x.think_end)
        if at < 0:
            return reasoning, None  # cut off while reasoning
        return reasoning, self.x.vocab.decode(ids[at + len(self.x.think_end):])

    def extract_reasoning_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                    previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                    delta_token_ids: Sequence[int]) -> DeltaMessage | None:
        # vLLM hands an engine-based parser the new ids only: the ids so far
        # are kept here.
        self.ids += delta_token_ids
        ids, end = self.ids, self.x.think_end
        at = _find_first(ids, end, max(0, self.scanned - len(end) + 1))
        self.scanned = len(ids)
        if at >= 0:
            self.ended = True
            self.content_ids = ids[at + len(end):]
            return self._reasoning(at, final=True)
        # Hold back a tail that may be the start of the close (indexes only:
        # a copy of the ids so far would make each step cost the whole).
        body = len(ids)
        for k in range(min(len(end) - 1, len(ids)), 0, -1):
            if ids[len(ids) - k:] == end[:k]:
                body = len(ids) - k
                break
        return self._reasoning(body, final=False)

    def _reasoning(self, body: int, final: bool) -> DeltaMessage | None:
        """The reasoning text of the ids before ``body`` not sent yet: only
        the new ids are decoded, so each step costs what it adds."""
        todo = self.ids[self.done:body]
        if not final:
            # A character cut between ids waits for its last bytes, and only
            # it: what is held is at most three ids, so each step decodes
            # what it adds and those.
            todo = todo[:len(todo) - self.x.incomplete_tail(todo)]
        if not todo:
            return None
        text = self.x.vocab.decode(todo)
        self.done += len(todo)
        return DeltaMessage(reasoning=text) if text else None

    def has_engine_confirmed_reasoning_end(self) -> bool:
        return self.ended

    def finish_streaming(self) -> DeltaMessage | None:
        """At the end of a stream cut off while reasoning: what was held."""
        return None if self.ended else self._reasoning(len(self.ids), final=True)


class XtmlToolParser(ToolParser):
    """The answer and the tool calls: what follows the reasoning (or the
    whole completion when the prompt opened no reasoning)."""

    supports_required_and_named = False
    # Engine-based: the answer and calls are read here for every tool_choice
    # (none included) and at the end of a stream (finish_streaming), so no
    # markup reaches the client as content.
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, tools: Any = None) -> None:
        super().__init__(tokenizer, tools)
        self.x = _setup(tokenizer)
        self.stream: StreamParser | None = None
        self.sent_calls = 0
        # A whole answer's generated ids, when vLLM hands them (.plugin).
        self.generated: list[int] | None = None

    def set_model_output_token_ids(self, token_ids: Sequence[int] | None) -> None:
        """The generated ids of the whole answer :meth:`extract_tool_calls`
        reads next (None: none)."""
        self.generated = None if token_ids is None else list(token_ids)

    def adjust_request(self, request: Any) -> Any:
        request = _keep_special_tokens(super().adjust_request(request))
        if getattr(request, "structured_outputs", None) is None and _constrained(request):
            # The answer's grammar, as an xgrammar structural tag (vLLM's
            # default backend takes it): it starts where vLLM starts
            # structured output, after the reasoning.
            tag = self.x.tpl.completion_grammar(_xtml_request(request), self.x.vocab, format="xgrammar-tag",
                                                after_reasoning=True)
            request.structured_outputs = StructuredOutputsParams(structural_tag=tag)
        return request

    def _ids(self, model_output: str, request: Any) -> tuple[list[int], bool]:
        """The completion's ids as xtml reads them, and its mode."""
        thinking = _thinking(self.x.tpl, _request_options(request))
        generated, self.generated = self.generated, None
        if generated is not None:
            ids = _answer_ids(self.x, generated, model_output, thinking)
            if ids is not None:
                return ids, thinking
        ids = self.x.tpl.completion_ids(model_output, self.x.vocab)
        if thinking and ids[:len(self.x.response_open)] == self.x.response_open:
            ids = [*self.x.think_end, *ids]  # the reasoning was read already
        return ids, thinking

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        ids, thinking = self._ids(model_output, request)
        msg = self.x.tpl.parse(ids, self.x.vocab, completion=True, lenient=True, thinking=thinking)
        _repaired(msg.get("diagnostics") or ())
        # The calls as the stream sends them: a call the answer was cut off
        # in is withheld, whole as streamed.
        stream = self.x.stream(thinking)
        events = [*stream.feed_many(ids), *_kept(stream.close())]
        calls = [ToolCall(id=e.call.get("id") or None, type="function",
                          function=FunctionCall(name=e.call["function"]["name"],
                                                arguments=e.call["function"]["arguments"]))
                 for e in events if e.type == "tool_call_end" and e.call is not None]
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls,
                                            content=_text(msg.get("content")) or None)

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                     delta_token_ids: Sequence[int], request: Any) -> DeltaMessage | None:
        if not delta_token_ids:
            return None
        if self.stream is None:
            thinking = _thinking(self.x.tpl, _request_options(request))
            self.stream = self.x.stream(thinking)
            first = list(delta_token_ids[:1])
            if thinking and first == [self.x.open]:
                # The reasoning parser read up to here: the answer follows.
                self.stream.feed_many(self.x.think_end)
        return self._delta(self.stream.feed_many(delta_token_ids))

    def finish_streaming(self) -> DeltaMessage | None:
        """The end of the stream: what xtml's parser held."""
        if self.stream is None:
            return None
        stream, self.stream = self.stream, None
        return self._delta(_kept(stream.close()))

    def _delta(self, events: list[Any]) -> DeltaMessage | None:
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[DeltaToolCall] = []
        _repaired([e.diagnostic for e in events if e.type == "diagnostic" and e.diagnostic is not None])
        for e in events:
            if e.type == "text" and e.text:
                if e.channel == self.x.content_tag:
                    content.append(e.text)
                elif e.channel == self.x.reasoning_tag:
                    reasoning.append(e.text)
            elif e.type == "tool_call_end" and e.call is not None:
                fn = e.call["function"]
                calls.append(DeltaToolCall(index=self.sent_calls, id=e.call.get("id") or None, type="function",
                                           function=DeltaFunctionCall(name=fn["name"], arguments=fn["arguments"])))
                self.sent_calls += 1
        if not (reasoning or content or calls):
            return None
        fields: dict[str, Any] = {}
        if reasoning:
            fields["reasoning"] = "".join(reasoning)
        if content:
            fields["content"] = "".join(content)
        if calls:
            fields["tool_calls"] = calls
        return DeltaMessage(**fields)


def _answer_ids(x: _Setup, generated: list[int], content: str, thinking: bool) -> list[int] | None:
    """The generated ids, to be read whole, when ``content`` (what the
    reasoning parser handed on) is the text of those after the reasoning's
    first close (all of them with thinking off; none when the answer was cut
    off while reasoning): then the reasoning parser split them where xtml
    does. None otherwise (another reasoning parser, or no ids), and the text
    is read."""
    if not generated:
        return generated if not content else None
    if thinking:
        at = _find_first(generated, x.think_end)
        if at < 0:
            return generated if not content else None
        tail = generated[at + len(x.think_end):]
    else:
        tail = generated
    if content == x.vocab.decode(tail):
        return generated
    # Without a reasoning parser the content is vLLM's text, which leaves the
    # stop token's text out.
    if tail and tail[-1] in x.vocab.special_ids() and content == x.vocab.decode(tail[:-1]):
        return generated
    return None


def _constrained(request: Any) -> bool:
    """Whether the request asks for what a prompt alone cannot hold: a call
    (tool_choice required or named) or a JSON answer."""
    choice = getattr(request, "tool_choice", None)
    if choice == "required" or (choice is not None and not isinstance(choice, str)):
        return bool(getattr(request, "tools", None))
    rf = getattr(request, "response_format", None)
    return getattr(rf, "type", None) in ("json_object", "json_schema")


def _xtml_request(request: Any) -> dict[str, Any]:
    """The parts of a vLLM chat request the completion grammar reads."""
    body: dict[str, Any] = {"messages": []}
    if request.tools:
        body["tools"] = [t.model_dump(exclude_none=True) for t in request.tools]
    choice = request.tool_choice
    body["tool_choice"] = choice if isinstance(choice, str) or choice is None else choice.model_dump(exclude_none=True)
    if request.response_format is not None:
        body["response_format"] = request.response_format.model_dump(exclude_none=True, by_alias=True)
    if getattr(request, "parallel_tool_calls", None) is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    body.update(_request_options(request))
    return body


def _repaired(diagnostics: Sequence[dict[str, Any]]) -> None:
    """Say what the parse of an answer left out or repaired: vLLM's
    response has no field for it, so its log does (one warning an answer),
    and nothing is lost in silence."""
    if diagnostics:
        log.warning("xtml: the answer was not written as the format writes one, and was read with %d "
                    "repair(s): %s", len(diagnostics),
                    "; ".join(f"{d['kind']} at token {d['offset']}: {d['message']}" for d in diagnostics))


def _kept(events: list[Any]) -> list[Any]:
    """The events of closing a stream, less the call that closing it ended
    when the answer was cut off (``max_tokens``, a stop sequence): the cut
    may have fallen inside it, so it is withheld and must not run, as
    ``xtml serve`` withholds it."""
    cut = any(e.type == "message_end" and e.stop_reason == "length" for e in events)
    return [e for e in events if not (cut and e.type == "tool_call_end")]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""
