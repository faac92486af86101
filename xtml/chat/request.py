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
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MessageError, OptionError, RequestError, shown
from ..markup.markers import EMBED_BEGIN, EMBED_END, EMBED_INNER, EMBED_MARK, TEXT
from ..markup.parse import lex_text
from ..plugins import jsonfmt
from ..plugins.api import ContentExtension
from ..plugins.jsonfmt import value_type as value_type  # its former home
from . import fields
from .dialect import Dialect

# The options rendering reads; every key a request body may carry, and what it
# does, is in :data:`.fields.FIELDS`.
OPTION_NAMES = fields.OPTIONS

# Keys of a chat-completions body that concern sampling or the API, not the
# prompt. They are accepted and have no effect on rendering.
API_KEYS = frozenset(f.name for f in fields.FIELDS if f.effect == fields.IGNORED)

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
    continue_final: bool = False
    """``continue_final_message``: the last message is left open."""


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
                    raise RequestError(f"JSON object keys must be strings, not {shown(k)}", location=where)
                stack.append(v)
        elif isinstance(x, list | tuple):
            stack.extend(x)


def json_compact(value: Any, where: str, key: bytes | None = None) -> str:
    """Compact JSON with every object's keys sorted, as K3 writes schemas
    (``sort_keys`` sorts recursively, like :func:`deep_sort`, but in C).

    Refuses what JSON would change silently (non-string keys): the text is
    read back and compared, in C; only on a difference does the slow walk
    look for the cause (tuples, say, differ harmlessly). ``key``: the
    value's marshal bytes, when the caller has them already."""
    # The same tool list arrives with every request of a conversation, as a
    # new object. marshal writes plain built-in values only (anything else
    # raises) and its bytes give the value back exactly, types and key order
    # included, so equal bytes mean the same JSON: a key five times cheaper
    # to make than the JSON itself.
    if key is None:
        try:
            key = marshal.dumps(value)
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
    if jsonfmt.lone_surrogate(text) >= 0:
        bad = surrogate_in(value, where)
        if bad is not None:
            raise RequestError(bad[1], location=bad[0])
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
    if type(request) is not dict and not isinstance(request, list | tuple) and not _is_map(request):
        # A request model's defaults are not the caller's: only what was set.
        request = fields.dump(request, unset=True)
    opts: dict[str, Any]
    if isinstance(request, list | tuple):
        messages = list(request)
        opts = {}
    elif _is_map(request):
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


# What a missing option reads as, told apart from an option given as None.
_ABSENT: Any = object()


def resolve_options(d: Dialect, opts: Mapping[str, Any], known: _Known | None = None) -> Options:
    """The options of a request, checked; ``known``: a tool list and its
    marshal bytes, if the caller has made them."""
    thinking = d.thinking_default
    # ``thinking`` wins over its alias, as in the reference encoder.
    explicit: bool | None = None
    for key in ("enable_thinking", "thinking"):
        if opts.get(key) is not None:
            v = opts[key]
            if not isinstance(v, bool):
                raise OptionError(f"{key} must be true or false", option=key)
            thinking = explicit = v
    effort = d.default_effort
    re_ = opts.get("reasoning_effort")
    te = opts.get("thinking_effort")
    if isinstance(re_, str) and re_ in d.thinking_off:
        if explicit is True and not d.off_wins:
            raise OptionError(f"reasoning_effort={shown(re_)} switches thinking off, but thinking is on",
                              option="reasoning_effort")
        thinking = False
    elif re_ is not None:
        # thinking_effort wins; reasoning_effort is then not read at all.
        if te is None:
            effort = _effort(d, "reasoning_effort", re_)
        # An effort asks for reasoning (as vLLM and SGLang read it), unless
        # the request says otherwise.
        if explicit is None:
            thinking = True
    if te is not None:
        effort = _effort(d, "thinking_effort", te)
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
    rf_in = opts.get("response_format")
    schema = opts.get("response_schema")
    if schema is not None:
        t = rf_in if isinstance(rf_in, str) else rf_in.get("type") if rf_in is not None and _is_map(rf_in) else None
        if t != "json_schema":
            raise OptionError("response_schema is the schema of a json_schema response format; give "
                              "response_format {\"type\": \"json_schema\"} with it", option="response_schema")
        rf_in = {"type": "json_schema", "json_schema": {"schema": schema}}
    rf = _response_format(rf_in)
    cont = opts.get("continue_final_message")
    if cont is not None and not isinstance(cont, bool):
        raise OptionError("continue_final_message must be true or false", option="continue_final_message")
    # Absent, it opens the assistant's turn; None is false, as K3's
    # reference encoder reads it (and Jinja, where transformers' default is
    # false too). Every other option reads None as absent (docs/requests.md).
    agp = opts.get("add_generation_prompt", _ABSENT)
    if agp is not _ABSENT and agp is not None and not isinstance(agp, bool):
        raise OptionError("add_generation_prompt must be true or false", option="add_generation_prompt")
    if cont:
        if agp is True:
            raise OptionError("continue_final_message leaves the last message open for the model to continue; "
                              "a generation prompt after it cannot be: drop add_generation_prompt=true",
                              option="continue_final_message")
        agp = False
    else:
        agp = agp is _ABSENT or agp is True
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
                raise OptionError(f"image_prompts[{i}] is not an image prompt of this format: {shown(p)}",
                                  option="image_prompts")
            if jsonfmt.lone_surrogate(p) >= 0:
                raise OptionError(f"image_prompts[{i}]: {_surrogate_message(p, jsonfmt.lone_surrogate(p))}",
                                  option="image_prompts")
            why = _not_one_embed(d, p)
            if why:
                raise OptionError(f"image_prompts[{i}] would not read back as one image: a prompt is one embed "
                                  f"(from an embed-begin marker to an embed-end marker, or an embed mark) with "
                                  f"nothing around it, and this one has {why}", option="image_prompts")
    tools = opts.get("tools")
    tools_json = ""
    if tools is not None:
        if not isinstance(tools, list | tuple):
            raise OptionError("tools must be a list of tool schemas", option="tools")
        tools = fields.tool_list(tools, "tools") if tools else None
        if tools:
            tools_json = json_compact(tools, "tools", known[1] if known is not None and known[0] is tools else None)
            check_tools(tools, "tools")
    return Options(thinking, effort, tc if tc in ("none", "required") else None, rf, agp, prompts, tools,
                   tools_json, bool(cont))


