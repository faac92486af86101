"""The facade: a template renders requests to text, segments and ids, and
parses ids or text back.

Data flow: request → (chat layer) markup tree → (markup layer) segments →
(tokenizer binding) ids → (markup layer) tree → (chat layer) request.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from .chat import fields as _fields
from .chat.dialect import Dialect
from .chat.fields import MAX_N, dump, keyword_options, request_options
from .chat.layout import LayoutDialect
from .chat.layout_file import load_any_dialect
from .chat.layout_request import Dropped
from .chat.prompt import generation_prompt
from .chat.render import normal_form, render, render_tree
from .chat.request import MAX_CHARS, TEXT_PART_TYPES, Msg, Options, prepare, request_size, split_request
from .codec import layout as layout_codec
from .codec.completion import completion_plan
from .codec.conversation import Conversation
from .codec.parse import parse, reasoning_length
from .codec.stream import StreamParser
from .codec.training import TrainingExample, encode_example
from .errors import OptionError, ParseError, RequestError
from .lru import Lru
from .markup.collector import collector_paused
from .markup.markers import Markers
from .markup.nodes import Document
from .markup.parse import check_size
from .markup.segments import Segment, to_segments
from .vocab.binding import Binding, bound
from .vocab.load import load_tokenizer
from .vocab.tokens import TokenBinding
from .vocab.vocabulary import Vocabulary

__all__ = ["MAX_N", "Ambiguity", "Dropped", "Encoded", "Rendered", "Template", "check_fields", "load"]


class Ambiguity(NamedTuple):
    """A marker literal in the text of a render: read back as text, it is a
    marker (spec.md §5)."""

    offset: int
    """Where it starts in :attr:`Rendered.text`."""
    marker: str
    """The marker string."""
    message: int
    """The message it is in: its position among the messages of the rendered
    text, from 0 (the template's own system messages count; the generation
    prompt is the last). -1 when the render's markers are unknown."""
    segment: int
    """The segment it starts in."""


class _TextAndSegments(NamedTuple):
    text: str
    """The canonical text form."""
    segments: list[Segment]
    """``(text, special)`` pairs; tokenized one by one they give the ids."""


class Rendered(_TextAndSegments):
    """What :meth:`Template.render` returns: the pair ``(text, segments)``,
    which also knows where its text form is ambiguous (:attr:`ambiguous`)."""

    # A pair still, so that ``text, segments = template.render(...)`` holds;
    # the markers ride in the instance's __dict__, outside the tuple.
    _markers: Markers | None = None
    _finder: tuple[re.Pattern[str], str] | None = None
    _dropped: tuple[Dropped, ...] = ()

    def __new__(cls, text: str, segments: list[Segment], markers: Markers | None = None, *,
                finder: tuple[re.Pattern[str], str] | None = None, dropped: tuple[Dropped, ...] = ()) -> Rendered:
        self = super().__new__(cls, text, segments)
        self._markers = markers
        if finder is not None:
            self._finder = finder
        if dropped:
            self._dropped = dropped
        return self

    @property
    def dropped(self) -> tuple[Dropped, ...]:
        """What the request held that the format does not write (a layout
        dialect's declared drops, as its official template drops them):
        one entry per field or option, never silent. Empty for XTML
        dialects, which write everything they accept."""
        return self._dropped

    @cached_property
    def ambiguous(self) -> tuple[Ambiguity, ...]:
        """Every marker literal that a text parse would read as a marker but
        that is not one: the text form reads back as what was rendered
        exactly when this is empty. Token ids are never ambiguous."""
        segs = self.segments
        markers = self._markers
        end: str | None
        if self._finder is not None:
            finder, end = self._finder
        elif markers is not None:
            finder = markers.splitter()
            end = markers.end
        else:  # made by hand: the markers it holds are all that is known
            held = sorted({s.text for s in segs if s.special}, key=len, reverse=True)
            if not held:
                return ()
            finder = re.compile("|".join(map(re.escape, held)))
            end = None
        found: list[Ambiguity] = []
        k = ends = 0
        stop = len(segs[0].text) if segs else 0
        for m in finder.finditer(self.text):
            at = m.start()
            while stop <= at and k + 1 < len(segs):
                if segs[k].special and segs[k].text == end:
                    ends += 1
                k += 1
                stop += len(segs[k].text)
            if segs[k].special and m.end() <= stop:
                continue  # a marker of the render (or one inside an embed)
            found.append(Ambiguity(at, m.group(), ends if end is not None else -1, k))
        return tuple(found)


