"""vLLM behind ``xtml serve``: its OpenAI-compatible completions endpoint, on ids.

The wire format, as read from vLLM's documentation and source (docs/serving.md,
"The gateway", lists each kind's): ``POST /v1/completions`` with ``prompt``
as a list of ids and ``return_token_ids: true``. vLLM's request model
describes it: "If specified, the result will include token IDs alongside the
generated text. In streaming mode, prompt_token_ids is included only in the
first chunk, and token_ids contains the delta tokens for each chunk"
(vllm/entrypoints/openai/protocol.py, ``CompletionRequest.return_token_ids``).
Streams are server-sent events ending with ``data: [DONE]``; an error in a
stream is ``data: {"error": {...}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ...plugins.jsonfmt import read
from ..client import TransportError
from .framing import (
    Backend,
    BackendError,
    EventReader,
    Generation,
    Output,
    Piece,
    answer_object,
    checked_ids,
    garbage,
    status_error,
    transport_error,
)

log = logging.getLogger("xtml.serve")

__all__ = ["VLLM"]

# Sampling fields vLLM's CompletionRequest takes under the same names.
_VLLM_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty", "seed", "max_tokens", "min_tokens", "stop", "ignore_eos", "logit_bias", "n")


class VLLM(Backend):
    """vLLM's OpenAI-compatible completions endpoint, on ids."""

    kind = "vllm"
    path = "/v1/completions"
    # CompletionRequest.n: "n: int = 1"; the answer has n choices, each with
    # its index, and a stream's chunks carry the index of the choice they
    # are of (vllm/entrypoints/openai/serving_completion.py,
    # completion_stream_generator: "choices=[CompletionResponseStreamChoice(
    # index=i, ...)]").
    takes_n = True

    def __init__(self, url: str, *, model: str | None = None, timeout: float = 600.0) -> None:
        super().__init__(url, model=model, timeout=timeout)
        self.max_model_len: int | None = None
        """The engine's context length, from its model list."""

    async def learn(self) -> None:
        # A chat request without max_tokens may fill the context, but vLLM's
        # CompletionRequest defaults max_tokens to 16 (the completions API's
        # default; vllm/entrypoints/openai/completion/protocol.py), and its
        # stream asserts max_tokens is not None: so the gateway always sends
        # one, the context length less the prompt, which is what vLLM itself
        # takes when a request leaves it out (entrypoints/utils.py,
        # get_max_tokens). The context length is the model card's
        # max_model_len in GET /v1/models (engine/protocol.py, ModelCard).
        try:
            status, content = await self.client.request("GET", "/v1/models", limit=1 << 20)
        except TransportError as e:
            raise transport_error(e, self.url) from None
        if status >= 500:
            # Not ready (loading, or a proxy's hiccup): asked again next time.
            raise status_error(status, content, self.url)
        self.ready = True
        try:
            cards = read(content)["data"] if status == 200 else []
        except (ValueError, TypeError, KeyError):
            cards = []
        if not isinstance(cards, list):
            cards = []
        cards = [c for c in cards if isinstance(c, Mapping)]
        card = next((c for c in cards if c.get("id") == self.model), cards[0] if cards else None)
        n = card.get("max_model_len") if card is not None else None
        if type(n) is int and n > 0:
            self.max_model_len = n
        else:
            log.warning("the backend's GET /v1/models gives no max_model_len: a request without max_tokens "
                        "gets the engine's default limit (16 tokens for vLLM's completions)")

    def body(self, gen: Generation, stream: bool) -> dict[str, Any]:
        p = gen.params
        out: dict[str, Any] = {"prompt": gen.prompt, "return_token_ids": True, "skip_special_tokens": False,
                               "stop_token_ids": gen.all_stop_ids(), "stream": stream}
        if self.model is not None:
            out["model"] = self.model
        for k in _VLLM_FIELDS:
            if k in p:
                out[k] = p[k]
        if "max_tokens" not in p and self.max_model_len is not None:
            # A prompt that fills the context is vLLM's to refuse, in its words.
            out["max_tokens"] = max(1, self.max_model_len - len(gen.prompt))
        if gen.grammar is not None:
            # docs/features/structured_outputs.md: "guided_grammar ->
            # {"structured_outputs": {"grammar": ...}}"; the guidance backend
            # (vllm/v1/structured_output/backend_guidance.py) loads it with
            # llguidance.grammar_from("grammar", ...), which takes Lark.
            out["structured_outputs"] = {"grammar": gen.grammar}
        return out

    def read(self, data: Any, gen: Generation) -> Output:
        c = _vllm_choice(answer_object(data, "body"))
        if c is None:
            raise garbage("no choices", "choices")
        ids = c.get("token_ids")
        if ids is None:
            raise garbage("no token_ids: the backend must be vLLM with return_token_ids (0.10.2 or later)",
                           "choices[0].token_ids")
        return Output(checked_ids(ids, gen.vocab_size, "choices[0].token_ids"), _finish(c.get("finish_reason")))

    def reader(self, gen: Generation) -> EventReader:
        return _VLLMReader(gen)

    def read_n(self, data: Any, gen: Generation, n: int) -> list[Output]:
        choices = answer_object(data, "body").get("choices")
        if not isinstance(choices, list) or len(choices) != n or not all(isinstance(c, Mapping) for c in choices):
            raise garbage(f"expected {n} choices", "choices")
        by = {c.get("index"): c for c in choices}
        if sorted(by, key=str) != sorted(range(n), key=str):
            raise garbage(f"the choices' indices are not 0 to {n - 1}", "choices")
        return [self.read({"choices": [by[k]]}, gen) for k in range(n)]

    def index_of(self, data: Any) -> int:
        c = _vllm_choice(data)
        k = c.get("index", 0) if c is not None else 0
        if type(k) is not int:
            raise garbage("a choice index that is not a number", "choices[0].index")
        return k


def _vllm_choice(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise garbage("no choices list", "choices")
    if not choices:
        return None  # the usage chunk
    c = choices[0]
    if not isinstance(c, Mapping):
        raise garbage("a choice that is not an object", "choices[0]")
    return c


class _VLLMReader(EventReader):
    __slots__ = ()

    def read(self, data: Any) -> Piece | None:
        c = _vllm_choice(answer_object(data, "stream"))
        if c is None:
            return None
        finish = _finish(c.get("finish_reason"))
        ids = c.get("token_ids")
        if ids is None:
            if finish is None:
                raise garbage("an event without token_ids: the backend must be vLLM with return_token_ids "
                               "(0.10.2 or later)", "choices[0].token_ids")
            ids = []
        return checked_ids(ids, self.gen.vocab_size, "choices[0].token_ids"), finish


def _finish(v: Any) -> str | None:
    if v is None:
        return None
    if v == "length":
        return "length"
    if v in ("abort", "error"):
        raise BackendError(f"the backend ended the request: finish_reason {v!r}", code="backend_error")
    return "stop"
