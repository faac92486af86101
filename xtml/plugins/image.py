"""Images: image content parts rendered as an embed.

``prompt`` is the format of a processor-made image prompt, e.g.
``<|media_begin|>image {width}x{height}<|media_content|>{pads}<|media_end|>``
with ``pad`` repeated where ``{pads}`` is. Three ways an image is written, in
this order:

* the request's ``image_prompts`` option gives each image's prompt, made by
  the model's processor (every prompt must be of the ``prompt`` format);
* the image's size is known (``width``/``height`` in the part, or read from a
  ``data:`` URL or a local file) and the template sets ``write_prompts``: the
  ``prompt`` format, with as many pads as the processor's patch grid
  (``patch_size``, ``merge_size``, ``min_pixels``, ``max_pixels``) makes;
* otherwise the ``placeholder``.

Pixels are not in the tokens: parse gives back ``{"type": "image"}``, with
``width`` and ``height`` when the markup carries them.
"""

from __future__ import annotations

import json
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

_GRID_KEYS = ("patch_size", "merge_size", "min_pixels", "max_pixels")
_KEYS = ("placeholder", "part_types", "prompt", "pad", "write_prompts", *_GRID_KEYS, "read_files")
_NEVER = re.compile("(?!)")
_SIZE_FIELDS = {"width": "[0-9]+", "height": "[0-9]+"}
_FORMAT_FIELD = re.compile(r"\{(?:width|height|pads)\}")


@dataclass(frozen=True, slots=True)
class ImageValue:
    width: int | None = None
    height: int | None = None


class ImageExtension(ContentExtension):
    name = "image"
    embeds = True
    # Always set by this plugin (the API allows None).
    placeholder: str
    prompt_pattern: re.Pattern[str]

    def __init__(self, settings: Mapping[str, Any], where: str) -> None:
        if "size_prompt" in settings:
            raise TemplateError("size_prompt is now prompt: write its format as prompt, and set write_prompts = true",
                                location=f"{where}.size_prompt")
        s = Settings(settings, where, _KEYS)
        self.placeholder = s.text("placeholder")
        # "image" is the normal form's own spelling, whatever the template calls it.
        self.part_types, self.input_types = s.part_types("image", ["image"])
        self.format: PromptFormat | None = None
        if s.has("prompt"):
            source = s.text("prompt")
            _refuse_regex(source, settings.get("pad"), where)
            self.format = PromptFormat(source, s.text("pad"), _SIZE_FIELDS, where)
        elif s.has("pad"):
            raise TemplateError("pad goes with prompt, which this table does not give", location=f"{where}.pad")
        # The chat layer vets the image_prompts option with it before rendering.
        self.prompt_pattern = self.format.pattern if self.format else _NEVER
        self.read_files = s.flag("read_files", False)
        self.grid: Grid | None = None
        if s.flag("write_prompts", False):
            if self.format is None:
                raise TemplateError("write_prompts needs prompt (and pad)", location=f"{where}.write_prompts")
            self.grid = Grid.from_settings(s)
        else:
            for k in _GRID_KEYS:
                if s.has(k):
                    raise TemplateError(f"{k} sizes the prompts written with write_prompts = true, which this table "
                                        "does not set", location=f"{where}.{k}")
        self.markers = (self.placeholder, self.format.pad) if self.format else (self.placeholder,)

    # -- render --------------------------------------------------------------------

    def prepare(self, part: Mapping[str, Any]) -> ImageValue:
        if self.grid is None:
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
        assert self.format is not None and self.grid is not None
        return self.format.render(self.grid.tokens(width, height), width=str(width), height=str(height))

    def render(self, value: ImageValue, out: MarkupSink, ctx: Context) -> None:
        prompts = getattr(ctx.options, "image_prompts", None)
        if prompts is not None:
            st = ctx.of(self.name)
            used = st.get("used", 0)
            st["used"] = used + 1
            out.embed(prompts[used] if used < len(prompts) else "")
        elif value.width is not None and value.height is not None and self.grid is not None:
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
        elif value.width is not None and self.grid is not None:
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
        if self.format is None or self.grid is None:
            return None
        got = self.format.read(raw)
        if got is None:
            return None
        w, h = prompt_int(got[0]["width"]), prompt_int(got[0]["height"])
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
        if self.format is not None and self.format.read(raw) is not None:
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
        if self.grid is None:
            return plain
        sized = st.builds(lambda w, h: {"type": "image", "width": w, "height": h},
                          st.integers(1, 5000), st.integers(1, 5000))
        return st.one_of(plain, sized)


# The regular expression a template once gave as prompt, in the one shape
# that has a format equivalent: literal text, the two numbers as named
# groups, the pads as one repeated group, maybe anchored at both ends.
_OLD_PART = re.compile(r"\(\?P<(width|height)>[^()]*\)|\(\?:([^()]+)\)\*|(\\[^A-Za-z0-9]|[^\\()\[\]{}*+?|.^$])",
                       re.DOTALL)
_LITERAL = re.compile(r"(?:\\[^A-Za-z0-9]|[^\\()\[\]{}*+?|.^$])+", re.DOTALL)
# Markers hold "|" and maybe "?": neither tells a regular expression apart.
_REGEX_SIGNS = re.compile(r"\\.|\(\?|[\[\]*+^$]")


def _refuse_regex(source: str, pad: Any, where: str) -> None:
    """Refuse a prompt written as a regular expression, saying what format
    to write instead."""
    if _FORMAT_FIELD.search(source) or not _REGEX_SIGNS.search(source):
        return
    got = _as_format(source)
    if got is None:
        fix = ("write the prompt as the processor writes it, with {width}, {height} and {pads} where the numbers "
               "and the pads go, and the pad marker as pad")
    elif isinstance(pad, str) and pad != got[1]:
        fix = f"write prompt = {_toml(got[0])}, and pad = {_toml(got[1])} (not {_toml(pad)})"
    else:
        fix = f"write prompt = {_toml(got[0])} and pad = {_toml(got[1])}"
    raise TemplateError(f"prompt is a format, not a regular expression: {fix}", location=f"{where}.prompt")


def _as_format(source: str) -> tuple[str, str] | None:
    """The format and pad a regular expression of the one convertible shape
    stands for, or None."""
    body = source.removeprefix("^")
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    out: list[str] = []
    pad: str | None = None
    pos = 0
    while pos < len(body):
        m = _OLD_PART.match(body, pos)
        if m is None:
            return None
        field, pads, char = m.groups()
        if field:
            out.append("{" + field + "}")
        elif pads:
            if pad is not None or not _LITERAL.fullmatch(pads):
                return None
            pad = _unescape(pads)
            out.append("{pads}")
        else:
            out.append(_unescape(char))
        pos = m.end()
    fmt = "".join(out)
    if pad is None or sorted(_FORMAT_FIELD.findall(fmt)) != ["{height}", "{pads}", "{width}"]:
        return None
    return fmt, pad


def _unescape(literal: str) -> str:
    return re.sub(r"\\(.)", r"\1", literal, flags=re.DOTALL)


def _toml(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class ImagePlugin:
    name = "image"

    def configure(self, settings: Mapping[str, Any], where: str) -> ImageExtension:
        return ImageExtension(settings, where)


plugin = ImagePlugin()
