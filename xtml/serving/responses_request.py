"""A Responses request as the chat-completions body it stands for
(:func:`translate`): ``instructions`` a system message, ``input`` (a string,
or items: messages with ``input_text``/``input_image`` parts,
``function_call`` and ``function_call_output`` items, ``reasoning`` items
replayed) the messages after the conversation of ``previous_response_id``,
function ``tools``, ``tool_choice``, ``text.format`` as ``response_format``,
``reasoning.effort`` as the dialect's thinking options, ``max_output_tokens``.
What may not be served is refused with a 400 naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..chat.response_format import FormatShape, read_response_format
from ..errors import RequestError, shown
from ..template import check_fields
from .responses_events import Exchange
from .responses_store import ResponseStore

__all__ = ["ResponseNotFound", "effort_of", "translate"]

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


def _flat_schema(f: Mapping[str, Any], shape: FormatShape) -> dict[str, Any]:
    schema = f.get("schema")
    if not isinstance(schema, Mapping):
        raise shape.error("a json_schema format needs its schema as an object", "schema")
    name = f.get("name")
    if name is not None and not isinstance(name, str):
        raise shape.error("a json_schema format's name must be a string", "name")
    js: dict[str, Any] = {"name": name or "response", "schema": schema}
    for key in ("description", "strict"):
        if f.get(key) is not None:
            js[key] = f[key]
    return js


_FORMAT = FormatShape(error=lambda msg, part: RequestError(msg, location="text.format" + (f".{part}" if part else "")),
                      not_object="text.format must be an object", type_name="text.format.type", schema=_flat_schema)
"""The Responses API's ``text.format``: a schema's fields beside its type."""


def _format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise RequestError("text must be an object", location="text")
    return read_response_format(text.get("format"), _FORMAT)


def _check_echoed(body: Mapping[str, Any]) -> None:
    """The metadata a response repeats as it came: what OpenAI's types take,
    or a 400 (never a response the client's own types reject). The other
    fields it repeats have their JSON types checked with the rest."""
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
    check_fields(body, api="responses")
    stream = body.get("stream")
    keep = body.get("store")
    if keep is None:
        keep = True
    b = _Builder()
    instructions = body.get("instructions")
    if instructions:
        b.add({"role": "system", "content": instructions}, "instructions")
    previous = body.get("previous_response_id")
    if previous is not None:
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
