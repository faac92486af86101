"""A request as a layout dialect reads it: transformers' preprocessing
(None-valued keys dropped), the dialect's own options, the declared
refusals raised and the declared drops listed."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import MessageError, OptionError, RequestError, shown
from .layout import EACH, HISTORY, REFUSE, SYSTEM, LayoutDialect
from .request import OPTION_NAMES, split_request

__all__ = ["Dropped", "Msg", "read_request"]


class Dropped(NamedTuple):
    """Something a request held that the format does not write (a declared
    drop of the dialect): the official template leaves it out too."""

    message: int
    """Its message's index in the request, -1 for a request option."""
    field: str
    """The field (``tool_calls``, ``name``) or option (``tools``)."""
    why: str


_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


class Msg(NamedTuple):
    role: str
    content: str
    at: int
    """Its index in the request."""
    reasoning: str | None = None
    calls: tuple[tuple[str, str], ...] = ()
    """(name, arguments as written) of each call."""


def read_request(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> tuple[
        list[Msg], dict[str, Any], list[Dropped], dict[str, Any]]:
    """The request as the format reads it: transformers' preprocessing
    (None-valued keys dropped), the declared refusals raised, the declared
    drops listed."""
    request, options, own = _own_options(d, request, options)
    messages, opts = split_request(request, options)
    opts.update(own)
    dropped: list[Dropped] = []
    resolved: dict[str, Any] = {}
    agp = opts.get("add_generation_prompt", True)
    if agp is not None and not isinstance(agp, bool):
        raise OptionError("add_generation_prompt must be true or false", option="add_generation_prompt")
    resolved["add_generation_prompt"] = agp is not False and agp is not None
    if opts.get("continue_final_message"):
        raise OptionError(f"continue_final_message is not yet available for the layout dialect {d.name!r}",
                          option="continue_final_message")
    for key, default in d.options.items():
        v = opts.get(key, default)
        if v is None:
            v = default
        if not isinstance(v, bool):
            raise OptionError(f"{key} must be true or false", option=key)
        resolved[key] = v
    for key in ("tools", "tool_choice", "response_format", "response_schema", "thinking", "enable_thinking",
                "thinking_effort", "reasoning_effort", "image_prompts"):
        if key in resolved or opts.get(key) in (None, [], {}):
            continue
        if key == "tools" and d.tools == SYSTEM:
            continue
        if key == "tools" and d.tools == REFUSE:
            raise OptionError(f"the {d.name} format has no place for tools", option="tools")
        dropped.append(Dropped(-1, key, f"the {d.name} format does not write {key}"))
    if not messages:
        raise RequestError("messages must hold at least one message", location="messages")
    out: list[Msg] = []
    for i, raw in enumerate(messages):
        if not isinstance(raw, Mapping):
            raise MessageError(f"a message must be an object, not {type(raw).__name__}", index=i)
        # As transformers does before any template sees a message.
        m = {k: v for k, v in raw.items() if v is not None}
        role = m.get("role")
        if not isinstance(role, str):
            raise MessageError("a message needs a role (a string)", index=i, path="role")
        if role not in d.roles:
            raise MessageError(f"role {shown(role)} is not one of this format's: {', '.join(d.roles)}", index=i,
                               path="role")
        content = m.get("content")
        if content is None:
            if d.missing_by_role.get(role, d.content_missing) == REFUSE:
                why = " (an assistant's tool calls are not written by this format; give content, even \"\")" \
                    if m.get("tool_calls") else ""
                raise MessageError(f"the {d.name} format needs content on every message{why}", index=i,
                                   path="content")
            content = ""
        elif isinstance(content, list | tuple):
            if d.content_parts == REFUSE:
                raise MessageError(f"the {d.name} format writes content as one string: a list of parts is not "
                                   "read", index=i, path="content")
            content = _join_parts(content, i)
        elif not isinstance(content, str):
            raise MessageError(f"content must be a string, not {type(content).__name__}", index=i, path="content")
        _surrogates(content, i)
        reasoning: str | None = None
        calls: tuple[tuple[str, str], ...] = ()
        if d.reasoning == HISTORY and role == "assistant":
            # As transformers aliases them: the first given of the three.
            given = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if k in m), None)
            if given is not None and not isinstance(given, str):
                raise MessageError("reasoning must be a string", index=i, path="reasoning_content")
            reasoning = given
        if d.calls == EACH and role == "assistant" and m.get("tool_calls"):
            calls = _calls(m["tool_calls"], i, dropped)
        for k, v in m.items():
            if k in ("role", "content") or v in ("", [], {}):
                continue
            if (k == "tool_calls" and calls) or (k in _REASONING_KEYS and reasoning is not None):
                continue
            if k == "tool_calls":
                if d.calls == REFUSE:
                    raise MessageError(f"the {d.name} format has no tool calls", index=i, path=k)
                dropped.append(Dropped(i, k, f"the {d.name} format does not write tool calls"))
            elif k in _REASONING_KEYS:
                dropped.append(Dropped(i, k, f"the {d.name} format does not write reasoning"))
            elif k in ("name", "tool_call_id", "id", "tool", "tools", "annotations", "refusal", "audio"):
                dropped.append(Dropped(i, k, f"the {d.name} format does not write a message's {k}"))
            else:
                raise MessageError(f"unknown message field {shown(k)}", index=i, path=str(k))
        out.append(Msg(role, content, i, reasoning, calls))
    return out, resolved, dropped, opts


