"""Shared by the media plugins: settings checks, the processor-style patch
grid, prompt formats that render and read back, and reading media sizes."""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..errors import TemplateError


class Settings:
    """Checked access to one ``[plugins.NAME]`` table."""

    def __init__(self, settings: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> None:
        self.s = settings
        self.where = where
        for k in settings:
            if k not in allowed:
                raise TemplateError(f"unknown key {k!r} (this plugin takes {', '.join(allowed)})", location=where)

    def text(self, key: str, default: str | None = None) -> str:
        v = self.s.get(key, default)
        if not isinstance(v, str) or not v:
            raise TemplateError(f"{key} must be a non-empty string", location=f"{self.where}.{key}")
        return v

    def types(self, key: str, default: list[str]) -> tuple[str, ...]:
        v = self.s.get(key, default)
        if not isinstance(v, list) or not v or not all(isinstance(t, str) and t for t in v):
            raise TemplateError(f"{key} must be a list of non-empty strings", location=f"{self.where}.{key}")
        if any(t in ("text", "input_text") for t in v):
            raise TemplateError(f"{key} cannot claim the text part types", location=f"{self.where}.{key}")
        return tuple(v)

    def part_types(self, own: str, default: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(part types the plugin owns, led by ``own``; the types it reads)
        from the ``part_types`` setting."""
        types = self.types("part_types", default)
        return (own, *(t for t in types if t != own)), types

    def num(self, key: str, default: float | None = None, *, integer: bool = False, minimum: float = 0) -> Any:
        v = self.s.get(key, default)
        ok = isinstance(v, int) if integer else isinstance(v, int | float)
        if not ok or isinstance(v, bool) or v is None or v < minimum or (not integer and not math.isfinite(v)):
            kind = "an integer" if integer else "a number"
            raise TemplateError(f"{key} must be {kind} ≥ {minimum}", location=f"{self.where}.{key}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.s.get(key, default)
        if type(v) is not bool:
            raise TemplateError(f"{key} must be true or false", location=f"{self.where}.{key}")
        return v

    def has(self, key: str) -> bool:
        return key in self.s


@dataclass(frozen=True, slots=True)
class Grid:
    """How a processor cuts an image into patches and merges them into tokens."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    @classmethod
    def from_settings(cls, s: Settings) -> Grid:
        g = cls(s.num("patch_size", 14, integer=True, minimum=1), s.num("merge_size", 2, integer=True, minimum=1),
                s.num("min_pixels", 56 * 56, integer=True, minimum=1),
                s.num("max_pixels", 28 * 28 * 1280, integer=True, minimum=1))
        if g.min_pixels > g.max_pixels:
            raise TemplateError("min_pixels must not exceed max_pixels", location=f"{s.where}.min_pixels")
        return g

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """The size the processor resizes to: multiples of patch * merge,
        aspect kept, pixel count within [min_pixels, max_pixels]."""
        f = self.patch_size * self.merge_size
        h = max(f, round(height / f) * f)
        w = max(f, round(width / f) * f)
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h = max(f, math.floor(height / beta / f) * f)
            w = max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h = math.ceil(height * beta / f) * f
            w = math.ceil(width * beta / f) * f
        # A very thin image keeps its short side at one cell: shrink the long
        # side so the pixel bound still holds, whatever the aspect ratio.
        if h * w > self.max_pixels:
            if w >= h:
                w = max(f, self.max_pixels // h // f * f)
            else:
                h = max(f, self.max_pixels // w // f * f)
        return w, h

    def tokens(self, width: int, height: int) -> int:
        """Pad tokens of one image (or video frame) of this size."""
        w, h = self.resize(width, height)
        return (w // self.patch_size) * (h // self.patch_size) // (self.merge_size * self.merge_size)


_FIELD = re.compile(r"\{([a-z]+)\}")


class PromptFormat:
    """A prompt written with ``{field}`` placeholders and ``{pads}``, e.g.
    ``<|media_begin|>audio {seconds}s<|media_content|>{pads}<|media_end|>``.
    It renders and, through a pattern built from it, reads back."""

    def __init__(self, source: str, pad: str, fields: dict[str, str], where: str) -> None:
        self.source = source
        self.pad = pad
        names = _FIELD.findall(source)
        want = {*fields, "pads"}
        if set(names) != want or len(names) != len(want):
            raise TemplateError(f"prompt must hold each of {', '.join('{' + n + '}' for n in sorted(want))} once",
                                location=f"{where}.prompt")
        rx: list[str] = []
        pos = 0
        for m in _FIELD.finditer(source):
            rx.append(re.escape(source[pos:m.start()]))
            name = m.group(1)
            rx.append(f"(?P<pads>(?:{re.escape(pad)})*)" if name == "pads" else f"(?P<{name}>{fields[name]})")
            pos = m.end()
        rx.append(re.escape(source[pos:]))
        self.pattern = re.compile("".join(rx), re.DOTALL)

    def render(self, pads: int, **values: str) -> str:
        return _FIELD.sub(lambda m: self.pad * pads if m.group(1) == "pads" else values[m.group(1)], self.source)

    def read(self, raw: str) -> tuple[dict[str, str], int] | None:
        m = self.pattern.fullmatch(raw)
        if m is None:
            return None
        d = m.groupdict()
        pads = d.pop("pads")
        return d, len(pads) // len(self.pad)


# -- media data ----------------------------------------------------------------------

def data_bytes(url: str) -> bytes | None:
    """The bytes of a base64 ``data:`` URL, None for any other string."""
    if not url.startswith("data:"):
        return None
    head, sep, body = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ValueError("a data: URL must be base64-encoded")
    return b64(body)


def b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("media data is not valid base64") from None


def local_path(ref: str, allowed: bool) -> Path | None:
    """A local file named by ``ref`` (a path or a file:// URL), else None.
    Reading files named in requests is off unless the template allows it:
    a served model must not let a request probe the server's files."""
    if not allowed:
        return None
    if ref.startswith("file://"):
        return Path(unquote(urlparse(ref).path))
    if "://" in ref or ref.startswith("data:"):
        return None
    return Path(ref)


def image_size(data: bytes | Path) -> tuple[int, int]:
    """Width and height read from an image's header (Pillow)."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ValueError("reading an image's size needs Pillow: pip install 'xtml[media]', or give width and "
                         "height in the part") from None
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as im:
            return int(im.width), int(im.height)
    except FileNotFoundError:
        raise ValueError(f"image file not found: {data!s}") from None
    except UnidentifiedImageError:
        what = "the data" if isinstance(data, bytes) else f"file {data!s}"
        raise ValueError(f"{what} is not an image format Pillow reads") from None
    except OSError as e:
        raise ValueError(f"cannot read the image: {e.strerror or e}") from None


def wav_seconds(data: bytes) -> float:
    """Duration of WAV audio (the standard library's reader)."""
    import wave

    try:
        with wave.open(io.BytesIO(data)) as w:
            rate = w.getframerate()
            if rate <= 0:
                raise ValueError("WAV audio with a zero frame rate")
            return float(w.getnframes()) / float(rate)
    except (wave.Error, EOFError) as e:
        raise ValueError(f"not readable WAV audio: {str(e) or 'the data ends before its header does'}") from None


def positive_int(part: Mapping[str, Any], key: str) -> int | None:
    v = part.get(key)
    if v is None:
        return None
    if type(v) is not int or v <= 0:
        raise ValueError(f"{key} must be a positive integer")
    return v


def positive_number(part: Mapping[str, Any], key: str) -> float | None:
    v = part.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{key} must be a positive number")
    return float(v)


def reference(part: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    """The URL or path of a part: ``part[k]`` or ``part[k]["url"]`` for the
    first key present."""
    for k in keys:
        v = part.get(k)
        if isinstance(v, Mapping):
            v = v.get("url")
        if isinstance(v, str) and v:
            return v
    return None
