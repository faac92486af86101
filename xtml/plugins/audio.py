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
from typing import TYPE_CHECKING, Any

from .api import ContentExtension, Context
from .media import (
    PromptFormat,
    Settings,
    b64,
    data_bytes,
    local_path,
    positive_number,
    read_file,
    reference,
    wav_seconds,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..markup.sink import MarkupSink

_KEYS = ("part_types", "prompt", "pad", "frame_rate", "decimals", "max_seconds", "read_files")


class AudioExtension(ContentExtension):
    name = "audio"
    embeds = True

    def __init__(self, settings: Mapping[str, Any], where: str) -> None:
        s = Settings(settings, where, _KEYS)
        self.part_types, self.input_types = s.part_types("audio", ["audio", "input_audio"])
        self.read_files = s.flag("read_files", False)
        self.decimals = s.num("decimals", 2, integer=True, minimum=0, maximum=17)
        self.frame_rate = s.num("frame_rate", 12.5, minimum=1e-9, maximum=1e6)
        self.max_seconds = s.num("max_seconds", 3600, minimum=1e-9, maximum=1e7)
        self.format = PromptFormat(s.text("prompt"), s.text("pad"), {"seconds": r"[0-9]+(?:\.[0-9]+)?"}, where)
        self.markers = (self.format.pad,)

    def seconds(self, duration: float) -> str:
        return f"{duration:.{self.decimals}f}"

    def pads(self, seconds: str) -> int:
        return int(max(1, math.ceil(float(seconds) * self.frame_rate - 1e-9)))

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

    def jinja(self) -> str | None:
        # The prompt comes from the audio itself (its length),
        # which a Jinja template cannot read: the exported template refuses the
        # part rather than render another prompt.
        return ("{{ raise_exception('audio parts need the prompt xtml computes from the media, which a Jinja "
                "template cannot: render with xtml (at messages[' ~ mi ~ '].' ~ where ~ ')') }}")

    def render(self, value: str, out: MarkupSink, ctx: Context) -> None:
        out.embed(self.format.render(self.pads(value), seconds=value))

    def normal(self, value: str, ctx: Context) -> dict[str, Any]:
        return {"type": "audio", "duration": float(value)}

    def read_embed(self, raw: str, ctx: Context) -> dict[str, Any] | None:
        got = self.format.read(raw)
        if got is None:
            return None
        seconds, pads = got[0]["seconds"], got[1]
        # Read back only what render writes: a length past max_seconds (or
        # past a float's range) would not render again.
        if not 0 < float(seconds) <= self.max_seconds:
            shown = seconds if len(seconds) <= 24 else f"{seconds[:24]}… ({len(seconds):,} digits)"
            raise ValueError(f"audio of {shown} s: a length is more than 0 and at most this template's "
                             f"max_seconds ({self.max_seconds:g})")
        if pads != self.pads(seconds):
            ctx.problem(f"audio of {seconds} s has {pads} pads, expected {self.pads(seconds)}", "bad-embed")
        return {"type": "audio", "duration": float(seconds)}

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


class AudioPlugin:
    name = "audio"

    def configure(self, settings: Mapping[str, Any], where: str) -> AudioExtension:
        return AudioExtension(settings, where)


plugin = AudioPlugin()
