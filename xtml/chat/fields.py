"""Every key a chat-completions body may carry, and what each does to the prompt.

Clients send more than ``messages`` and ``tools``: sampling settings, serving
switches, the extra parameters of vLLM and SGLang, deprecated OpenAI fields.
:data:`FIELDS` is the one table of them. Each entry says where the key comes
from and its effect:

* ``prompt`` — it shapes the prompt; ``feeds`` names the option it becomes;
* ``ignored`` — accepted with any value, and the ids are those of the same
  request without it (sampling, decoding, output format, serving);
* ``refused`` — accepted only when empty (``null``, ``""``, ``[]``, ``{}``):
  honouring a value would change the prompt in a way the template cannot,
  and dropping it silently would render something else than was asked.

A key in no table is an error with a "did you mean" hint, unless the caller
asks for unknown keys to be ignored (``unknown_keys="ignore"``).
docs/requests.md is generated from this table (:func:`markdown_table`).

Objects are taken where dicts are: anything with ``model_dump`` (pydantic
models, openai SDK types) is dumped, and a Python function in ``tools``
becomes a tool schema (:func:`function_tool`).
"""

from __future__ import annotations

import difflib
import inspect
import math
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MessageError, OptionError, RequestError, XtmlError, shown

__all__ = ["APIS", "FIELDS", "IGNORED", "MAX_N", "PROMPT", "REFUSED", "RESPONSES", "UNKNOWN_KEYS", "Field", "Kind",
           "check", "did_you_mean", "function_tool", "markdown_table", "tool_function", "tool_problem"]

PROMPT = "prompt"
IGNORED = "ignored"
REFUSED = "refused"

UNKNOWN_KEYS = ("error", "ignore")
"""Values of the ``unknown_keys`` keyword every Template method that takes a
request accepts: unknown keys of the request (top level,
``chat_template_kwargs``, messages) are an error, or are ignored."""


@dataclass(frozen=True, slots=True)
class Kind:
    """The JSON type a field's value must have, and its range. Null always
    passes: a field given as null reads as left out."""

    what: str
    """``boolean``, ``string``, ``number`` (finite), ``integer`` (64 bits),
    ``count`` (a whole number from ``lo`` to ``hi``) or ``object``."""
    lo: int = 0
    hi: int | None = None
    members: tuple[tuple[str, Kind], ...] = ()
    """An object's own typed members."""

    def problem(self, v: Any) -> str | None:
        """What is wrong with ``v`` (``"must be ..."``), or None."""
        w = self.what
        if w == "boolean":
            return None if type(v) is bool else "must be true or false"
        if w == "string":
            return None if isinstance(v, str) else "must be a string"
        if w == "number":
            # Python's JSON reader takes NaN and Infinity, which no engine's
            # JSON parser does: the engine would refuse the whole body.
            return None if type(v) in (int, float) and math.isfinite(v) else "must be a finite number"
        if w == "integer":
            if type(v) is not int:
                return "must be an integer"
            # Engines read these into 64-bit integers (vLLM's seed field is
            # bounded so); past that the engine refuses the body.
            return None if _INT64[0] <= v <= _INT64[1] else "must fit in 64 bits"
        if w == "count":
            if type(v) is int and self.lo <= v and (self.hi is None or v <= self.hi):
                return None
            return f"must be a whole number from {self.lo} to {self.hi}" if self.hi is not None else \
                f"must be a whole number, {self.lo} or more"
        if w == "object":
            return None if isinstance(v, Mapping) else "must be an object"
        raise AssertionError(f"no JSON type {w!r}")


_INT64 = (-(2**63), 2**63 - 1)
BOOLEAN = Kind("boolean")
STRING = Kind("string")
NUMBER = Kind("number")
INTEGER = Kind("integer")

