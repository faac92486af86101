"""Shared by the media plugins: settings checks, the processor-style patch
grid, prompt formats that render and read back, reading media sizes, and
the shell of a plugin whose part is a prompt of pads (:class:`MediaExtension`)."""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import re
import stat
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar
from urllib.parse import unquote, urlparse

from ..errors import TemplateError
from .api import ContentExtension, Context

if TYPE_CHECKING:
    from ..markup.sink import MarkupSink


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

    def num(self, key: str, default: float | None = None, *, integer: bool = False, minimum: float = 0,
            maximum: float = 1e9) -> Any:
        """A number in [minimum, maximum]. The bound keeps the plugins'
        arithmetic (sizes times rates, in floats) finite."""
        v = self.s.get(key, default)
        ok = isinstance(v, int) if integer else isinstance(v, int | float)
        if not ok or isinstance(v, bool) or v is None or not minimum <= v <= maximum:
            kind = "an integer" if integer else "a number"
            raise TemplateError(f"{key} must be {kind} from {minimum:g} to {maximum:g}", location=f"{self.where}.{key}")
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
        g = cls(s.num("patch_size", 14, integer=True, minimum=1, maximum=MAX_SIDE),
                s.num("merge_size", 2, integer=True, minimum=1, maximum=MAX_SIDE),
                s.num("min_pixels", 56 * 56, integer=True, minimum=1, maximum=MAX_PIXELS),
                s.num("max_pixels", 28 * 28 * 1280, integer=True, minimum=1, maximum=MAX_PIXELS))
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


def _numeric_edge(text: str) -> bool:
    return text[:1].isdigit() or text[:1] == "."


class PromptFormat:
    """A prompt written with ``{field}`` placeholders and ``{pads}``, e.g.
    ``<|media_begin|>audio {seconds}s<|media_content|>{pads}<|media_end|>``.
    It renders and, through a pattern built from it, reads back.

    ``fields`` gives each field's pattern: digits, maybe with a decimal
    point. Unlike a regular expression a template would write, the pattern
    reads every prompt one way only, in time linear in its length: where a
    number ends is never in doubt, because what follows it cannot start with
    a digit or a point."""

    def __init__(self, source: str, pad: str, fields: dict[str, str], where: str) -> None:
        self.source = source
        self.pad = pad
        names = _FIELD.findall(source)
        want = {*fields, "pads"}
        if set(names) != want or len(names) != len(want):
            raise TemplateError(f"prompt must hold each of {', '.join('{' + n + '}' for n in sorted(want))} once",
                                location=f"{where}.prompt")
        if _numeric_edge(pad):
            raise TemplateError("pad must not start with a digit or a point", location=f"{where}.pad")
        rx: list[str] = []
        pos = 0
        marks = list(_FIELD.finditer(source))
        for i, m in enumerate(marks):
            name = m.group(1)
            nxt = marks[i + 1] if i + 1 < len(marks) else None
            after = source[m.end():nxt.start() if nxt else len(source)]
            # Right after a number: text, the pads (whose pad starts with
            # neither), or the end.
            if name != "pads" and (_numeric_edge(after) or (not after and nxt is not None and nxt.group(1) != "pads")):
                raise TemplateError(f"in prompt, {{{name}}} must be followed by text that does not start with a digit "
                                    "or a point, so that the number's end is plain", location=f"{where}.prompt")
            rx.append(re.escape(source[pos:m.start()]))
            rx.append(f"(?P<pads>(?:{re.escape(pad)})*)" if name == "pads" else f"(?P<{name}>{fields[name]})")
            pos = m.end()
        rx.append(re.escape(source[pos:]))
        # Anchored at the end too, so that match() and fullmatch() agree.
        self.pattern = re.compile("".join(rx) + r"\Z", re.DOTALL)

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

# The largest image (or video frame) xtml reads the size of or takes a size
# for: 2**26 pixels (8192 x 8192). Below Pillow's own threshold for a
# decompression bomb (89,478,485 pixels, where it warns), so Pillow's
# warnings never decide what is accepted.
MAX_PIXELS = 1 << 26
# A side, for settings that multiply into sizes (patch_size, merge_size).
MAX_SIDE = 1 << 16
# The largest local file read (when a template allows reading files): 64 MiB.
MAX_FILE_BYTES = 64 << 20


