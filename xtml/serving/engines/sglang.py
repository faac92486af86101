"""SGLang behind ``xtml serve``: its native generate endpoint, on ids.

The wire format, as read from SGLang's source (docs/serving.md, "The
gateway", lists each kind's): the native ``POST /generate`` with
``input_ids`` and ``sampling_params``. Its answer is ``{"text",
"output_ids", "meta_info"}``; ``meta_info.finish_reason`` is null until the
end, then ``{"type": "stop" | "length" | "abort", ...}``, and
``meta_info.completion_tokens`` counts the ids so far. Streamed (``"stream":
true``), each event ``data: {...}`` holds *all* ids so far, or only the new
ones when the server runs with ``--incremental-streaming-output``
(sglang/srt/managers/tokenizer_manager output processing: ``"output_ids":
state.output_ids`` against ``delta_output_ids``); the stream ends with
``data: [DONE]`` and an error is ``data: {"error": {"message": ...}}``
(sglang/srt/entrypoints/http_server.py, ``generate_request``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .framing import Backend, BackendError, EventReader, Generation, Output, Piece, answer_object, checked_ids, garbage

__all__ = ["SGLang"]

# OpenAI's names → SGLang's sampling_params names.
_SGLANG_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "repetition_penalty": "repetition_penalty", "max_tokens": "max_new_tokens",
                  "min_tokens": "min_new_tokens", "stop": "stop", "ignore_eos": "ignore_eos",
                  "seed": "sampling_seed", "logit_bias": "logit_bias", "n": "n"}


class SGLang(Backend):
    """SGLang's native generate endpoint, on ids."""

    kind = "sglang"
    path = "/generate"
    # sampling_params.n asks for a parallel sample: the whole answer is the
    # list of the n outputs, and each event of a stream one output with
    # "index" set to its choice (sglang/srt/managers/tokenizer_manager.py,
    # _handle_batch_request: "outputs = await
    # self._collect_batch_responses(generators); yield outputs", and
    # _stream_batch_responses: 'result["index"] = rid_to_index[...]').
    takes_n = True

    def body(self, gen: Generation, stream: bool) -> dict[str, Any]:
        # max_new_tokens is 128 when left out (SamplingParams), but null is
        # "up to the context": the scheduler takes min(max_new_tokens, or
        # 1 << 30 when None, max_req_len - prompt - 1)
        # (sglang/srt/managers/scheduler.py, init_req_max_new_tokens), as
        # SGLang's own chat endpoint does for a request without max_tokens.
        params: dict[str, Any] = {"stop_token_ids": gen.all_stop_ids(), "skip_special_tokens": False,
                                  "max_new_tokens": None}
        for k, name in _SGLANG_FIELDS.items():
            if k in gen.params:
                params[name] = gen.params[k]
        if gen.grammar is not None:
            # sampling_params.ebnf; SGLang's llguidance grammar backend
            # (sglang/srt/constrained/llguidance_backend.py, dispatch_ebnf)
            # loads it with llguidance.grammar_from("ebnf", ...), which
            # takes Lark as it is.
            params["ebnf"] = gen.grammar
        return {"input_ids": gen.prompt, "sampling_params": params, "stream": stream}

    def read(self, data: Any, gen: Generation) -> Output:
        d = answer_object(data, "body")
        ids = d.get("output_ids")
        if ids is None:
            raise garbage("no output_ids", "output_ids")
        meta = d.get("meta_info")
        return Output(checked_ids(ids, gen.vocab_size, "output_ids"),
                      _sglang_finish(meta.get("finish_reason") if isinstance(meta, Mapping) else None))

    def reader(self, gen: Generation) -> EventReader:
        return _SGLangReader(gen)

    def read_n(self, data: Any, gen: Generation, n: int) -> list[Output]:
        if not isinstance(data, list) or len(data) != n:
            raise garbage(f"expected a list of {n} answers", "body")
        return [self.read(d, gen) for d in data]

    def index_of(self, data: Any) -> int:
        k = data.get("index", 0)
        if type(k) is not int:
            raise garbage("an index that is not a number", "index")
        return k


def _sglang_finish(v: Any) -> str | None:
    if v is None:
        return None
    kind = v.get("type") if isinstance(v, Mapping) else v
    if kind == "length":
        return "length"
    if kind == "abort":
        why = v.get("message") if isinstance(v, Mapping) else None
        raise BackendError(f"the backend aborted the request{': ' + str(why) if why else ''}",
                           code="backend_error")
    return "stop"


class _SGLangReader(EventReader):
    __slots__ = ("seen",)

    def __init__(self, gen: Generation) -> None:
        super().__init__(gen)
        self.seen = 0

    def read(self, data: Any) -> Piece | None:
        d = answer_object(data, "stream")
        ids = d.get("output_ids")
        if not isinstance(ids, list):
            raise garbage("an event without output_ids", "output_ids")
        meta = d.get("meta_info")
        meta = meta if isinstance(meta, Mapping) else {}
        count = meta.get("completion_tokens")
        seen = self.seen
        # Events hold all ids so far (SGLang's default) or only the new
        # ones (--incremental-streaming-output): completion_tokens, the
        # count so far, says which. Without it, all so far.
        if type(count) is int and count == seen + len(ids) and (seen == 0 or count != len(ids)):
            new = ids
        elif len(ids) >= seen:
            new = ids[seen:]
        else:
            raise garbage(f"{len(ids)} ids after {seen} were already sent", "output_ids")
        self.seen = seen + len(new)
        return checked_ids(new, self.gen.vocab_size, "output_ids"), _sglang_finish(meta.get("finish_reason"))