def _tool_named(request: Any, options: dict[str, Any]) -> dict[str, Any] | None:
    """The ``tool_choice`` of a checked request (keyword options over the
    body's) when it names a function."""
    given: dict[str, Any] = {}
    if not isinstance(request, list | tuple):
        given = request_options(dump(request, unset=True), options.get("unknown_keys") == "ignore")
    keywords = {k: v for k, v in options.items() if k not in ("unknown_keys", "max_chars")}
    if keywords:
        given.update(keyword_options(keywords))
    tc = given.get("tool_choice")
    return dict(tc) if isinstance(tc, Mapping) else None


class _IdsAndOptions(NamedTuple):
    ids: list[int]
    options: Options


class Encoded(_IdsAndOptions):
    """What :meth:`Template.encode_request` returns: the ids, and the options
    the request resolved to (defaults, aliases and precedence applied), for
    callers that act on them (a gateway refusing ``continue_final_message``,
    a stream started in the mode of the prompt). A pair, so that ``ids,
    options = template.encode_request(...)`` holds; :attr:`tool_named` rides
    beside it."""

    tool_named: dict[str, Any] | None
    """A ``tool_choice`` naming a function, as given: the options read it
    as ``auto`` (the prompt says nothing of it); a grammar holds the model
    to it."""

    def __new__(cls, ids: list[int], options: Options, tool_named: dict[str, Any] | None = None) -> Encoded:
        self = super().__new__(cls, ids, options)
        self.tool_named = tool_named
        return self


TokenizerLike = Vocabulary | str | os.PathLike[str] | Any


_Copies = weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], Vocabulary]]
_Pinned = Lru[int, tuple[Any, tuple[Any, ...], Vocabulary]]

# Tokenizers loaded from a path, by the resolved path: loading one takes a
# second, and every template of the process may use it.
_by_path: Lru[str, Vocabulary] = Lru()


