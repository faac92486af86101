"""Video: video content parts rendered as an embed with, for each sampled
frame, as many pads as the processor's patch grid gives a frame of its size.

A part gives ``width`` and ``height`` and either ``frames`` (already sampled)
or ``duration`` (seconds), from which ``sample_fps`` frames per second are
taken, at most ``max_frames``. The frames are not in the tokens: parse gives
back ``{"type": "video", "frames": F, "width": W, "height": H}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .api import Context
from .media import (
    MAX_PIXELS,
    Grid,
    MediaExtension,
    MediaPlugin,
    Settings,
    check_size,
    positive_int,
    positive_number,
    prompt_int,
    show_digits,
    show_int,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

Frames = tuple[int, int, int]
"""A prepared part: frames, width, height."""


class VideoExtension(MediaExtension[Frames]):
    name = "video"
    keys = ("part_types", "prompt", "pad", "patch_size", "merge_size", "min_pixels", "max_pixels", "sample_fps",
            "max_frames")
    default_types = ("video", "video_url")
    fields: ClassVar[dict[str, str]] = {"frames": "[0-9]+", "width": "[0-9]+", "height": "[0-9]+"}

    def setup(self, s: Settings) -> None:
        self.grid = Grid.from_settings(s)
        self.sample_fps = s.num("sample_fps", 2.0, minimum=1e-9, maximum=1e4)
        self.max_frames = s.num("max_frames", 64, integer=True, minimum=1, maximum=1 << 20)

    def frames_for(self, duration: float) -> int:
        # duration is finite, but times sample_fps it may not be.
        return int(max(1, min(self.max_frames, round(min(duration * self.sample_fps, 1e18)))))

    def prepare(self, part: Mapping[str, Any]) -> Frames:
        w, h = positive_int(part, "width"), positive_int(part, "height")
        if w is None or h is None:
            raise ValueError("a video part needs width and height (of its frames)")
        check_size(w, h, "a video frame")
        frames = positive_int(part, "frames")
        if frames is None:
            duration = positive_number(part, "duration")
            if duration is None:
                raise ValueError("a video part needs frames (sampled) or duration (seconds)")
            frames = self.frames_for(duration)
        if frames > self.max_frames:
            raise ValueError(f"{show_int(frames)} frames is more than this template's max_frames "
                             f"({self.max_frames})")
        return frames, w, h

    def pads(self, value: Frames) -> int:
        frames, width, height = value
        return frames * self.grid.tokens(width, height)

    def prompt_fields(self, value: Frames) -> dict[str, str]:
        f, w, h = value
        return {"frames": str(f), "width": str(w), "height": str(h)}

    def from_fields(self, fields: dict[str, str]) -> Frames:
        f, w, h = prompt_int(fields["frames"]), prompt_int(fields["width"]), prompt_int(fields["height"])
        # Read back only what render writes: a frame count or size it refuses
        # would not render again (and a huge one would overflow the grid).
        if f is None or w is None or h is None or not 0 < f <= self.max_frames or min(w, h) <= 0 \
                or w * h > MAX_PIXELS:
            raise ValueError(f"video {show_digits(fields['frames'])}x{show_digits(fields['width'])}x"
                             f"{show_digits(fields['height'])}: a video has 1 to {self.max_frames} frames of 1 to "
                             f"{MAX_PIXELS:,} pixels")
        return f, w, h

    def describe(self, value: Frames) -> str:
        return "video {}x{}x{}".format(*value)

    def normal(self, value: Frames, ctx: Context) -> dict[str, Any]:
        f, w, h = value
        return {"type": "video", "frames": f, "width": w, "height": h}

    def strategy(self) -> SearchStrategy[dict[str, Any]]:
        from hypothesis import strategies as st

        size = st.integers(16, 1920)
        return st.one_of(
            st.builds(lambda t, f, w, h: {"type": t, "frames": f, "width": w, "height": h},
                      st.sampled_from(self.input_types), st.integers(1, min(8, self.max_frames)), size, size),
            st.builds(lambda d, w, h: {"type": "video", "duration": d, "width": w, "height": h},
                      st.floats(0.1, 20.0), size, size),
        )


plugin = MediaPlugin(VideoExtension)
