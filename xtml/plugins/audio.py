"""Audio: audio content parts rendered as an embed with one pad per audio
token, ``frame_rate`` tokens per second.

A part gives its length as ``duration`` (seconds), or carries WAV data
(OpenAI's ``{"type": "input_audio", "input_audio": {"data": …, "format":
"wav"}}``, or a ``data:`` URL / local ``.wav`` path in ``audio``), whose
length is read. The samples are not in the tokens: parse gives back
``{"type": "audio", "duration": SECONDS}`` as the markup writes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .api import Context
from .media import (
    MediaExtension,
    MediaPlugin,
    Settings,
    b64,
    data_bytes,
    local_path,
    positive_number,
    read_file,
    reference,
    show_digits,
    wav_seconds,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


class AudioExtension(MediaExtension[str]):
    """A prepared part is its length in seconds as the prompt writes it."""

    name = "audio"
    keys = ("part_types", "prompt", "pad", "frame_rate", "decimals", "max_seconds", "read_files")
    default_types = ("audio", "input_audio")
    fields: ClassVar[dict[str, str]] = {"seconds": r"[0-9]+(?:\.[0-9]+)?"}

    def setup(self, s: Settings) -> None:
        self.read_files = s.flag("read_files", False)
        self.decimals = s.num("decimals", 2, integer=True, minimum=0, maximum=17)
        self.frame_rate = s.num("frame_rate", 12.5, minimum=1e-9, maximum=1e6)
        self.max_seconds = s.num("max_seconds", 3600, minimum=1e-9, maximum=1e7)

    def seconds(self, duration: float) -> str:
        return f"{duration:.{self.decimals}f}"

    def pads(self, value: str) -> int:
        return int(max(1, math.ceil(float(value) * self.frame_rate - 1e-9)))

    def prepare(self, part: Mapping[str, Any]) -> str:
        duration = positive_number(part, "duration")
        inner = part.get("input_audio")
        if duration is None and isinstance(inner, Mapping):
            duration = positive_number(inner, "duration")
            if duration is None and isinstance(inner.get("data"), str):
                fmt = inner.get("format", "wav")
                if fmt != "wav":
                    raise ValueError(f"the length of {fmt!r} audio cannot be read; give its duration")
                duration = wav_seconds(b64(inner["data"]))
        if duration is None:
            ref = reference(part, ("audio", "audio_url", "url"))
            if ref is not None:
                data = data_bytes(ref)
                path = local_path(ref, self.read_files) if data is None else None
                if data is None and path is not None and path.suffix.lower() == ".wav":
                    data = read_file(path, "audio")
                if data is not None:
                    duration = wav_seconds(data)
        if duration is None:
            raise ValueError("an audio part needs its duration (seconds), or WAV data to read it from")
        if duration > self.max_seconds:
            raise ValueError(f"audio of {duration:g} s is longer than this template's max_seconds "
                             f"({self.max_seconds:g})")
        s = self.seconds(duration)
        if float(s) <= 0:
            raise ValueError(f"audio of {duration:g} s rounds to no time at all")
        return s

    def prompt_fields(self, value: str) -> dict[str, str]:
        return {"seconds": value}

    def from_fields(self, fields: dict[str, str]) -> str:
        seconds = fields["seconds"]
        # Read back only what render writes: a length past max_seconds (or
        # past a float's range) would not render again.
        if not 0 < float(seconds) <= self.max_seconds:
            raise ValueError(f"audio of {show_digits(seconds)} s: a length is more than 0 and at most this "
                             f"template's max_seconds ({self.max_seconds:g})")
        return seconds

    def describe(self, value: str) -> str:
        return f"audio of {value} s"

    def normal(self, value: str, ctx: Context) -> dict[str, Any]:
        return {"type": "audio", "duration": float(value)}

    def strategy(self) -> SearchStrategy[dict[str, Any]]:
        from hypothesis import strategies as st

        durations = st.floats(0.05, min(60.0, float(self.max_seconds)), allow_nan=False)
        return st.one_of(
            st.builds(lambda t, d: {"type": t, "duration": d}, st.sampled_from(self.input_types), durations),
            st.builds(lambda frames: {"type": "input_audio", "input_audio": {"data": _wav(frames), "format": "wav"}},
                      st.integers(800, 48_000)),
        )


def _wav(frames: int) -> str:
    """Base64 of a silent 16 kHz mono WAV of ``frames`` frames."""
    import base64
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(b"\0\0" * frames)
    return base64.b64encode(buf.getvalue()).decode("ascii")


plugin = MediaPlugin(AudioExtension)
