"""The gateway's request checks, one per API: a chat-completions body
(:func:`chat_job`) and a Responses body (:func:`responses_job`, translated
to the chat body it stands for, then checked as one) become a
:class:`~.served.Job`: its prompt rendered to ids by the facade
(``Template.encode_request``), the JSON types of its other fields checked
against the field table (:func:`~xtml.template.check_fields`), its sampling
fields (:func:`~.sampling.sampling`), and the grammar the engine is sent when the
request constrains the output. Bad requests raise
:class:`~xtml.RequestError` naming where.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import MessageError, OptionError, RequestError, shown
from ..plugins import jsonfmt
from ..template import check_fields
from .engines import BACKENDS, Generation
from .responses import Exchange, ResponseStore, translate
from .sampling import sampling
from .served import Job, Served

__all__ = ["MAX_TOOLS", "chat_job", "responses_job"]

MAX_TOOLS = 128
"""The most tools a request may declare, as OpenAI takes: each one is in
the prompt and, when the output is constrained, in the grammar the engine
compiles."""


def _servable(body: Mapping[str, Any], text_parts: tuple[str, ...]) -> None:
    """Refuse what would reach no engine, and tool lists past their bound.

    The engine is sent token ids only: an image (or audio, video) part
    would be one placeholder in the prompt, the model answering about a
    picture it never got. Until an engine is sent the media itself, such a
    request is refused, naming the part, rather than answered without it."""
    for key in ("tools", "functions"):
        tools = body.get(key)
        if isinstance(tools, list) and len(tools) > MAX_TOOLS:
            raise RequestError(f"{key} declares {len(tools)} tools: at most {MAX_TOOLS} are taken", location=key)
    if body.get("image_prompts"):
        raise OptionError("image_prompts cannot be served: the engine is sent token ids only, and no image",
                          option="image_prompts")
    messages = body.get("messages")
    if not isinstance(messages, list):
        return  # the chat layer says what is wrong with it
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            t = part.get("type") if isinstance(part, Mapping) else None
            if isinstance(t, str) and t not in text_parts:
                raise MessageError(f"a content part of type {shown(t)} cannot be served: the engine is sent token "
                                   "ids only, so the model would never see it", index=i, path=f"content[{j}]")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key given twice")
    return out


def arguments_as_objects(t: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The body with each call's arguments text read as the JSON object it
    holds, for a format whose template writes arguments through ``tojson``
    or a value syntax (Gemma's key:value one).

    Clients send arguments as JSON text (the OpenAI shape); engines read it
    as JSON before the chat template sees it (vLLM's chat_utils does, for
    every model), so such a template writes the object the model wrote, not
    a JSON string of it (a value syntax writes a string in braces, as
    given). Text that is no JSON object, or one with a key given twice (an
    object would lose one), stays text."""
    if getattr(getattr(t, "layout", None), "arguments", None) not in ("tojson", "syntax"):
        return body
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return body
    out: list[Any] = []
    for m in msgs:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list):
            m = {**m, "tool_calls": [_call_as_object(c) for c in calls]}
        out.append(m)
    return {**body, "messages": out}


def _call_as_object(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    args = fn.get("arguments") if isinstance(fn, dict) else None
    if not isinstance(args, str):
        return call
    try:
        value = jsonfmt.read(args, object_pairs_hook=_unique)
    except ValueError:  # not JSON, a key twice, or nested past the reader
        return call
    if not isinstance(value, dict):
        return call
    assert isinstance(fn, dict)
    return {**call, "function": {**fn, "arguments": value}}


def chat_job(served: Served, body: Any) -> Job:
    """Check a chat-completions body and render its prompt."""
    if not isinstance(body, dict):
        raise RequestError(f"the request must be a JSON object, not {type(body).__name__}")
    if body.get("messages") == []:
        # OpenAI's answer too: there is nothing to answer.
        raise RequestError("messages must hold at least one message", location="messages")
    check_fields(body, api="chat")
    stream = body.get("stream")
    so = body.get("stream_options")
    include_usage = so.get("include_usage") if so else None
    vocab = served.vocab
    params = sampling(body, vocab.size)
    t = served.template
    _servable(body, t.text_part_types)
    for k in BACKENDS[served.kind].lacks:
        if params.get(k):
            raise RequestError(f"{k} cannot be served: the {served.kind} backend has no such field", location=k)
    body = arguments_as_objects(t, body)
    encoded = t.encode_request(body, vocab, unknown_keys="ignore")
    o = encoded.options
    if o.continue_final:
        raise OptionError("continue_final_message is not served: a chat completion starts a new assistant "
                          "message", option="continue_final_message")
    if not o.add_generation_prompt:
        raise OptionError("a chat completion continues the generation prompt: add_generation_prompt "
                          "cannot be false", option="add_generation_prompt")
    grammar = None
    one_call = body.get("parallel_tool_calls") is False
    # "none" with tools declared: the grammar has no tools channel.
    if served.grammar and (o.tool_choice == "required" or o.response_format is not None
                           or (o.tool_choice == "none" and o.tools)
                           # One call at most: only a grammar holds a model to it.
                           or (one_call and o.tools)
                           or encoded.tool_named is not None):
        grammar = t.completion_grammar(body, vocab, format=served.grammar_format, unknown_keys="ignore")
    b = served.binding
    gen = Generation(encoded.ids, params, b.stop_ids, vocab.size, grammar, b.text_table)
    legacy = bool(body.get("functions")) and not body.get("tools")
    return Job(gen, o.thinking, bool(stream), bool(include_usage), legacy=legacy,
               max_calls=1 if one_call else None, tools=o.tools)


def responses_job(served: Served, store: ResponseStore, body: Any, made: list[Exchange] | None = None) -> Job:
    """Check a Responses body and render its prompt as :func:`chat_job`
    does; the request's :class:`~.responses.Exchange` is added to ``made``
    as soon as it exists (its errors name the request's own items)."""
    if not isinstance(body, dict):
        raise RequestError(f"the request must be a JSON object, not {type(body).__name__}")
    d = served.template.dialect
    chat, api = translate(body, store, efforts=d.efforts, thinking_off=d.thinking_off)
    if made is not None:
        made.append(api)
    job = chat_job(served, chat)
    job.api = api
    job.include_usage = True  # the last event's response has the usage
    return job
