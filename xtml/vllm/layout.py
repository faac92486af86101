"""The ``xtml`` tool-call and reasoning parsers for vLLM with a layout
template (``[template] engine = "layout"``: Qwen3's ChatML, say), on token
ids as :mod:`.parsers` reads XTML templates.

A layout dialect has no reasoning channel the prompt opens: the answer
itself opens its reasoning block, or does not. So the reasoning ends, as far
as vLLM asks, at the prompt: the completion grammar holds the optional block
from the first generated id, and the tool parser reads every id of a stream
with the dialect's stream parser (:meth:`xtml.Template.stream`), sending the
block's text as ``reasoning`` deltas, the answer's as ``content`` and the
calls, whole, with the message. A whole answer is split by the reasoning
parser (the block's text as ``reasoning``) and read whole by the tool
parser, on the generated ids the plugin hands both (:mod:`.plugin`), or,
where they do not come, on its text read back to ids. What the parse repairs
or withholds is said in vLLM's log, one warning an answer.
"""

from __future__ import annotations

import weakref
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

from ..errors import TokenizerError
from ..template import LayoutTemplate
from ..vocab.vocabulary import Vocabulary
from .parsers import _constrained, _keep_special_tokens, _repaired, _text, _xtml_request
from .plugin import template

__all__ = ["XtmlLayoutReasoningParser", "XtmlLayoutToolParser"]