def _calls(raw: Any, i: int, dropped: list[Dropped]) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list | tuple):
        raise MessageError("tool_calls must be a list", index=i, path="tool_calls")
    out: list[tuple[str, str]] = []
    ids = False
    for j, call in enumerate(raw):
        where = f"tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise MessageError("a tool call must be an object", index=i, path=where)
        fn = call.get("function", call)
        if not isinstance(fn, Mapping):
            raise MessageError("a tool call's function must be an object", index=i, path=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str):
            raise MessageError("a tool call needs a name (a string)", index=i, path=f"{where}.function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            text = args
        elif isinstance(args, Mapping):
            # transformers' tojson: insertion order, ", " and ": ", no ASCII escapes.
            text = json.dumps(args, ensure_ascii=False)
        else:
            raise MessageError("arguments must be a JSON object or a string", index=i,
                               path=f"{where}.function.arguments")
        _surrogates(name + text, i)
        ids = ids or call.get("id") not in (None, "")
        out.append((name, text))
    if ids:
        dropped.append(Dropped(i, "tool_calls.id", "the format does not write call ids"))
    return tuple(out)


def _own_options(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> tuple[
        Any, Mapping[str, Any], dict[str, Any]]:
    """The dialect's own options (the official template's keyword names,
    which the shared table of request fields does not hold) taken out of
    the request's ``chat_template_kwargs`` and the call's keyword options:
    the keyword ones win, as for every option."""
    names = [k for k in d.options if k not in OPTION_NAMES]
    own: dict[str, Any] = {}
    if not names:
        return request, options, own

    def take(kwargs: Any) -> Any:
        if not isinstance(kwargs, Mapping) or not any(k in kwargs for k in names):
            return kwargs
        own.update({k: kwargs[k] for k in names if k in kwargs})
        return {k: v for k, v in kwargs.items() if k not in names}

    if isinstance(request, Mapping) and "chat_template_kwargs" in request:
        request = {**request, "chat_template_kwargs": take(request["chat_template_kwargs"])}
    if "chat_template_kwargs" in options:
        options = {**options, "chat_template_kwargs": take(options["chat_template_kwargs"])}
    options = take(options)
    return request, options, own


def _join_parts(parts: Sequence[Any], i: int) -> str:
    texts: list[str] = []
    for j, p in enumerate(parts):
        if isinstance(p, str):
            texts.append(p)
        elif isinstance(p, Mapping) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str):
            texts.append(p["text"])
        else:
            raise MessageError("only text parts are written by this format", index=i, path=f"content[{j}]")
    return "".join(texts)


def _surrogates(text: str, i: int) -> None:
    for at, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise MessageError(f"a lone surrogate (U+{ord(ch):04X}) at character {at}: text must be valid Unicode",
                               index=i, path="content")
