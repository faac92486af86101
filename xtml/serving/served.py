"""What the gateway's request checks and answer paths share: the model
served (:class:`Served`) and one checked request (:class:`Job`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .engines import Generation
from .responses import Exchange

if TYPE_CHECKING:
    from ..template import Template
    from ..vocab.binding import Binding
    from ..vocab.tokens import TokenBinding
    from ..vocab.vocabulary import Vocabulary

__all__ = ["Job", "Served"]


@dataclass(slots=True)
class Served:
    """The model a gateway serves: its template and the tokenizer bound to
    it, the name it answers as, the engine's kind, and the grammar sent."""

    template: Template
    vocab: Vocabulary
    """The tokenizer (the template's methods take the Vocabulary itself at
    no cost: a path would be resolved on every call)."""
    binding: Binding | TokenBinding
    """The template's markers bound to ``vocab`` (stop ids, the text of each id)."""
    model: str
    kind: str
    grammar: bool
    """Whether a completion grammar is sent when a request constrains the output."""
    grammar_format: str


@dataclass(slots=True)
class Job:
    """One checked request, rendered."""

    gen: Generation
    thinking: bool
    stream: bool
    include_usage: bool
    api: Exchange | None = None
    """The Responses request it serves, if any (else a chat completion)."""
    legacy: bool = False
    """Tools declared as the deprecated ``functions``: the answer's call is
    a ``function_call``."""
    max_calls: int | None = None
    """The most calls an answer hands back: 1 when the request set
    ``parallel_tool_calls`` false (an engine given no grammar, or one that
    ignores it, may make more)."""
    tools: Any = None
    """The request's tools: a format that writes arguments untyped reads
    them back by their schemas."""
