"""A template and a tokenizer as a Hugging Face tokenizer folder that works
with no xtml installed: ``tokenizer.json`` with the dialect's markers as
special tokens, ``tokenizer_config.json`` with the Jinja chat template
(:mod:`.jinja`) and transformers' ``response_template`` (:mod:`.response_template`),
and ``XTML.md`` saying what the folder cannot do that xtml does.

The folder is written whole or not at all. A new one is written into a
folder beside the target, renamed into place. An existing folder (or one a
symbolic link names: the link stays) is written into: each file beside its
final name, then moved over it, so every file is replaced atomically and
nothing else in the folder is touched; a folder that is not empty is
refused unless ``force``. Folders and files get the modes the umask gives
anything new (an engine running as another user reads them), a replaced
file keeps its own mode, and a symbolic link in the folder under one of
the names written is replaced, never written through.

A tiktoken vocabulary (Kimi's models ship one) is converted to a
``tokenizer.json`` with transformers' converter, then checked id for id
against tiktoken on a corpus; a conversion that gives other ids is refused.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ExportError, TokenizerError
from ..template import LayoutTemplate, Template
from ..vocab.tiktoken import TiktokenVocabulary
from ..vocab.vocabulary import Vocabulary
from .jinja import jinja_template
from .response_template import response_template

__all__ = ["FILES", "export_hf"]

FILES = ("tokenizer.json", "tokenizer_config.json", "XTML.md")
"""The files :func:`export_hf` writes, and the only ones it replaces."""


def export_hf(template: Template, vocab: Vocabulary, folder: str | os.PathLike[str], *,
              force: bool = False) -> Path:
    """Write the Hugging Face tokenizer folder of ``template`` over ``vocab``
    (which must hold every marker as one special token) into ``folder``;
    returns the folder. Raises :class:`ExportError` for a folder that exists
    and is not empty (unless ``force``), a symbolic link to nothing, or a
    folder that cannot be written, :class:`~xtml.TokenizerError` for a
    vocabulary without the markers or one that does not convert exactly, and
    :class:`~xtml.TemplateError` for a dialect with no Jinja form."""
    target = Path(folder)
    if target.is_symlink() and not target.exists():
        raise ExportError(f"{str(target)!r} is a symbolic link to {os.readlink(target)!r}, which does not exist: "
                          "make that folder, or give another", location=str(target))
    if target.exists() and not target.is_dir():
        raise ExportError(f"{str(target)!r} exists and is not a folder", location=str(target))
    empty = target.is_dir() and not any(target.iterdir())
    if target.is_dir() and not empty and not force:
        raise ExportError(f"{str(target)!r} exists and is not empty: give another folder, or force to replace "
                          f"the files this export writes ({', '.join(FILES)}) and leave the rest",
                          location=str(target))
    texts = _layout_texts(template, vocab) if isinstance(template, LayoutTemplate) else _texts(template, vocab)
    try:
        if target.is_dir():
            _write_into(target, texts, empty)
        else:
            _write_new(target, texts)
    except OSError as e:
        # Named by the target: the temporary names are gone by now.
        raise ExportError(f"cannot write {str(target)!r}: {e.strerror or e}", location=str(target)) from None
    return target


def _texts(template: Template, vocab: Vocabulary) -> dict[str, str]:
    binding = template.bind(vocab)  # every marker one special token, or TokenizerError
    d = template.dialect
    chat = jinja_template(d)
    parser, parser_limits = response_template(d)
    tokenizer = _hf_tokenizer(vocab)
    end = d.markers.end
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": end,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat,
        "response_template": parser,
    }
    return {
        "tokenizer.json": tokenizer.to_str(pretty=True),  # what Tokenizer.save writes
        "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=2) + "\n",
        "XTML.md": _note(template, binding.marker_ids, parser_limits),
    }


def _layout_texts(template: LayoutTemplate, vocab: Vocabulary) -> dict[str, str]:
    """The folder of a layout dialect: its chat template, its first stop
    token that ends an answer as ``eos_token``; no response template (the
    format's calls and reasoning are parsed by xtml)."""
    binding = template.bind(vocab)  # every special token one special id, or TokenizerError
    d = template.layout
    chat = jinja_template(d)
    tokenizer = _hf_tokenizer(vocab)
    end = next((t for t, meaning in d.stops.items() if meaning == "end"), next(iter(d.stops)))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": end,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat,
    }
    ids = ", ".join(f"`{t}` = {i}" for t, i in binding.token_ids.items())
    as_text = ", ".join(f"`{t}`" for t in binding.text_tokens)
    lines = [
        f"# {d.name}: a Hugging Face tokenizer folder written by {_made_by()}",
        "",
        d.description,
        "",
        "* `tokenizer.json`: the tokenizer; the format's tokens: " + ids + "."
        + (f" Spelt as text (this vocabulary has no one token for them): {as_text}." if as_text else ""),
        "* `tokenizer_config.json`: `chat_template`, the format as Jinja (`xtml export jinja`); `eos_token`, the "
        "token that ends an answer.",
        "",
        "What this folder cannot do that xtml does:",
        "",
        "* The chat template makes text, which the tokenizer then tokenizes whole: a token's spelling in user "
        "text becomes the token. xtml encodes text and tokens apart (`Template.encode`).",
        "* The template leaves out what the format does not write (names, call ids, reasoning before the last "
        "query) without a word; xtml's render lists each drop.",
        "* There is no `response_template`: parse completions with xtml (`Template.parse`, `xtml parse`).",
        "",
    ]
    return {
        "tokenizer.json": tokenizer.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=2) + "\n",
        "XTML.md": "\n".join(lines),
    }


