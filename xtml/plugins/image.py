"""Images: image content parts rendered as an embed.

Without sizes the model sees a placeholder; a processor that knows the image
passes the expanded prompt instead (the ``image_prompts`` option), which must
match ``prompt``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import TemplateError


@dataclass(frozen=True, slots=True)
class ImageSettings:
    placeholder: str
    """What an image renders as when no prompt is given."""
    part_types: tuple[str, ...]
    """Content part ``type`` values that are images."""
    prompt: re.Pattern[str]
    """What a processor-made image prompt must match."""


_KEYS = ("placeholder", "part_types", "prompt")


class ImagePlugin:
    name = "image"

    def configure(self, settings: Mapping[str, Any], where: str) -> ImageSettings:
        for k in settings:
            if k not in _KEYS:
                raise TemplateError(f"unknown key {k!r} (image takes {', '.join(_KEYS)})", location=where)
        ph = settings.get("placeholder")
        if not isinstance(ph, str) or not ph:
            raise TemplateError("placeholder must be a non-empty string", location=f"{where}.placeholder")
        types = settings.get("part_types", ["image"])
        if not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types):
            raise TemplateError("part_types must be a list of non-empty strings", location=f"{where}.part_types")
        if any(t in ("text", "input_text") for t in types):
            raise TemplateError("part_types cannot claim the text part types", location=f"{where}.part_types")
        raw = settings.get("prompt", "(?!)")
        if not isinstance(raw, str):
            raise TemplateError("prompt must be a regular expression string", location=f"{where}.prompt")
        try:
            prompt = re.compile(raw)
        except re.error as e:
            raise TemplateError(f"prompt is not a valid regular expression: {e}", location=f"{where}.prompt") from None
        return ImageSettings(ph, tuple(types), prompt)


plugin = ImagePlugin()
