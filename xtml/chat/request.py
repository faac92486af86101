"""Chat requests in, checked and resolved: the input side of the chat layer.

A request is what users already have: an OpenAI-style chat-completions body
(``messages``, ``tools`` and options as top-level keys) or a bare list of
messages. :func:`prepare` checks it against a dialect and resolves everything
that rendering and the normal form both need: option defaults, role aliases,
tool-result order and names, argument typing. Errors name the message index
and the field.
"""

from __future__ import annotations

import json
import marshal
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MessageError, OptionError, RequestError
from ..plugins import jsonfmt
from ..plugins.api import ContentExtension
from ..plugins.image import ImageValue
from ..plugins.jsonfmt import value_type as value_type  # its former home
from .dialect import Dialect

OPTION_NAMES = (
    "tools",
    "thinking",
    "enable_thinking",
    "thinking_effort",
    "reasoning_effort",
    "tool_choice",
    "response_format",
    "add_generation_prompt",
    "image_prompts",
)

# Keys of a chat-completions body that concern sampling or the API, not the
# prompt. They are accepted and have no effect on rendering.
API_KEYS = frozenset({
    "model", "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "stream",
    "stream_options", "n", "stop", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logprobs", "top_logprobs", "logit_bias", "user", "metadata", "parallel_tool_calls", "service_tier",
    "store", "modalities", "prediction", "audio", "web_search_options", "extra_body",
})

MESSAGE_KEYS = frozenset({
    "role", "content", "name", "reasoning_content", "reasoning", "thinking", "tool_calls", "tool_call_id",
    "tool", "tools", "id",
})
# What each role may carry. A field outside its role's set is accepted only
# when empty (APIs return `"tool_calls": null`, `"refusal": null` and the
# like); with a value it is an error, since rendering would drop it.
ROLE_KEYS = {
    "system": frozenset({"role", "content", "name", "tools", "id"}),
    "user": frozenset({"role", "content", "name", "id"}),
    "assistant": frozenset({"role", "content", "name", "reasoning_content", "reasoning", "thinking", "tool_calls",
                            "id"}),
    "tool": frozenset({"role", "content", "name", "tool", "tool_call_id", "id"}),
}


# Fields APIs put on returned messages, which a prompt has no place for.
API_FIELDS = frozenset({"refusal", "annotations", "audio", "function_call"})


def _check_keys(m: Mapping[str, Any], role: str, allowed: frozenset[str], i: int) -> None:
    for k, v in m.items():
        if k in allowed or v is None or v == "" or v == [] or v == {}:
            continue
        if k in MESSAGE_KEYS:
            raise MessageError(f"a {role} message cannot carry {k!r}; this template would drop it", index=i, path=k)
        if k in API_FIELDS:
            raise MessageError(f"field {k!r} cannot be rendered by this template", index=i, path=k)
        raise MessageError(f"unknown message field {k!r}", index=i, path=k)


class PluginPart:
    """A content part a plugin renders: its extension and what its
    ``prepare`` made of the input part."""

    __slots__ = ("ext", "value")

    def __init__(self, ext: ContentExtension, value: Any) -> None:
        self.ext = ext
        self.value = value


Part = str | PluginPart


@dataclass(slots=True)
class Call:
    name: str
    args: list[tuple[str, Any]] | None
    """Typed arguments in order, or None when ``raw`` holds a non-JSON string."""
    raw: str | None = None


class Msg:
    """A message checked and resolved for rendering.

    A plain slotted class: one is made per message per render, and a
    dataclass with default factories costs several times more to create."""

    __slots__ = ("call_id", "call_ref", "calls", "index", "known_calls", "name", "parts", "reasoning", "role",
                 "tool_index", "tools", "tools_json")

    def __init__(self, role: str, index: int) -> None:
        self.role = role
        self.index = index
        """Position in the request's ``messages``."""
        self.name: str | None = None
        self.parts: list[Part] = _NO_PARTS
        self.reasoning = ""
        self.calls: list[Call] = _NO_CALLS
        self.tools: list[Any] | None = None
        self.tools_json = ""
        self.tool_index = 0
        self.call_ref: tuple[int, int] | None = None
        """(position of the assistant message in the output, call index) of
        the call a tool message answers, when there is one at its position."""
        self.call_id: str | None = None
        """A tool message's ``tool_call_id`` as given."""
        self.known_calls: dict[str, tuple[int, str]] = _NO_IDS
        """For a tool message: call id → (index, name) of the latest
        assistant's calls."""


