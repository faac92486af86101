"""The options of a chat request, checked and resolved against a dialect:
thinking and its effort, tool choice, response format, the generation
prompt, image prompts and the tool list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MessageError, OptionError, shown
from ..markup.markers import EMBED_BEGIN, EMBED_END, EMBED_INNER, EMBED_MARK, TEXT
from ..markup.parse import lex_text
from ..plugins import jsonfmt
from . import fields
from .dialect import Dialect
from .json_values import is_map, json_compact, surrogate_message
from .request_size import Known
from .response_format import CHAT as CHAT_FORMAT
from .response_format import read_response_format

__all__ = ["API_KEYS", "OPTION_NAMES", "Options", "check_tools", "resolve_options"]

# The options rendering reads; every key a request body may carry, and what it
# does, is in :data:`.fields.FIELDS`.
OPTION_NAMES = fields.OPTIONS

# Keys of a chat-completions body that concern sampling or the API, not the
# prompt. They are accepted and have no effect on rendering.
API_KEYS = frozenset(f.name for f in fields.FIELDS if f.effect == fields.IGNORED)


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


# What a missing option reads as, told apart from an option given as None.
_ABSENT: Any = object()


def resolve_options(d: Dialect, opts: Mapping[str, Any], known: Known | None = None) -> Options:
    """The options of a request, checked; ``known``: a tool list and its
    marshal bytes, if the caller has made them."""
    fields.check(opts, "options")
    thinking = d.thinking_default
    # ``thinking`` wins over its alias, as in the reference encoder.
    explicit: bool | None = None
    for key in ("enable_thinking", "thinking"):
        if opts.get(key) is not None:
            thinking = explicit = opts[key]
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
    if is_map(tc) and tc.get("type") == "function":
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
        t = rf_in if isinstance(rf_in, str) else rf_in.get("type") if rf_in is not None and is_map(rf_in) else None
        if t != "json_schema":
            raise OptionError("response_schema is the schema of a json_schema response format; give "
                              "response_format {\"type\": \"json_schema\"} with it", option="response_schema")
        rf_in = {"type": "json_schema", "json_schema": {"schema": schema}}
    rf = _response_format(rf_in)
    if schema is None and "response_schema" in opts and rf is not None and rf["type"] == "json_schema":
        # K3's reference encoder takes the keyword when it is given at all:
        # given as None, it writes the schema null.
        rf = {"type": "json_schema", "json_schema": {"schema": None}}
    cont = opts.get("continue_final_message")
    # Absent, it opens the assistant's turn; None is false, as K3's
    # reference encoder reads it (and Jinja, where transformers' default is
    # false too). Every other option reads None as absent (docs/requests.md).
    agp = opts.get("add_generation_prompt", _ABSENT)
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
                raise OptionError(f"image_prompts[{i}]: {surrogate_message(p, jsonfmt.lone_surrogate(p))}",
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
    got = read_response_format(rf, CHAT_FORMAT)
    if got is not None and got["type"] == "json_schema":
        json_compact(got["json_schema"]["schema"], "response_format")
    return got
