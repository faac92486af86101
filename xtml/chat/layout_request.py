"""A request as a layout dialect reads it: transformers' preprocessing
(None-valued keys dropped), the dialect's own options, the declared
refusals raised and the declared drops listed."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ..errors import MessageError, OptionError, RequestError, shown
from ..lru import Lru
from .layout import DROP, EACH, HISTORY, LAST_USER, REFUSE, SYNTAX, SYSTEM, TURN, LayoutDialect
from .layout_pattern import Builder, Lit, Slot
from .layout_turn import KEEP, TURNS
from .request import OPTION_NAMES, split_request

__all__ = ["Dropped", "Msg", "name_of_id", "read_request", "spelled_id"]


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
    name: str = ""
    """The message's name, where the format writes names (else dropped)."""
    call_id: str = ""
    """A tool result's ``tool_call_id``, where the format writes it."""
    ids: tuple[str, ...] = ()
    """Each call's id as written (given or generated), where the format
    writes ids."""
    parts: tuple[str | None, ...] = ()
    """The content's parts when it holds an image (``None``), which the
    format writes as its image placeholder; empty otherwise."""
    flags: frozenset[str] = frozenset()
    """The message's flags (of the dialect's) that are true."""
    raw: Mapping[str, Any] | None = None
    """The message as read, None-valued keys dropped."""