# Shared empty defaults; a message that has parts or calls gets its own list.
_NO_PARTS: list[Part] = []
_NO_CALLS: list[Call] = []
_NO_IDS: dict[str, tuple[int, str]] = {}


@dataclass(slots=True)
class Options:
    thinking: bool
    effort: str
    tool_choice: str | None
    response_format: dict[str, Any] | None
    add_generation_prompt: bool
    image_prompts: list[str] | None
    tools: list[Any] | None
    tools_json: str = ""
    """The tool list as the declaration writes it."""


def _is_map(x: object) -> bool:
    # Plain dicts are what users pass; the ABC check is slow on a hot path.
    return type(x) is dict or isinstance(x, Mapping)


def deep_sort(obj: Any, where: str = "tools") -> Any:
    """Dicts with keys sorted, recursively (how K3 serialises schemas)."""
    if _is_map(obj):
        try:
            items = sorted(obj.items())
        except TypeError:
            raise RequestError("JSON object keys must be strings", location=where) from None
        return {k: deep_sort(v, where) for k, v in items}
    if isinstance(obj, list | tuple):
        return [deep_sort(v, where) for v in obj]
    return obj


def check_json_keys(obj: Any, where: str) -> None:
    """Refuse objects whose keys are not strings: JSON would turn them into
    strings silently, and parse could not give them back."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if _is_map(x):
            for k, v in x.items():
                if not isinstance(k, str):
                    raise RequestError(f"JSON object keys must be strings, not {k!r}", location=where)
                stack.append(v)
        elif isinstance(x, list | tuple):
            stack.extend(x)


def json_compact(value: Any, where: str) -> str:
    """Compact JSON with every object's keys sorted, as K3 writes schemas
    (``sort_keys`` sorts recursively, like :func:`deep_sort`, but in C).

    Refuses what JSON would change silently (non-string keys): the text is
    read back and compared, in C; only on a difference does the slow walk
    look for the cause (tuples, say, differ harmlessly)."""
    # The same tool list arrives with every request of a conversation, as a
    # new object. marshal writes plain built-in values only (anything else
    # raises) and its bytes give the value back exactly, types and key order
    # included, so equal bytes mean the same JSON: a key five times cheaper
    # to make than the JSON itself.
    try:
        key: bytes | None = marshal.dumps(value)
    except ValueError:
        key = None
    if key is not None:
        text = _compact.get(key)
        if text is not None:
            return text
    try:
        text = jsonfmt.compact(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise RequestError(f"not JSON-serialisable: {e}", location=where) from None
    if json.loads(text) != value:
        check_json_keys(value, where)
    if key is not None and len(key) <= _COMPACT_MAX:
        if len(_compact) >= 64:
            _compact.clear()
        _compact[key] = text
    return text


# The JSON of recent tool lists and schemas by their marshal bytes: at most
# 64 of at most 256 kB each, so a server holds a few tens of MB at worst.
_compact: dict[bytes, str] = {}
_COMPACT_MAX = 256 << 10


def split_request(request: Any, options: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Messages and options from a request body or a bare message list."""
    opts: dict[str, Any] = {}
    if isinstance(request, list | tuple):
        messages = list(request)
    elif _is_map(request):
        if "messages" not in request:
            raise RequestError("a request needs 'messages' (or pass a bare list of messages)")
        messages = request["messages"]
        if not isinstance(messages, list | tuple):
            raise RequestError("'messages' must be a list", location="messages")
        messages = list(messages)
        for k, v in request.items():
            if k == "messages" or k in API_KEYS:
                continue
            if k == "chat_template_kwargs":
                if not _is_map(v):
                    raise RequestError("'chat_template_kwargs' must be an object", location=k)
                for kk, vv in v.items():
                    if kk not in OPTION_NAMES:
                        raise OptionError(f"unknown option {kk!r}", option=kk)
                    opts[kk] = vv
                continue
            if k not in OPTION_NAMES:
                raise RequestError(f"unknown request key {k!r}", location=k)
            opts[k] = v
    else:
        raise RequestError(f"a request is an object with 'messages' or a list of messages, "
                           f"not {type(request).__name__}")
    for k, v in options.items():
        if k not in OPTION_NAMES:
            raise OptionError(f"unknown option {k!r} (known: {', '.join(OPTION_NAMES)})", option=k)
        opts[k] = v
    return messages, opts