def check_size(width: int, height: int, what: str = "an image") -> tuple[int, int]:
    """``(width, height)``, refused (ValueError) when not positive or when
    the pixel count is past :data:`MAX_PIXELS`."""
    if width <= 0 or height <= 0:
        raise ValueError(f"{what} of {show_int(width)}x{show_int(height)} pixels has no pixels")
    if width * height > MAX_PIXELS:
        raise ValueError(f"{what} of {show_int(width)}x{show_int(height)} pixels is larger than xtml reads "
                         f"({MAX_PIXELS:,} pixels)")
    return width, height


def show_int(n: int) -> str:
    """An integer from a request, for a message: it may be too long to print
    (past Python's digit limit, str() raises)."""
    return str(n) if n.bit_length() <= 64 else f"(a {n.bit_length():,}-bit number)"


def prompt_int(text: str) -> int | None:
    """A whole number a prompt pattern matched (ASCII digits), or None when
    it has more digits than any size or count xtml writes."""
    return int(text) if len(text) <= 18 else None


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
    if ref[:7].lower() == "file://":
        url = urlparse(ref)
        # file://HOST/path names a file on another machine (a network share
        # on Windows); reading /path here instead would be another file.
        if url.netloc not in ("", "localhost"):
            raise ValueError(f"a file URL names a host ({url.netloc!r}); only local files are read")
        return Path(unquote(url.path))
    if "://" in ref or ref.startswith("data:"):
        return None
    return Path(ref)


class FileBytes(bytes):
    """Bytes read from a local file named in a request. A reader that cannot
    make sense of them (:func:`image_size`, :func:`wav_seconds`) raises
    :attr:`cannot`, the message of a file that cannot be read at all: a
    request must not learn that a file exists by being told it is not an
    image."""

    cannot: str