def read_request(d: LayoutDialect, request: Any, options: Mapping[str, Any],
                 check: Callable[[int, str, Mapping[str, Any]], None] | None = None) -> tuple[
        list[Msg], dict[str, Any], list[Dropped], dict[str, Any]]:
    """The request as the format reads it: transformers' preprocessing
    (None-valued keys dropped), the declared refusals raised, the declared
    drops listed. ``check`` (index, role, message) raises a writer's own
    refusals of each message before this reader's, in the template's order."""
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
        v = opts.get(key)
        if v is None and key in d.option_aliases:
            v = opts.get(d.option_aliases[key])
        if v is None:
            v = default
        if not isinstance(v, bool):
            raise OptionError(f"{key} must be true or false", option=key)
        resolved[key] = v
    for key, o in d.text_options.items():
        v = opts.get(key)
        if v is None:
            # A template that reads the clock writes the day it renders on.
            v = o.default if o.default is not None else datetime.now().strftime(o.clock)
        if not isinstance(v, str):
            raise OptionError(f"{key} must be a string", option=key)
        resolved[key] = v
    for key in ("tools", "tool_choice", "response_format", "response_schema", "thinking", "enable_thinking",
                "thinking_effort", "reasoning_effort", "image_prompts"):
        if key in resolved or key in d.option_aliases.values() or opts.get(key) in (None, [], {}):
            continue
        if key == "tools" and d.tools in (SYSTEM, TURN, TURNS, LAST_USER, SYNTAX):
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
        role = d.role_aliases.get(role, role)
        if role not in d.roles:
            raise MessageError(f"role {shown(role)} is not one of this format's: {', '.join(d.roles)}", index=i,
                               path="role")
        if role in d.first_only and i > 0:
            raise MessageError(f"the {d.name} format writes a {role} message only first (the template raises on a "
                               "later one)", index=i, path="role")
        if check is not None:
            check(i, role, m)
        content = m.get("content")
        parts: tuple[str | None, ...] = ()
        if d.calls_content == DROP and role == "assistant" and m.get("tool_calls") == []:
            # Read as a message with calls, of which it has none to write.
            raise MessageError(f"the {d.name} format writes an assistant message with tool_calls as its calls: give "
                               "at least one, or no tool_calls", index=i, path="tool_calls")
        if d.calls_content == DROP and role == "assistant" and m.get("tool_calls"):
            # Never read beside calls, whatever it holds.
            if content not in (None, "", [], ()):
                dropped.append(Dropped(i, "content", f"the {d.name} format does not write content beside calls"))
            content = ""
        if content is None:
            missing = d.missing_by_role.get(role, d.content_missing)
            if missing == REFUSE or (missing == "with_calls" and not m.get("tool_calls")):
                why = " (an assistant's tool calls are not written by this format; give content, even \"\")" \
                    if m.get("tool_calls") else ""
                where = "every message" if missing == REFUSE else "a message without calls"
                raise MessageError(f"the {d.name} format needs content on {where}{why}", index=i, path="content")
            content = ""
        elif isinstance(content, list | tuple) and d.parts_by_role.get(role) == KEEP:
            content = ""  # the body writes the list itself, from raw
        elif isinstance(content, list | tuple) and d.parts_by_role.get(role) == "str":
            content = str(list(content))  # as the template's |string writes a list: Python's str()
        elif isinstance(content, list | tuple) and d.parts_by_role.get(role) == "first":
            content = _first_part(d, content, i, dropped)
        elif isinstance(content, list | tuple):
            policy = d.parts_by_role.get("with_calls") if role == "assistant" and m.get("tool_calls") else None
            if (policy or d.parts_by_role.get(role, d.content_parts)) == REFUSE:
                raise MessageError(f"the {d.name} format writes content as one string: a list of parts is not "
                                   "read" + (" here" if d.content_parts != REFUSE else ""), index=i, path="content")
            if d.image is not None:
                parts = _image_parts(content, i, dropped)
                content = "".join(p for p in parts if p is not None)
                if None not in parts:
                    parts = ()
            else:
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
        ids: tuple[str, ...] = ()
        if d.calls == EACH and role == "assistant" and m.get("tool_calls"):
            if d.call_ids == "absent" and d.arguments == "as_given" and d.call_id is None:
                calls = _calls(m["tool_calls"], i, dropped)
            else:
                calls, ids = _calls_with_ids(d, m["tool_calls"], i, dropped)
        name = ""
        if d.role_names and isinstance(m.get("name"), str):
            name = m["name"]
            _surrogates(name, i)
        call_id = ""
        if "tool_call_id" in m and "tool_call_id" in d.roles[role].body.slots():
            call_id = m["tool_call_id"]
            if not isinstance(call_id, str):
                raise MessageError("tool_call_id must be a string", index=i, path="tool_call_id")
            _surrogates(call_id, i)
        if d.id_tail and "tool_call_id" in d.roles[role].body.slots():
            call_id = _tail(d, call_id if "tool_call_id" in m else None, i, "tool_call_id")
            if len(m["tool_call_id"]) > d.id_tail:
                dropped.append(Dropped(i, "tool_call_id", f"an id is written as its last {d.id_tail} characters"))
        flags: set[str] = set()
        for f in d.flags:
            if f in m:
                if not isinstance(m[f], bool):
                    raise MessageError(f"{f} must be true or false", index=i, path=f)
                if m[f]:
                    flags.add(f)
        for k, v in m.items():
            if k in ("role", "content") or v in ("", [], {}) or k in d.flags:
                continue
            if (k == "name" and name) or (k == "tool_call_id" and call_id):
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
        out.append(Msg(role, content, i, reasoning, calls, name, call_id, ids, parts, frozenset(flags), m))
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


