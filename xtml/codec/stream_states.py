"""Where a stream parser is: its state, as callers see it, and the object
that holds what each state keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from ..errors import ParseError
from .stream_events import StreamEvent

__all__ = ["Ended", "Failed", "Phase", "Reading", "Ready", "Refused", "StreamState"]


class StreamState(Enum):
    """Where a :class:`~xtml.codec.stream.StreamParser` is (its ``state``).

    READY → READING at the first token (or ``close``); READING → REFUSED when
    the tree builder refuses the input; READING or REFUSED → ENDED at the end
    marker or ``close``; any of them → FAILED when a strict stream raises.
    """

    READY = "ready"
    """Nothing fed yet: ``message_start`` and the events of the generation
    prompt go out with the first token."""
    READING = "reading"
    """The message is open: markers step the tree builder, text streams to
    where the open elements say."""
    REFUSED = "refused"
    """The builder refused the input (nesting past the limit; lenient only):
    nothing more is read but the end marker, which ends the message with the
    calls read so far."""
    ENDED = "ended"
    """``message_end`` went out; more output is reported once, as trailing."""
    FAILED = "failed"
    """A strict stream raised: every call raises the same error again."""


@dataclass(slots=True)
class Ready:
    """READY: the events of the generation prompt, which go out after
    ``message_start`` (the prompt is read when the parser is made)."""

    startup: list[StreamEvent]
    state: ClassVar[StreamState] = StreamState.READY


@dataclass(slots=True)
class Reading:
    """READING: what it reads is the parser's current run of text and tree."""

    state: ClassVar[StreamState] = StreamState.READING


@dataclass(slots=True)
class Refused:
    """REFUSED: nothing is read, so nothing is kept."""

    state: ClassVar[StreamState] = StreamState.REFUSED


@dataclass(slots=True)
class Ended:
    trailing: bool = False
    """Output after the end was reported (once)."""
    state: ClassVar[StreamState] = StreamState.ENDED


@dataclass(slots=True)
class Failed:
    error: ParseError
    state: ClassVar[StreamState] = StreamState.FAILED


Phase = Ready | Reading | Refused | Ended | Failed