MAX_N = 16
"""Choices in ``n``: each is generated, read and parsed."""


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a chat-completions request body."""

    name: str
    sources: tuple[str, ...]
    """Who defines it: openai, vllm, sglang, transformers, xtml."""
    effect: str
    """:data:`PROMPT`, :data:`IGNORED` or :data:`REFUSED`."""
    feeds: str
    """For a prompt field, what it becomes (an option, or how it is read)."""
    note: str
    json: Kind | None = None
    """Its JSON type, where a value of another type is refused (:func:`check`)."""


def _f(name: str, sources: str, effect: str, note: str, feeds: str = "", json: Kind | None = None) -> Field:
    return Field(name, tuple(sources.split()), effect, feeds, note, json)


_SAMPLING = "sampling"
_DECODING = "constrained decoding, applied to the output"
_SERVING = "serving and routing"
_OUTPUT = "what the response carries"

FIELDS: tuple[Field, ...] = (
    # -- what the prompt is made of --------------------------------------------------------
    _f("messages", "openai", PROMPT, "the conversation", "messages"),
    _f("tools", "openai", PROMPT, "tool schemas (dicts, objects with model_dump, or Python functions)", "tools"),
    _f("tool_choice", "openai", PROMPT, "`required` and `none` render a message; `auto` and a named "
       "function render nothing", "tool_choice"),
    _f("response_format", "openai", PROMPT, "`json_object` and `json_schema` render a message",
       "response_format"),
    _f("reasoning_effort", "openai", PROMPT, "an `off` value turns thinking off; another value is the "
       "effort when `thinking_effort` is not given, and turns thinking on unless `thinking` or "
       "`enable_thinking` says otherwise", "thinking, thinking_effort"),
    _f("functions", "openai", PROMPT, "deprecated form of `tools`: each function becomes "
       "`{\"type\": \"function\", \"function\": ...}`; not together with `tools`", "tools"),
    _f("function_call", "openai", PROMPT, "deprecated form of `tool_choice`: `none`, `auto`, or "
       "`{\"name\": ...}` for a named function; not together with `tool_choice`", "tool_choice"),
    _f("extra_body", "openai", PROMPT, "the openai SDK merges it into the body: its keys are read as "
       "top-level keys (and win over them)", "its keys"),
    _f("chat_template_kwargs", "vllm sglang", PROMPT, "options for the template; its keys follow this "
       "table and win over top-level keys", "its keys"),
    _f("add_generation_prompt", "transformers vllm", PROMPT, "open the assistant's turn (default true; "
       "`null` is false, as K3's reference encoder reads it)", "add_generation_prompt", BOOLEAN),
    _f("continue_final_message", "transformers vllm sglang", PROMPT, "leave the final assistant message "
       "open so the model continues it; not together with add_generation_prompt=true",
       "continue_final_message", BOOLEAN),
    _f("enable_thinking", "transformers vllm sglang", PROMPT, "alias of `thinking`, which wins when both "
       "are given", "thinking", BOOLEAN),
    _f("reasoning", "sglang", PROMPT, "`{\"effort\": E, \"enabled\": B}`: E is read as `reasoning_effort` "
       "(and wins over it), `enabled: true` turns thinking on unless `thinking` is given",
       "reasoning_effort, thinking"),
    _f("thinking", "xtml", PROMPT, "thinking mode (default: the template's)", "thinking", BOOLEAN),
    _f("thinking_effort", "xtml", PROMPT, "the effort named in the thinking-effort message; wins over "
       "`reasoning_effort`", "thinking_effort"),
    _f("response_schema", "xtml", PROMPT, "the schema of a `json_schema` response format, as the K3 "
       "reference encoder takes it; wins over `response_format.json_schema`", "response_format"),
    _f("image_prompts", "xtml", PROMPT, "processor-made image prompts, one per image", "image_prompts"),
    # -- refused unless empty --------------------------------------------------------------
    _f("documents", "transformers vllm", REFUSED, "retrieval documents: the template has no place for them; "
       "put them in a message"),
    _f("chat_template", "transformers vllm", REFUSED, "a Jinja template: xtml renders with its template "
       "file and never runs Jinja"),
    _f("input_ids", "sglang", REFUSED, "ids that replace the rendered prompt: send them to the engine "
       "directly"),
    # -- OpenAI, no effect on the prompt ---------------------------------------------------
    _f("model", "openai", IGNORED, "which model serves the request"),
    _f("audio", "openai", IGNORED, "output audio settings"),
    _f("frequency_penalty", "openai", IGNORED, _SAMPLING, json=NUMBER),
    _f("logit_bias", "openai", IGNORED, _SAMPLING),
    _f("logprobs", "openai", IGNORED, _OUTPUT),
    _f("max_completion_tokens", "openai", IGNORED, _SAMPLING, json=INTEGER),
    _f("max_tokens", "openai", IGNORED, _SAMPLING, json=INTEGER),
    _f("metadata", "openai", IGNORED, "stored with the completion"),
    _f("modalities", "openai", IGNORED, "output modalities"),
    _f("moderation", "openai", IGNORED, "moderation of input and output, outside the prompt"),
    _f("n", "openai", IGNORED, _SAMPLING, json=Kind("count", 1, MAX_N)),
    _f("parallel_tool_calls", "openai", IGNORED, "bounds the calls of a completion grammar, not the prompt"),
    _f("prediction", "openai", IGNORED, "predicted output: a latency hint"),
    _f("presence_penalty", "openai", IGNORED, _SAMPLING, json=NUMBER),
    _f("prompt_cache_key", "openai", IGNORED, "prompt caching"),
    _f("prompt_cache_options", "openai", IGNORED, "prompt caching"),
    _f("prompt_cache_retention", "openai", IGNORED, "prompt caching"),
    _f("safety_identifier", "openai", IGNORED, "abuse monitoring"),
    _f("seed", "openai", IGNORED, _SAMPLING, json=INTEGER),
    _f("service_tier", "openai", IGNORED, _SERVING),
    _f("stop", "openai", IGNORED, _SAMPLING),
    _f("store", "openai", IGNORED, "stored completions"),
    _f("stream", "openai", IGNORED, _OUTPUT, json=BOOLEAN),
    _f("stream_options", "openai", IGNORED, _OUTPUT, json=Kind("object", members=(("include_usage", BOOLEAN),))),
    _f("temperature", "openai", IGNORED, _SAMPLING, json=NUMBER),
    _f("top_logprobs", "openai", IGNORED, _OUTPUT),
    _f("top_p", "openai", IGNORED, _SAMPLING, json=NUMBER),
    _f("user", "openai", IGNORED, "end-user id"),
    _f("verbosity", "openai", IGNORED, "the template has no prose for it"),
    _f("web_search_options", "openai", IGNORED, "a hosted tool: nothing to declare"),
    _f("extra_headers", "openai", IGNORED, "an openai SDK argument, not part of the body"),
    _f("extra_query", "openai", IGNORED, "an openai SDK argument, not part of the body"),
    _f("timeout", "openai", IGNORED, "an openai SDK argument, not part of the body"),
    # -- vLLM --------------------------------------------------------------------------------
    _f("use_beam_search", "vllm", IGNORED, _SAMPLING),
    _f("best_of", "vllm", IGNORED, _SAMPLING),
    _f("early_stopping", "vllm", IGNORED, _SAMPLING),
    _f("length_penalty", "vllm", IGNORED, _SAMPLING),
    _f("top_k", "vllm sglang", IGNORED, _SAMPLING, json=INTEGER),
    _f("min_p", "vllm sglang", IGNORED, _SAMPLING, json=NUMBER),
    _f("repetition_penalty", "vllm sglang", IGNORED, _SAMPLING, json=NUMBER),
    _f("min_tokens", "vllm sglang", IGNORED, _SAMPLING, json=INTEGER),
    _f("ignore_eos", "vllm sglang", IGNORED, _SAMPLING, json=BOOLEAN),
    _f("stop_token_ids", "vllm sglang", IGNORED, _SAMPLING),
    _f("bad_words", "vllm", IGNORED, _SAMPLING),
    _f("allowed_token_ids", "vllm", IGNORED, _SAMPLING),
    _f("watermarking", "vllm", IGNORED, _SAMPLING),
    _f("thinking_token_budget", "vllm", IGNORED, "a decoding budget; the effort message is the prompt's part"),
    _f("repetition_detection", "vllm", IGNORED, _SAMPLING),
    _f("logits_processors", "vllm", IGNORED, _SAMPLING),
    _f("include_stop_str_in_output", "vllm", IGNORED, _OUTPUT),
    _f("skip_special_tokens", "vllm sglang", IGNORED, "detokenizing the output"),
    _f("spaces_between_special_tokens", "vllm sglang", IGNORED, "detokenizing the output"),
    _f("echo", "vllm", IGNORED, _OUTPUT),
    _f("include_reasoning", "vllm", IGNORED, _OUTPUT),
    _f("prompt_logprobs", "vllm", IGNORED, _OUTPUT),
    _f("logprob_token_ids", "vllm", IGNORED, _OUTPUT),
    _f("return_tokens_as_token_ids", "vllm", IGNORED, _OUTPUT),
    _f("return_token_ids", "vllm sglang", IGNORED, _OUTPUT),
    _f("return_token_offsets", "vllm", IGNORED, _OUTPUT),
    _f("return_prompt_text", "vllm", IGNORED, _OUTPUT),
    _f("return_mm_kwargs", "vllm", IGNORED, _OUTPUT),
    _f("routed_experts_prompt_start", "vllm", IGNORED, _OUTPUT),
    _f("add_special_tokens", "vllm", IGNORED, "the template writes every special token; the tokenizer's own "
       "(a BOS) are never added"),
    _f("truncate_prompt_tokens", "vllm", IGNORED, "the engine cuts the rendered ids"),
    _f("truncation_side", "vllm", IGNORED, "the engine cuts the rendered ids"),
    _f("structured_outputs", "vllm", IGNORED, _DECODING),
    _f("guided_json", "vllm", IGNORED, _DECODING),
    _f("guided_regex", "vllm", IGNORED, _DECODING),
    _f("guided_choice", "vllm", IGNORED, _DECODING),
    _f("guided_grammar", "vllm", IGNORED, _DECODING),
    _f("guided_decoding_backend", "vllm sglang", IGNORED, _DECODING),
    _f("guided_whitespace_pattern", "vllm", IGNORED, _DECODING),
    _f("media_io_kwargs", "vllm", IGNORED, "loading media; image prompts come from `image_prompts`"),
    _f("mm_processor_kwargs", "vllm", IGNORED, "the media processor; image prompts come from `image_prompts`"),
    _f("priority", "vllm sglang", IGNORED, _SERVING),
    _f("request_id", "vllm", IGNORED, _SERVING),
    _f("session_id", "vllm sglang", IGNORED, _SERVING),
    _f("cache_salt", "vllm sglang", IGNORED, "prefix-cache isolation"),
    _f("kv_transfer_params", "vllm", IGNORED, _SERVING),
    _f("ec_transfer_params", "vllm", IGNORED, _SERVING),
    _f("vllm_xargs", "vllm", IGNORED, "engine extensions"),
    _f("stream_interval", "vllm", IGNORED, _OUTPUT),
    # -- SGLang ------------------------------------------------------------------------------
    _f("regex", "sglang", IGNORED, _DECODING),
    _f("ebnf", "sglang", IGNORED, _DECODING),
    _f("json_schema", "sglang", IGNORED, _DECODING),
    _f("stop_regex", "sglang", IGNORED, _SAMPLING),
    _f("no_stop_trim", "sglang", IGNORED, _OUTPUT),
    _f("lora_path", "sglang", IGNORED, "adapter selection"),
    _f("session_params", "sglang", IGNORED, _SERVING),
    _f("separate_reasoning", "sglang", IGNORED, _OUTPUT),
    _f("stream_reasoning", "sglang", IGNORED, _OUTPUT),
    _f("return_hidden_states", "sglang", IGNORED, _OUTPUT),
    _f("return_routed_experts", "sglang", IGNORED, _OUTPUT),
    _f("routed_experts_start_len", "sglang", IGNORED, _OUTPUT),
    _f("return_cached_tokens_details", "sglang", IGNORED, _OUTPUT),
    _f("return_prompt_token_ids", "sglang", IGNORED, _OUTPUT),
    _f("return_meta_info", "sglang", IGNORED, _OUTPUT),
    _f("rid", "sglang", IGNORED, _SERVING),
    _f("extra_key", "sglang", IGNORED, _SERVING),
    _f("ngram_corpus_id", "sglang", IGNORED, "speculative decoding"),
    _f("bootstrap_host", "sglang", IGNORED, _SERVING),
    _f("bootstrap_port", "sglang", IGNORED, _SERVING),
    _f("bootstrap_room", "sglang", IGNORED, _SERVING),
    _f("routed_dp_rank", "sglang", IGNORED, _SERVING),
    _f("disagg_prefill_dp_rank", "sglang", IGNORED, _SERVING),
    _f("data_parallel_rank", "sglang", IGNORED, _SERVING),
    _f("custom_logit_processor", "sglang", IGNORED, _SAMPLING),
    _f("custom_params", "sglang", IGNORED, _SAMPLING),
    _f("max_dynamic_patch", "sglang", IGNORED, "the media processor; image prompts come from `image_prompts`"),
    _f("min_dynamic_patch", "sglang", IGNORED, "the media processor; image prompts come from `image_prompts`"),
    _f("use_audio_in_video", "sglang", IGNORED, "the media processor"),
    _f("images_config", "sglang", IGNORED, "the media processor; image prompts come from `image_prompts`"),
    _f("task", "sglang", IGNORED, "read only by DeepSeek V4's encoder"),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
NAMES: tuple[str, ...] = tuple(sorted(BY_NAME))
OPTIONS: tuple[str, ...] = (
    "tools", "thinking", "enable_thinking", "thinking_effort", "reasoning_effort", "tool_choice", "response_format",
    "response_schema", "add_generation_prompt", "continue_final_message", "image_prompts",
)
"""Prompt fields that are render options as they stand; the other prompt
fields are read into these (``functions`` into ``tools`` ...)."""
_OPTION_SET = frozenset(OPTIONS)


RESPONSES: tuple[tuple[str, Kind], ...] = (
    ("stream", BOOLEAN), ("store", BOOLEAN), ("instructions", STRING), ("previous_response_id", STRING),
    # It limits calls of built-in tools, which the gateway runs none of: any
    # count is met.
    ("max_tool_calls", Kind("count", 0)), ("user", STRING), ("parallel_tool_calls", BOOLEAN),
)
"""The typed fields of a Responses request the gateway reads or repeats in
its answer; the sampling fields it passes on are checked as chat fields."""

_CHECKED: dict[str, tuple[tuple[str, Kind], ...]] = {
    "chat": tuple((f.name, f.json) for f in FIELDS if f.json is not None and f.effect == IGNORED),
    "options": tuple((f.name, f.json) for f in FIELDS if f.json is not None and f.effect == PROMPT),
    "responses": RESPONSES,
}
APIS = tuple(_CHECKED)
"""What :func:`check` checks: ``chat`` the fields of a chat-completions body
that the prompt does not read (sampling, streaming), ``options`` the render
options, ``responses`` a Responses body's own fields."""