def _calls_with_ids(d: LayoutDialect, raw: Any, i: int, dropped: list[Dropped]) -> tuple[
        tuple[tuple[str, str], ...], tuple[str, ...]]:
    """:func:`_calls` of a format that writes call ids (given or generated),
    may quote string arguments, may write them as key/value pairs and may
    write no name but the id's."""
    if d.arguments == "pairs":
        raw = _pair_arguments(d, raw, i)
    calls = _calls(raw, i, [])
    if d.arguments == "string":
        # The template adds arguments to strings: an object raises there.
        for j, call in enumerate(raw):
            if not isinstance(_given_arguments(call), str):
                raise MessageError(f"the {d.name} format writes arguments as given: give them as a JSON string",
                                   index=i, path=f"tool_calls[{j}].function.arguments")
    if d.arguments == "tojson":
        calls = tuple((name, json.dumps(_given_arguments(raw[j]), ensure_ascii=False))
                      for j, (name, _) in enumerate(calls))
    given = [_given_id(c, i, j) for j, c in enumerate(raw)]
    if d.id_tail:
        tails = [_tail(d, g if c.get("id") is not None else None, i, f"tool_calls[{j}].id")
                 for j, (g, c) in enumerate(zip(given, raw, strict=True))]
        if any(len(g) > d.id_tail for g in given):
            dropped.append(Dropped(i, "tool_calls.id", f"an id is written as its last {d.id_tail} characters"))
        given = tails
    if d.call_ids == "generated":
        assert d.call_id is not None
        ids = tuple(spelled_id(d, name, j) for j, (name, _) in enumerate(calls))
        if any(g and g != w for g, w in zip(given, ids, strict=True)):
            dropped.append(Dropped(i, "tool_calls.id", "the format writes its own call ids"))
    elif d.call_ids == "given":
        ids = tuple(given)
    else:
        ids = ()
        if any(given):
            dropped.append(Dropped(i, "tool_calls.id", "the format does not write call ids"))
    each = d.calls_each
    if each is not None and "name" not in each.slots() and d.call_id is not None:
        # Only the id carries the name: a name it does not spell is lost.
        if any(name_of_id(d, ids[j] if ids else "") != name for j, (name, _) in enumerate(calls)):
            dropped.append(Dropped(i, "tool_calls.function.name",
                                   "the format writes no call name but the one its id spells"))
    return calls, ids


def _pair_arguments(d: LayoutDialect, raw: Any, i: int) -> Any:
    """The calls with their arguments as the template reads them for
    key/value pairs: an object, or none (absent or empty: no pairs); a
    string raises there, and is refused here."""
    if not isinstance(raw, list | tuple):
        return raw
    out: list[Any] = []
    for j, call in enumerate(raw):
        if not isinstance(call, Mapping) or not isinstance(call.get("function", call), Mapping):
            out.append(call)
            continue
        fn = call.get("function", call)
        args = fn.get("arguments")
        if not args:
            args = {}
        elif not isinstance(args, Mapping):
            raise MessageError(f"the {d.name} format writes arguments as key/value pairs: give them as an object, "
                               f"not {type(args).__name__} (the template raises on it)", index=i,
                               path=f"tool_calls[{j}].function.arguments")
        fn = {**fn, "arguments": dict(args)}
        out.append({**call, "function": fn} if "function" in call else fn)
    return out


def _tail(d: LayoutDialect, given: str | None, i: int, path: str) -> str:
    """An id as a format that keeps its last :attr:`~.layout.LayoutDialect.id_tail`
    characters writes it; a shorter or absent one is refused, as the
    template raises on it."""
    n = d.id_tail
    if given is None or len(given) < n:
        what = "no id" if given is None else f"the id {shown(given)}"
        raise MessageError(f"the {d.name} format writes an id's last {n} characters: {what} has fewer (the template "
                           "raises on it)", index=i, path=path)
    return given[-n:]


def _first_part(d: LayoutDialect, parts: Sequence[Any], i: int, dropped: list[Dropped]) -> str:
    """The first part's text, as a template that reads ``content[0]['text']``
    takes it; the other parts are not written."""
    first = parts[0] if parts else None
    if not isinstance(first, Mapping) or not isinstance(first.get("text"), str):
        raise MessageError(f"the {d.name} format writes the first part's text: give it a text part first",
                           index=i, path="content[0]")
    dropped.extend(Dropped(i, f"content[{j}]", "only the first part of a list is written")
                   for j in range(1, len(parts)))
    text: str = first["text"]
    return text


def _given_arguments(call: Mapping[str, Any]) -> Any:
    fn = call.get("function", call)
    return fn["arguments"]


def _given_id(call: Mapping[str, Any], i: int, j: int) -> str:
    v = call.get("id")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise MessageError("a call's id must be a string", index=i, path=f"tool_calls[{j}].id")
    _surrogates(v, i)
    return v