class Template:
    """A dialect of XTML, ready to render and parse.

    Read-only: :func:`load` gives the same template to every caller of the
    process. :meth:`replace` makes one with another ``max_chars``."""

    dialect: Dialect
    markers: Markers
    max_chars: int | None
    """The largest request (characters of its strings, keys included,
    plus one per value) and the longest parse input (characters of text,
    or token ids) this template takes; None: no limit. A call's own
    ``max_chars=`` keyword overrides it. Past it: :class:`RequestError`
    or :class:`ParseError`, in lenient parses too."""
    text_part_types: tuple[str, ...] = TEXT_PART_TYPES
    """The content part types that are text; any other part is media, which
    a plugin renders (an engine sent ids only would see a placeholder)."""
    _copies: _Copies
    _pinned: _Pinned

    def __init__(self, dialect: Dialect, *, max_chars: int | None = MAX_CHARS) -> None:
        self._init(dialect, _checked_limit(max_chars), weakref.WeakKeyDictionary(), Lru())

    def _init(self, dialect: Dialect, max_chars: int | None, copies: _Copies, pinned: _Pinned) -> None:
        put: Callable[[str, Any], None] = super().__setattr__
        put("dialect", dialect)
        put("markers", dialect.markers)
        put("max_chars", max_chars)
        # A tokenizer object's Vocabulary (a copy, made once: a large
        # vocabulary takes a second to copy), with the marker ids it was made
        # with. By the object while it lives, or by id() with the object kept
        # alive, for one that takes no weak reference. The vocabulary keeps
        # its bindings itself (Vocabulary.derived).
        put("_copies", copies)
        put("_pinned", pinned)

    def replace(self, *, max_chars: int | None) -> Template:
        """This template with another ``max_chars`` (``None``: no limit); it
        shares this one's copies of tokenizer objects."""
        t = object.__new__(Template)
        t._init(self.dialect, _checked_limit(max_chars), self._copies, self._pinned)
        return t

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):  # the template's own bookkeeping
            super().__setattr__(name, value)
            return
        raise AttributeError(_read_only(name))

    def __delattr__(self, name: str) -> None:
        raise AttributeError(_read_only(name))

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
        if options.get("max_chars") is None:
            options["max_chars"] = self.max_chars
        return prepare(self.dialect, request, options)

    def document(self, request: Any, **options: Any) -> Document:
        """The markup tree of a request."""
        o, msgs = self._prepare(request, options)
        return Document(tuple(render_tree(self.dialect, o, msgs)))

    def render(self, request: Any, **options: Any) -> Rendered:
        """Text and segments of a request (a chat-completions body or a list of
        messages); keyword options override the request's own."""
        segs = to_segments(self.document(request, **options), self.markers)
        return Rendered("".join(s.text for s in segs), segs, self.markers)

    def normalize(self, request: Any, **options: Any) -> dict[str, Any]:
        """The request as parse would return it after render (spec.md, "Normal form")."""
        o, msgs = self._prepare(request, options)
        render_tree(self.dialect, o, msgs)  # the same checks as render
        return normal_form(self.dialect, o, msgs)

    def encode(self, request: Any, tokenizer: TokenizerLike, **options: Any) -> list[int]:
        """Token ids of a request for ``tokenizer`` (a :class:`Vocabulary`, a
        ``tokenizers.Tokenizer`` or a path)."""
        return self.encode_request(request, tokenizer, **options).ids

    def encode_request(self, request: Any, tokenizer: TokenizerLike, **options: Any) -> Encoded:
        """:meth:`encode`, with the options the request resolved to."""
        sink = self.bind(tokenizer).sink()
        # Checking and rendering make objects per message and per part, none
        # of them garbage: a collection meanwhile only walks the process's
        # live objects (10,000 messages: 39 against 34 ms of checks).
        with collector_paused():
            o, msgs = self._prepare(request, options)
            render(self.dialect, o, msgs, sink)
            return Encoded(sink.finish(), o, _tool_named(request, options) if o.tool_choice is None else None)

    def encode_training(self, request: Any, tokenizer: TokenizerLike, *, train: Any = None,
                        **options: Any) -> TrainingExample:
        """Ids (as :meth:`encode`), loss mask and message/channel spans of a
        request; ``train`` overrides what the template trains (see
        :func:`xtml.training.encode_training`)."""
        if options.get("max_chars") is None:
            options["max_chars"] = self.max_chars
        if split_request(request, {k: v for k, v in options.items() if k != "max_chars"})[1].get(
                "continue_final_message"):
            raise OptionError("a training example ends with its last message closed; continue_final_message "
                              "is for prompts", option="continue_final_message")
        return encode_example(self.dialect, self.bind(tokenizer), request, train=train, options=options)

    def bind(self, tokenizer: TokenizerLike) -> Binding:
        """The binding of this template's markers to ``tokenizer`` (made once
        per vocabulary and markers, and kept on the vocabulary)."""
        return bound(self.markers, self._vocab(tokenizer))

    def _own_tokens(self) -> tuple[str, ...]:
        """The token strings the format writes: a tokenizer object that gains
        one after a first use (as the error for one without them advises)
        gets a new copy."""
        return tuple(self.markers.all())

    def _vocab(self, tokenizer: TokenizerLike) -> Vocabulary:
        if isinstance(tokenizer, Vocabulary):
            return tokenizer
        if isinstance(tokenizer, str | os.PathLike):
            key = str(Path(tokenizer).resolve())
            loaded = _by_path.get(key)
            return loaded if loaded is not None else _by_path.put(key, load_tokenizer(tokenizer))
        # A transformers PreTrainedTokenizerFast: its tokenizers.Tokenizer,
        # which holds the added special tokens too.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and type(backend).__module__.startswith("tokenizers"):
            tokenizer = backend
        token_to_id = getattr(tokenizer, "token_to_id", None)
        stamp = tuple(token_to_id(m) for m in self._own_tokens()) if callable(token_to_id) else ()
        try:
            hit = self._copies.get(tokenizer)
            weak = True
        except TypeError:  # no weak reference to it
            pinned = self._pinned.get(id(tokenizer))
            hit = pinned[1:] if pinned is not None and pinned[0] is tokenizer else None
            weak = False
        if hit is not None and hit[0] == stamp:
            return hit[1]
        vocab = Vocabulary(tokenizer)
        if weak:
            self._copies[tokenizer] = (stamp, vocab)
        else:
            self._pinned.put(id(tokenizer), (tokenizer, stamp, vocab))
        return vocab

    def generation_prompt(self, *, thinking: bool | None = None) -> list[Segment]:
        """The segments that open the assistant's turn."""
        on = self.dialect.thinking_default if thinking is None else thinking
        return to_segments([generation_prompt(self.dialect, on)], self.markers)

    def stream(self, tokenizer: TokenizerLike, *, thinking: bool | None = None, keep: bool = True,
               lenient: bool = True, tools: Any = None) -> StreamParser:
        """A :class:`~xtml.stream.StreamParser` for what a model generates
        after this template's generation prompt. ``tools``: the request's,
        as :meth:`parse` reads them."""
        return StreamParser(self.dialect, self.bind(tokenizer), thinking=thinking, keep=keep, lenient=lenient)

    def conversation(self, tokenizer: TokenizerLike, messages: Sequence[Any] = (), *,
                     max_chars: int | None = None, unknown_keys: str = "error", **options: Any) -> Conversation:
        """A :class:`~xtml.codec.conversation.Conversation` of this
        template: messages and conversation options (``tools``, ``thinking``,
        ``thinking_effort`` ...) whose ids are kept, so that each turn renders
        only what is new. Its :meth:`~Conversation.prompt_ids` are always
        :meth:`encode` of the whole request."""
        return Conversation(self.dialect, self.bind(tokenizer), messages,
                            max_chars=self.max_chars if max_chars is None else max_chars,
                            unknown_keys=unknown_keys, **options)

    def completion_ids(self, text: str, tokenizer: TokenizerLike) -> list[int]:
        """Token ids of a completion given as text, as the model would have
        generated it: every marker string is its special id, the text between
        markers is ordinary text (each run encoded whole, so a tag header may
        take other ids than the renderer's, which encodes its parts one by
        one; parses read both the same). For streaming a completion that
        was saved as text; the inverse of decoding without skipping special
        tokens."""
        if not isinstance(text, str):
            raise TypeError("expected the completion's text")
        check_size(text, self.max_chars)
        segs: list[Segment] = []
        pos = 0
        for m in self.markers.splitter().finditer(text):
            if m.start() > pos:
                segs.append(Segment(text[pos : m.start()], False))
            segs.append(Segment(m.group(), True))
            pos = m.end()
        if pos < len(text):
            segs.append(Segment(text[pos:], False))
        return self.bind(tokenizer).encode_segments(segs)

    def completion_grammar(self, request: Any, tokenizer: TokenizerLike | None = None, *,
                           format: str = "llguidance", **options: Any) -> str:
        """The grammar of what the assistant may generate for ``request``
        after the generation prompt, for constrained decoding: Lark text
        ``llguidance.LLMatcher`` loads as it is, xgrammar EBNF
        (``format="xgrammar"``), an xgrammar structural tag as JSON text
        (``"xgrammar-tag"``) or llama.cpp's GBNF (``"gbnf"``); all but the
        first need the tokenizer (see :data:`xtml.codec.completion.FORMATS`). ``options`` are
        the request's options and those of
        :func:`xtml.codec.completion.completion_plan`."""
        from importlib import import_module

        binding = self.bind(tokenizer) if tokenizer is not None else None
        plan = completion_plan(self.dialect, binding, request, format=format, **options)
        # One writer module per format, loaded by name when a grammar is
        # asked for: `import xtml` loads none of them.
        writer = import_module(f"xtml.codec.completion.{plan.format.replace('-', '_')}")
        text: str = writer.write(plan)
        return text

    # -- parse -------------------------------------------------------------------

    def reasoning_tokens(self, ids: Sequence[int], tokenizer: TokenizerLike, *, thinking: bool | None = None) -> int:
        """How many of a completion's ids are reasoning (OpenAI's
        ``usage.completion_tokens_details.reasoning_tokens``): up to and with
        the close of the reasoning channel, all of them when it never
        closes, none when the prompt (``thinking``, default: the template's
        default mode) opened no reasoning."""
        return reasoning_length(self.dialect, self.bind(tokenizer), ids, thinking)

    def parse(
        self,
        data: Sequence[int] | str,
        tokenizer: TokenizerLike | None = None,
        *,
        completion: bool = False,
        lenient: bool = False,
        thinking: bool | None = None,
        max_chars: int | None = None,
        prefill: Any = None,
        repaired_calls: bool = False,
        tools: Any = None,
    ) -> dict[str, Any]:
        """Token ids (with their tokenizer) or text back to a request.

        ``completion=True`` reads what a model generated after the generation
        prompt and returns one assistant message; ``thinking`` says which
        prompt that was (default: the template's default mode). With
        ``prefill`` (the final assistant message of a request rendered with
        ``continue_final_message``), the input is what the model generated
        after that open message, and the result is the whole message. Strict parses
        raise :class:`ParseError` with the token offset (or line and column);
        ``lenient=True`` never raises on content and adds ``"diagnostics"``.
        ``max_chars`` caps the input's length (default: :attr:`max_chars`).

        A lenient parse of text withholds every tool call that exists only
        because of a repair, with a ``withheld-call`` diagnostic: in text a
        marker may be a literal the model quoted (a web page it echoes). A
        call is withheld when its tools channel was opened inside a channel
        that was never closed, or when its message was repaired before the
        call opened (any diagnostic from the message's open tag to the
        call's; text outside a channel counts at the open tag), and so is
        every later call of that message. ``repaired_calls=True`` keeps
        them. Parses of ids keep every call: a marker there is a special
        token, never quoted text.

        ``tools`` (the request's) type the arguments of a format that writes
        them untyped (GLM's key/value pairs: a ``string`` property's value
        is its text, any other JSON); XTML writes arguments as JSON and
        needs none.
        """
        limit = self.max_chars if max_chars is None else max_chars
        check_size(data, limit)  # before the tokenizer is loaded
        binding = self.bind(tokenizer) if tokenizer is not None and not isinstance(data, str) else None
        return parse(self.dialect, binding, data, completion=completion, lenient=lenient, thinking=thinking,
                     prefill=prefill, max_chars=limit, repaired_calls=repaired_calls)


