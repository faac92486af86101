"""llama.cpp behind ``xtml serve``: its server's native completion endpoint, on ids.

The wire format, as read from llama.cpp's documentation and source
(docs/serving.md, "The gateway", lists each kind's): llama.cpp server's
``POST /completion`` (tools/server/README.md): "``prompt``: ... a single
sequence of tokens: ``[12, 34, 56]``", "``return_tokens``: Return the raw
generated token ids in the ``tokens`` field", "``n_predict``: Set the
maximum number of tokens to predict", "``stop``: Boolean for use with
``stream`` to check whether the generation has stopped", "``stop_type``: ...
``eos`` ... ``limit``: Stopped because ``n_predict`` tokens were generated
... ``word``". Streamed, each event is ``data: {"content", "tokens", "stop",
"tokens_predicted", ...}``, and some ids are never sent (see
:class:`LlamaCpp`; :func:`cut_into_tokens` finds them again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .framing import Backend, EventReader, Generation, Output, Piece, answer_object, checked_ids, garbage

log = logging.getLogger("xtml.serve")

__all__ = ["LlamaCpp", "cut_into_tokens"]

# OpenAI's names → the /completion endpoint's.
_LLAMACPP_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                    "repetition_penalty": "repeat_penalty", "max_tokens": "n_predict", "stop": "stop",
                    "seed": "seed", "ignore_eos": "ignore_eos"}


class LlamaCpp(Backend):
    """llama.cpp server's native completion endpoint, on ids.

    It takes no stop ids: it stops at the model's end-of-generation tokens
    (the GGUF's), so the template's end marker should be one of them; the
    gateway cuts an answer after the end marker either way.

    A whole answer is asked for whole: its ``tokens`` are every generated
    id. A stream is not as exact. The server sends a token's id only with
    text it can send, and holds back text that ends inside a UTF-8
    character, so a token that ends inside one (a byte of a CJK character,
    say) never has its id sent: the next event has the held text and only
    its own id, and a stream cut by the token limit there has its last ids
    nowhere (tools/server/server-context.cpp: ``process_token`` sends
    nothing while ``validate_utf8(generated_text)`` is short of the text;
    ``send_partial_response`` sends ``tokens.assign(1, tkn.tok)``; the last
    event of a stream has empty ``content`` and ``tokens``). Each event's
    ``tokens_predicted`` counts what was generated, so a gap is seen: the
    held bytes are the event's text less its own token's, and are cut into
    that many tokens of the vocabulary (the model's own ids whenever only
    one such cut exists; any cut gives the client the same text). Where the
    text does not give them (bytes the server replaced, a stop string
    holding text back, the end of the stream) they are counted in
    :attr:`Generation.lost` and the client is told."""

    kind = "llamacpp"
    path = "/completion"
    lacks = ("min_tokens",)  # tools/server/README.md lists no minimum length

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._index: tuple[Sequence[bytes | None], dict[bytes, int], int] | None = None
        self._warned = False

    def body(self, gen: Generation, stream: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": gen.prompt, "return_tokens": True, "stream": stream,
                               "cache_prompt": True}
        for k, name in _LLAMACPP_FIELDS.items():
            if k in gen.params:
                out[name] = gen.params[k]
        bias = gen.params.get("logit_bias")
        if bias:
            out["logit_bias"] = [[int(k), v] for k, v in bias.items()]  # keys checked by sampling()
        if gen.grammar is not None:
            # GBNF goes to llama.cpp's own grammar sampler; a grammar that
            # opens with "%llguidance {}" only to a build with
            # LLAMA_LLGUIDANCE (the gateway's grammar format says which).
            out["grammar"] = gen.grammar
        return out

    def read(self, data: Any, gen: Generation) -> Output:
        d = answer_object(data, "body")
        if "tokens" not in d:
            raise garbage("no tokens: the backend must be llama.cpp's server (return_tokens)", "tokens")
        ids = checked_ids(d["tokens"], gen.vocab_size, "tokens")
        finish = _llamacpp_finish(d)
        stops = frozenset(gen.all_stop_ids())
        if not stops.isdisjoint(ids):
            # A model whose end-of-generation tokens miss the end marker
            # goes on past it: what follows is not the answer's.
            end = next(k for k, t in enumerate(ids) if t in stops) + 1
            # Past a stop id of the request is what the server does (it
            # takes none); past the end marker means the model's setup.
            if end < len(ids) and ids[end - 1] in gen.stop_ids and not self._warned:
                self._warned = True
                log.warning("llama.cpp generated %d ids past the end marker: the model's end-of-generation "
                            "tokens (its GGUF's) do not include it, so each answer runs on to its token limit",
                            len(ids) - end)
            del ids[end:]
            finish = "stop"
        return Output(ids, finish)

    def reader(self, gen: Generation) -> EventReader:
        return _LlamaCppReader(gen, self.token_index)

    def token_index(self, table: Sequence[bytes | None]) -> tuple[dict[bytes, int], int]:
        """Bytes → id of every ordinary token (-1 where two ids share their
        bytes), and the longest token's length; made once per table."""
        index = self._index
        if index is None or index[0] is not table:
            by: dict[bytes, int] = {}
            for i, b in enumerate(table):
                if b:
                    by[b] = -1 if b in by else i
            index = self._index = (table, by, max(map(len, by), default=0))
        return index[1], index[2]


def _llamacpp_finish(d: Mapping[str, Any]) -> str | None:
    if not d.get("stop"):
        return None
    return "length" if d.get("stop_type") == "limit" else "stop"


class _LlamaCppReader(EventReader):
    __slots__ = ("delivered", "index", "table")

    def __init__(self, gen: Generation,
                 index: Callable[[Sequence[bytes | None]], tuple[dict[bytes, int], int]]) -> None:
        super().__init__(gen)
        self.index = index
        self.delivered = 0  # ids given on so far, sent or found again
        # A stop string makes the server hold text back for a while with its
        # ids sent, so an event's text no longer starts with what was left
        # out: nothing is looked for then, and a gap is reported.
        self.table = None if gen.params.get("stop") else gen.token_bytes

    def read(self, data: Any) -> Piece | None:
        d = answer_object(data, "stream")
        ids = d.get("tokens")
        if ids is None:
            ids = []
            if not d.get("stop"):
                raise garbage("an event without tokens: the backend must be llama.cpp's server", "tokens")
        finish = _llamacpp_finish(d)
        if finish is not None:
            self.done = True
        ids = checked_ids(ids, self.gen.vocab_size, "tokens")
        predicted = d.get("tokens_predicted")
        gap = predicted - self.delivered - self.gen.lost - len(ids) if type(predicted) is int else 0
        if gap > 0:
            if finish is not None:
                # The last event carries no text: ids held back when the
                # stream ended (the token limit cut a character) are lost.
                self._lose(gap)
            else:
                table = self.table() if self.table is not None else None
                held = self._held(d.get("content"), ids, table) if table else None
                if held is None:
                    self._lose(gap)
                elif held:
                    assert table is not None
                    found = cut_into_tokens(held, gap, *self.index(table))
                    if found is None:
                        self._lose(gap)
                    else:
                        ids = found + ids
                # No held text: the count ran ahead of the events (a draft
                # model's tokens are counted before each is sent).
        self.delivered += len(ids)
        return ids, finish

    def _lose(self, k: int) -> None:
        if not self.gen.lost:
            self.gen.lost_at = self.delivered
        self.gen.lost += k

    @staticmethod
    def _held(content: Any, ids: list[int], table: Sequence[bytes | None]) -> bytes | None:
        """The bytes the server held back, from an event's text (theirs, then
        the sent ids'); None when the text does not give them."""
        if not isinstance(content, str) or "\ufffd" in content:
            # U+FFFD: the server replaced bytes that are not UTF-8.
            return None
        pieces = [table[t] if t < len(table) else None for t in ids]
        if None in pieces:
            return None
        try:
            whole = content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            return None
        tail = b"".join(pieces)  # type: ignore[arg-type]
        if not whole.endswith(tail):
            return None
        return whole[: len(whole) - len(tail)]


# Held text longer than this is not cut into tokens (the cut's cost grows
# with it); what a server holds back is the start of one character and the
# tokens before it in one event.
_MAX_HELD = 128
_MAX_CUT = 32


def cut_into_tokens(held: bytes, k: int, by: dict[bytes, int], longest: int) -> list[int] | None:
    """Ids of tokens of ``by`` (bytes → id, -1 where two ids share bytes)
    whose bytes make up ``held``: ``k`` of them if that can be (the model's
    own ids when only one such cut exists), else as few as can be; None if
    no cut exists or ``held`` is longer than :data:`_MAX_HELD`. Any cut gives
    the same text, which is what a client gets."""
    n = len(held)
    if not held or n > _MAX_HELD:
        return None
    # The tokens starting at each offset, looked up once.
    starts: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for i in range(n):
        for e in range(i + 1, min(n, i + longest) + 1):
            t = by.get(held[i:e])
            if t is not None and t >= 0:
                starts[i].append((e, t))
    # fewest[i]: the fewest tokens that make up held[i:] (n + 1: none do).
    fewest = [n + 1] * (n + 1)
    fewest[n] = 0
    for i in range(n - 1, -1, -1):
        fewest[i] = min((fewest[e] + 1 for e, _ in starts[i]), default=n + 1)
    if fewest[0] > n:
        return None
    out: list[int] = []
    if k <= _MAX_CUT:
        # reach[i]: the numbers of tokens (up to k) that make up held[i:].
        reach: list[set[int]] = [set() for _ in range(n + 1)]
        reach[n].add(0)
        for i in range(n - 1, -1, -1):
            for e, _ in starts[i]:
                reach[i].update(j + 1 for j in reach[e] if j < k)
        if k in reach[0]:
            i, j = 0, k
            while j:
                e, t = next((e, t) for e, t in starts[i] if j - 1 in reach[e])
                out.append(t)
                i, j = e, j - 1
            return out
    i = 0
    while i < n:
        e, t = next((e, t) for e, t in starts[i] if fewest[e] == fewest[i] - 1)
        out.append(t)
        i = e
    return out