class _LayoutSetup:
    """What both parsers need of one tokenizer, for a layout template."""

    def __init__(self, tpl: LayoutTemplate, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError(f"the xtml parsers read a Hugging Face fast tokenizer; this one is a "
                                 f"{type(tokenizer).__name__}")
        self.tpl = tpl
        self.vocab = Vocabulary(backend)
        self.binding = tpl.bind(self.vocab)  # checks the format's tokens against the tokenizer
        d = tpl.layout
        self.reasoning_tag = d.channel_tag("reasoning") or "think"
        self.content_tag = d.channel_tag("content") or "response"
        block = d.reasoning_split or d.reasoning_block
        self.block: tuple[str, str] | None = (block[0], block[1]) if block else None
        self.specials = self.vocab.special_ids()
        known = self.binding.token_ids
        self.block_ids = (known[self.block[0]], known[self.block[1]]) \
            if self.block is not None and self.block[0] in known and self.block[1] in known else None

    def parse(self, ids: list[int], request: Any = None) -> dict[str, Any]:
        return self.tpl.parse(ids, self.vocab, completion=True, lenient=True, tools=_tools(request))

    def reasoning_length(self, ids: list[int]) -> int:
        return self.tpl.reasoning_tokens(ids, self.vocab)

    def block_length(self, ids: list[int]) -> int:
        """How many ids the reasoning block that opens the answer takes, as
        the parse reads it (all of them when it never closes; none when the
        answer does not open with one, or the vocabulary spells the block's
        tokens as text)."""
        if self.block_ids is None or ids[:1] != [self.block_ids[0]]:
            return 0
        close = self.block_ids[1]
        return next((k + 1 for k, t in enumerate(ids) if t == close), len(ids))

    def is_text_of(self, text: str, ids: list[int]) -> bool:
        """Whether ``text`` is what vLLM decodes of ``ids``: all of them, or
        all but a special stop id, whose text it leaves out."""
        return text == self.vocab.decode(ids) or bool(
            ids and ids[-1] in self.specials and text == self.vocab.decode(ids[:-1]))


_LAYOUT_SETUPS: weakref.WeakKeyDictionary[Any, _LayoutSetup] = weakref.WeakKeyDictionary()


def _tools(request: Any) -> list[Any] | None:
    """A request's tools as dicts: a format that writes arguments untyped
    reads them back by their schemas."""
    tools = getattr(request, "tools", None)
    return [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t for t in tools] if tools else None


def _skeleton(request: Any) -> list[dict[str, Any]]:
    """Messages that end as the request's do, for a format whose generation
    prompt depends on the last message (DeepSeek opens no reasoning block
    after a tool result): the grammar reads only which role came last, and
    the request's own messages may hold what the grammar need not read."""
    roles = [m.get("role") for m in getattr(request, "messages", None) or () if isinstance(m, dict)]
    last = next((r for r in reversed(roles) if r != "system"), "user")
    out: list[dict[str, Any]] = [{"role": "user", "content": ""}]
    if last == "tool":
        out += [{"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "tool", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_0", "content": ""}]
    elif last == "assistant":
        out.append({"role": "assistant", "content": ""})
    return out


def _layout_setup(tokenizer: Any) -> _LayoutSetup:
    tpl = template()
    if not isinstance(tpl, LayoutTemplate):
        raise TypeError("the layout parsers read a layout template")
    try:
        hit = _LAYOUT_SETUPS.get(tokenizer)
    except TypeError:  # not weakly referable: made each time
        return _LayoutSetup(tpl, tokenizer)
    if hit is None:
        hit = _LAYOUT_SETUPS[tokenizer] = _LayoutSetup(tpl, tokenizer)
    return hit


# The content a reasoning parser handed on after a reasoning block, by the
# request it was read for: where the tool parser reads that content from
# text (no ids), it reads it after a closed block, as the answer wrote it
# (the format's newlines after the block are the block's, not content). The
# request is kept beside its entry, so a reused id misses; entries the tool
# parser never takes (no tool parser) are dropped oldest first.
_SPLIT: dict[int, tuple[Any, str]] = {}
_SPLIT_MAX = 1024


def _handed_on(request: Any, content: str) -> None:
    if len(_SPLIT) >= _SPLIT_MAX:
        del _SPLIT[next(iter(_SPLIT))]
    _SPLIT[id(request)] = (request, content)


def _after_block(request: Any, content: str) -> bool:
    hit = _SPLIT.pop(id(request), None)
    return hit is not None and hit[0] is request and hit[1] == content


class XtmlLayoutReasoningParser(ReasoningParser):
    """The reasoning block of a layout template's answer (whole answers; a
    stream's reasoning comes from the tool parser, which reads every id)."""

    engine_based_streaming = True

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.x = _layout_setup(tokenizer)
        self.generated: list[int] | None = None
        #: Kept for the XTML parser's interface: a layout answer read from
        #: text is read as text reads (the format's tokens found in it).
        self.ambiguous_at: int | None = None

    def set_model_output_token_ids(self, token_ids: Sequence[int] | None) -> None:
        """The generated ids of the whole answer :meth:`extract_reasoning`
        reads next (None: none)."""
        self.generated = None if token_ids is None else list(token_ids)

    @property
    def reasoning_end_str(self) -> str | None:
        return self.x.block[1] if self.x.block is not None else None

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        # The answer opens its own block, or none: whatever vLLM constrains
        # or reads after the reasoning starts at the first generated id.
        return True

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Sequence[int]) -> bool:
        return True

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        return list(input_ids)

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        return self.x.reasoning_length(list(token_ids))

    def adjust_request(self, request: Any) -> Any:
        return _keep_special_tokens(super().adjust_request(request))

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        generated, self.generated = self.generated, None
        whole = generated is not None and (bool(generated) or not model_output)
        ids = generated if whole and generated is not None else self.x.tpl.completion_ids(model_output,
                                                                                          self.x.vocab)
        reasoning = self.x.parse(ids, request).get("reasoning_content")
        k = self.x.block_length(ids)
        if k == 0:
            # No block to split off (or one spelled as text, which the tool
            # parser reads with the rest): the content is the whole answer.
            return reasoning, self.x.vocab.decode(ids) if whole else model_output
        reasoning = reasoning or ""
        if k >= len(ids):
            return reasoning, None  # cut off while reasoning
        content = self.x.vocab.decode(ids[k:])
        _handed_on(request, content)
        return reasoning, content

    def extract_reasoning_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                    previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                    delta_token_ids: Sequence[int]) -> DeltaMessage | None:
        # Not reached through vLLM's composed parser (the reasoning ends at
        # the prompt); anything handed here is the answer's, read by the
        # tool parser.
        return DeltaMessage(content=delta_text) if delta_text else None

    def has_engine_confirmed_reasoning_end(self) -> bool:
        return True


