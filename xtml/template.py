"""The facade: a template renders requests to text, segments and ids, and
parses ids or text back.

Data flow: request → (chat layer) markup tree → (markup layer) segments →
(tokenizer binding) ids → (markup layer) tree → (chat layer) request.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .chat.dialect import Dialect, load_dialect
from .chat.parse import parse_completion, parse_conversation
from .chat.render import normal_form, render, render_tree
from .chat.request import Msg, Options, prepare
from .errors import ParseError, RequestError
from .markup.grammar import parse_lexemes
from .markup.markers import CLOSE, END, SEP, TEXT
from .markup.nodes import Diagnostic, Document, Element
from .markup.parse import Lexemes, build, lex_text, line_col
from .markup.segments import Segment, to_segments
from .serving.stream import StreamParser
from .training.masks import TrainingExample, encode_example
from .vocab.binding import Binding
from .vocab.load import load_tokenizer
from .vocab.vocabulary import Vocabulary

__all__ = ["Rendered", "Template", "load"]


class Rendered(NamedTuple):
    """What :meth:`Template.render` returns."""

    text: str
    """The canonical text form."""
    segments: list[Segment]
    """``(text, special)`` pairs; tokenized one by one they give the ids."""


TokenizerLike = Vocabulary | str | os.PathLike[str] | Any


class Template:
    """A dialect of XTML, ready to render and parse."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.markers = dialect.markers
        self._bindings: weakref.WeakKeyDictionary[Vocabulary, Binding] = weakref.WeakKeyDictionary()
        self._loaded: dict[str, Vocabulary] = {}

    @property
    def name(self) -> str:
        return self.dialect.name

    @property
    def path(self) -> str:
        return self.dialect.path

    def __repr__(self) -> str:
        return f"<xtml.Template {self.name!r}>"

    # -- render ------------------------------------------------------------------

    def _prepare(self, request: Any, options: dict[str, Any]) -> tuple[Options, list[Msg]]:
        return prepare(self.dialect, request, options)

    def document(self, request: Any, **options: Any) -> Document:
        """The markup tree of a request."""
        o, msgs = self._prepare(request, options)
        return Document(tuple(render_tree(self.dialect, o, msgs)))

    def render(self, request: Any, **options: Any) -> Rendered:
        """Text and segments of a request (a chat-completions body or a list of
        messages); keyword options override the request's own."""
        segs = to_segments(self.document(request, **options), self.markers)
        return Rendered("".join(s.text for s in segs), segs)

    def normalize(self, request: Any, **options: Any) -> dict[str, Any]:
        """The request as parse would return it after render (spec.md, "Normal form")."""
        o, msgs = self._prepare(request, options)
        render_tree(self.dialect, o, msgs)  # the same checks as render
        try:
            return normal_form(self.dialect, o, msgs)
        except RecursionError:
            raise RequestError("the request is nested too deeply") from None

    def encode(self, request: Any, tokenizer: TokenizerLike, **options: Any) -> list[int]:
        """Token ids of a request for ``tokenizer`` (a :class:`Vocabulary`, a
        ``tokenizers.Tokenizer`` or a path)."""
        sink = self.bind(tokenizer).sink()
        o, msgs = self._prepare(request, options)
        render(self.dialect, o, msgs, sink)
        return sink.finish()

    def encode_training(self, request: Any, tokenizer: TokenizerLike, *, train: Any = None,
                        **options: Any) -> TrainingExample:
        """Ids (as :meth:`encode`), loss mask and message/channel spans of a
        request; ``train`` overrides what the template trains (see
        :func:`xtml.training.encode_training`)."""
        return encode_example(self.dialect, self.bind(tokenizer), request, train=train, options=options)

    def bind(self, tokenizer: TokenizerLike) -> Binding:
        """The binding of this template's markers to ``tokenizer`` (cached)."""
        vocab = self._vocab(tokenizer)
        b = self._bindings.get(vocab)
        if b is None:
            b = Binding(self.markers, vocab)
            self._bindings[vocab] = b
        return b

    def _vocab(self, tokenizer: TokenizerLike) -> Vocabulary:
        if isinstance(tokenizer, Vocabulary):
            return tokenizer
        if isinstance(tokenizer, str | os.PathLike):
            key = str(Path(tokenizer).resolve())
            if key not in self._loaded:
                self._loaded[key] = load_tokenizer(tokenizer)
            return self._loaded[key]
        return Vocabulary(tokenizer)

    def generation_prompt(self, *, thinking: bool | None = None) -> list[Segment]:
        """The segments that open the assistant's turn."""
        return to_segments(self._prompt_nodes(thinking), self.markers)

    def _prompt_nodes(self, thinking: bool | None) -> list[Element]:
        n = self.dialect.names
        on = self.dialect.thinking_default if thinking is None else thinking
        tag = self.dialect.prompt_tag(on)
        channel = (Element(tag, (), (), closed=False),) if tag else ()
        return [Element(n["message"], ((n["role"], "assistant"),), channel, closed=False)]

    def stream(self, tokenizer: TokenizerLike, *, thinking: bool | None = None, keep: bool = True,
               lenient: bool = True) -> StreamParser:
        """A :class:`~xtml.stream.StreamParser` for what a model generates
        after this template's generation prompt."""
        return StreamParser(self, tokenizer, thinking=thinking, keep=keep, lenient=lenient)

    # -- parse -------------------------------------------------------------------

    def parse(
        self,
        data: Sequence[int] | str,
        tokenizer: TokenizerLike | None = None,
        *,
        completion: bool = False,
        lenient: bool = False,
        thinking: bool | None = None,
    ) -> dict[str, Any]:
        """Token ids (with their tokenizer) or text back to a request.

        ``completion=True`` reads what a model generated after the generation
        prompt and returns one assistant message; ``thinking`` says which
        prompt that was (default: the template's default mode). Strict parses
        raise :class:`ParseError` with the token offset (or line and column);
        ``lenient=True`` never raises on content and adds ``"diagnostics"``.
        """
        try:
            result, diags = self._parse(data, tokenizer, completion, lenient, thinking)
        except RecursionError:
            raise ParseError("input nested too deeply", offset=0) from None
        if lenient:
            result["diagnostics"] = [x.as_dict() for x in diags]
        return result

    def _parse(
        self,
        data: Sequence[int] | str,
        tokenizer: TokenizerLike | None,
        completion: bool,
        lenient: bool,
        thinking: bool | None,
    ) -> tuple[dict[str, Any], list[Diagnostic]]:
        on = self.dialect.thinking_default if thinking is None else thinking
        is_text = isinstance(data, str)
        if not is_text:
            if tokenizer is None:
                raise TypeError("parsing token ids needs their tokenizer (or pass text)")
            if not isinstance(data, Sequence) or isinstance(data, bytes | bytearray):
                raise TypeError("expected a sequence of token ids or a string")
        shift = 0
        if is_text:
            text = str(data)
            if completion:
                prefix = "".join(s.text for s in self.generation_prompt(thinking=on))
                shift = len(prefix)
                text = prefix + text
            lx = lex_text(text, self.markers)
            where = line_col(text)

            def line_of(off: int) -> tuple[int, int]:
                return where(off) if not shift else line_col(text[shift:])(max(0, off - shift))
        else:
            binding = self.bind(tokenizer)
            ids: list[int] = list(data)  # type: ignore[arg-type]
            if not completion:
                doc = binding.document(ids, lenient=lenient)
                return parse_conversation(self.dialect, doc, lenient=lenient)
            if completion:
                prefix_ids = binding.encode(self._prompt_nodes(on))
                shift = len(prefix_ids)
                ids = prefix_ids + ids
            lx = binding.lex(ids)
            line_of = None  # type: ignore[assignment]
        if completion:
            _end_if_closed(lx, self.dialect.names["message"])
        try:
            if is_text and not lenient and not completion:
                doc = parse_lexemes(lx, source=text)
            else:
                doc = build(lx, lenient=lenient, line_of=line_of)
            if completion:
                return parse_completion(self.dialect, doc, thinking=on, lenient=lenient, shift=shift)
            return parse_conversation(self.dialect, doc, lenient=lenient)
        except ParseError as e:
            raise _relocate(e, shift, line_of) from None