def _checked_limit(max_chars: Any) -> int | None:
    if max_chars is not None and (type(max_chars) is not int or max_chars < 0):
        raise OptionError(f"max_chars must be a non-negative integer or None, not {max_chars!r}",
                          option="max_chars")
    limit: int | None = max_chars
    return limit


def _read_only(name: str) -> str:
    if name == "max_chars":
        return ("a Template is read-only (xtml.load gives the same one to every caller): "
                "template.replace(max_chars=...) makes one with another limit, or pass max_chars= to a call")
    return f"a Template is read-only (xtml.load gives the same one to every caller); {name!r} cannot be set"


_cache: Lru[Any, Template] = Lru()


def check_fields(body: Mapping[str, Any], *, api: str = "chat") -> None:
    """Refuse a field of a request body whose value is not of its JSON type
    (the table of :mod:`xtml.chat.fields`), with a :class:`RequestError`
    naming it: ``api`` is ``chat`` (the fields a chat-completions body gives
    beside its prompt: sampling, streaming) or ``responses`` (a Responses
    body's own fields). The prompt's fields are checked when the request is
    read (``Template.encode_request`` and the rest)."""
    if api not in ("chat", "responses"):
        raise ValueError(f"api must be 'chat' or 'responses', not {api!r}")
    _fields.check(body, api)


