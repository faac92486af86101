"""Images: image content parts rendered as an embed.

Three ways an image is written, in this order:

* the request's ``image_prompts`` option gives each image's prompt, made by
  the model's processor (every prompt must match ``prompt``);
* the image's size is known (``width``/``height`` in the part, or read from a
  ``data:`` URL or a local file) and the template gives ``size_prompt``: the
  processor-style prompt, with as many pads as the processor's patch grid
  (``patch_size``, ``merge_size``, ``min_pixels``, ``max_pixels``) makes;
* otherwise the ``placeholder``.

Pixels are not in the tokens: parse gives back ``{"type": "image"}``, with
``width`` and ``height`` when the markup carries them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import OptionError, TemplateError
from .api import ContentExtension, Context
from .media import (
    MAX_PIXELS,
    Grid,
    PromptFormat,
    Settings,
    check_size,
    data_bytes,
    image_size,
    local_path,
    positive_int,
    prompt_int,
    read_file,
    reference,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..markup.sink import MarkupSink

_KEYS = ("placeholder", "part_types", "prompt", "size_prompt", "pad", "patch_size", "merge_size", "min_pixels",
         "max_pixels", "read_files")
_NEVER = "(?!)"


@dataclass(frozen=True, slots=True)
class ImageValue:
    width: int | None = None
    height: int | None = None


class ImageExtension(ContentExtension):
    name = "image"
    embeds = True

    def __init__(self, settings: Mapping[str, Any], where: str) -> None:
        s = Settings(settings, where, _KEYS)
        self.placeholder = s.text("placeholder")
        # "image" is the normal form's own spelling, whatever the template calls it.
        self.part_types, self.input_types = s.part_types("image", ["image"])
        raw = settings.get("prompt", _NEVER)
        if not isinstance(raw, str):
            raise TemplateError("prompt must be a regular expression string", location=f"{where}.prompt")
        try:
            self.prompt = re.compile(raw)
        except re.error as e:
            raise TemplateError(f"prompt is not a valid regular expression: {e}", location=f"{where}.prompt") from None
        self.read_files = s.flag("read_files", False)
        self.sized: PromptFormat | None = None
        self.grid: Grid | None = None
        self.markers = (self.placeholder,)
        if s.has("size_prompt"):
            self.sized = PromptFormat(s.text("size_prompt"), s.text("pad"), {"width": "[0-9]+", "height": "[0-9]+"},
                                      where)
            self.grid = Grid.from_settings(s)
            self.markers = (self.placeholder, self.sized.pad)

    # -- render --------------------------------------------------------------------

    def prepare(self, part: Mapping[str, Any]) -> ImageValue:
        if self.sized is None:
            return ImageValue()
        w, h = positive_int(part, "width"), positive_int(part, "height")
        if (w is None) != (h is None):
            raise ValueError("give both width and height, or neither")
        if w is not None and h is not None:
            return ImageValue(*check_size(w, h))
        ref = reference(part, ("image_url", "image", "url"))
        if ref is None:
            return ImageValue()
        data = data_bytes(ref)
        if data is not None:
            return ImageValue(*image_size(data))
        path = local_path(ref, self.read_files)
        if path is not None:
            return ImageValue(*image_size(read_file(path, "image"), f"file {path}"))
        return ImageValue()  # a remote URL: its size is unknown here

    def prompt_for(self, width: int, height: int) -> str:
        assert self.sized is not None and self.grid is not None
        return self.sized.render(self.grid.tokens(width, height), width=str(width), height=str(height))

    def render(self, value: ImageValue, out: MarkupSink, ctx: Context) -> None:
        prompts = getattr(ctx.options, "image_prompts", None)
        if prompts is not None:
            st = ctx.of(self.name)
            used = st.get("used", 0)
            st["used"] = used + 1
            out.embed(prompts[used] if used < len(prompts) else "")
        elif value.width is not None and value.height is not None and self.sized is not None:
            out.embed(self.prompt_for(value.width, value.height))
        else:
            out.embed(self.placeholder)

    def finish_render(self, ctx: Context) -> None:
        prompts = getattr(ctx.options, "image_prompts", None)
        used = ctx.of(self.name).get("used", 0)
        if prompts is not None and used != len(prompts):
            raise OptionError(f"image prompt count does not match the image parts ({len(prompts)} prompts, "
                              f"{used} images)", option="image_prompts")

    # -- normal form -------------------------------------------------------------------

    def normal(self, value: ImageValue, ctx: Context) -> dict[str, Any]:
        part: dict[str, Any] = {"type": "image"}
        if getattr(ctx.options, "image_prompts", None) is not None:
            ctx.of(self.name).setdefault("parts", []).append(part)
        elif value.width is not None and self.sized is not None:
            part["width"], part["height"] = value.width, value.height
        return part

    def finish_normal(self, request: dict[str, Any], ctx: Context) -> None:
        # Prompts that are exactly what this template computes for their size
        # read back as sized parts (see finish_parse): say so here too.
        parts = ctx.of(self.name).get("parts", [])
        prompts = request.get("image_prompts")
        if not prompts or len(prompts) != len(parts):
            return
        sizes = [self.own_size(p) for p in prompts]
        if all(s is not None for s in sizes):
            for part, size in zip(parts, sizes):
                assert size is not None
                part["width"], part["height"] = size
            del request["image_prompts"]

    # -- parse -------------------------------------------------------------------------

    def own_size(self, raw: str) -> tuple[int, int] | None:
        """The size of a prompt this template would write for that size."""
        if self.sized is None:
            return None
        got = self.sized.read(raw)
        if got is None:
            return None
        w, h = prompt_int(got[0]["width"]), prompt_int(got[0]["height"])
        assert self.grid is not None
        # A size render refuses is not one this template writes.
        if w is None or h is None or w <= 0 or h <= 0 or w * h > MAX_PIXELS:
            return None
        if got[1] != self.grid.tokens(w, h) or raw != self.prompt_for(w, h):
            return None
        return w, h

    def read_embed(self, raw: str, ctx: Context) -> dict[str, Any] | None:
        st = ctx.of(self.name)
        if raw == self.placeholder:
            st["placeholders"] = st.get("placeholders", 0) + 1
            return {"type": "image"}
        if self.prompt.match(raw) or self.own_size(raw) is not None:
            part: dict[str, Any] = {"type": "image"}
            st.setdefault("prompts", []).append((part, raw))
            return part
        return None

    def finish_parse(self, request: dict[str, Any], ctx: Context) -> None:
        st = ctx.of(self.name)
        prompts: list[tuple[dict[str, Any], str]] = st.get("prompts", [])
        if not prompts:
            return
        sizes = [self.own_size(raw) for _, raw in prompts]
        if all(s is not None for s in sizes):
            for (part, _), size in zip(prompts, sizes):
                assert size is not None
                part["width"], part["height"] = size
            return
        if st.get("placeholders"):
            ctx.problem("image placeholders and expanded image prompts in one conversation", "mixed-images")
        request["image_prompts"] = [raw for _, raw in prompts]

    def strategy(self) -> SearchStrategy[dict[str, Any]]:
        from hypothesis import strategies as st

        urls = ("https://example.com/a.png",)
        plain = st.builds(lambda t, how, url: {"type": t} if how == 0 else {"type": t, t: {"url": url}},
                          st.sampled_from(self.input_types), st.integers(0, 1), st.sampled_from(urls))
        if self.sized is None:
            return plain
        sized = st.builds(lambda w, h: {"type": "image", "width": w, "height": h},
                          st.integers(1, 5000), st.integers(1, 5000))
        return st.one_of(plain, sized)


class ImagePlugin:
    name = "image"

    def configure(self, settings: Mapping[str, Any], where: str) -> ImageExtension:
        return ImageExtension(settings, where)


plugin = ImagePlugin()