def _not_one_embed(d: Dialect, prompt: str) -> str:
    """Why ``prompt`` is not one embed span and nothing else, or ``""``. A
    prompt format may write text around its embed (a newline after the end
    marker, say); read back, that text is a text part of the message, not
    part of the image."""
    lx = lex_text(prompt, d.markers)
    kinds = lx.kinds
    if kinds == [EMBED_MARK] or (len(kinds) >= 2 and kinds[0] == EMBED_BEGIN and kinds[-1] == EMBED_END
                                 and all(k == TEXT or k == EMBED_INNER for k in kinds[1:-1])):
        return ""
    if kinds and kinds[0] == TEXT:
        return f"text before its embed, {shown(lx.texts[0])}"
    if kinds and kinds[-1] == TEXT:
        return f"text after its embed, {shown(lx.texts[-1])}"
    return "markers that do not make one embed"


def check_tools(tools: list[Any], where: str, message: int | None = None) -> None:
    """Refuse a tool list holding anything but tool schemas
    (:func:`.fields.tool_problem`), at ``where[j]`` and the key in it: an
    option's, or with ``message`` that message's field."""
    for j, t in enumerate(tools):
        bad = fields.tool_problem(t)
        if bad is not None:
            path = f"{where}[{j}]{bad[0]}"
            if message is None:
                raise OptionError(bad[1], option=path)
            raise MessageError(bad[1], index=message, path=path)


def _effort(d: Dialect, key: str, v: Any) -> str:
    if isinstance(v, str) and v in d.efforts:
        return v
    extra = f" (or {', '.join(d.thinking_off)} to switch thinking off)" if key == "reasoning_effort" and \
        d.thinking_off else ""
    why = ""
    if isinstance(v, str) and f"`{v}`" in d.system["thinking-effort"].body.source:
        # The prose may name more efforts than the model takes (K3's names
        # `medium`, which its reference encoder refuses).
        why = (f": the thinking-effort message of {d.name} names {shown(v)}, but {d.name} accepts only "
               f"{', '.join(d.efforts)}")
    raise OptionError(f"{key} must be one of {', '.join(d.efforts)}{extra}, not {shown(v)}{why}", option=key)


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
    raise OptionError(f"response_format type must be text, json_object or json_schema, not {shown(t)}",
                      option="response_format")


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
        except (ValueError, RecursionError):
            return None, str.__str__(raw)  # plain str, even from a subclass
        if type(parsed) is not dict:
            raise MessageError("tool call arguments must be a JSON object", index=i, path=_args_path(j))
        return list(parsed.items()), None
    if not _is_map(raw):
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


# -- lone surrogates -----------------------------------------------------------------
# A str may hold a lone surrogate (JSON's "\udc00" decodes to one), which is
# not text: UTF-8 cannot write it, the tokenizers library refuses it with a
# TypeError and tiktoken replaces it with U+FFFD, silently. Every string the
# render writes is checked where the request is read, so the error names it.


def _surrogate_message(text: str, at: int) -> str:
    return (f"U+{ord(text[at]):04X} at character {at:,} is a lone surrogate, not text: no tokenizer encodes it "
            f"and UTF-8 cannot write it")


def _text(text: str, i: int, path: str) -> None:
    """Refuse a string of message ``i`` that holds a lone surrogate."""
    if not text.isascii():
        at = jsonfmt.lone_surrogate(text)
        if at >= 0:
            raise MessageError(_surrogate_message(text, at), index=i, path=path)


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"


