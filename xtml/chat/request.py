"""Chat requests in, checked and resolved: the input side of the chat layer.

A request is what users already have: an OpenAI-style chat-completions body
(``messages``, ``tools`` and options as top-level keys) or a bare list of
messages. :func:`prepare` checks it against a dialect and resolves everything
that rendering and the normal form both need: option defaults, role aliases,
tool-result order and names, argument typing. Errors name the message index
and the field.

This module reads the messages into :class:`Msg`; the options are read by
:mod:`.options`, the size and depth measured by :mod:`.request_size`, and
JSON values written and checked by :mod:`.json_values`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MessageError, OptionError, RequestError, shown
from ..plugins import jsonfmt
from ..plugins.api import ContentExtension
from ..plugins.jsonfmt import value_type as value_type  # its former home
from . import fields
from .dialect import Dialect
from .json_values import is_map, json_compact, surrogate_in, surrogate_message
from .options import OPTION_NAMES as OPTION_NAMES  # its former home
from .options import Options as Options  # its former home
from .options import check_tools, resolve_options
from .request_size import MAX_CHARS as MAX_CHARS  # its former home
from .request_size import Known, size_and_tools
from .request_size import request_size as request_size  # its former home

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
    # Annotations (url citations) are read, not rendered: the content already
    # holds the text they point into.
    "assistant": frozenset({"role", "content", "name", "reasoning_content", "reasoning", "thinking", "tool_calls",
                            "id", "annotations"}),
    "tool": frozenset({"role", "content", "name", "tool", "tool_call_id", "id"}),
}


# Fields APIs put on returned messages, which a prompt has no place for (an
# assistant's ``function_call`` is read as its tool call before this check).
API_FIELDS = frozenset({"refusal", "annotations", "audio", "function_call"})
KNOWN_MESSAGE_KEYS = MESSAGE_KEYS | API_FIELDS


def _check_keys(m: Mapping[str, Any], role: str, allowed: frozenset[str], i: int) -> None:
    for k, v in m.items():
        if k in allowed or v is None or v == "" or v == [] or v == {}:
            continue
        if k in MESSAGE_KEYS:
            raise MessageError(f"a {role} message cannot carry {shown(k)}; this template would drop it", index=i,
                               path=k)
        if k in API_FIELDS:
            raise MessageError(f"field {shown(k)} cannot be rendered by this template", index=i, path=k)
        raise MessageError(f"unknown message field {shown(k)}{fields.did_you_mean(k, KNOWN_MESSAGE_KEYS)}", index=i,
                           path=str(k))


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


def split_request(request: Any, options: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Messages and options from a request body or a bare message list.

    Keyword options win over ``chat_template_kwargs``, which win over the
    body's top-level keys. Every key is read by :data:`.fields.FIELDS`; one
    in no table is an error, or ignored when ``options`` holds
    ``unknown_keys="ignore"`` (which only the caller sets). Objects with
    ``model_dump`` are taken for the request and for each message."""
    ignore = False
    if "unknown_keys" in options:
        mode = options["unknown_keys"]
        if mode not in fields.UNKNOWN_KEYS:
            raise OptionError(f"unknown_keys must be one of {', '.join(map(repr, fields.UNKNOWN_KEYS))}, "
                              f"not {shown(mode)}", option="unknown_keys")
        ignore = mode == "ignore"
        options = {k: v for k, v in options.items() if k != "unknown_keys"}
    if type(request) is not dict and not isinstance(request, list | tuple) and not is_map(request):
        # A request model's defaults are not the caller's: only what was set.
        request = fields.dump(request, unset=True)
    opts: dict[str, Any]
    if isinstance(request, list | tuple):
        messages = list(request)
        opts = {}
    elif is_map(request):
        if "messages" not in request:
            raise RequestError("a request needs 'messages' (or pass a bare list of messages)")
        messages = request["messages"]
        if not isinstance(messages, list | tuple):
            raise RequestError("'messages' must be a list", location="messages")
        messages = list(messages)
        opts = fields.request_options(request, ignore)
    else:
        raise RequestError(f"a request is an object with 'messages' or a list of messages, "
                           f"not {type(request).__name__}")
    if options:
        opts.update(fields.keyword_options(options))
    return fields.messages_of(messages, ignore, KNOWN_MESSAGE_KEYS), opts