class XtmlLayoutToolParser(ToolParser):
    """The answer of a layout template: reasoning, content and tool calls,
    read on the generated ids by the dialect's parser (streamed: its stream
    parser)."""

    supports_required_and_named = False
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, tools: Any = None) -> None:
        super().__init__(tokenizer, tools)
        self.x = _layout_setup(tokenizer)
        self.stream: Any = None
        # The stream's fast path gives content on the response channel.
        self._fast = self.x.content_tag == "response"
        self.sent_calls = 0
        self.generated: list[int] | None = None

    def set_model_output_token_ids(self, token_ids: Sequence[int] | None) -> None:
        """The generated ids of the whole answer :meth:`extract_tool_calls`
        reads next (None: none)."""
        self.generated = None if token_ids is None else list(token_ids)

    def adjust_request(self, request: Any) -> Any:
        request = _keep_special_tokens(super().adjust_request(request))
        if getattr(request, "structured_outputs", None) is None and _constrained(request):
            # From the first generated id: the grammar holds the optional
            # reasoning block the answer may open.
            body = _xtml_request(request)
            # The grammar reads the request's options (the dialect's own
            # among them) and the format reads at least one message.
            given = getattr(request, "chat_template_kwargs", None) or {}
            body.update({k: v for k, v in given.items() if k in self.x.tpl.layout.options})
            body["messages"] = _skeleton(request) if self.x.tpl.layout.message_conds else \
                [{"role": "user", "content": ""}]
            tag = self.x.tpl.completion_grammar(body, self.x.vocab, format="xgrammar-tag")
            request.structured_outputs = StructuredOutputsParams(structural_tag=tag)
        return request

    def _ids(self, content: str, request: Any) -> list[int]:
        """The ids of the answer ``content`` ends: the generated ids when
        ``content`` is their text (after the reasoning block the reasoning
        parser split off, or all of it), else ``content`` read back."""
        generated, self.generated = self.generated, None
        after = _after_block(request, content)
        if generated is not None:
            k = self.x.block_length(generated)
            if self.x.is_text_of(content, generated[k:]) or self.x.is_text_of(content, generated) or (
                    not generated and not content):
                return generated
        block = self.x.block
        text = f"{block[0]}{block[1]}{content}" if after and block is not None else content
        return self.x.tpl.completion_ids(text, self.x.vocab)

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        msg = self.x.parse(self._ids(model_output, request), request)
        _repaired(msg.get("diagnostics") or ())
        calls = [ToolCall(type="function", function=FunctionCall(name=c["function"]["name"],
                                                                 arguments=c["function"]["arguments"]))
                 for c in msg.get("tool_calls") or ()]
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls,
                                            content=_text(msg.get("content")) or None)

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                     delta_token_ids: Sequence[int], request: Any) -> DeltaMessage | None:
        if not delta_token_ids:
            return None
        stream = self.stream
        if stream is None:
            stream = self.stream = self.x.tpl.stream(self.x.vocab, tools=_tools(request))
        if len(delta_token_ids) == 1 and self._fast:
            # Most deltas: one id of content, as it is.
            text = stream.content_text(delta_token_ids[0])
            if text is not None:
                return DeltaMessage(content=text)
        return self._delta(stream.feed_many(delta_token_ids))

    def finish_streaming(self) -> DeltaMessage | None:
        """The end of the stream: what the stream parser held, and the calls."""
        if self.stream is None:
            return None
        stream, self.stream = self.stream, None
        return self._delta(stream.close())

    def _delta(self, events: list[Any]) -> DeltaMessage | None:
        if len(events) == 1:
            # Most deltas are one piece of text: no lists, no joins.
            e = events[0]
            if e.type == "text":
                if not e.text:
                    return None
                if e.channel == self.x.content_tag:
                    return DeltaMessage(content=e.text)
                if e.channel == self.x.reasoning_tag:
                    return DeltaMessage(reasoning=e.text)
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
            elif e.type == "message_end" and e.message is not None:
                # The calls go out whole with the message: a call cut off
                # or malformed is withheld by the parse (its diagnostic).
                for c in e.message.get("tool_calls") or ():
                    fn = c["function"]
                    calls.append(DeltaToolCall(index=self.sent_calls, id=None, type="function",
                                               function=DeltaFunctionCall(name=fn["name"],
                                                                          arguments=fn["arguments"])))
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