def surrogate_in(value: Any, path: str = "") -> tuple[str, str] | None:
    """(path, message) of the first string, key or value, of a JSON-like
    value that holds a lone surrogate, or None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        x, where = stack.pop()
        if isinstance(x, str):
            at = jsonfmt.lone_surrogate(x)
            if at >= 0:
                return where, _surrogate_message(x, at)
        elif _is_map(x):
            items = list(x.items())
            for k, v in reversed(items):
                if isinstance(k, str):
                    at = jsonfmt.lone_surrogate(k)
                    if at >= 0:
                        return where, f"a key: {_surrogate_message(k, at)}"
                    stack.append((v, _key_path(where, k)))
                else:
                    stack.append((v, f"{where}[{type(k).__name__}]"))
        elif isinstance(x, list | tuple):
            stack.extend((v, f"{where}[{n}]") for n, v in reversed(list(enumerate(x))))
    return None


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
        if not _is_map(part):
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


# The most a request may hold unless the caller says otherwise (the
# ``max_chars`` keyword): characters of every string in it, keys included,
# plus one per value. Rendering, tokenizing and parsing grow linearly with
# this; the limit bounds what one request can cost.
MAX_CHARS = 64 << 20


def request_size(request: Any, limit: int) -> int:
    """The size :data:`MAX_CHARS` counts, or a count past ``limit`` (the walk
    stops at the first level that crosses it). Values nested deeper than
    Python's recursion limit are left to :func:`prepare`, which refuses
    them; so a value that contains itself is not walked forever."""
    return _request_size(request, limit)[0]


# A request's tool list and its marshal bytes, which the size check makes
# and the tool declaration's JSON is found by: made once per request.
_Known = tuple[Any, bytes]


def _request_size(request: Any, limit: int) -> tuple[int, _Known | None]:
    tools = request.get("tools") if type(request) is dict else None
    if type(tools) is list and tools:
        # The same tool list (deep JSON schemas, most of a short request's
        # walk) comes with every request of a conversation: its size is kept
        # by its marshal bytes, as json_compact keeps its JSON.
        try:
            key = marshal.dumps(tools)
        except ValueError:
            key = b""
        size = _tool_sizes.get(key) if key else None
        if size is None:
            size = _walk_size(tools, limit)
            if key and size <= limit and len(key) <= _COMPACT_MAX:
                if len(_tool_sizes) >= 64:
                    _tool_sizes.clear()
                _tool_sizes[key] = size
        known = (tools, key) if key else None
        if size > limit:
            return size, known
        rest = {k: v for k, v in request.items() if k != "tools"}
        return size + len("tools") + _walk_size(rest, limit - size), known
    return _walk_size(request, limit), None


_tool_sizes: dict[bytes, int] = {}


_SCALARS = frozenset({int, float, bool, type(None)})


def _walk_size(request: Any, limit: int) -> int:
    # Level by level, so that a container's children are queued in C
    # (``extend``): this runs on every request.
    total = 0
    level = [request]
    for _ in range(sys.getrecursionlimit()):
        total += len(level)
        nxt: list[Any] = []
        extend = nxt.extend
        for x in level:
            t = type(x)
            if t is str:
                total += len(x)
            elif t is dict or (t is not list and t is not tuple and isinstance(x, Mapping)):
                try:
                    total += sum(map(len, x))
                except TypeError:  # a key that is not a string
                    total += sum(len(k) for k in x if isinstance(k, str))
                extend(x.values())
            elif t is list or t is tuple or isinstance(x, list | tuple):
                extend(x)
            elif isinstance(x, str):
                total += len(x)
            elif t not in _SCALARS and callable(getattr(x, "model_dump", None)):
                # A request or message model counts as what it renders from.
                extend((fields.dump(x),))
        if total > limit or not nxt:
            break
        level = nxt
    return total


def prepare(d: Dialect, request: Any, options: Mapping[str, Any]) -> tuple[Options, list[Msg]]:
    """Check a request and resolve it into messages ready to render.

    ``options`` may hold ``max_chars`` (default :data:`MAX_CHARS`; None: no
    limit), which only the caller sets: a request body cannot."""
    limit = options.get("max_chars", MAX_CHARS)
    if "max_chars" in options:
        options = {k: v for k, v in options.items() if k != "max_chars"}
    known = None
    if limit is not None:
        if type(limit) is not int or limit < 0:
            raise OptionError("max_chars must be a non-negative integer or None", option="max_chars")
        size, known = _request_size(request, limit)
        if size > limit:
            raise RequestError(f"the request is too large: at least {size:,} characters, more than "
                               f"max_chars={limit:,}")
    try:
        return _prepare(d, request, options, known)
    except RecursionError:
        # Only a pathologically nested request gets here (JSON values deeper
        # than Python's recursion limit).
        raise RequestError("the request is nested too deeply") from None


def _prepare(d: Dialect, request: Any, options: Mapping[str, Any],
             known: _Known | None = None) -> tuple[Options, list[Msg]]:
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
        if type(m) is not dict and not _is_map(m):
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
                if type(c) is not dict and not _is_map(c):
                    raise MessageError("a tool call must be an object", index=i, path=f"tool_calls[{j}]")
                fn = c.get("function", c)
                if type(fn) is not dict and not _is_map(fn):
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