def _unique(make: Callable[[Path], None], folder: Path, name: str) -> Path:
    """A new entry ``.NAME.RANDOM`` in ``folder``, made by ``make`` (which
    must fail on an existing name: never through a link planted there)."""
    for _ in range(100):
        path = folder / f".{name}.{secrets.token_hex(6)}"
        try:
            make(path)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free temporary name for {name!r} in {str(folder)!r}")


def _create(path: Path) -> None:
    # 0o666 less the umask (and 0o777 for a folder, os.mkdir), applied by the
    # system itself: reading the umask (os.umask) would change it for every
    # thread for a moment.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:  # an existing file: its mode stays
        f.write(text)


def _write_new(target: Path, texts: dict[str, str]) -> None:
    """A folder that does not exist: written beside it, renamed into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = _unique(lambda p: os.mkdir(p, 0o777), target.parent, target.name)
    try:
        for name, text in texts.items():
            _write(work / name, text)
        os.rename(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_into(folder: Path, texts: dict[str, str], empty: bool) -> None:
    """An existing folder: each file written beside its final name, then
    moved over it. In a folder that was empty, a failure takes away what
    was moved in, so that it is left as it was."""
    parts: dict[str, Path] = {}
    placed: list[Path] = []
    try:
        for name, text in texts.items():
            part = parts[name] = _unique(_create, folder, name)
            _write(part, text)
            try:
                old = os.lstat(folder / name)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(old.st_mode):
                os.chmod(part, stat.S_IMODE(old.st_mode))
        for name, part in parts.items():
            os.replace(part, folder / name)
            placed.append(folder / name)
    except BaseException:
        for part in parts.values():
            part.unlink(missing_ok=True)
        if empty:
            for path in placed:
                path.unlink(missing_ok=True)
        raise


def _hf_tokenizer(vocab: Vocabulary) -> Any:
    from tokenizers import Tokenizer

    if isinstance(vocab, TiktokenVocabulary):
        return _converted(vocab)
    tok = Tokenizer.from_str(vocab.tokenizer.to_str())
    # xtml's copy encodes text with special tokens never matched; an engine
    # loading the folder matches them, as every Hugging Face tokenizer does.
    tok.encode_special_tokens = False
    return tok


def _converted(vocab: TiktokenVocabulary) -> Any:
    try:
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError:
        raise TokenizerError("converting a tiktoken vocabulary to tokenizer.json needs transformers' converter: "
                             "pip install 'xtml[hf]'") from None
    ranks = dict(vocab.ranks)
    added = vocab.added_tokens()

    class _FromRanks(TikTokenConverter):
        # The converter reads a file; the ranks are read already.
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    converter: Any = _FromRanks
    tok = converter(vocab_file="", pattern=vocab.pattern, extra_special_tokens=added).converted()
    _check_conversion(vocab, tok)
    return tok


# Text of every kind a chat holds: prose in several scripts, code, numbers,
# white space runs, emoji, JSON, markup-like text.
_CORPUS = (
    "Hello, world! How's it going? I'm fine; they'd've said so.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "  leading and trailing spaces  \n\n\tand tabs\t\r\n",
    "def f(x):\n    return {\"a\": [1, 2.5, -3e-7], 'b': None}\n",
    "中文的句子\uff0c还有标点。日本語のテキストです。한국어 문장입니다.",
    "Ünïcödé, naïve café, Zürich, São Paulo, Reykjavík, Δ, Ω, Ж, ש, ع",
    "emoji 🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷 and symbols ∑∫√≈≠",
    "<div class=\"x\">&amp; &quot;quoted&quot;</div> <|not a marker|>",
    "URL https://example.com/a/b?c=d&e=f#g, mail a.b@c.de, path /usr/local/bin",
    "          many spaces, then newlines\n\n\n\n and CRs\r\r\r",
    "numbers 3.14159 2718281828 1e10 0x1F 1_000_000 42nd 7th",
    "MixedCASE camelCase snake_case kebab-case SCREAMING_CASE",
    "\u2019curly quotes\u2019 \u201cdouble\u201d \u2014 dashes \u2013 and \u2026 ellipsis",
    "Zero\u200bwidth\u200djoiner and NBSP\u00a0here",
)


def _check_conversion(vocab: TiktokenVocabulary, tok: Any) -> None:
    """The converted tokenizer gives tiktoken's ids on the corpus (ordinary
    text) and the same bytes for every id, or the conversion is refused."""
    tok.encode_special_tokens = True
    texts = list(_CORPUS) + [t + u for t in _CORPUS for u in _CORPUS[:3]]
    want = vocab.ids_of(texts)
    got = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    for text, a, b in zip(texts, want, got, strict=True):
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise TokenizerError(
                f"the tiktoken vocabulary does not convert exactly to tokenizer.json: {text[:40]!r} gives other "
                f"ids from token {k} on (the tokenizers library splits text by the pre-tokenizer pattern otherwise "
                "than tiktoken: another regex engine, and it keeps text the pattern does not match); "
                "export from a tokenizer.json instead")
    tok.encode_special_tokens = False


def _made_by() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"xtml {version('xtml')}"
    except PackageNotFoundError:  # a plain checkout
        return "xtml"


def _note(template: Template, marker_ids: dict[str, int], parser_limits: list[str]) -> str:
    made_by = _made_by()
    d = template.dialect
    markers = ", ".join(f"`{m}` = {i}" for m, i in marker_ids.items())
    lines = [
        f"# {d.name}: a Hugging Face tokenizer folder written by {made_by}",
        "",
        f"{d.description}",
        "",
        "* `tokenizer.json`: the tokenizer, with the template's markers as special tokens: " + markers + ".",
        "* `tokenizer_config.json`: `chat_template`, the template as Jinja (`xtml export jinja`), and "
        "`response_template`, transformers' spec to parse a completion (`tokenizer.parse_response`, "
        "`get_response_parser`).",
        "",
        "What this folder cannot do that xtml does:",
        "",
        "* The chat template makes text, which the tokenizer then tokenizes whole: a marker's spelling in user "
        "text becomes the marker. xtml encodes text and markers apart (`Template.encode`).",
        "* Tool-call `arguments` must be objects (parsed JSON) when handed to `apply_chat_template`: Jinja "
        "cannot parse a JSON string, and the template raises rather than render it differently.",
        *[f"* Parsing: {x}" for x in parser_limits],
        "",
    ]
    return "\n".join(lines)
