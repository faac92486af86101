"""What a stream parser says: the events a token completes, and where the
characters of a run of text go.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sink", "StreamEvent"]


@dataclass(slots=True)
class StreamEvent:
    """One thing a token completed.

    ``type`` is one of ``message_start``, ``channel_start``, ``text``, ``channel_end``,
    ``tool_call_start``, ``argument_start``, ``argument_delta``,
    ``argument_end``, ``tool_call_end``, ``message_end``, ``diagnostic``.
    """

    type: str
    offset: int
    """Token offset (from the start of the completion) of the token that
    completed the event."""
    channel: str | None = None
    """For channel and text events: ``think``, ``response`` or ``tools``."""
    text: str | None = None
    """For ``text`` and ``argument_delta``: the new characters."""
    index: int | None = None
    """For tool-call events: the call's position in ``tool_calls`` (1-based)."""
    name: str | None = None
    """For ``tool_call_start``: the tool name."""
    key: str | None = None
    """For argument events: the argument name (None for a json block)."""
    value_type: str | None = None
    """For ``argument_start``: the declared type; ``json`` for a json block,
    or for an argument whose deltas are the JSON of the value read (a value
    syntax's reader hands each value over read)."""
    call: dict[str, Any] | None = None
    """For ``tool_call_end``: the whole call, as in ``tool_calls``."""
    message: dict[str, Any] | None = None
    """For ``message_end``: the whole message, as the batch parser gives it."""
    stop_reason: str | None = None
    """For ``message_end``: ``stop``, ``tool_calls`` or ``length`` (cut off)."""
    diagnostic: dict[str, Any] | None = field(default=None)
    """For ``diagnostic``: kind, offset, message."""
    role: str | None = None
    """For ``message_start``: the role."""


@dataclass(frozen=True, slots=True)
class Sink:
    """Where characters go: a channel's text or a call's argument."""

    type: str
    channel: str | None = None
    """Set for a channel's text only, whose type is then ``text`` (feed's
    short path goes by it)."""
    index: int | None = None
    key: str | None = None

    def event(self, at: int, text: str) -> StreamEvent:
        # Positional: this is made for every token of text.
        return StreamEvent(self.type, at, self.channel, text, self.index, None, self.key)
