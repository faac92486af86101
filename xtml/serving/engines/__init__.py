"""The engines behind ``xtml serve``: token ids in, token ids out.

:mod:`.framing` is what they all share (the :class:`Backend` base, the
:class:`Generation` asked for, the checked sampling fields, server-sent
events, :class:`BackendError`); each kind is one module, which quotes the
wire format it speaks from the engine's documentation and source:
:mod:`.vllm` (``POST /v1/completions``), :mod:`.sglang` (``POST
/generate``), :mod:`.llamacpp` (``POST /completion``). docs/serving.md, "The
gateway", lists them per kind.
"""

from __future__ import annotations

from collections.abc import Sequence

from .framing import Backend, BackendError, Choice, Generation, Output, Piece, dumps, one_choice, sampling
from .llamacpp import LlamaCpp, cut_into_tokens
from .sglang import SGLang
from .vllm import VLLM

__all__ = [
    "BACKENDS",
    "KINDS",
    "VLLM",
    "Backend",
    "BackendError",
    "Choice",
    "Generation",
    "LlamaCpp",
    "Output",
    "Piece",
    "SGLang",
    "cut_into_tokens",
    "dumps",
    "one_choice",
    "sampling",
]

BACKENDS: dict[str, type[Backend]] = {b.kind: b for b in (VLLM, SGLang, LlamaCpp)}
"""Each kind's class, by the name ``--backend-kind`` takes."""
KINDS: Sequence[str] = tuple(BACKENDS)