def resolve_options(d: Dialect, opts: Mapping[str, Any]) -> Options:
    thinking = d.thinking_default
    for key in ("enable_thinking", "thinking"):
        if opts.get(key) is not None:
            v = opts[key]
            if not isinstance(v, bool):
                raise OptionError(f"{key} must be true or false", option=key)
            thinking = v
    effort = d.default_effort
    for key in ("reasoning_effort", "thinking_effort"):
        v = opts.get(key)
        if v is None:
            continue
        if key == "reasoning_effort" and v in d.thinking_off:
            if opts.get("thinking") is True or opts.get("enable_thinking") is True:
                raise OptionError(f"reasoning_effort={v!r} switches thinking off, but thinking is on",
                                  option=key)
            thinking = False
            continue
        if v not in d.efforts:
            extra = f" (or {', '.join(d.thinking_off)} to switch thinking off)" if key == "reasoning_effort" \
                else ""
            raise OptionError(f"{key} must be one of {', '.join(d.efforts)}{extra}, not {v!r}", option=key)
        effort = v
    tc: Any = opts.get("tool_choice")
    if _is_map(tc) and tc.get("type") == "function":
        # A named tool is enforced by constrained decoding, not by the prompt:
        # the format has no prose for it and renders nothing, like "auto".
        tc = "auto"
    if tc is not None and tc not in ("auto", "none", "required"):
        raise OptionError(
            "tool_choice must be 'auto', 'none', 'required' or a named function",
            option="tool_choice",
        )
    rf = _response_format(opts.get("response_format"))
    agp = opts.get("add_generation_prompt", True)
    if not isinstance(agp, bool):
        raise OptionError("add_generation_prompt must be true or false", option="add_generation_prompt")
    prompts = opts.get("image_prompts")
    if prompts is not None:
        if not d.image_part_types:
            raise OptionError("this template has no images (its [plugins.image] is not enabled)",
                              option="image_prompts")
        if not isinstance(prompts, list | tuple):
            raise OptionError("image_prompts must be a list of strings", option="image_prompts")
        prompts = list(prompts)
        for i, p in enumerate(prompts):
            if not isinstance(p, str) or not d.image_prompt.match(p):
                raise OptionError(f"image_prompts[{i}] is not an image prompt of this format: {p!r}",
                                  option="image_prompts")
    tools = opts.get("tools")
    tools_json = ""
    if tools is not None:
        if not isinstance(tools, list | tuple):
            raise OptionError("tools must be a list of tool schemas", option="tools")
        tools = list(tools) if tools else None
        tools_json = json_compact(tools, "tools") if tools else ""
    return Options(thinking, effort, tc if tc in ("none", "required") else None, rf, agp, prompts, tools,
                   tools_json)


def _response_format(rf: Any) -> dict[str, Any] | None:
    if rf is None:
        return None
    if isinstance(rf, str):
        rf = {"type": rf}
    if not _is_map(rf):
        raise OptionError("response_format must be an object with a 'type'", option="response_format")
    t = rf.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return {"type": "json_object"}
    if t == "json_schema":
        js = rf.get("json_schema")
        if not _is_map(js):
            raise OptionError("response_format json_schema needs a 'json_schema' object",
                              option="response_format")
        schema = js.get("schema", js.get("json_schema", js))
        json_compact(schema, "response_format")
        return {"type": "json_schema", "json_schema": {"schema": schema}}
    raise OptionError(f"response_format type must be text, json_object or json_schema, not {t!r}",
                      option="response_format")


def _arguments(raw: Any, i: int, j: int) -> tuple[list[tuple[str, Any]] | None, str | None]:
    """Typed arguments of call ``j`` of message ``i``, or (None, raw) for a
    string that is not JSON."""
    if raw is None:
        return [], None
    if isinstance(raw, str):
        if not raw.strip():
            return [], None
        try:
            parsed = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            return None, str.__str__(raw)  # plain str, even from a subclass
        if type(parsed) is not dict:
            raise MessageError("tool call arguments must be a JSON object", index=i, path=_args_path(j))
        # Decoded JSON has string keys; only NaN and the infinities (which
        # Python's decoder accepts) need a look.
        items = list(parsed.items())
        for k, v in items:
            if type(v) is float and not math.isfinite(v):
                raise MessageError(f"argument {k!r} is {v}, which JSON cannot carry", index=i, path=_args_path(j))
        return items, None
    if not _is_map(raw):
        raise MessageError("tool call arguments must be a dict or a JSON object string", index=i, path=_args_path(j))
    parsed = raw
    out: list[tuple[str, Any]] = []
    for k, v in parsed.items():
        if not isinstance(k, str):
            raise MessageError(f"argument names must be strings, not {k!r}", index=i, path=_args_path(j))
        if isinstance(v, float) and not math.isfinite(v):
            raise MessageError(f"argument {k!r} is {v}, which JSON cannot carry", index=i, path=_args_path(j))
        out.append((k, v))
    return out, None


