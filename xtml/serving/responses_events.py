"""A Responses request's answer (:class:`Exchange`): a ``chat.completion``
as a ``response`` object, a stream's ``chat.completion.chunk`` objects as
the typed events of a Responses stream, each with its
``sequence_number``, and a chat location in an error as the request's own
(``messages[3]`` as ``input[1]``)."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from .chunks import ChunkStream
from .responses_store import ResponseStore, Stored

__all__ = ["Exchange", "new_id"]


def new_id(prefix: str) -> str:
    """An object id as OpenAI's: a prefix (``resp``, ``msg``, ``fc``, ``rs``)
    and 48 random hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"



_MESSAGES_AT = re.compile(r"messages\[(\d+)\]")
# The chat body's fields a Responses request gives under other names.
_NAMES = {"reasoning_effort": "reasoning.effort", "max_completion_tokens": "max_output_tokens",
          "response_format": "text.format", "messages": "input"}
_OPTION = re.compile(r"option '(\w+)'")
_TOOL_FIELD = re.compile(r"(tools\[\d+\])\.function\.")
_CHAT_NAME = re.compile(r"\b(?:reasoning_effort|max_completion_tokens|response_format)\b")


@dataclass
class _Item:
    """An output item as it streams."""

    item: dict[str, Any]
    index: int
    parts: list[str] = field(default_factory=list)
    call: int | None = None  # the chat stream's index of a call