def read_file(path: Path, what: str) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_FILE_BYTES`.

    A device, a pipe or a folder is refused before anything is read (a
    link to /dev/zero would be read until memory runs out), and at most one
    byte past the cap is read, so a file that grows meanwhile is refused
    too. A missing file, one this process may not read, one that is not a
    regular file, one past the cap and (through :class:`FileBytes`) one
    whose bytes are not of its kind get the same message: the request
    learns no more about the server's files than that it cannot have this
    one."""
    message = (f"{what} file not found or not readable, larger than xtml reads ({MAX_FILE_BYTES:,} bytes) or not "
               f"{what} data xtml reads: {str(path)!r}")
    cannot = ValueError(message)
    # Without O_NONBLOCK, opening a FIFO waits for a writer; a tty must not
    # become the process's controlling terminal.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        raise cannot from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise cannot
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        raise cannot from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise cannot
    out = FileBytes(data)
    out.cannot = message
    return out


def image_size(data: bytes, what: str = "the data") -> tuple[int, int]:
    """Width and height read from an image's header (Pillow), checked by
    :func:`check_size`. Only the header is read: the pixels are never
    decoded. ``what`` names the data in messages."""
    try:
        return _image_size(data, what)
    except ValueError:
        if isinstance(data, FileBytes):
            raise ValueError(data.cannot) from None
        raise


def _image_size(data: bytes, what: str) -> tuple[int, int]:
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("reading an image's size needs Pillow: pip install 'xtml[media]', or give width and "
                         "height in the part") from None
    try:
        with Image.open(io.BytesIO(data)) as im:
            size = int(im.width), int(im.height)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Past Pillow's own limit, which is above ours: too large either way.
        raise ValueError(f"{what}: the image is larger than xtml reads ({MAX_PIXELS:,} pixels)") from None
    except Exception:
        # Pillow's format readers parse hostile bytes; besides OSError
        # (UnidentifiedImageError) some raise ValueError, struct.error or
        # worse on truncated or crafted headers.
        raise ValueError(f"{what} is not an image format Pillow reads") from None
    return check_size(*size)


def wav_seconds(data: bytes) -> float:
    """Duration of WAV audio (the standard library's reader)."""
    try:
        return _wav_seconds(data)
    except ValueError:
        if isinstance(data, FileBytes):
            raise ValueError(data.cannot) from None
        raise


def _wav_seconds(data: bytes) -> float:
    import wave

    try:
        with wave.open(io.BytesIO(data)) as w:
            rate = w.getframerate()
            frames = w.getnframes()
    except (wave.Error, EOFError) as e:
        raise ValueError(f"not readable WAV audio: {str(e) or 'the data ends before its header does'}") from None
    except Exception:
        # The reader trusts the header's chunk sizes and counts.
        raise ValueError("not readable WAV audio") from None
    if rate <= 0:
        raise ValueError("WAV audio with a zero frame rate")
    return float(frames) / float(rate)


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
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{key} must be a positive number")
    try:
        f = float(v)
    except OverflowError:  # an integer past a float's range
        raise ValueError(f"{key} must be a positive number a float can hold") from None
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"{key} must be a positive number")
    return f


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


def show_digits(text: str) -> str:
    """Digits a prompt pattern matched, for a message: cut when long."""
    return text if len(text) <= 24 else f"{text[:24]}… ({len(text):,} digits)"


# -- the shell of a media plugin ------------------------------------------------------

V = TypeVar("V")


class MediaExtension(ContentExtension, Generic[V]):
    """A content extension whose part renders as one embed: a prompt with
    fields computed from the media (``PromptFormat``) and a number of pads,
    both from the prepared value (a ``V``); read back, the prompt's fields
    give the value again and the pads are counted against it.

    A subclass names its settings (``keys``), its fields' patterns
    (``fields``) and its default part types, checks its own settings in
    :meth:`setup`, and says how a value is prepared, counted, written and
    read."""

    embeds = True
    keys: ClassVar[tuple[str, ...]]
    """The keys its ``[plugins.NAME]`` table may hold."""
    default_types: ClassVar[tuple[str, ...]]
    """The part types it reads when ``part_types`` is not set."""
    fields: ClassVar[dict[str, str]]
    """The prompt's fields and the pattern of each (see :class:`PromptFormat`)."""

    def __init__(self, settings: Mapping[str, Any], where: str) -> None:
        s = Settings(settings, where, self.keys)
        self.part_types, self.input_types = s.part_types(self.name, list(self.default_types))
        self.setup(s)
        self.format = PromptFormat(s.text("prompt"), s.text("pad"), self.fields, where)
        self.markers = (self.format.pad,)

    @abstractmethod
    def setup(self, s: Settings) -> None:
        """Read the plugin's own settings (all but part_types, prompt and pad)."""

    @abstractmethod
    def pads(self, value: V) -> int:
        """How many pads the prompt of ``value`` holds."""

    @abstractmethod
    def prompt_fields(self, value: V) -> dict[str, str]:
        """The prompt's fields for ``value``, as written."""

    @abstractmethod
    def from_fields(self, fields: dict[str, str]) -> V:
        """The value a read prompt's fields give; raises ValueError for one
        that :meth:`render` would not write."""

    @abstractmethod
    def describe(self, value: V) -> str:
        """``value`` in a message (``audio of 2.00 s``)."""

    def jinja(self) -> str | None:
        # The prompt comes from the media itself (its length, its size),
        # which a Jinja template cannot read: the exported template refuses
        # the part rather than render another prompt.
        return (f"{{{{ raise_exception('{self.name} parts need the prompt xtml computes from the media, which a "
                "Jinja template cannot: render with xtml (at messages[' ~ mi ~ '].' ~ where ~ ')') }}")

    def render(self, value: V, out: MarkupSink, ctx: Context) -> None:
        out.embed(self.format.render(self.pads(value), **self.prompt_fields(value)))

    def read_embed(self, raw: str, ctx: Context) -> dict[str, Any] | None:
        got = self.format.read(raw)
        if got is None:
            return None
        fields, pads = got
        value = self.from_fields(fields)
        if pads != self.pads(value):
            ctx.problem(f"{self.describe(value)} has {pads} pads, expected {self.pads(value)}", "bad-embed")
        return self.normal(value, ctx)


class MediaPlugin:
    """The plugin object of a :class:`MediaExtension`: its ``configure``
    makes the extension."""

    def __init__(self, extension: type[MediaExtension[Any]]) -> None:
        self.name = extension.name
        self.extension = extension

    def configure(self, settings: Mapping[str, Any], where: str) -> MediaExtension[Any]:
        return self.extension(settings, where)