def _args_path(j: int) -> str:
    return f"tool_calls[{j}].function.arguments"


# Part types whose "text" is rendered as text (OpenAI's chat and responses APIs).
TEXT_PART_TYPES = ("text", "input_text")


def _text_of(x: Any, i: int, path: str) -> str:
    if not isinstance(x, str):
        raise MessageError(f"expected a string, not {type(x).__name__}", index=i, path=path)
    return x


def _content(d: Dialect, content: Any, i: int, split_marks: bool) -> list[Part]:
    """Content as text and image parts. With image prompts given, a
    placeholder literal in text marks an image too (as the model's processor
    reads it)."""
    if type(content) is str and not (split_marks and d.image_placeholder in content):
        return [content] if content else []
    parts: list[Part] = []

    def add_text(s: str) -> None:
        if not s:
            return
        if type(s) is not str:
            # A str subclass (an Enum member, say) as its plain value:
            # renderers tell text from plugin parts by exact type.
            s = str.__str__(s)
        if split_marks and d.image_placeholder in s:
            pieces = s.split(d.image_placeholder)
            for j, piece in enumerate(pieces):
                if piece:
                    parts.append(piece)
                if j < len(pieces) - 1:
                    parts.append(PluginPart(d.plugins["image"], ImageValue()))
        else:
            parts.append(s)

    if content is None:
        return parts
    if isinstance(content, str):
        add_text(content)
        return parts
    if not isinstance(content, list | tuple):
        raise MessageError(f"content must be a string or a list of parts, not {type(content).__name__}",
                           index=i, path="content")
    for j, part in enumerate(content):
        where = f"content[{j}]"
        if isinstance(part, str):
            add_text(part)
            continue
        if not _is_map(part):
            raise MessageError("a content part must be an object", index=i, path=where)
        t = part.get("type")
        if t in TEXT_PART_TYPES:
            if "text" not in part:
                raise MessageError("a text part needs 'text'", index=i, path=where)
            add_text(_text_of(part["text"], i, f"{where}.text"))
            continue
        ext = d.part_owner.get(t) if isinstance(t, str) else None
        if ext is None:
            raise MessageError(
                f"content part type {t!r} is not supported by this template "
                f"(supported: {', '.join([*TEXT_PART_TYPES, *d.part_owner])})",
                index=i, path=where)
        try:
            value = ext.prepare(part)
        except ValueError as e:
            raise MessageError(getattr(e, "msg", str(e)), index=i, path=where) from None
        parts.append(PluginPart(ext, value))
    return parts


def prepare(d: Dialect, request: Any, options: Mapping[str, Any]) -> tuple[Options, list[Msg]]:
    """Check a request and resolve it into messages ready to render."""
    try:
        return _prepare(d, request, options)
    except RecursionError:
        # Only a pathologically nested request gets here (JSON values deeper
        # than Python's recursion limit).
        raise RequestError("the request is nested too deeply") from None


