"""The OpenAI Responses API (``POST /v1/responses``) as a translation at the
edge of the chat path.

A Responses request becomes the chat-completions body the template renders
(:func:`translate`): ``instructions`` a system message, ``input`` (a string,
or items: messages with ``input_text``/``input_image`` parts,
``function_call`` and ``function_call_output`` items, ``reasoning`` items
replayed) the messages after the conversation of ``previous_response_id``,
function ``tools``, ``tool_choice``, ``text.format`` as ``response_format``,
``reasoning.effort`` as the dialect's thinking options, ``max_output_tokens``.
The answer goes the other way: a ``chat.completion`` becomes a ``response``
object (:meth:`Exchange.whole`), and a stream's ``chat.completion.chunk``
objects become the typed events of a Responses stream
(:meth:`Exchange.events`), each with its ``sequence_number``.

What a request may not be served is refused with a 400 naming the field:
tools other than functions, ``background``, ``conversation``, stored
``prompt`` templates, ``item_reference`` items, log probabilities. Responses
are kept (``store``, true by default, as OpenAI's) in a
:class:`ResponseStore` bounded in entries and age: a ``previous_response_id``
it does not hold is a 404 saying so.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from ..errors import RequestError, shown
from .engines.framing import dumps
from .openai import ChunkStream

__all__ = [
    "MAX_AGE",
    "MAX_BYTES",
    "MAX_ENTRIES",
    "Exchange",
    "ResponseNotFound",
    "ResponseStore",
    "Stored",
    "effort_of",
    "translate",
]

MAX_ENTRIES = 1000
"""Responses a store keeps by default; the oldest goes first."""
MAX_AGE = 3600.0
"""Seconds a stored response is kept by default."""
MAX_BYTES = 256 << 20
"""Bytes (of the entries' JSON) a store keeps by default: a request body may
be 32 MiB, so a count of entries alone bounds no memory."""

# OpenAI's efforts, least to most; a dialect's own names win.
_OPENAI_EFFORTS = ("minimal", "low", "medium", "high", "xhigh")
# Keys of a Responses request that no engine behind the gateway can serve:
# answering as if they were not set would answer another request.
_REFUSED = {
    "background": "background responses are not served: the answer comes in the request's own connection",
    "conversation": "conversations are not served: pass previous_response_id, or the whole input",
    "prompt": "stored prompt templates are not served: send the input itself",
    "top_logprobs": "this server returns no log probabilities",
    "background_options": "background responses are not served: the answer comes in the request's own connection",
    "context_management": "context management (compaction) is not served: send the input to answer",
    "moderation": "moderation is not served by this gateway",
    "image": "image generation options are not served: this gateway serves a chat model",
    "access_programs": "access programs are not served by this gateway",
}
# What a request may hold that changes nothing an engine on ids does (the
# gateway serves one model, never truncates, caches nothing it is told to).
_IGNORED = frozenset({"include", "truncation", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                      "prompt_cache_options", "safety_identifier", "stream_options", "model"})
_TAKEN = frozenset({"input", "instructions", "previous_response_id", "tools", "tool_choice", "text", "reasoning",
                    "max_output_tokens", "stream", "store", "metadata", "user", "max_tool_calls"})
# Sampling fields of the chat path a Responses request may also give (as
# vLLM's Responses endpoint takes them): passed on as they are.
_PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "stop", "stop_token_ids", "parallel_tool_calls")


class ResponseNotFound(RequestError):
    """A ``previous_response_id`` (or a response asked for by id) that the
    store does not hold: answered 404."""

    status = 404


def new_id(prefix: str) -> str:
    """An object id as OpenAI's: a prefix (``resp``, ``msg``, ``fc``, ``rs``)
    and 48 random hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


# -- the store -----------------------------------------------------------------------

@dataclass(slots=True)
class Stored:
    """A stored response: the object as answered, and the conversation a
    follow-up continues (chat messages, without the ``instructions``, which
    are not carried over, as OpenAI's are not). ``size`` is the bytes of
    their JSON, as the store keeps them."""

    response: dict[str, Any]
    history: list[dict[str, Any]]
    at: float = 0.0
    size: int = 0


def _text(value: Any) -> bytes:
    """``value`` as compact JSON, in bytes of exactly its length: orjson's
    bytes keep the buffer they were written in (five times the text, for
    a conversation of many short messages), which the store would hold."""
    return bytes(memoryview(dumps(value)))


class _Kept:
    """A response as the store holds it: its JSON text, which is what the
    store's bound counts (the objects it decodes to take several times
    as much memory: ten 30 MiB requests held 2 GB under a bound of 256 MiB)."""

    __slots__ = ("at", "history", "response")

    def __init__(self, response: bytes, history: bytes, at: float) -> None:
        self.response = response
        self.history = history
        self.at = at

    @property
    def size(self) -> int:
        return len(self.response) + len(self.history)


class ResponseStore:
    """Responses kept in this process for ``previous_response_id``: at most
    ``max_entries`` and ``max_bytes`` of their JSON (the oldest is dropped
    first; one larger than ``max_bytes`` is not kept), each for ``max_age``
    seconds. ``clock`` is the time source (monotonic seconds). What is kept
    is the JSON text itself, decoded by :meth:`get`: the bound in bytes is
    the memory held."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_age: float = MAX_AGE, *,
                 max_bytes: int = MAX_BYTES, clock: Callable[[], float] = time.monotonic) -> None:
        if type(max_entries) is not int or max_entries < 0:
            raise ValueError(f"max_entries must be a whole number, not {max_entries!r}")
        if not max_age > 0:
            raise ValueError(f"max_age must be a positive number of seconds, not {max_age!r}")
        if type(max_bytes) is not int or max_bytes < 0:
            raise ValueError(f"max_bytes must be a whole number of bytes, not {max_bytes!r}")
        self.max_entries = max_entries
        self.max_age = float(max_age)
        self.max_bytes = max_bytes
        self._bytes = 0
        self._clock = clock
        self._items: OrderedDict[str, _Kept] = OrderedDict()
        # Requests are rendered in worker threads when large.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._items)

    @property
    def held(self) -> int:
        """The bytes of JSON kept."""
        with self._lock:
            self._expire()
            return self._bytes

    def _expire(self) -> None:
        oldest = self._clock() - self.max_age
        items = self._items
        while items:
            key, first = next(iter(items.items()))
            if first.at > oldest:
                break
            del items[key]
            self._bytes -= first.size

    def put(self, id: str, entry: Stored) -> None:
        kept = _Kept(_text(entry.response), _text(entry.history), 0.0)
        entry.size = kept.size
        with self._lock:
            old = self._items.pop(id, None)
            if old is not None:
                self._bytes -= old.size
            if kept.size > self.max_bytes:
                return  # never kept: a later previous_response_id to it is a 404, as for any other
            kept.at = entry.at = self._clock()
            self._items[id] = kept
            self._bytes += kept.size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.size
            self._expire()

    def _kept(self, id: str) -> _Kept | None:
        with self._lock:
            self._expire()
            return self._items.get(id)

    def get(self, id: str) -> Stored | None:
        """The response stored as ``id``, decoded (objects of its own)."""
        kept = self._kept(id)
        if kept is None:
            return None
        return Stored(json.loads(kept.response), json.loads(kept.history), kept.at, kept.size)

    def size(self, id: str) -> int | None:
        """The bytes of the response stored as ``id``, without decoding it."""
        kept = self._kept(id)
        return None if kept is None else kept.size

    def response_json(self, id: str) -> bytes | None:
        """The response object stored as ``id``, as the JSON it is kept as."""
        kept = self._kept(id)
        return None if kept is None else kept.response

    def delete(self, id: str) -> bool:
        with self._lock:
            entry = self._items.pop(id, None)
            if entry is None:
                return False
            self._bytes -= entry.size
            return True


# -- requests ------------------------------------------------------------------------

def effort_of(effort: Any, efforts: tuple[str, ...], off: tuple[str, ...]) -> Any:
    """A Responses ``reasoning.effort`` as a dialect's ``reasoning_effort``:
    a name of the dialect's as it is; ``none`` its thinking-off value;
    another of OpenAI's (``minimal`` ... ``xhigh``) the dialect's effort at
    the same place on its own scale. Anything else is left for the chat
    layer to refuse, naming it."""
    if not isinstance(effort, str) or effort in efforts or effort in off:
        return effort
    if effort == "none" and off:
        return off[0]
    if effort in _OPENAI_EFFORTS and efforts:
        rank = _OPENAI_EFFORTS.index(effort) / (len(_OPENAI_EFFORTS) - 1)
        return efforts[round(rank * (len(efforts) - 1))]
    return effort


def _text_parts(content: Any, where: str, *, assistant: bool) -> Any:
    """A message's content as the chat layer takes it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError("content must be a string or a list of content parts", location=where)
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(p, Mapping):
            raise RequestError("a content part must be an object", location=at)
        t = p.get("type")
        if t in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            text = p.get("text")
            if not isinstance(text, str):
                raise RequestError(f"a {t} part needs its text as a string", location=f"{at}.text")
            parts.append({"type": "text", "text": text})
        elif t == "refusal":
            text = p.get("refusal")
            if not isinstance(text, str):
                raise RequestError("a refusal part needs its refusal as a string", location=f"{at}.refusal")
            parts.append({"type": "text", "text": text})
        elif t == "input_image" and not assistant:
            # Handed on as the chat part it is: the gateway refuses it there,
            # as it refuses any part that would reach the engine as nothing.
            url = p.get("image_url") or p.get("file_id")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise RequestError(f"a content part of type {shown(t)} cannot be served here: only input_text, "
                               "output_text and refusal parts are text", location=f"{at}.type")
    if assistant:
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        text = _text_parts(output, where, assistant=True)
        assert isinstance(text, str)
        return text
    raise RequestError("output must be a string or a list of content parts", location=where)


class _Builder:
    """Chat messages out of Responses input items, with where each came from
    (an error in a message names the item it was)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.origins: list[str] = []
        # The reasoning items' texts until the assistant message they belong
        # to takes them, joined once: adding each to the text so far copied
        # it all again per item (100,000 items took 18 s).
        self.reasoning: list[str] | None = None
        self.open: dict[str, Any] | None = None  # the assistant message calls and reasoning join
        # Call ids of the conversation so far, and of the latest assistant
        # message (the calls a function_call_output answers), with those
        # already answered: a tool result goes to its call by id or not at all.
        self.call_ids: set[str] = set()
        self.turn_calls: set[str] = set()
        self.answered: set[str] = set()

    def add(self, message: dict[str, Any], origin: str) -> dict[str, Any]:
        self.messages.append(message)
        self.origins.append(origin)
        if message.get("role") == "assistant":
            self.turn_calls = set()
            self.answered = set()
        return message

    def stored(self, message: dict[str, Any]) -> None:
        """A message of the stored conversation a follow-up continues: its
        calls are those the follow-up's outputs may answer."""
        self.add(message, "previous_response_id")
        if message.get("role") == "assistant":
            for c in message.get("tool_calls") or ():
                self.call_ids.add(c["id"])
                self.turn_calls.add(c["id"])
        elif message.get("role") == "tool":
            self.answered.add(str(message.get("tool_call_id")))

    def assistant(self, origin: str) -> dict[str, Any]:
        m = self.open
        if m is None:
            m = self.add({"role": "assistant", "content": ""}, origin)
            self.open = m
        if self.reasoning is not None:
            m["reasoning_content"] = "".join(self.reasoning)
            self.reasoning = None
        return m

    def item(self, item: Any, where: str) -> None:
        if not isinstance(item, Mapping):
            raise RequestError("an input item must be an object", location=where)
        t = item.get("type")
        if t is None and "role" in item:
            t = "message"
        if t == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"a message's role must be user, system, developer or assistant, not "
                                   f"{shown(role)}", location=f"{where}.role")
            content = _text_parts(item.get("content"), f"{where}.content", assistant=role == "assistant")
            if role == "assistant":
                m = self.assistant(where)
                if m.get("tool_calls") or m["content"]:
                    # Text after calls, or a second message: a turn of its own.
                    self.open = None
                    m = self.assistant(where)
                m["content"] = content
            else:
                self.close()
                self.add({"role": role, "content": content}, where)
        elif t == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            for key, v in (("call_id", call_id), ("name", name), ("arguments", args)):
                if not isinstance(v, str):
                    raise RequestError(f"a function_call item needs its {key} as a string",
                                       location=f"{where}.{key}")
            assert isinstance(call_id, str)
            if call_id in self.call_ids:
                # Its output could be sent to either call.
                raise RequestError(f"the call_id {shown(call_id)} is given to an earlier function_call of the "
                                   "conversation: each call needs an id of its own", location=f"{where}.call_id")
            m = self.assistant(where)
            m.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
            self.call_ids.add(call_id)
            self.turn_calls.add(call_id)
        elif t == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise RequestError("a function_call_output item needs its call_id as a string",
                                   location=f"{where}.call_id")
            output = _output_text(item.get("output"), f"{where}.output")
            self.close()
            if call_id not in self.turn_calls:
                # Matched by position instead, the output would be sent to
                # another call: OpenAI's answer is a 400 too.
                why = ("is a call of an earlier assistant turn: an output answers a call of the latest one"
                       if call_id in self.call_ids else "names no function_call of the conversation")
                raise RequestError(f"No tool call found for function call output with call_id {shown(call_id)}: "
                                   f"it {why}", location=f"{where}.call_id")
            if call_id in self.answered:
                raise RequestError(f"the call {shown(call_id)} already has its function_call_output: each call "
                                   "has one", location=f"{where}.call_id")
            self.answered.add(call_id)
            self.add({"role": "tool", "tool_call_id": call_id, "content": output}, where)
        elif t == "reasoning":
            parts: dict[str, list[str]] = {}
            for key in ("content", "summary"):
                value = item.get(key)
                if value is None:
                    continue
                if not isinstance(value, list):
                    raise RequestError(f"a reasoning item's {key} must be a list of parts", location=f"{where}.{key}")
                for j, part in enumerate(value):
                    if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
                        raise RequestError("a reasoning part must be an object with its text as a string",
                                           location=f"{where}.{key}[{j}]")
                parts[key] = [part["text"] for part in value]
            # The reasoning itself when it is there, else its summary.
            text = "".join(parts.get("content") or parts.get("summary") or ())
            if not text:
                if item.get("encrypted_content") is not None:
                    raise RequestError("encrypted reasoning cannot be replayed: this server issues its reasoning "
                                       "as text; send the reasoning item's content", location=where)
                return  # an empty reasoning item: nothing to render
            if self.open is not None and (self.open["content"] or self.open.get("tool_calls")):
                self.open = None  # reasoning starts the next assistant turn
            if self.reasoning is None:
                self.reasoning = [text]
            else:
                self.reasoning.append(text)
        elif t == "item_reference":
            raise RequestError("item_reference items are not served: send the item itself",
                               location=f"{where}.type")
        else:
            raise RequestError(f"an input item of type {shown(t)} cannot be served: only messages, function_call, "
                               "function_call_output and reasoning items are", location=f"{where}.type")

    def close(self) -> None:
        if self.reasoning is not None:
            # Reasoning that no answer followed is kept, as a turn of its own.
            self.assistant("input")
        self.open = None


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", location="tools")
    out: list[dict[str, Any]] = []
    others: list[str] = []
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping):
            raise RequestError("a tool must be an object", location=f"tools[{i}]")
        if t.get("type") != "function":
            others.append(f"tools[{i}] ({shown(t.get('type'))})")
            continue
        name = t.get("name")
        if not isinstance(name, str):
            raise RequestError("a function tool needs its name as a string", location=f"tools[{i}].name")
        fn: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if t.get(key) is not None:
                fn[key] = t[key]
        out.append({"type": "function", "function": fn})
    if others:
        raise RequestError(f"only function tools are served: {', '.join(others)} cannot be; the model would "
                           "call tools nobody runs", location="tools")
    return out