def _end_if_closed(lx: Lexemes, message_tag: str) -> None:
    """A completion may stop right before the stop token (engines strip it):
    supply the end marker after a closed message."""
    k = lx.kinds
    if len(k) >= 3 and k[-3] == CLOSE and k[-2] == TEXT and k[-1] == SEP and lx.texts[-2] == message_tag:
        k.append(END)
        lx.texts.append("")
        lx.offsets.append(lx.end)


def _relocate(e: ParseError, shift: int, line_of: Any) -> ParseError:
    """Offsets relative to the caller's input (not the generation prompt
    prepended to a completion), with line and column for text."""
    if not shift and (line_of is None or e.line is not None):
        return e
    off = max(0, e.offset - shift)
    if line_of is not None:
        line, col = line_of(e.offset)
        return ParseError(e.msg, offset=off, line=line, column=col, path=e.path)
    return ParseError(e.msg, offset=off, path=e.path)


_cache: dict[Any, Template] = {}


def load(name_or_path: str | os.PathLike[str] = "kimi-k3") -> Template:
    """A template by built-in name (``kimi-k3``) or by file path."""
    name = os.fspath(name_or_path)
    key: Any = name
    try:
        st = os.stat(name)
        # A file edited since it was loaded is read again.
        key = (name, st.st_mtime_ns, st.st_size)
    except OSError:
        pass
    t = _cache.get(key)
    if t is None:
        t = Template(load_dialect(name))
        if len(_cache) < 64:
            _cache[key] = t
    return t