def _prepare(d: Dialect, request: Any, options: Mapping[str, Any]) -> tuple[Options, list[Msg]]:
    raw_messages, opts = split_request(request, options)
    o = resolve_options(d, opts)
    split_marks = o.image_prompts is not None
    msgs: list[Msg] = []
    call_ids: dict[str, tuple[int, str]] = {}
    aliases, roles, user_keys = d.role_aliases, d.roles, ROLE_KEYS["user"]
    image_mark = d.image_placeholder if split_marks else None
    # This loop runs once per message of every request: the common cases
    # (plain dicts, string content) are tested inline before the general
    # paths.
    for i, m in enumerate(raw_messages):
        if type(m) is not dict and not _is_map(m):
            raise MessageError(f"a message must be an object, not {type(m).__name__}", index=i)
        role = m.get("role")
        if not isinstance(role, str):
            raise MessageError("a message needs a 'role' string", index=i, path="role")
        role = aliases.get(role, role)
        if role not in roles:
            raise MessageError(f"role {m.get('role')!r} is not one of {', '.join(roles)}", index=i, path="role")
        # Roles a template adds carry what a user message carries.
        allowed = ROLE_KEYS.get(role, user_keys)
        if not m.keys() <= allowed:
            _check_keys(m, role, allowed, i)
        msg = Msg(role, i)
        name = m.get("name")
        if name is not None and role != "tool":
            if not isinstance(name, str):
                raise MessageError("name must be a string", index=i, path="name")
            msg.name = name or None
        content = m.get("content")
        parts: list[Part] | None = None
        if type(content) is str and (image_mark is None or image_mark not in content):
            parts = [content] if content else _NO_PARTS
        if role == "system" and m.get("tools"):
            tools = m["tools"]
            if not isinstance(tools, list | tuple):
                raise MessageError("tools must be a list of tool schemas", index=i, path="tools")
            if parts if parts is not None else _content(d, content, i, False):
                raise MessageError("a system message that declares tools renders only the declaration; "
                                   "move its content to a message of its own", index=i, path="content")
            if m.get("name"):
                raise MessageError("a system message that declares tools renders no name", index=i, path="name")
            msg.tools = list(tools)
            msg.tools_json = json_compact(msg.tools, f"messages[{i}].tools")
            msgs.append(msg)
            continue
        msg.parts = parts if parts is not None else _content(d, content, i, split_marks)
        if role == "assistant":
            reasoning = m.get("reasoning_content") or m.get("reasoning") or m.get("thinking")
            if reasoning is not None and not isinstance(reasoning, str):
                raise MessageError("reasoning must be a string", index=i, path="reasoning_content")
            if reasoning and reasoning.strip() and o.thinking:
                msg.reasoning = reasoning
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list | tuple):
                raise MessageError("tool_calls must be a list", index=i, path="tool_calls")
            call_ids = {}
            if calls:
                msg.calls = []
            for j, c in enumerate(calls):
                if type(c) is not dict and not _is_map(c):
                    raise MessageError("a tool call must be an object", index=i, path=f"tool_calls[{j}]")
                fn = c.get("function", c)
                if type(fn) is not dict and not _is_map(fn):
                    raise MessageError("function must be an object", index=i, path=f"tool_calls[{j}].function")
                fname = fn.get("name")
                if not isinstance(fname, str) or not fname:
                    raise MessageError("a tool call needs a function name", index=i,
                                       path=f"tool_calls[{j}].function.name")
                args, raw = _arguments(fn.get("arguments"), i, j)
                msg.calls.append(Call(fname, args, raw))
                cid = c.get("id")
                if cid is not None:
                    call_ids.setdefault(str(cid), (j + 1, fname))
        elif role == "tool":
            tool = m.get("tool", m.get("name"))
            if tool is not None and not isinstance(tool, str):
                raise MessageError("the tool name must be a string", index=i, path="tool")
            msg.name = tool
            cid = m.get("tool_call_id", m.get("id"))
            msg.call_id = None if cid is None else str(cid)
            msg.known_calls = call_ids
        msgs.append(msg)
    return o, resolve_tool_results(msgs)


def resolve_tool_results(msgs: list[Msg]) -> list[Msg]:
    """Order each run of tool results as the calls they answer, and give each
    its index and tool name.

    A run whose every message names a call of the latest assistant message (by
    ``tool_call_id``) is sorted into call order, stably, and the call's name
    wins; otherwise the run keeps its order. Then each tool message gets its
    1-based position after the latest assistant message, and a missing name is
    taken from the call at that position.
    """
    # One pass, reordering in place (``msgs`` is prepare's own list): this
    # runs on every request.
    prior: Msg | None = None
    prior_pos = count = 0
    i, n = 0, len(msgs)
    while i < n:
        m = msgs[i]
        if m.role != "tool":
            if m.role == "assistant":
                prior, prior_pos, count = m, i, 0
            i += 1
            continue
        j = i + 1
        while j < n and msgs[j].role == "tool":
            j += 1
        run = msgs[i:j]
        targets = [m.known_calls.get(m.call_id) if m.call_id is not None else None for m in run]
        if None not in targets:
            order = []
            for m, t in zip(run, targets):
                assert t is not None
                m.name = t[1]
                order.append(t[0])
            if order != sorted(order):
                msgs[i:j] = [m for _, m in sorted(zip(order, run), key=lambda x: x[0])]
        for pos in range(i, j):
            m = msgs[pos]
            count += 1
            m.tool_index = count
            has_call = prior is not None and count <= len(prior.calls)
            if m.name is None and has_call:
                assert prior is not None
                m.name = prior.calls[count - 1].name
            if m.name is None:
                raise MessageError("tool message needs a resolvable tool name: give 'tool_call_id', "
                                   "'name' or 'tool'", index=m.index, path="name")
            if has_call:
                assert prior is not None
                # Linked only when the names agree: rendering a link makes the
                # call's name win, so a link to another name would rename it.
                if prior.calls[count - 1].name == m.name:
                    m.call_ref = (prior_pos, count)
        i = j
    return msgs