def _tool_choice(v: Any) -> Any:
    if v is None or v in ("auto", "none", "required"):
        return v
    if isinstance(v, Mapping) and v.get("type") == "function" and isinstance(v.get("name"), str):
        return {"type": "function", "function": {"name": v["name"]}}
    what = v.get("type") if isinstance(v, Mapping) else v
    raise RequestError(f"tool_choice must be auto, none, required or a function tool, not {shown(what)}",
                       location="tool_choice")


def _format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise RequestError("text must be an object", location="text")
    f = text.get("format")
    if f is None:
        return None
    if not isinstance(f, Mapping):
        raise RequestError("text.format must be an object", location="text.format")
    t = f.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return {"type": "json_object"}
    if t == "json_schema":
        schema = f.get("schema")
        if not isinstance(schema, Mapping):
            raise RequestError("a json_schema format needs its schema as an object", location="text.format.schema")
        name = f.get("name")
        if name is not None and not isinstance(name, str):
            raise RequestError("a json_schema format's name must be a string", location="text.format.name")
        js: dict[str, Any] = {"name": name or "response", "schema": schema}
        for key in ("description", "strict"):
            if f.get(key) is not None:
                js[key] = f[key]
        return {"type": "json_schema", "json_schema": js}
    raise RequestError(f"text.format.type must be text, json_object or json_schema, not {shown(t)}",
                       location="text.format.type")