def _arguments(raw: Any, i: int, j: int) -> tuple[list[tuple[str, Any]] | None, str | None]:
    """Typed arguments of call ``j`` of message ``i``, or (None, raw) for a
    string that is not a standard JSON object."""
    if raw is None:
        return [], None
    if isinstance(raw, str):
        if not raw.strip():
            return [], None
        _text(raw, i, _args_path(j))
        # As K3's reference encoder has it: text that is not JSON goes whole
        # into the json block, JSON that is not an object is an error. What
        # only Python's decoder reads (NaN, 1e999, an escaped lone
        # surrogate, a 5,000-digit integer) is JSON to the reference, so it
        # is refused here rather than rendered differently.
        try:
            parsed = jsonfmt.loads(raw)
        except jsonfmt.NotStandard as e:
            raise MessageError(f"tool call arguments are not standard JSON: {e}", index=i,
                               path=_args_path(j)) from None
        except ValueError:
            return None, str.__str__(raw)  # plain str, even from a subclass
        if type(parsed) is not dict:
            raise MessageError("tool call arguments must be a JSON object", index=i, path=_args_path(j))
        return list(parsed.items()), None
    if not is_map(raw):
        raise MessageError("tool call arguments must be a dict or a JSON object string", index=i, path=_args_path(j))
    parsed = raw
    out: list[tuple[str, Any]] = []
    for k, v in parsed.items():
        if not isinstance(k, str):
            raise MessageError(f"argument names must be strings, not {type(k).__name__}", index=i,
                               path=_args_path(j))
        if isinstance(v, float) and not math.isfinite(v):
            raise MessageError(f"argument {shown(k)} is {v}, which JSON cannot carry", index=i, path=_args_path(j))
        out.append((k, v))
    found = surrogate_in(raw, _args_path(j))
    if found is not None:
        raise MessageError(found[1], index=i, path=found[0])
    return out, None


def _args_path(j: int) -> str:
    return f"tool_calls[{j}].function.arguments"


def _text(text: str, i: int, path: str) -> None:
    """Refuse a string of message ``i`` that holds a lone surrogate."""
    if not text.isascii():
        at = jsonfmt.lone_surrogate(text)
        if at >= 0:
            raise MessageError(surrogate_message(text, at), index=i, path=path)


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
        _text(content, i, "content")
        return [content] if content else []
    parts: list[Part] = []

    def add_text(s: str, where: str = "content") -> None:
        if not s:
            return
        _text(s, i, where)
        if type(s) is not str:
            # A str subclass (an Enum member, say) as its plain value:
            # renderers tell text from plugin parts by exact type.
            s = str.__str__(s)
        if split_marks and d.image_placeholder in s:
            pieces = s.split(d.image_placeholder)
            images = d.plugins["image"]
            for j, piece in enumerate(pieces):
                if piece:
                    parts.append(piece)
                if j < len(pieces) - 1:
                    # The placeholder stands for an image part with nothing
                    # but its type.
                    parts.append(PluginPart(images, images.prepare({"type": "image"})))
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
            add_text(part, where)
            continue
        if not is_map(part):
            raise MessageError("a content part must be an object", index=i, path=where)
        t = part.get("type")
        if t in TEXT_PART_TYPES:
            if "text" not in part:
                raise MessageError("a text part needs 'text'", index=i, path=where)
            add_text(_text_of(part["text"], i, f"{where}.text"), f"{where}.text")
            continue
        ext = d.part_owner.get(t) if isinstance(t, str) else None
        if ext is None:
            raise MessageError(
                f"content part type {shown(t)} is not supported by this template "
                f"(supported: {', '.join([*TEXT_PART_TYPES, *d.part_owner])})",
                index=i, path=where)
        # What a plugin renders of a part (a caption, an attribute) is text too.
        bad = surrogate_in(part, where)
        if bad is not None:
            raise MessageError(bad[1], index=i, path=bad[0])
        try:
            value = ext.prepare(part)
        except ValueError as e:
            raise MessageError(getattr(e, "msg", str(e)), index=i, path=where) from None
        parts.append(PluginPart(ext, value))
    return parts