def load(name_or_path: str | os.PathLike[str] = "kimi-k3") -> Template:
    """A template by built-in name (``kimi-k3``) or by file path. The same
    name gives the same (read-only) template while it stays among the
    last few loaded."""
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
        d = load_any_dialect(name)
        t = _cache.put(key, LayoutTemplate(d) if isinstance(d, LayoutDialect) else Template(d))
    return t




class LayoutTemplate(Template):
    """A template of a layout dialect (``[template] engine = "layout"``):
    the :class:`Template` API over a format that is not XTML-shaped.

    Its :attr:`dialect` is a :class:`~xtml.chat.layout.LayoutDialect`,
    which answers what the serving layer asks of a dialect; :meth:`bind`
    gives a :class:`~xtml.vocab.tokens.TokenBinding` and :meth:`stream` a
    :class:`~xtml.codec.layout.LayoutStream`, each with the members the
    gateway uses. What the layout engine does not do yet raises a
    :class:`~xtml.XtmlError` saying so."""

    layout: LayoutDialect
    _finder: re.Pattern[str]

    def __init__(self, dialect: LayoutDialect, *, max_chars: int | None = MAX_CHARS) -> None:
        self._init_layout(dialect, _checked_limit(max_chars), weakref.WeakKeyDictionary(), Lru())

    def _init_layout(self, dialect: LayoutDialect, max_chars: int | None, copies: _Copies, pinned: _Pinned) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("layout", dialect)
        # The serving layer reads efforts, thinking_off and channel_tag of
        # any template's dialect; a layout dialect has them.
        put("dialect", dialect)
        put("max_chars", max_chars)
        put("_copies", copies)
        put("_pinned", pinned)
        put("_finder", dialect.finder())

    def replace(self, *, max_chars: int | None) -> Template:
        t = object.__new__(LayoutTemplate)
        t._init_layout(self.layout, _checked_limit(max_chars), self._copies, self._pinned)
        return t

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def path(self) -> str:
        return self.layout.path

    def _not_yet(self, what: str) -> OptionError:
        return OptionError(f"{what} is not yet available for the layout dialect {self.layout.name!r}",
                           option=what.split(" ")[0])

    def _read_back(self, what: str) -> None:
        """Refuses what reads the format back (or spells it otherwise than
        render) where the dialect writes what no reader reads yet."""
        if self.layout.render_only:
            raise OptionError(f"{what} is not yet available for the layout dialect {self.layout.name!r} (it writes "
                              f"{', '.join(self.layout.render_only)}): only render is", option=what.split(" ")[0])

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        limit = options.pop("max_chars", None)
        if limit is None:
            limit = self.max_chars
        if limit is not None and (type(limit) is not int or limit < 0):
            raise OptionError("max_chars must be a non-negative integer or None", option="max_chars")
        return {"limit": limit}

    def _measured(self, request: Any, options: dict[str, Any]) -> None:
        """Refuses a request over ``max_chars`` (the option, else the
        template's), before anything reads it."""
        limit = self._options(options)["limit"]
        if limit is not None:
            size = request_size(request, limit)
            if size > limit:
                raise RequestError(f"the request is too large: at least {size:,} characters, more than "
                                   f"max_chars={limit:,}")

    def _render(self, request: Any, options: dict[str, Any]) -> Any:
        from .chat.layout_engine import render as layout_render

        self._measured(request, options)
        return layout_render(self.layout, request, options)

    def document(self, request: Any, **options: Any) -> Document:
        raise self._not_yet("document (a markup tree)")

    def render(self, request: Any, **options: Any) -> Rendered:
        r = self._render(request, options)
        end = self.layout.frame_close.items
        first = next((i.token for i in end if hasattr(i, "token")), "")
        return Rendered("".join(s.text for s in r.segments), r.segments, finder=(self._finder, first),
                        dropped=r.dropped)

    def normalize(self, request: Any, **options: Any) -> dict[str, Any]:
        from .chat.layout_engine import normal_form as layout_normal_form

        self._read_back("normalize")
        self._render(request, dict(options))  # the same checks as render
        self._options(options)
        return layout_normal_form(self.layout, request, options)

    def encode_request(self, request: Any, tokenizer: TokenizerLike, **options: Any) -> Encoded:
        binding = self.bind(tokenizer)
        r = self._render(request, options)
        ids = binding.encode_segments(r.segments)
        raw = r.request
        tc = raw.get("tool_choice")
        tools = raw.get("tools") or None
        o = Options(thinking=False, effort="", tool_choice=tc if tc in ("none", "required") else None,
                    response_format=raw.get("response_format"),
                    add_generation_prompt=bool(r.options["add_generation_prompt"]), image_prompts=None,
                    tools=list(tools) if isinstance(tools, list | tuple) else None)
        return Encoded(ids, o, dict(tc) if isinstance(tc, Mapping) else None)

    def encode_training(self, request: Any, tokenizer: TokenizerLike, *, train: Any = None,
                        **options: Any) -> TrainingExample:
        from .codec.layout_training import encode_layout_example

        self._read_back("encode_training")
        limit = self._options(options)["limit"]
        return encode_layout_example(self.layout, self.bind(tokenizer), request, train=train, options=options,
                                     max_chars=limit)

    def bind(self, tokenizer: TokenizerLike) -> TokenBinding:  # type: ignore[override]
        # Not a Binding: a layout format has tokens, not XTML markers; the
        # gateway reads what both have (vocab, stop_ids, text_table, text_strs).
        return layout_codec.bind(self.layout, self._vocab(tokenizer))

    def _own_tokens(self) -> tuple[str, ...]:
        return self.layout.tokens

    def generation_prompt(self, *, thinking: bool | None = None) -> list[Segment]:
        from .chat.layout_pattern import Builder

        b = Builder()
        self.layout.prompt.render({}, {**self.layout.options, "after_user": True}, b)
        return b.finish()

    def stream(self, tokenizer: TokenizerLike, *, thinking: bool | None = None, keep: bool = True,  # type: ignore[override]
               lenient: bool = True, tools: Any = None) -> layout_codec.LayoutStream:
        self._read_back("stream")
        return layout_codec.LayoutStream(self.layout, self.bind(tokenizer), keep=keep, lenient=lenient, tools=tools)

    def conversation(self, tokenizer: TokenizerLike, messages: Sequence[Any] = (), *,
                     max_chars: int | None = None, unknown_keys: str = "error", **options: Any) -> Conversation:
        raise self._not_yet("conversation (incremental prompts)")

    def completion_ids(self, text: str, tokenizer: TokenizerLike) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("expected the completion's text")
        check_size(text, self.max_chars)
        return self.bind(tokenizer).text_ids(text, self._finder)

    def completion_grammar(self, request: Any, tokenizer: TokenizerLike | None = None, *,
                           format: str = "llguidance", **options: Any) -> str:
        from .codec.completion.layout_plan import layout_plan
        from .codec.completion.layout_writer import write

        self._read_back("completion_grammar")
        self._measured(request, options)
        binding = self.bind(tokenizer) if tokenizer is not None else None
        return write(layout_plan(self.layout, binding, request, format=format, **options))

    def reasoning_tokens(self, ids: Sequence[int], tokenizer: TokenizerLike, *, thinking: bool | None = None) -> int:
        self._read_back("reasoning_tokens")
        return layout_codec.reasoning_length(self.layout, self.bind(tokenizer), ids)

    def parse(
        self,
        data: Sequence[int] | str,
        tokenizer: TokenizerLike | None = None,
        *,
        completion: bool = False,
        lenient: bool = False,
        thinking: bool | None = None,
        max_chars: int | None = None,
        prefill: Any = None,
        repaired_calls: bool = False,
        tools: Any = None,
    ) -> dict[str, Any]:
        self._read_back("parse")
        limit = self.max_chars if max_chars is None else max_chars
        check_size(data, limit)
        if prefill is not None:
            raise self._not_yet("prefill (continue_final_message)")
        binding = self.bind(tokenizer) if tokenizer is not None and not isinstance(data, str) else None
        if binding is None and not isinstance(data, str):
            raise ParseError("parsing token ids needs the tokenizer", offset=0)
        return layout_codec.parse(self.layout, binding, data, completion=completion, lenient=lenient, tools=tools)