def check(values: Mapping[str, Any], api: str) -> None:
    """Refuse a field of ``values`` whose value is not of its JSON type
    (:attr:`Field.json`, :data:`RESPONSES`), naming it: a
    :class:`~xtml.RequestError` at the field's path, or for ``api="options"``
    an :class:`~xtml.OptionError`. One pass over the fields ``api`` reads."""
    for name, kind in _CHECKED[api]:
        v = values.get(name)
        if v is not None:
            _check_value(kind, v, name, name, api)


def _check_value(kind: Kind, v: Any, name: str, at: str, api: str) -> None:
    bad = kind.problem(v)
    if bad is not None:
        msg = f"{name} {bad}"
        error: XtmlError = OptionError(msg, option=at) if api == "options" else RequestError(msg, location=at)
        raise error
    for member, k in kind.members:
        mv = v.get(member)
        if mv is not None:
            _check_value(k, mv, member, f"{at}.{member}", api)


def did_you_mean(key: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known key, or ``""``."""
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _empty(v: Any) -> bool:
    return v is None or (isinstance(v, str | list | tuple | dict) and not v)


# -- objects as dicts ------------------------------------------------------------------------

_PLAIN = (str, int, float, bool, type(None), list, dict, tuple)


def dump(obj: Any, *, unset: bool = False, none: bool = True) -> Any:
    """``obj.model_dump(...)`` for an object that has it, else ``obj``.

    ``unset=True`` drops the top-level fields nobody set (a request model's
    defaults — vLLM's ``tool_choice="none"``, say — are not the caller's); ``none=False``
    drops fields whose value is None (a tool model's unset description).
    Aliases are used (SGLang's ``schema_`` is ``schema`` on the wire)."""
    if type(obj) in _PLAIN:
        return obj
    md = getattr(obj, "model_dump", None)
    if not callable(md):
        return obj
    try:
        try:
            out = md(mode="json", by_alias=True, exclude_none=not none)
            # Only the top level: nested models (messages) are whole, their
            # defaults (a message's role, say) being part of them.
            given = md(by_alias=True, exclude_unset=True) if unset and isinstance(out, dict) else None
        except TypeError:  # a model_dump of another signature
            return md()
    except Exception as e:  # the object's own validation or serialisation
        raise RequestError(f"{type(obj).__name__}.model_dump() failed: {e}") from None
    if given is not None:
        out = {k: v for k, v in out.items() if k in given}
        for key in ("tools", "functions"):
            # Tool models as tool_list dumps them: without None fields.
            raw = getattr(obj, key, None)
            if key in out and isinstance(raw, list | tuple):
                out[key] = tool_list(raw, key)
    return out


def tool_list(tools: list[Any] | tuple[Any, ...], where: str) -> list[Any]:
    """Tools as dicts: objects dumped, Python functions made schemas."""
    out: list[Any] | None = None
    for j, t in enumerate(tools):
        if type(t) is dict:
            continue
        if out is None:
            out = list(tools)
        if callable(t) and not hasattr(t, "model_dump"):
            out[j] = function_tool(t, f"{where}[{j}]")
        else:
            out[j] = dump(t, none=False)
    return out if out is not None else tools if isinstance(tools, list) else list(tools)


# -- what a tool is ---------------------------------------------------------------------------

def tool_problem(tool: Any) -> tuple[str, str] | None:
    """Why ``tool`` (a dict, after :func:`tool_list`) is not a tool schema:
    ``(path under the tool, message)``, or None when it is one.

    The one check of a tool, for every reader of a tool list: render writes
    the declaration the model reads, the completion grammar lets the model
    call what is declared, so what one takes the other must take too. A tool
    is a function, written the ways clients send it: OpenAI's chat form
    ``{"type": "function", "function": {"name", ...}}``, the Responses API's
    flat form ``{"type": "function", "name", ...}``, or a bare function
    ``{"name", ...}``. The function needs a non-empty string ``name``; a
    ``description`` is a string and ``parameters`` a JSON schema (an object,
    or true or false) when given. Other keys are the client's and are kept.
    """
    # type() first: an ABC isinstance costs about a microsecond, and a parse
    # checks every tool it reads back.
    if type(tool) is not dict and not isinstance(tool, Mapping):
        return "", f"a tool is an object ({{\"type\": \"function\", \"function\": {{\"name\": ...}}}}), not " \
                   f"{_kind(tool)}"
    typ = tool.get("type")
    if typ is not None and typ != "function":
        return ".type", f"tool type {shown(typ)} is not one this template can declare or call (only 'function')"
    nested = tool.get("function")
    if nested is None:
        fn, at = tool, ""
        if "type" in tool and "name" not in tool:
            return ".function", "a function tool needs its function: {\"type\": \"function\", \"function\": " \
                                "{\"name\": ...}}"
    elif type(nested) is dict or isinstance(nested, Mapping):
        fn, at = nested, ".function"
    else:
        return ".function", f"function must be an object with a name, not {_kind(nested)}"
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        what = "an empty name" if name == "" else f"name {_kind(name)}" if "name" in fn else "no name"
        return f"{at}.name", f"a tool needs a name (a non-empty string) to be declared and called; this one has {what}"
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        return f"{at}.description", f"a tool's description is a string, not {_kind(description)}"
    params = fn.get("parameters")
    if params is not None and type(params) is not dict and not isinstance(params, Mapping | bool):
        return f"{at}.parameters", f"a tool's parameters are a JSON schema (an object), not {_kind(params)}"
    return None


def tool_function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The function object of a tool that :func:`tool_problem` passed."""
    nested = tool.get("function")
    return nested if isinstance(nested, Mapping) else tool


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, str):
        return f"the string {shown(v)}"
    if isinstance(v, list | tuple):
        return "a list"
    return f"a {type(v).__name__}"


# -- tools from Python functions -------------------------------------------------------------

_schemas: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def function_tool(fn: Callable[..., Any], where: str = "tools") -> dict[str, Any]:
    """The tool schema of a Python function with type hints and a docstring
    (Google style, or reST / numpydoc): ``{"type": "function", "function":
    {"name", "description", "parameters"}}``, the shape transformers'
    ``get_json_schema`` gives. The parameter schema is pydantic's (titles
    left out); descriptions come from the docstring. Needs the ``functions``
    extra (pydantic, docstring-parser). The same function gives the same
    dict object each time: treat it as read-only."""
    try:
        hit = _schemas.get(fn)
    except TypeError:  # no weak reference to it
        hit = None
    if hit is not None:
        return hit
    tool = _function_tool(fn, where)
    try:
        _schemas[fn] = tool
    except TypeError:
        pass
    return tool


def _function_tool(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    try:
        import docstring_parser
        from pydantic import TypeAdapter
        from pydantic.json_schema import GenerateJsonSchema
    except ImportError:
        raise OptionError("tools given as Python functions need pydantic and docstring-parser: "
                          "pip install 'xtml[functions]'", option=where) from None
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise OptionError(f"a tool given as a callable needs a function name, not {name!r}", option=where)
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except (TypeError, ValueError, NameError) as e:
        raise OptionError(f"cannot read the signature of {name}: {e}", option=where) from None
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise OptionError(f"{name}: parameter {p.name!r} cannot be given by name in a JSON object "
                              "(no *args, **kwargs or positional-only parameters)", option=where)
        if p.name not in hints:
            raise OptionError(f"{name}: parameter {p.name!r} has no type hint, so its schema is unknown",
                              option=where)

    class _NoTitles(GenerateJsonSchema):
        # Titles pydantic makes up from names ("City") add nothing to a
        # prompt that already has the names.
        def field_title_should_be_set(self, schema: Any) -> bool:
            return False

        def model_schema(self, schema: Any) -> Any:
            out = super().model_schema(schema)
            out.pop("title", None)
            return out

    # Pydantic describes a callable's arguments; it is given a stand-in
    # whose annotations are already resolved, since it would evaluate string
    # annotations in the function's module, which code run by exec() lacks.
    def stand_in(**kwargs: Any) -> None:
        raise AssertionError("never called")

    stand_in.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(annotation=hints[p.name]) for p in sig.parameters.values()],
        return_annotation=inspect.Signature.empty)
    stand_in.__annotations__ = {n: hints[n] for n in sig.parameters}
    try:
        adapter: Any = TypeAdapter(typing.cast(Any, stand_in))
        params: dict[str, Any] = adapter.json_schema(schema_generator=_NoTitles)
    except Exception as e:  # pydantic's own errors for types it cannot describe
        raise OptionError(f"{name}: no JSON schema for its parameters: {e}", option=where) from None
    params.pop("additionalProperties", None)
    params.pop("title", None)
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    described = {p.arg_name: p.description for p in doc.params if p.description}
    props = params.get("properties", {})
    for arg, text in described.items():
        if arg in props and "description" not in props[arg]:
            props[arg] = {"description": text.strip(), **props[arg]}
    function: dict[str, Any] = {"name": name}
    description = "\n\n".join(x.strip() for x in (doc.short_description, doc.long_description) if x)
    if description:
        function["description"] = description
    function["parameters"] = params
    return {"type": "function", "function": function}


# -- request levels → options ----------------------------------------------------------------

def _functions(v: Any, where: str) -> Any:
    if not isinstance(v, list | tuple):
        raise OptionError("functions must be a list of function schemas", option=where)
    out = []
    for j, fn in enumerate(v):
        if callable(fn) and not hasattr(fn, "model_dump"):
            out.append(function_tool(fn, f"{where}[{j}]"))
            continue
        fn = dump(fn, none=False)
        # Checked as the bare function it is, so that the error names the
        # client's own key rather than the tool it becomes.
        bad = tool_problem(fn)
        if bad is not None:
            raise OptionError(bad[1], option=f"{where}[{j}]{bad[0]}")
        out.append({"type": "function", "function": fn})
    return out


def _function_call(v: Any, where: str) -> Any:
    v = dump(v)
    if v in ("none", "auto"):
        return v
    if isinstance(v, Mapping) and isinstance(v.get("name"), str) and v["name"]:
        return {"type": "function", "function": {"name": v["name"]}}
    raise OptionError("function_call must be 'none', 'auto' or {\"name\": ...}", option=where)


def _reasoning(v: Any, where: str, out: dict[str, Any]) -> None:
    v = dump(v)
    if v is None:
        return
    if not isinstance(v, Mapping):
        raise OptionError("reasoning must be an object with 'effort' and/or 'enabled'", option=where)
    effort = v.get("effort", v.get("reasoning_effort"))
    enabled = v.get("enabled", v.get("enable"))
    if enabled is not None and not isinstance(enabled, bool):
        raise OptionError("reasoning.enabled must be true or false", option=where)
    if effort is not None:
        out["reasoning_effort"] = effort
    if enabled:
        out.setdefault("thinking", True)


# What reading a key takes: 0 nothing (ignored), 1 an option as it stands,
# 2 refused unless empty, 3 a reading of its own. One dict lookup per key:
# every request goes through here.
_ACTION: dict[str, int] = {
    f.name: 0 if f.effect == IGNORED else 2 if f.effect == REFUSED else 1 if f.name in _OPTION_SET else 3
    for f in FIELDS}


def _level(items: Mapping[str, Any], level: str, ignore: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The options one level of a request gives (``level``: ``body``,
    ``chat_template_kwargs`` or ``keyword``), and those of its nested
    ``chat_template_kwargs``."""
    if "extra_body" in items:
        # The openai SDK merges it into the body: its keys win.
        extra = dump(items["extra_body"])
        if extra is not None:
            if not isinstance(extra, Mapping):
                raise _error(level, "extra_body", "'extra_body' must be an object")
            merged = {k: v for k, v in items.items() if k != "extra_body"}
            merged.update(extra)
            items = merged
    out: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    action = _ACTION.get
    for k, v in items.items():
        a = action(k)
        if a == 1:
            out[k] = v if type(v) in _PLAIN else dump(v)
        elif a == 0:
            continue
        elif a is None:
            if ignore and level != "keyword":
                continue
            _unknown(k, level)
        elif a == 2:
            if not _empty(v):
                raise _error(level, k, f"{k!r} cannot be honoured: {BY_NAME[k].note}")
        elif k == "messages":
            if level != "body":
                raise _error(level, k, "'messages' belongs at the top level of the request")
        elif k == "chat_template_kwargs":
            if level == "chat_template_kwargs":
                raise _error(level, k, "chat_template_kwargs cannot be nested")
            v = dump(v)
            if v is None:
                continue
            if not isinstance(v, Mapping):
                raise _error(level, k, "'chat_template_kwargs' must be an object")
            nested = _level(v, "chat_template_kwargs", ignore)[0]
        elif k == "functions":
            if not _empty(items.get("tools")):
                raise _error(level, k, "give tools or the deprecated functions, not both")
            if not _empty(v):
                out["tools"] = _functions(v, k)
        elif k == "function_call":
            if items.get("tool_choice") is not None:
                raise _error(level, k, "give tool_choice or the deprecated function_call, not both")
            if v is not None:
                out["tool_choice"] = _function_call(v, k)
        elif k == "reasoning":
            _reasoning(v, k, out)
        elif k != "extra_body":  # a prompt field without a reading is a bug of the table
            raise AssertionError(f"no reading for prompt field {k!r}")
    return out, nested


def _error(level: str, key: str, msg: str) -> OptionError:
    return OptionError(msg, option=f"chat_template_kwargs.{key}" if level == "chat_template_kwargs" else key)


def _unknown(key: Any, level: str) -> typing.NoReturn:
    hint = did_you_mean(key, NAMES)
    if level == "body":
        raise RequestError(f"unknown request key {key!r}{hint}", location=str(key))
    if level == "chat_template_kwargs":
        raise OptionError(f"unknown option {key!r}{hint}", option=f"chat_template_kwargs.{key}")
    if not hint:
        hint = f" (known: {', '.join(OPTIONS)})"
    raise OptionError(f"unknown option {key!r}{hint}", option=str(key))


def request_options(body: Mapping[str, Any], ignore: bool) -> dict[str, Any]:
    """The options a request body gives: top-level keys (``extra_body``
    merged in), then ``chat_template_kwargs`` over them."""
    top, nested = _level(body, "body", ignore)
    if nested:
        top.update(nested)
    return top


def keyword_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a call's keyword arguments (unknown ones always an
    error: they are the caller's own code, not forwarded traffic)."""
    top, nested = _level(options, "keyword", False)
    if nested:
        return {**nested, **top}
    return top


# -- messages --------------------------------------------------------------------------------

def messages_of(messages: list[Any], ignore: bool, known: frozenset[str]) -> list[Any]:
    """Messages as dicts (objects dumped; ``messages`` is the caller's own
    copy of the list and is changed in place, never the message dicts):
    an assistant's deprecated ``function_call`` becomes its one tool call,
    Python functions in a system message's ``tools`` become schemas, and with
    ``ignore`` keys outside ``known`` are dropped."""
    if not ignore:
        # Most requests need nothing here: one quick pass says so.
        for m in messages:
            if type(m) is not dict or "function_call" in m or "tools" in m:
                break
        else:
            return messages
    for i, m in enumerate(messages):
        if type(m) is not dict:
            if isinstance(m, Mapping):
                continue
            m = dump(m)
            if type(m) is not dict:
                continue  # not a message; prepare says so, with its index
            messages[i] = m
        fc = m.get("function_call")
        if fc is not None and m.get("role") == "assistant":
            if m.get("tool_calls"):
                raise MessageError("give tool_calls or the deprecated function_call, not both", index=i,
                                   path="function_call")
            fc = dump(fc)
            if not isinstance(fc, Mapping):
                raise MessageError("function_call must be an object with a name", index=i, path="function_call")
            m = {k: v for k, v in m.items() if k != "function_call"}
            m["tool_calls"] = [{"type": "function", "function": fc}]
            messages[i] = m
        tools = m.get("tools")
        if isinstance(tools, list | tuple) and any(type(t) is not dict for t in tools):
            m = {**m, "tools": tool_list(tools, f"messages[{i}].tools")}
            messages[i] = m
        if ignore and not m.keys() <= known:
            messages[i] = {k: v for k, v in m.items() if k in known}
    return messages


# -- documentation ---------------------------------------------------------------------------

def markdown_table() -> str:
    """The table of :data:`FIELDS` as docs/requests.md shows it."""
    rows = ["| key | from | effect | feeds | note |", "|---|---|---|---|---|"]
    for f in FIELDS:
        feeds = f.feeds if f.effect == PROMPT else ""
        rows.append(f"| `{f.name}` | {', '.join(f.sources)} | {f.effect} | {feeds} | {f.note} |")
    return "\n".join(rows)