def prepare(d: Dialect, request: Any, options: Mapping[str, Any]) -> tuple[Options, list[Msg]]:
    """Check a request and resolve it into messages ready to render.

    ``options`` may hold ``max_chars`` (default :data:`MAX_CHARS`; None: no
    limit), which only the caller sets: a request body cannot."""
    limit = options.get("max_chars", MAX_CHARS)
    if "max_chars" in options:
        options = {k: v for k, v in options.items() if k != "max_chars"}
    if limit is not None and (type(limit) is not int or limit < 0):
        raise OptionError("max_chars must be a non-negative integer or None", option="max_chars")
    # The walk that counts the size measures the depth too: it runs without
    # a limit as well, and nothing after it recurses past MAX_DEPTH levels.
    size, known = size_and_tools(request, sys.maxsize if limit is None else limit)
    if limit is not None and size > limit:
        raise RequestError(f"the request is too large: at least {size:,} characters, more than "
                           f"max_chars={limit:,}")
    return _prepare(d, request, options, known)


def _prepare(d: Dialect, request: Any, options: Mapping[str, Any],
             known: Known | None = None) -> tuple[Options, list[Msg]]:
    raw_messages, opts = split_request(request, options)
    o = resolve_options(d, opts, known)
    split_marks = o.image_prompts is not None
    msgs: list[Msg] = []
    call_ids: dict[str, tuple[int, str]] = {}
    aliases, roles, user_keys = d.role_aliases, d.roles, ROLE_KEYS["user"]
    image_mark = d.image_placeholder if split_marks else None
    # This loop runs once per message of every request: the common cases
    # (plain dicts, string content) are tested inline before the general
    # paths.
    for i, m in enumerate(raw_messages):
        if type(m) is not dict and not is_map(m):
            raise MessageError(f"a message must be an object, not {type(m).__name__}", index=i)
        role = m.get("role")
        if not isinstance(role, str):
            raise MessageError("a message needs a 'role' string", index=i, path="role")
        role = aliases.get(role, role)
        if role not in roles:
            raise MessageError(f"role {shown(m.get('role'))} is not one of {', '.join(roles)}", index=i, path="role")
        # Roles a template adds carry what a user message carries.
        allowed = ROLE_KEYS.get(role, user_keys)
        if not m.keys() <= allowed:
            _check_keys(m, role, allowed, i)
        msg = Msg(role, i)
        name = m.get("name")
        if name is not None and role != "tool":
            if not isinstance(name, str):
                raise MessageError("name must be a string", index=i, path="name")
            _text(name, i, "name")
            msg.name = name or None
        content = m.get("content")
        parts: list[Part] | None = None
        if type(content) is str and (image_mark is None or image_mark not in content):
            _text(content, i, "content")
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
            check_tools(msg.tools, "tools", i)
            msgs.append(msg)
            continue
        msg.parts = parts if parts is not None else _content(d, content, i, split_marks)
        if role == "assistant":
            reasoning = m.get("reasoning_content") or m.get("reasoning") or m.get("thinking")
            if reasoning is not None and not isinstance(reasoning, str):
                raise MessageError("reasoning must be a string", index=i, path="reasoning_content")
            if reasoning and reasoning.strip() and o.thinking:
                _text(reasoning, i, next(k for k in ("reasoning_content", "reasoning", "thinking") if m.get(k)))
                msg.reasoning = reasoning
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list | tuple):
                raise MessageError("tool_calls must be a list", index=i, path="tool_calls")
            call_ids = {}
            if calls:
                msg.calls = []
            for j, c in enumerate(calls):
                if type(c) is not dict and not is_map(c):
                    raise MessageError("a tool call must be an object", index=i, path=f"tool_calls[{j}]")
                fn = c.get("function", c)
                if type(fn) is not dict and not is_map(fn):
                    raise MessageError("function must be an object", index=i, path=f"tool_calls[{j}].function")
                fname = fn.get("name")
                if not isinstance(fname, str) or not fname:
                    raise MessageError("a tool call needs a function name", index=i,
                                       path=f"tool_calls[{j}].function.name")
                _text(fname, i, f"tool_calls[{j}].function.name")
                args, raw = _arguments(fn.get("arguments"), i, j)
                msg.calls.append(Call(fname, args, raw))
                cid = c.get("id")
                if cid is not None:
                    call_ids.setdefault(str(cid), (j + 1, fname))
        elif role == "tool":
            tool = m.get("tool", m.get("name"))
            if tool is not None and not isinstance(tool, str):
                raise MessageError("the tool name must be a string", index=i, path="tool")
            if tool is not None:
                _text(tool, i, "tool" if "tool" in m else "name")
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