def _check_echoed(body: Mapping[str, Any]) -> None:
    """The fields a response repeats as they came: what OpenAI's types take,
    or a 400 (never a response the client's own types reject)."""
    most = body.get("max_tool_calls")
    if most is not None and (type(most) is not int or most < 0):
        # It limits calls of built-in tools, which this server runs none of:
        # any count is met.
        raise RequestError("max_tool_calls must be a whole number, 0 or more", location="max_tool_calls")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError("user must be a string", location="user")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and type(parallel) is not bool:
        raise RequestError("parallel_tool_calls must be true or false", location="parallel_tool_calls")
    metadata = body.get("metadata")
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise RequestError("metadata must be an object of string keys and string values", location="metadata")
    if len(metadata) > 16:
        raise RequestError(f"metadata holds at most 16 pairs, not {len(metadata)}", location="metadata")
    for key, value in metadata.items():
        if not isinstance(key, str) or len(key) > 64:
            raise RequestError("a metadata key is a string of at most 64 characters", location="metadata")
        if not isinstance(value, str) or len(value) > 512:
            raise RequestError("a metadata value is a string of at most 512 characters",
                               location=f"metadata.{key}")


def translate(body: Mapping[str, Any], store: ResponseStore, *, efforts: tuple[str, ...] = (),
              thinking_off: tuple[str, ...] = ()) -> tuple[dict[str, Any], Exchange]:
    """A Responses request as the chat-completions body the gateway serves,
    and the :class:`Exchange` that answers it. ``efforts`` and
    ``thinking_off`` are the dialect's (``reasoning.effort`` is mapped onto
    them). Bad requests raise :class:`~xtml.RequestError` naming the field;
    a ``previous_response_id`` the store does not hold,
    :class:`ResponseNotFound`."""
    for key in body:
        if key not in _TAKEN and key not in _IGNORED and key not in _REFUSED and key not in _PASSED:
            raise RequestError(f"unknown parameter {shown(key)}", location=str(key))
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
            raise RequestError("include must be a list of strings", location="include")
        if any("logprobs" in v for v in include):
            raise RequestError("this server returns no log probabilities", location="include")
    for key, why in _REFUSED.items():
        v = body.get(key)
        if v is not None and v is not False and v != 0:
            raise RequestError(why, location=key)
    stream = body.get("stream")
    if stream is not None and type(stream) is not bool:
        raise RequestError("stream must be true or false", location="stream")
    keep = body.get("store", True)
    if keep is None:
        keep = True
    if type(keep) is not bool:
        raise RequestError("store must be true or false", location="store")
    b = _Builder()
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("instructions must be a string", location="instructions")
        if instructions:
            b.add({"role": "system", "content": instructions}, "instructions")
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise RequestError("previous_response_id must be a string", location="previous_response_id")
        stored = store.get(previous)
        if stored is None:
            raise ResponseNotFound(f"no response with id {shown(previous)} is stored here (responses are kept "
                                   f"for {store.max_age:g} s, the latest {store.max_entries:,}, and only those "
                                   "made with store true)", location="previous_response_id")
        for m in stored.history:
            b.stored(m)
    start = len(b.messages)
    given = body.get("input")
    if isinstance(given, str):
        b.add({"role": "user", "content": given}, "input")
    elif isinstance(given, list):
        for i, item in enumerate(given):
            b.item(item, f"input[{i}]")
        b.close()
    elif given is not None:
        raise RequestError("input must be a string or a list of items", location="input")
    if len(b.messages) == start or not any(m["role"] != "system" for m in b.messages):
        raise RequestError("input holds no message: there is nothing to answer", location="input")
    chat: dict[str, Any] = {"messages": b.messages}
    tools = body.get("tools")
    if tools:
        chat["tools"] = _tools(tools)
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, Mapping):
            raise RequestError("reasoning must be an object", location="reasoning")
        effort = reasoning.get("effort")
        if effort is not None:
            chat["reasoning_effort"] = effort_of(effort, efforts, thinking_off)
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    for key in _PASSED:
        if body.get(key) is not None:
            chat[key] = body[key]
    if stream:
        chat["stream"] = True
    _check_echoed(body)
    echo = {k: body.get(k) for k in ("instructions", "max_output_tokens", "previous_response_id", "temperature",
                                     "top_p", "user")}
    echo["metadata"] = dict(body.get("metadata") or {})
    echo["tools"] = [{"type": "function", "name": t["function"]["name"],
                      "description": t["function"].get("description"),
                      "parameters": t["function"].get("parameters"),
                      "strict": t["function"].get("strict", True)} for t in chat.get("tools", ())]
    echo["tool_choice"] = body.get("tool_choice") or "auto"
    echo["parallel_tool_calls"] = body.get("parallel_tool_calls") is not False
    text = body.get("text")
    given_format = (text.get("format") if isinstance(text, Mapping) else None) or {"type": "text"}
    if fmt is not None and fmt["type"] == "json_schema":
        # The name served, when the request left it out.
        given_format = {**given_format, "name": fmt["json_schema"]["name"]}
    echo["text"] = {"format": given_format}
    echo["reasoning"] = {"effort": (reasoning or {}).get("effort"), "summary": None}
    echo["store"] = keep
    echo["truncation"] = "disabled"
    history = b.messages[1:] if instructions else list(b.messages)
    ex = Exchange(store=store if keep else None, history=history, origins=b.origins, echo=echo)
    return chat, ex


_MESSAGES_AT = re.compile(r"messages\[(\d+)\]")
# The chat body's fields a Responses request gives under other names.
_NAMES = {"reasoning_effort": "reasoning.effort", "max_completion_tokens": "max_output_tokens",
          "response_format": "text.format", "messages": "input"}
_OPTION = re.compile(r"option '(\w+)'")
_TOOL_FIELD = re.compile(r"(tools\[\d+\])\.function\.")
_CHAT_NAME = re.compile(r"\b(?:reasoning_effort|max_completion_tokens|response_format)\b")


# -- answers -------------------------------------------------------------------------

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
