"""A parsed completion in the shape of the OpenAI Chat Completions API: a
``chat.completion`` object (:func:`chat_completion`), or just its message
and finish reason (:func:`shape_message`), and the ``usage`` of an answer
(:func:`usage`). The functions keep no state. The rules are those of
:mod:`.openai`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import RequestError

__all__ = ["Shaped", "chat_completion", "new_call_id", "new_completion_id", "shape_message", "usage", "writes_call_ids"]


def new_call_id() -> str:
    """A tool-call id as OpenAI makes them: ``call_`` and 24 random
    URL-safe characters."""
    return "call_" + secrets.token_urlsafe(18)


def new_completion_id() -> str:
    """A completion id: ``chatcmpl-`` and 24 random URL-safe characters."""
    return "chatcmpl-" + secrets.token_urlsafe(18)


def writes_call_ids(template: Any) -> bool:
    """Whether ``template``'s format writes a call's id in the answer (Kimi
    K2's ``functions.NAME:IDX``), so that its parse reads back the id the
    model wrote: an XTML template's parse makes up positional ids instead."""
    return getattr(getattr(template, "layout", None), "call_ids", "absent") != "absent"



class Shaped(NamedTuple):
    """A completion in OpenAI's terms."""

    message: dict[str, Any]
    """``{"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}``."""
    finish_reason: str
    """``stop``, ``tool_calls`` or ``length``."""
    diagnostics: list[dict[str, Any]]
    """The parser's diagnostics, then those of the shaping (withheld calls,
    dropped parts)."""


def _cut(diagnostics: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a batch parse's diagnostics say the input ended inside the
    message (an end marker inside it ends it instead: ``early-end``)."""
    kinds = {d.get("kind") for d in diagnostics}
    return "truncated" in kinds and "early-end" not in kinds


def cut_at(diagnostics: Sequence[Mapping[str, Any]], default: int) -> int:
    """Where the cut was reported (the last ``truncated`` diagnostic)."""
    for d in reversed(diagnostics):
        if d.get("kind") == "truncated" and isinstance(d.get("offset"), int):
            return int(d["offset"])
    return default


def call_diagnostic(kind: str, offset: int, index: int, id_: str, name: str, why: str) -> dict[str, Any]:
    return {"kind": kind, "offset": offset, "message": f"tool call {index} ({name!r}, id {id_}) {why}",
            "index": index, "id": id_, "name": name}


def _text_of(content: Any, diags: list[dict[str, Any]]) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content", f"content must be a string or a list of parts, not {type(content).__name__}")
    pieces: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        else:
            what = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            diags.append({"kind": "dropped-part", "offset": 0,
                          "message": f"content part {i} ({what!r}) is not text: an OpenAI assistant message "
                                     "holds only text, so it is left out"})
    return "".join(pieces)


def _bad(where: str, msg: str) -> RequestError:
    return RequestError(msg, location=f"parsed completion: {where}")


def _calls_of(parsed: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    """(name, arguments, id) of each call of a parsed message; the id where
    the format writes one (Kimi K2's ``functions.NAME:IDX``), else None."""
    calls = parsed.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _bad("tool_calls", "tool_calls must be a list")
    out: list[tuple[str, str, str | None]] = []
    for i, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments"), str):
            raise _bad(f"tool_calls[{i}]", "a call must be {'function': {'name': str, 'arguments': str}}")
        given = c.get("id")
        out.append((fn["name"], fn["arguments"], given if isinstance(given, str) and given else None))
    return out


CUT_BY = {"length": "was cut off by the token limit", "stop": "was cut off where the engine stopped (a stop "
           "sequence or stop token of the request)"}


_ONE_CALL = ("is more than the request allows (parallel_tool_calls is false, and the engine made more than one "
             "call): it is withheld and must not run")


def shape(parsed: Any, cut: bool, id_of: Callable[[int], str], end: int, cut_by: str = "length",
           max_calls: int | None = None, keep_ids: bool = False) -> Shaped:
    """The shaping itself; ``id_of(k)`` gives call ``k``'s id (from 0)
    where ``keep_ids`` is false or the parse gave the call none;
    ``cut_by``: the finish reason of a cut message (``stop`` when the
    engine stopped it for the request's stop sequences or ids);
    ``max_calls``: the most calls handed back."""
    if not isinstance(parsed, Mapping):
        raise _bad("", f"expected the assistant message a completion parse returns, not {type(parsed).__name__}")
    if parsed.get("role", "assistant") != "assistant":
        raise _bad("role", f"expected an assistant message, not role {parsed.get('role')!r}")
    given = parsed.get("diagnostics") or []
    if not isinstance(given, list):
        raise _bad("diagnostics", "diagnostics must be a list")
    diags: list[dict[str, Any]] = [dict(d) for d in given if isinstance(d, Mapping)]
    text = _text_of(parsed.get("content"), diags)
    calls = _calls_of(parsed)
    kept = len(calls) - 1 if cut and calls else len(calls)
    allowed = kept if max_calls is None else min(kept, max_calls)
    # A client that sends the history back must send the id the model
    # wrote for the format to write the same call (Kimi K2 Thinking reads
    # the name out of it); a format that writes none gets the gateway's own.
    ids = [given if keep_ids and given else id_of(k) for k, (_, _, given) in enumerate(calls)]
    tool_calls = [{"id": ids[k], "type": "function", "function": {"name": name, "arguments": args}}
                  for k, (name, args, _) in enumerate(calls[:allowed])]
    for k in range(allowed, kept):
        diags.append(call_diagnostic("withheld-call", end, k, ids[k], calls[k][0], _ONE_CALL))
    if kept < len(calls):
        diags.append(call_diagnostic("withheld-call", cut_at(diags, end), kept, ids[kept], calls[kept][0],
                                f"{CUT_BY[cut_by]}: it is withheld and must not run"))
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not tool_calls else None}
    reasoning = parsed.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    reason = cut_by if cut else ("tool_calls" if tool_calls else "stop")
    return Shaped(message, reason, diags)


def shape_message(parsed: Mapping[str, Any], *, stop_reason: str | None = None,
                  ids: Callable[[], str] | None = None, cut_by: str = "length",
                  max_calls: int | None = None, keep_ids: bool = False) -> Shaped:
    """A parsed completion as an OpenAI message, finish reason and
    diagnostics.

    ``parsed`` is what ``Template.parse(..., completion=True, lenient=True)``
    returns (its ``diagnostics`` say whether it was cut off), or the
    ``message`` of a ``message_end`` event with its ``stop_reason``. ``ids``
    makes each call's id (default :func:`new_call_id`); with ``keep_ids``
    (for a format that :func:`writes_call_ids`), a call keeps the id its
    parse read. ``cut_by`` is the finish reason of a message that was cut
    off: ``length`` (the token limit), or ``stop`` when the engine said it
    stopped for the request's stop sequences or ids. ``max_calls`` is the most calls handed back
    (1 when the request set ``parallel_tool_calls`` false): the first ones
    are kept, and each further one is withheld with a diagnostic
    (``withheld-call``)."""
    if cut_by not in CUT_BY:
        raise ValueError(f"cut_by must be one of {', '.join(CUT_BY)}, not {cut_by!r}")
    make = ids or new_call_id
    cut = _cut(parsed.get("diagnostics") or []) if stop_reason is None else stop_reason == "length"
    return shape(parsed, cut, lambda k: make(), 0, cut_by, max_calls, keep_ids)


def usage(prompt_tokens: int | None, completion_tokens: int | None,
           reasoning_tokens: int | None = None) -> dict[str, Any] | None:
    if prompt_tokens is None and completion_tokens is None:
        return None
    if prompt_tokens is None or completion_tokens is None:
        raise TypeError("usage needs both prompt_tokens and completion_tokens")
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def _choice(index: int, shaped: Shaped) -> dict[str, Any]:
    return {"index": index, "message": shaped.message, "finish_reason": shaped.finish_reason, "logprobs": None,
            "xtml_diagnostics": shaped.diagnostics}


def chat_completion(parsed: Mapping[str, Any] | Shaped | Sequence[Mapping[str, Any] | Shaped], *, model: str,
                    id: str | None = None, created: int | None = None, prompt_tokens: int | None = None,
                    completion_tokens: int | None = None, stop_reason: str | None = None,
                    ids: Callable[[], str] | None = None, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """A whole ``chat.completion`` object: ``parsed`` as :func:`shape_message`
    takes it (or already shaped), or a list of them, one choice each (``n``).
    ``usage`` is there when the token counts are given, with
    ``completion_tokens_details.reasoning_tokens`` when that is given
    (:meth:`xtml.Template.reasoning_tokens` counts it)."""
    items: list[Mapping[str, Any] | Shaped] = [parsed] if isinstance(parsed, Shaped | Mapping) else list(parsed)
    choices = []
    for k, p in enumerate(items):
        shaped = p if isinstance(p, Shaped) else shape_message(p, stop_reason=stop_reason, ids=ids)
        choices.append(_choice(k, shaped))
    out: dict[str, Any] = {"id": id or new_completion_id(), "object": "chat.completion",
                           "created": int(time.time()) if created is None else created, "model": model,
                           "choices": choices}
    counted = usage(prompt_tokens, completion_tokens, reasoning_tokens)
    if counted is not None:
        out["usage"] = counted
    return out

