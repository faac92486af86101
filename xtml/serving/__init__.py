"""Serving: what a model generates, read as it streams."""

from .stream import StreamEvent, StreamParser

__all__ = ["StreamEvent", "StreamParser"]