@dataclass
class Exchange:
    """One Responses request: what its answer echoes, where its chat messages
    came from, and, while it streams, the items and events so far."""

    store: ResponseStore | None
    history: list[dict[str, Any]]
    origins: list[str]
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    seq: int = 0
    items: list[_Item] = field(default_factory=list)
    current: _Item | None = None
    calls: dict[int, _Item] = field(default_factory=dict)
    finish: str | None = None
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    model: str = ""
    source: ChunkStream | None = None
    """The stream's chunks, whose final message has the parser's reading
    of each call."""

    # -- errors --------------------------------------------------------------------

    def where(self, text: str) -> str:
        """A chat location (``messages[3].content``) as the request's own
        (``input[1].content``)."""
        def sub(m: re.Match[str]) -> str:
            k = int(m.group(1))
            return self.origins[k] if k < len(self.origins) else m.group(0)

        if text in _NAMES:
            return _NAMES[text]
        text = _OPTION.sub(lambda m: f"option {_NAMES.get(m.group(1), m.group(1))!r}", text)
        # A Responses tool has no "function" level; field names in prose
        # are the request's own.
        text = _TOOL_FIELD.sub(r"\1.", text)
        text = _CHAT_NAME.sub(lambda m: _NAMES[m.group(0)], text)
        return _MESSAGES_AT.sub(sub, text)

    # -- a whole answer ------------------------------------------------------------

    def response(self, output: list[dict[str, Any]], *, status: str, usage: Mapping[str, Any] | None,
                 model: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "object": "response", "created_at": self.created_at,
                               "status": status, "error": error,
                               "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
                               else None, "model": model, "output": output, **self.echo}
        if usage is not None:
            out["usage"] = {"input_tokens": usage["prompt_tokens"],
                            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                            "output_tokens": usage["completion_tokens"],
                            "output_tokens_details": {"reasoning_tokens": (
                                usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)},
                            "total_tokens": usage["total_tokens"]}
        else:
            out["usage"] = None
        if status != "in_progress":
            out["xtml_diagnostics"] = self.diagnostics
        return out

    def whole(self, completion: Mapping[str, Any]) -> dict[str, Any]:
        """The ``response`` object of a ``chat.completion``; stored when the
        request said so."""
        choice = completion["choices"][0]
        m = choice["message"]
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        self.diagnostics = list(choice.get("xtml_diagnostics") or ())
        output: list[dict[str, Any]] = []
        if m.get("reasoning_content"):
            output.append(_reasoning_item(new_id("rs"), m["reasoning_content"], "completed"))
        if m.get("content"):
            # The cut fell in the message's text only if nothing was begun
            # after it (a call, kept or withheld): as a stream marks it.
            later = m.get("tool_calls") or any(d.get("kind") == "withheld-call" for d in self.diagnostics)
            output.append(_message_item(new_id("msg"), m["content"], "completed" if later else status))
        for c in m.get("tool_calls") or ():
            output.append(_call_item(new_id("fc"), c["id"], c["function"]["name"], c["function"]["arguments"],
                                     "completed"))
        out = self.response(output, status=status, usage=completion.get("usage"), model=completion["model"])
        self._keep(out, m)
        return out

    def _keep(self, response: dict[str, Any], message: Mapping[str, Any]) -> None:
        if self.store is None:
            return
        said: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("reasoning_content"):
            said["reasoning_content"] = message["reasoning_content"]
        if message.get("tool_calls"):
            said["tool_calls"] = [{"id": c["id"], "type": "function", "function": dict(c["function"])}
                                  for c in message["tool_calls"]]
        self.store.put(self.id, Stored(response, [*self.history, said]))

    # -- a stream ------------------------------------------------------------------

    def _event(self, type: str, **fields: Any) -> str:
        data = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {type}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def events(self, chunks: Iterable[Mapping[str, Any]]) -> list[str]:
        """The events of a stream's chunks, in order."""
        out: list[str] = []
        for c in chunks:
            choices = c.get("choices")
            if not choices:
                if c.get("usage") is not None:
                    out += self._end(c["usage"])
                continue
            ch = choices[0]
            delta = ch.get("delta") or {}
            if delta.get("role") and self.seq == 0:
                self.model = c.get("model", "")
                started = self.response([], status="in_progress", usage=None, model=self.model)
                out.append(self._event("response.created", response=started))
                out.append(self._event("response.in_progress", response=started))
            text = delta.get("reasoning_content")
            if text:
                out += self._text("reasoning", text)
            text = delta.get("content")
            if text:
                out += self._text("message", text)
            for tc in delta.get("tool_calls") or ():
                out += self._call(tc)
            if ch.get("finish_reason") is not None:
                self.finish = ch["finish_reason"]
                self.diagnostics = list(ch.get("xtml_diagnostics") or ())
                out += self._close_current()
        return out

    def _open(self, item: dict[str, Any]) -> tuple[_Item, list[str]]:
        out = self._close_current()
        it = _Item(item, len(self.items))
        self.items.append(it)
        self.current = it
        out.append(self._event("response.output_item.added", output_index=it.index, item=item))
        return it, out

    def _text(self, kind: str, text: str) -> list[str]:
        out: list[str] = []
        it = self.current
        if it is None or it.item["type"] != kind:
            if kind == "reasoning":
                it, out = self._open(_reasoning_item(new_id("rs"), "", "in_progress", content=[]))
                part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
            else:
                it, out = self._open(_message_item(new_id("msg"), "", "in_progress", content=[]))
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._event("response.content_part.added", item_id=it.item["id"], output_index=it.index,
                                   content_index=0, part=part))
        it.parts.append(text)
        if kind == "reasoning":
            out.append(self._delta("response.reasoning_text.delta", it, text, ',"content_index":0'))
        else:
            out.append(self._delta("response.output_text.delta", it, text, ',"content_index":0,"logprobs":[]'))
        return out

    def _delta(self, type: str, it: _Item, delta: str, extra: str = "") -> str:
        """A delta event, written as :meth:`_event` writes it: these are most
        of a stream's events, and encoding only the delta is several times
        cheaper than encoding the event."""
        seq = self.seq
        self.seq += 1
        return (f'event: {type}\ndata: {{"type":"{type}","sequence_number":{seq},"item_id":"{it.item["id"]}",'
                f'"output_index":{it.index}{extra},"delta":{encode_basestring(delta)}}}\n\n')

    def _call(self, tc: Mapping[str, Any]) -> list[str]:
        out: list[str] = []
        fn = tc.get("function") or {}
        k = tc.get("index", 0)
        if tc.get("id") is not None:
            it, out = self._open(_call_item(new_id("fc"), tc["id"], fn.get("name", ""), "", "in_progress"))
            it.call = k
            self.calls[k] = it
        it2 = self.calls.get(k)
        args = fn.get("arguments")
        if it2 is not None and args:
            it2.parts.append(args)
            out.append(self._delta("response.function_call_arguments.delta", it2, args))
        return out

    def _close_current(self) -> list[str]:
        it = self.current
        if it is None:
            return []
        self.current = None
        kind = it.item["type"]
        text = "".join(it.parts)
        out: list[str] = []
        if kind == "reasoning":
            out.append(self._event("response.reasoning_text.done", item_id=it.item["id"], output_index=it.index,
                                   content_index=0, text=text))
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            out.append(self._event("response.content_part.done", item_id=it.item["id"], output_index=it.index,
                                   content_index=0, part=part))
            it.item = _reasoning_item(it.item["id"], text, "completed")
        elif kind == "message":
            out.append(self._event("response.output_text.done", item_id=it.item["id"], output_index=it.index,
                                   content_index=0, text=text, logprobs=[]))
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out.append(self._event("response.content_part.done", item_id=it.item["id"], output_index=it.index,
                                   content_index=0, part=part))
            # A message is complete unless the token limit cut it, which is
            # known only when the stream finishes.
            it.item = _message_item(it.item["id"], text,
                                    "incomplete" if self.finish == "length" else "completed")
        else:
            kept = self.source.kept_arguments(it.call) if self.source is not None and it.call is not None else None
            if self.finish is None and kept is None:
                # Not known to be kept yet: it closes when the message ends.
                self.current = it
                return []
            # The next call started after its element closed (it is kept,
            # with its final arguments), or the message ended: each item is
            # done before the next is added, as OpenAI's streams go.
            out += self._close_call(it, kept)
            return out
        out.append(self._event("response.output_item.done", output_index=it.index, item=it.item))
        return out

    def _close_call(self, it: _Item, kept: str | None = None) -> list[str]:
        withheld = {d.get("id") for d in self.diagnostics if d.get("kind") == "withheld-call"}
        call_id = it.item["call_id"]
        args = "".join(it.parts)
        out: list[str] = []
        if kept is not None:
            out.append(self._event("response.function_call_arguments.done", item_id=it.item["id"],
                                   output_index=it.index, name=it.item["name"], arguments=kept))
            it.item = _call_item(it.item["id"], call_id, it.item["name"], kept, "completed")
        elif call_id in withheld:
            # Cut off: it must not run, so it is no part of the answer.
            it.item = _call_item(it.item["id"], call_id, it.item["name"], args, "incomplete")
        else:
            message = self.source.message if self.source is not None else None
            final = next((c["function"]["arguments"] for c in (message or {}).get("tool_calls") or ()
                          if c["id"] == call_id), args)
            out.append(self._event("response.function_call_arguments.done", item_id=it.item["id"],
                                   output_index=it.index, name=it.item["name"], arguments=final))
            it.item = _call_item(it.item["id"], call_id, it.item["name"], final, "completed")
        out.append(self._event("response.output_item.done", output_index=it.index, item=it.item))
        return out

    def _end(self, usage: Mapping[str, Any]) -> list[str]:
        out: list[str] = []
        for it in self.calls.values():
            if it.item["status"] == "in_progress":
                out += self._close_call(it)
        status = "incomplete" if self.finish == "length" else "completed"
        # A withheld call (cut off) must not run: it is no part of the answer.
        output = [it.item for it in self.items
                  if it.item["status"] != "incomplete" or it.item["type"] != "function_call"]
        final = self.response(output, status=status, usage=usage, model=self.model)
        self.final = final
        out.append(self._event(f"response.{status}", response=final))
        said: dict[str, Any] = {"content": "".join(it.item["content"][0]["text"] for it in self.items
                                                   if it.item["type"] == "message")}
        reasoning = "".join(it.item["content"][0]["text"] for it in self.items if it.item["type"] == "reasoning")
        if reasoning:
            said["reasoning_content"] = reasoning
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in output if i["type"] == "function_call"]
        if calls:
            said["tool_calls"] = calls
        self._keep(final, said)
        return out

    def error_event(self, message: str, code: str | int | None) -> str:
        """The end of a stream that failed: an ``error`` event, then
        ``response.failed``."""
        out = self._event("error", code=None if code is None else str(code), message=message, param=None)
        failed = self.response([it.item for it in self.items], status="failed", usage=None, model=self.model,
                               error={"code": "server_error", "message": message})
        return out + self._event("response.failed", response=failed)


def _reasoning_item(id: str, text: str, status: str, content: list[Any] | None = None) -> dict[str, Any]:
    return {"id": id, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if content is None else content}


def _message_item(id: str, text: str, status: str, content: list[Any] | None = None) -> dict[str, Any]:
    return {"id": id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
            if content is None else content}


def _call_item(id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
