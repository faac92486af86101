"""The sampling fields of a chat-completions request (:func:`sampling`),
checked as the engines take them: what goes to the engine as it came."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..chat.json_values import surrogate_in
from ..errors import RequestError, shown
from ..template import MAX_N

__all__ = ["MAX_LOGIT_BIAS", "MAX_N", "MAX_STOP", "MAX_STOP_CHARS", "MAX_STOP_IDS", "sampling"]

# The most a request may list. Each engine works through these on every
# token it generates (vLLM tries every stop string against the new text,
# and scans the stop ids), and the gateway holds back and searches text for
# every stop string: a request must not make every token cost what it
# chooses. OpenAI takes 4 stop sequences and 300 logit_bias entries.
MAX_STOP = 16
"""Stop sequences in ``stop``."""
MAX_STOP_CHARS = 1024
"""Characters in one stop sequence: the gateway holds back up to that much
text of a stream and searches it again with each token."""
MAX_STOP_IDS = 64
"""Ids in ``stop_token_ids``."""
MAX_LOGIT_BIAS = 300
"""Entries in ``logit_bias``."""

_PASSED = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
           "top_k", "seed", "max_tokens", "min_tokens")


def sampling(body: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """The sampling fields of a chat-completions body whose JSON types
    :func:`~xtml.template.check_fields` has checked (numbers finite, counts
    64-bit integers, ``n`` 1 to :data:`MAX_N`), checked further: token ids
    (``stop_token_ids``, the keys of ``logit_bias``) are below ``vocab_size``,
    ``stop`` is a string or a list of them, ``max_completion_tokens`` (which
    wins) and ``max_tokens`` are one ``max_tokens`` of at least 1. Lists are
    bounded (:data:`MAX_STOP` sequences of :data:`MAX_STOP_CHARS` characters,
    :data:`MAX_STOP_IDS` stop ids, :data:`MAX_LOGIT_BIAS` biases). Fields left
    out or null are not in the result. ``n`` is there when above 1. No log
    probabilities: the gateway cannot return them, and silently dropping them
    would answer something else than was asked. Bad values raise
    :class:`RequestError` naming the field."""
    out: dict[str, Any] = {}
    for k in _PASSED:
        v = body.get(k)
        if v is not None:
            out[k] = v
    mct = body.get("max_completion_tokens")
    if mct is not None:
        out["max_tokens"] = mct
    mt = out.get("max_tokens")
    if mt is not None and mt < 1:
        raise RequestError("max_tokens must be at least 1", location="max_completion_tokens"
                           if mct is not None else "max_tokens")
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise RequestError("stop must be a string or a list of strings", location="stop")
        if len(stop) > MAX_STOP:
            raise RequestError(f"stop holds {len(stop)} sequences: at most {MAX_STOP} are taken", location="stop")
        for j, s in enumerate(stop):
            if len(s) > MAX_STOP_CHARS:
                raise RequestError(f"a stop sequence of {len(s):,} characters: at most {MAX_STOP_CHARS:,} are taken",
                                   location=f"stop[{j}]" if isinstance(body.get("stop"), list) else "stop")
        # The one text of the request that goes to the engine as it came:
        # UTF-8 cannot write a lone surrogate, so the body could not be sent.
        hit = surrogate_in(stop, "stop")
        if hit is not None:
            raise RequestError(hit[1], location=hit[0] if isinstance(body.get("stop"), list) else "stop")
        if stop:
            out["stop"] = stop
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
            raise RequestError("stop_token_ids must be a list of token ids", location="stop_token_ids")
        if len(ids) > MAX_STOP_IDS:
            raise RequestError(f"stop_token_ids holds {len(ids)} ids: at most {MAX_STOP_IDS} are taken",
                               location="stop_token_ids")
        for j, i in enumerate(ids):
            if i >= vocab_size:
                raise RequestError(f"{i} is not a token id of this tokenizer", location=f"stop_token_ids[{j}]")
        out["stop_token_ids"] = ids
    if body.get("ignore_eos") is not None:
        out["ignore_eos"] = body["ignore_eos"]
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise RequestError("logit_bias must map token ids to numbers", location="logit_bias")
        if len(bias) > MAX_LOGIT_BIAS:
            raise RequestError(f"logit_bias holds {len(bias)} entries: at most {MAX_LOGIT_BIAS} are taken",
                               location="logit_bias")
        for k, b in bias.items():
            if not (isinstance(k, str) and k.isascii() and k.isdigit()):
                raise RequestError(f"logit_bias keys are token ids, not {shown(k)}", location="logit_bias")
            if len(k) > len(str(vocab_size)) or int(k) >= vocab_size:  # the length first: int() of 5,000 digits fails
                raise RequestError(f"{shown(k)} is not a token id of this tokenizer",
                                   location=f"logit_bias[{shown(k)}]")
            if type(b) not in (int, float) or not math.isfinite(b):
                raise RequestError(f"logit_bias[{shown(k)}] must be a finite number", location="logit_bias")
        if bias:
            out["logit_bias"] = dict(bias)
    n = body.get("n")
    if n is not None and n > 1:
        out["n"] = n
    if body.get("logprobs") or body.get("top_logprobs"):
        raise RequestError("this server returns no log probabilities", location="logprobs")
    return out