def spelled_id(d: LayoutDialect, name: str, index: int) -> str:
    """A generated call id: :attr:`~.layout.LayoutDialect.call_id` with the
    call's name and its index in its message."""
    assert d.call_id is not None
    b = Builder()
    d.call_id.render({"name": name, "index": str(index)}, {}, b)
    return "".join(s.text for s in b.finish())


def name_of_id(d: LayoutDialect, call_id: str) -> str | None:
    """The name an id of :attr:`~.layout.LayoutDialect.call_id`'s spelling
    holds; None when it is not of that spelling."""
    if d.call_id is None:
        return None
    m = _id_regex(d).fullmatch(call_id)
    return m.group("name") if m is not None else None


_id_regexes: Lru[str, re.Pattern[str]] = Lru()


def _id_regex(d: LayoutDialect) -> re.Pattern[str]:
    assert d.call_id is not None
    src = d.call_id.source
    hit = _id_regexes.get(src)
    if hit is None:
        parts: list[str] = []
        for item in d.call_id.items:
            if isinstance(item, Slot):
                parts.append("(?P<index>[0-9]+)" if item.name == "index" else f"(?P<{item.name}>.+?)")
            elif isinstance(item, Lit):
                parts.append(re.escape(item.text))
            else:
                parts.append("(?!)")  # an id is text: a token in its spelling matches nothing
        hit = _id_regexes.put(src, re.compile("".join(parts), re.S))
    return hit


def _image_parts(parts: Sequence[Any], i: int, dropped: list[Dropped]) -> tuple[str | None, ...]:
    """Text parts and images (``None``), as templates that write an image's
    placeholder tell them: a part of type ``image`` or with an ``image`` or
    ``image_url`` key."""
    out: list[str | None] = []
    for j, p in enumerate(parts):
        if isinstance(p, Mapping) and (p.get("type") == "image" or "image" in p or "image_url" in p):
            out.append(None)
            dropped.append(Dropped(i, f"content[{j}]", "an image is written as the format's placeholder: "
                                                       "its data is not in the text"))
        elif isinstance(p, str):
            out.append(p)
        elif isinstance(p, Mapping) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str):
            out.append(p["text"])
        else:
            raise MessageError("only text and image parts are written by this format", index=i,
                               path=f"content[{j}]")
    return tuple(out)


def _own_options(d: LayoutDialect, request: Any, options: Mapping[str, Any]) -> tuple[
        Any, Mapping[str, Any], dict[str, Any]]:
    """The dialect's own options (the official template's keyword names,
    which the shared table of request fields does not hold) taken out of
    the request's top level, its ``chat_template_kwargs`` and the call's
    keyword options: the keyword ones win, then ``chat_template_kwargs``,
    as for every option."""
    turn_options = d.header_turns.options if d.header_turns is not None else ()
    lists = d.split.lists if d.split is not None else ()
    names = [k for k in (*d.options, *d.option_aliases.values(), *turn_options, *d.text_options, *lists)
             if k not in OPTION_NAMES]
    own: dict[str, Any] = {}
    if not names:
        return request, options, own

    def take(kwargs: Any) -> Any:
        if not isinstance(kwargs, Mapping) or not any(k in kwargs for k in names):
            return kwargs
        own.update({k: kwargs[k] for k in names if k in kwargs})
        return {k: v for k, v in kwargs.items() if k not in names}

    if isinstance(request, Mapping):
        # At the body's top level too, as transformers passes every extra
        # keyword to the template; the lowest precedence, so taken first,
        # then extra_body's (the openai SDK merges it into the body).
        request = take(request)
        if isinstance(request.get("extra_body"), Mapping):
            request = {**request, "extra_body": take(request["extra_body"])}
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogates(text: str, i: int) -> None:
    if text.isascii():  # a flag of the string: no scan
        return
    m = _SURROGATE.search(text)
    if m is not None:
        raise MessageError(f"a lone surrogate (U+{ord(m.group()):04X}) at character {m.start()}: text must be "
                           "valid Unicode", index=i, path="content")
