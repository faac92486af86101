"""Media for the plugin tests: a silent WAV file, and a user message of
content parts."""

from __future__ import annotations

import io
import wave
from typing import Any


def wav(seconds: float, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * round(seconds * rate))
    return buf.getvalue()


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "look:"}, *parts]}]}
