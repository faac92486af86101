"""The OpenAI Responses API (``POST /v1/responses``) as a translation at the
edge of the chat path, one job per file: the request as the
chat-completions body it stands for (:mod:`.responses_request`,
:func:`translate`: what may not be served is a 400 naming the field), the
answer back as a ``response`` object or the typed events of a Responses
stream (:mod:`.responses_events`, :class:`Exchange`), and the responses kept
for ``previous_response_id`` (:mod:`.responses_store`,
:class:`ResponseStore`, bounded in entries, bytes and age: an id it does
not hold is a 404 saying so). Their names are here for callers.
"""

from __future__ import annotations

from .responses_events import Exchange, new_id
from .responses_request import ResponseNotFound, effort_of, translate
from .responses_store import MAX_AGE, MAX_BYTES, MAX_ENTRIES, ResponseStore, Stored

__all__ = [
    "MAX_AGE",
    "MAX_BYTES",
    "MAX_ENTRIES",
    "Exchange",
    "ResponseNotFound",
    "ResponseStore",
    "Stored",
    "effort_of",
    "new_id",
    "translate",
]
