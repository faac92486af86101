"""What each view of the playground shows, computed with the facade: the
tokens of a render with where each came from, the loss mask and budget
check, a lenient parse, a replayed stream and the grammar's next tokens.

Every function takes the already-decoded JSON fields of an API call and
returns plain JSON data; bad input raises :class:`FieldError` (an
:class:`~xtml.XtmlError`) naming the API field, and the request's own
location when the facade gave one.
"""

from __future__ import annotations

import codecs
import random
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..chat.dialect import Dialect
from ..chat.keys import locate
from ..chat.layout_file import check_any_text
from ..chat.template_file import BUILTIN, LAYOUT_BUILTIN, builtin_files
from ..errors import CallerError, OptionError, XtmlError
from ..markup.nodes import Element
from ..markup.segments import Segment
from ..plugins.jsonfmt import BadInput, input_json
from ..serving.openai import ChunkStream, chat_completion
from ..template import Ambiguity, LayoutTemplate, Template, load
from ..training import overruns, with_training_defaults
from ..vocab.binding import Binding
from ..vocab.tokens import TokenBinding
from ..vocab.vocabulary import Vocabulary
from .layout_views import example_completion, frame_roles, frames, literal_spans

__all__ = ["MAX_IDS", "MAX_PAGE", "MAX_TEXT", "FieldError", "Session", "default_tokenizer", "example_completion"]

MAX_PAGE = 1000
"""Most entries of the grammar's "allowed next" list in one answer."""
MAX_STEPS = 4000
"""Most steps of a replayed stream in one answer (a step is one delta)."""
MAX_TEXT = 1 << 20
"""Most characters of a render the render view shows, token by token. The
page draws an element per token, so more helps nobody; and a view's work
stays bounded, so a request its page gave up on does not hold a thread for
long."""
MAX_IDS = 1 << 18
"""Most ids of a completion the parse, stream and grammar views read."""

_AT = re.compile(r"\(at line (\d+), column (\d+)\)")


class FieldError(CallerError):
    """A bad field of a playground API call: ``field`` names it (``request``,
    ``completion``, ``template`` ...), ``location`` says where inside it
    (``messages[2].role``, ``option 'thinking'``), and ``line`` and ``column``
    where in the field's text when it is text."""

    def __init__(self, msg: str, *, field: str, location: str | None = None, line: int | None = None,
                 column: int | None = None) -> None:
        self.field = field
        self.line = line
        self.column = column
        super().__init__(msg, location=location)

    def to_json(self) -> dict[str, Any]:
        return {"message": str(self), "type": "invalid_request_error", "field": self.field,
                "param": self.location or self.field, "line": self.line, "column": self.column}


def _from(e: XtmlError, field: str) -> FieldError:
    """A facade error as the error of an API field."""
    if isinstance(e, FieldError):
        return e
    where = e.option if isinstance(e, OptionError) else e.location
    return FieldError(e.msg if hasattr(e, "msg") else str(e), field=field, location=where)


def _kind(value: Any) -> str:
    """A JSON value's kind, as the page's user knows it (not Python's name)."""
    return {type(None): "null", bool: "true or false", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), "another value")


def _json_field(text: Any, name: str) -> Any:
    """A field holding JSON text: its value, or the message ``xtml render``
    prints for a bad file, with the line and column."""
    if text is None:
        raise FieldError(f"{name} is missing", field=name)
    if not isinstance(text, str):
        raise FieldError(f"{name} must be JSON text (a string), not {_kind(text)}", field=name)
    try:
        return input_json(text)
    except BadInput as e:
        m = _AT.search(str(e))
        raise FieldError(f"{name}: {e}", field=name, line=int(m.group(1)) if m else None,
                         column=int(m.group(2)) if m else None) from None


def _options(raw: Any) -> dict[str, Any]:
    """The view's controls: render options that override the request's."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise FieldError(f"options must be an object, not {_kind(raw)}", field="options")
    return dict(raw)


def default_tokenizer(template: Template) -> Vocabulary:
    """A small byte-level BPE made on the spot, with the template's markers
    as special tokens (as the README's example makes one): no file, no
    network. Trained on the template file and a few chat phrases, so that
    common words are one token and every byte still encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = builtin_files().get(template.name) or builtin_files(layout=True).get(template.name) or template.path
    corpus = [_read(str(path)) if path else "", *_PHRASES]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=list(_own_tokens(template))))
    return Vocabulary(bpe, "<a byte-level BPE made on the spot>")


_PHRASES = [
    "You are a helpful assistant. What's the weather in Paris for the next 3 days? Sunny, then rain.",
    "The user wants a forecast; call the weather tool. Summarise. Thanks! Should I pack an umbrella?",
    'message role="user" role="assistant" role="system" role="tool" think response tools call argument',
    '{"city": "Paris", "days": 3} {"forecast": ["sun", "rain", "sun"]} type object properties string',
] * 20


def _own_tokens(t: Template) -> tuple[str, ...]:
    """The token strings a template writes: an XTML dialect's markers, or
    a layout dialect's declared tokens."""
    return t.layout.tokens if isinstance(t, LayoutTemplate) else tuple(t.markers.all())


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def templates() -> list[dict[str, Any]]:
    """The built-in templates, one entry per file, with their controls:
    the XTML dialects, then the layout dialects."""
    seen: dict[str, dict[str, Any]] = {}
    for table, files in ((BUILTIN, builtin_files()), (LAYOUT_BUILTIN, builtin_files(layout=True))):
        for name, file in table.items():
            if file in seen:
                continue
            seen[file] = {"name": name, **controls(load(name)), "path": str(files[name])}
    return list(seen.values())


def controls(t: Template) -> dict[str, Any]:
    """The options the dialect offers, for the page's controls; a layout
    dialect's own options (the official template's keyword names) under
    ``options``, each with its default."""
    d = t.dialect
    out = {"description": d.description, "efforts": list(d.efforts), "thinking_default": d.thinking_default,
           "default_effort": d.default_effort, "layout": isinstance(t, LayoutTemplate), "options": {}}
    if isinstance(t, LayoutTemplate):
        out["options"] = {k: v if v is None or isinstance(v, bool | int | float | str) else str(v)
                          for k, v in t.layout.options.items()}
    return out


@dataclass
class Session:
    """The playground's state: the tokenizer (one for the process), the
    template files pasted (by their text), and the llguidance tokenizer
    once the grammar view has needed it."""

    vocab: Vocabulary | None
    """None: each template gets the small BPE of :func:`default_tokenizer`."""
    default_template: str = "kimi-k3"
    tokenizer_name: str = "a small byte-level BPE made on the spot"
    trusted: set[str] = field(default_factory=set)
    """Template texts that may read local files: the one the playground was
    started with (its operator's). Any other template comes from whoever can
    reach the API, and may not."""
    _pasted: dict[str, Template] = field(default_factory=dict)
    _made: dict[str, Vocabulary] = field(default_factory=dict)
    _ll: dict[int, Any] = field(default_factory=dict)

    # -- inputs --------------------------------------------------------------------

    def template(self, raw: Any) -> Template:
        """``{"name": ...}`` (a built-in), ``{"toml": ...}`` (a template
        file's text, checked), or None for the default."""
        if raw is None:
            return load(self.default_template)
        if not isinstance(raw, dict):
            raise FieldError("template must be an object: {\"name\": ...} or {\"toml\": ...}", field="template")
        if "toml" in raw:
            text = raw["toml"]
            if not isinstance(text, str):
                raise FieldError("template.toml must be the template file's text", field="template")
            t = self._pasted.get(text)
            if t is None:
                d, problems = check_any_text(text, "template.toml")
                if d is None:
                    p = problems[0]
                    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                    hint = f"; {p.hint}" if p.hint else ""
                    raise FieldError(f"{p.message}{hint}{more}", field="template", location=p.where("template.toml"),
                                     line=p.line, column=p.column)
                if isinstance(d, Dialect) and text not in self.trusted:
                    _refuse_file_reading(d, text)
                t = Template(d) if isinstance(d, Dialect) else LayoutTemplate(d)
                if len(self._pasted) >= 16:
                    del self._pasted[next(iter(self._pasted))]
                self._pasted[text] = t
            return t
        name = raw.get("name", self.default_template)
        if not isinstance(name, str) or (name not in BUILTIN and name not in LAYOUT_BUILTIN):
            raise FieldError(f"template.name must be a built-in template ({', '.join([*BUILTIN, *LAYOUT_BUILTIN])}), "
                             f"not {str(name)[:40]!r}", field="template")
        return load(name)

    def tokenizer(self, t: Template) -> Vocabulary:
        if self.vocab is not None:
            return self.vocab
        key = t.name + "\0" + "\0".join(_own_tokens(t))
        v = self._made.get(key)
        if v is None:
            v = default_tokenizer(t)
            if len(self._made) >= 8:
                del self._made[next(iter(self._made))]
            self._made[key] = v
        return v

    def binding(self, t: Template) -> Binding | TokenBinding:
        try:
            return t.bind(self.tokenizer(t))
        except XtmlError as e:
            raise FieldError(f"the template's markers do not fit the tokenizer: {e}", field="template") from None

    def completion(self, t: Template, body: Mapping[str, Any]) -> list[int]:
        """The completion of a parse, stream or grammar call as ids: a JSON
        array of ids (``from: "ids"``), or text whose marker strings are
        their special ids (``from: "text"``, as the model would have made
        them)."""
        raw = body.get("completion", "")
        kind = body.get("from", "text")
        if not isinstance(raw, str):
            raise FieldError("completion must be text (the ids as a JSON array, or the text)", field="completion")
        vocab = self.binding(t).vocab
        if kind == "ids":
            data = _json_field(raw, "completion")
            if not isinstance(data, list):
                raise FieldError(f"completion: expected a JSON array of token ids, not {_kind(data)}",
                                 field="completion")
            _at_most(data)
            for k, x in enumerate(data):
                if type(x) is not int:
                    raise FieldError(f"completion: expected a JSON array of token ids: element {k} is "
                                     f"{str(x)[:40]}", field="completion", location=f"[{k}]")
                if not 0 <= x < vocab.size:
                    raise FieldError(f"completion: token {k} is {x}, not an id of the tokenizer (0 to "
                                     f"{vocab.size - 1})", field="completion", location=f"[{k}]")
            if t.max_chars is not None and len(data) > t.max_chars:
                raise FieldError(f"completion: {len(data):,} ids, more than {t.max_chars:,}", field="completion")
            return data
        if kind != "text":
            raise FieldError(f"from must be \"text\" or \"ids\", not {str(kind)[:40]!r}", field="from")
        if len(raw) > MAX_TEXT:
            raise FieldError(f"completion: {len(raw):,} characters, more than the {MAX_TEXT:,} the playground "
                             "reads", field="completion")
        try:
            return _at_most(t.completion_ids(raw, vocab))
        except XtmlError as e:
            raise _from(e, "completion") from None

    def request(self, body: Mapping[str, Any]) -> tuple[Template, Any, dict[str, Any]]:
        t = self.template(body.get("template"))
        return t, _json_field(body.get("request"), "request"), _options(body.get("options"))

    # -- render and training -------------------------------------------------------

    def render(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Every token of the request with its id, bytes, kind and source;
        counts per message; the marker literals of its text form; and the
        loss mask with the budget check (or why there is none)."""
        t, request, options = self.request(body)
        b = self.binding(t)
        if isinstance(t, LayoutTemplate):
            assert isinstance(b, TokenBinding)
            return self._render_layout(t, b, request, options)
        assert isinstance(b, Binding)
        try:
            rendered = t.render(request, **options)
            if len(rendered.text) > MAX_TEXT:
                raise FieldError(f"the request renders to {len(rendered.text):,} characters, more than the "
                                 f"{MAX_TEXT:,} the playground shows", field="request")
            doc = t.document(request, **options)
            ids = t.encode(request, b.vocab, **options)
        except XtmlError as e:
            raise _from(e, "request") from None
        toks = list(_tokens(doc, b))
        table = b.vocab.byte_table()
        out_tokens: list[dict[str, Any]] = []
        for k, (tid, marker, message, path) in enumerate(toks):
            raw = table[tid] if tid < len(table) and not marker else b.vocab.decode([tid]).encode()
            out_tokens.append({"id": tid, "text": b.vocab.decode([tid]), "bytes": raw.hex(" "), "marker": marker,
                               "message": message, "path": "/".join(path), "offset": k})
        messages: dict[int, dict[str, Any]] = {}
        for tok in out_tokens:
            m = messages.setdefault(tok["message"], {"index": tok["message"], "tokens": 0, "role": None,
                                                     "source": None})
            m["tokens"] += 1
        roles = _roles(doc, t)
        for k, m in messages.items():
            m["role"] = roles.get(k)
        found = rendered.ambiguous
        ambiguous = [{"offset": a.offset, "marker": a.marker, "message": a.message, "tokens": span}
                     for a, span in zip(found, _literal_tokens(rendered.segments, found, b), strict=True)]
        result: dict[str, Any] = {
            "template": t.name, "tokenizer": self.tokenizer_name, "ids": ids, "tokens": out_tokens,
            "messages": list(messages.values()), "text": rendered.text, "ambiguous": ambiguous,
            "consistent": [x["id"] for x in out_tokens] == ids,
        }
        result["training"] = training = self._training(t, b, request, options, ids)
        # Which of the request's messages each rendered one is (None: one the
        # template writes itself, or the generation prompt), from the spans.
        for span in training.get("spans", ()):
            if span["channel"] is None and span["start"] < len(out_tokens):
                messages[out_tokens[span["start"]]["message"]]["source"] = span["message"]
        return result

    def _render_layout(self, t: LayoutTemplate, b: TokenBinding, request: Any,
                       options: dict[str, Any]) -> dict[str, Any]:
        """The render view of a layout dialect: it has no markup tree, so
        each token's ``path`` is None and tokens are grouped by the frame
        (the turn) that writes them; the render's declared drops are listed."""
        try:
            rendered = t.render(request, **options)
            if len(rendered.text) > MAX_TEXT:
                raise FieldError(f"the request renders to {len(rendered.text):,} characters, more than the "
                                 f"{MAX_TEXT:,} the playground shows", field="request")
            ids = t.encode(request, b.vocab, **options)
        except XtmlError as e:
            raise _from(e, "request") from None
        marker_ids = b.char_of_id
        table = b.vocab.byte_table()
        turns = frames(t, b, ids)
        out_tokens: list[dict[str, Any]] = []
        raws: list[bytes] = []
        for k, tid in enumerate(ids):
            marker = tid in marker_ids
            text = b.vocab.decode([tid])
            raw = table[tid] if tid < len(table) and not marker else text.encode()
            raws.append(raw)
            out_tokens.append({"id": tid, "text": text, "bytes": raw.hex(" "), "marker": marker,
                               "message": turns[k], "path": None, "offset": k})
        messages: dict[int, dict[str, Any]] = {}
        for tok in out_tokens:
            m = messages.setdefault(tok["message"], {"index": tok["message"], "tokens": 0, "role": None,
                                                     "source": None})
            m["tokens"] += 1
        frame_roles(t, out_tokens, messages, request)
        found = rendered.ambiguous
        spans = literal_spans(rendered.text, found, raws)
        ambiguous = [{"offset": a.offset, "marker": a.marker, "message": out_tokens[span[0]]["message"],
                      "tokens": span} for a, span in zip(found, spans, strict=True)]
        return {
            "template": t.name, "tokenizer": self.tokenizer_name, "ids": ids, "tokens": out_tokens,
            "messages": list(messages.values()), "text": rendered.text, "ambiguous": ambiguous,
            # The ids of encode and those of the render's own segments: one and the same.
            "consistent": b.encode_segments(rendered.segments) == ids,
            "layout": True,
            "tree": f"{t.name} is a layout dialect: it has no markup tree; its tokens are grouped by the turn "
                    "that writes them",
            "dropped": [{"message": d.message, "field": d.field, "why": d.why} for d in rendered.dropped],
            "training": self._training(t, b, request, options, ids),
        }

    def _training(self, t: Template, b: Binding | TokenBinding, request: Any, options: dict[str, Any],
                  ids: list[int]) -> dict[str, Any]:
        # As lint-dataset reads a row: without the generation prompt unless the
        # request asks for it.
        try:
            ex = t.encode_training(with_training_defaults(request), b.vocab, **options)
        except XtmlError as e:
            return {"error": str(e)}
        # A layout dialect declares no thinking budgets: nothing runs over one.
        rules = getattr(t.dialect, "training", None)
        over = overruns(ex, t.dialect) if rules is not None else []
        return {
            "ids": ex.ids, "mask": list(ex.mask_bytes), "effort": ex.effort,
            "trained": sum(ex.mask_bytes), "same_ids": ex.ids == ids[: len(ex.ids)],
            "budgets": dict(rules.budgets) if rules is not None else {},
            "think_channel": t.dialect.channel_tag("reasoning"),
            "spans": [{"message": s.message, "role": s.role, "channel": s.channel, "start": s.start, "end": s.end,
                       "body_tokens": s.body_tokens} for s in ex.spans],
            "overruns": [{"message": o.message, "effort": o.effort, "tokens": o.tokens, "budget": o.budget}
                         for o in over],
        }

    # -- parse and stream ----------------------------------------------------------

    def _tokens_of(self, b: Binding | TokenBinding, ids: Sequence[int]) -> list[dict[str, Any]]:
        table = b.vocab.byte_table()
        markers = _marker_ids(b)
        return [{"id": i, "text": b.vocab.decode([i]), "marker": i in markers,
                 "bytes": table[i].hex(" ") if i < len(table) else ""} for i in ids]

    def parse(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A lenient parse of the completion on ids, its diagnostics with their
        token offsets, and the ``chat.completion`` object a server returns."""
        t = self.template(body.get("template"))
        b = self.binding(t)
        ids = self.completion(t, body)
        thinking = _thinking(body)
        try:
            parsed = t.parse(ids, b.vocab, completion=True, lenient=True, thinking=thinking)
        except XtmlError as e:
            raise _from(e, "completion") from None
        message = {k: v for k, v in parsed.items() if k != "diagnostics"}
        return {"tokens": self._tokens_of(b, ids), "message": message,
                "diagnostics": parsed.get("diagnostics", []),
                "openai": chat_completion(parsed, model=t.name)}

    def stream(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The completion fed to the stream parser ``delta`` ids at a time
        (or random sizes from 1 to ``delta`` with ``random``): per step, the
        ids fed, the events and chunks they gave, and the ids read but not
        yet shown in any event, with the reason."""
        t = self.template(body.get("template"))
        b = self.binding(t)
        ids = self.completion(t, body)
        delta = body.get("delta", 1)
        if type(delta) is not int or not 1 <= delta <= 1000:
            raise FieldError("delta must be a whole number from 1 to 1000", field="delta")
        rng = random.Random(body.get("seed", 0) if type(body.get("seed", 0)) is int else 0)
        sizes = _sizes(len(ids), delta, rng if body.get("random") else None)
        if len(sizes) > MAX_STEPS:
            raise FieldError(f"the replay would take {len(sizes):,} steps, more than {MAX_STEPS:,}: take a larger "
                             "delta", field="delta")
        parser = t.stream(b.vocab, thinking=_thinking(body))
        chunks = ChunkStream(model=t.name, template=t, id="chatcmpl-playground", created=0,
                             ids=_call_ids())
        steps: list[dict[str, Any]] = []
        # Markers among the first k ids, so that whether a held run holds one
        # is known without reading it: a tag that never reaches its
        # separator holds every id after it, step after step.
        marker_ids = _marker_ids(b)
        markers = [0]
        for i in ids:
            markers.append(markers[-1] + (i in marker_ids))
        at = 0
        shown = 0  # ids up to here have shown up in an event
        for size in [*sizes, 0]:
            fed = ids[at : at + size]
            events = parser.feed_many(fed) if size else parser.close()
            at += size
            out_events = [_event(e) for e in events]
            for e in events:
                shown = max(shown, e.offset + 1)
            out_chunks = chunks.feed(events)
            # The held ids are the answer's tokens[held_from:held_from+held]:
            # said by their extent, not again as tokens at every step.
            held_from = min(shown, at) if size else at
            held = at - held_from
            why = _why_held(b, ids, held_from, at, markers[at] > markers[held_from], isinstance(t, LayoutTemplate))
            steps.append({"start": at - size, "ids": fed, "closed": not size, "events": out_events,
                          "chunks": out_chunks, "held": held, "held_from": held_from, "why": why,
                          "state": parser.state.value})
        return {"tokens": self._tokens_of(b, ids), "steps": steps, "message": chunks.message}

    # -- grammar -------------------------------------------------------------------

    def grammar(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The llguidance grammar of the request's completion and, after the
        first ``position`` ids of the completion, the ids it allows next
        (``offset``/``limit`` page them)."""
        t, request, options = self.request(body)
        b = self.binding(t)
        try:
            if isinstance(t, LayoutTemplate):
                # The request's own errors are the request's; a grammar the
                # dialect does not have yet is the view's to say.
                t.render(request, **options)
                try:
                    grammar = t.completion_grammar(request, b.vocab, format="llguidance", **options)
                except OptionError as e:
                    return {"grammar": "", "available": False, "missing": str(e)}
            else:
                grammar = t.completion_grammar(request, b.vocab, format="llguidance", **options)
        except XtmlError as e:
            raise _from(e, "request") from None
        result: dict[str, Any] = {"grammar": grammar}
        try:
            import llguidance
        except ImportError:
            result["available"] = False
            result["install"] = "pip install 'llguidance>=1.9'"
            return result
        result["available"] = True
        ids = self.completion(t, body)
        position = body.get("position", len(ids))
        if type(position) is not int or not 0 <= position <= len(ids):
            raise FieldError(f"position must be a whole number from 0 to {len(ids)} (the completion's length)",
                             field="position")
        offset, limit = body.get("offset", 0), body.get("limit", 200)
        if type(offset) is not int or offset < 0:
            raise FieldError("offset must be a whole number, 0 or more", field="offset")
        if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
            raise FieldError(f"limit must be a whole number from 1 to {MAX_PAGE}", field="limit")
        lltok = self._lltokenizer(llguidance, t, b)
        if lltok is None:
            result["available"] = False
            result["install"] = "the grammar view needs a tokenizer.json tokenizer (llguidance reads its JSON)"
            return result
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        if m.is_error():
            raise FieldError(f"llguidance refused the grammar: {m.get_error()}", field="request")
        taken = m.try_consume_tokens(ids[:position])
        result["position"] = position
        result["consumed"] = taken
        result["tokens"] = self._tokens_of(b, ids)
        if taken < position:
            result["refused"] = {"offset": taken, "id": ids[taken], "text": b.vocab.decode([ids[taken]]),
                                 "why": m.get_error() or "the grammar allows no such token here"}
            result["allowed_count"] = 0
            result["allowed"] = []
            return result
        mask = m.compute_bitmask()
        allowed = list(_bits(mask, b.vocab.size))
        result["accepting"] = m.is_accepting()
        result["allowed_count"] = len(allowed)
        page = allowed[offset : offset + limit]
        result["offset"], result["limit"] = offset, limit
        result["allowed"] = self._tokens_of(b, page)
        return result

    def _lltokenizer(self, llguidance: Any, t: Template, b: Binding | TokenBinding) -> Any:
        end = b.stop_ids[0] if isinstance(b, TokenBinding) else b.marker_ids[t.markers.end]
        hit = self._ll.get(end)
        if hit is not None and hit[0] is b.vocab:
            return hit[1]
        to_str = getattr(b.vocab.tokenizer, "to_str", None)
        if not callable(to_str):
            return None
        # Built once per tokenizer and end marker: about two seconds for 129k ids.
        lltok = llguidance.LLTokenizer(to_str(), eos_token=end)
        self._ll[end] = (b.vocab, lltok)
        return lltok


def _refuse_file_reading(d: Dialect, text: str) -> None:
    """A located error if the template would read local files named in
    requests (``read_files = true`` in a plugin's table): through the API, a
    pasted template or a shared link's would let anyone who can reach the
    page open this machine's image and audio files."""
    for name, conf in d.plugins.items():
        if getattr(conf, "read_files", False) is True:
            key = f"plugins.{name}.read_files"
            pos = locate(text, key)
            line, column = pos if pos is not None else (None, None)
            where = f"template.toml:{line}:{column}: {key}" if line is not None else f"template.toml: {key}"
            raise FieldError(f"{key} = true: a template sent to the playground may not read local files (a "
                             "request's image or audio path would be opened on this machine); to use one that "
                             "does, start the playground with it: xtml playground -t FILE", field="template",
                             location=where, line=line, column=column)


def _at_most(ids: list[int]) -> list[int]:
    if len(ids) > MAX_IDS:
        raise FieldError(f"completion: {len(ids):,} ids, more than the {MAX_IDS:,} the playground reads",
                         field="completion")
    return ids


def _thinking(body: Mapping[str, Any]) -> bool | None:
    v = body.get("thinking")
    if v is not None and type(v) is not bool:
        raise FieldError("thinking must be true, false or null (the template's default)", field="thinking")
    return v


def _call_ids() -> Any:
    n = 0

    def make() -> str:
        nonlocal n
        n += 1
        return f"call_{n}"

    return make


def _sizes(n: int, delta: int, rng: random.Random | None) -> list[int]:
    out: list[int] = []
    left = n
    while left > 0:
        k = min(left, rng.randint(1, delta) if rng is not None else delta)
        out.append(k)
        left -= k
    return out


def _event(e: Any) -> dict[str, Any]:
    return {k: v for k in ("type", "offset", "channel", "text", "index", "name", "key", "value_type", "call",
                           "message", "stop_reason", "diagnostic", "role") if (v := getattr(e, k)) is not None}


def _why_held(b: Binding | TokenBinding, ids: Sequence[int], start: int, end: int, marker: bool,
              layout: bool = False) -> str:
    """Why ``ids[start:end]``, read, have not shown in an event yet
    (``marker``: whether a marker is among them; ``layout``: the stream of
    a layout dialect). Looks at the run's last few ids at most: a run that
    is not cut inside a character is text the parser is still reading,
    however long it is."""
    if start >= end:
        return ""
    if layout and marker:
        return ("a token of the format: what it opens (a tool call, say) goes out with the message, read whole "
                "when the answer ends")
    if marker:
        return ("a tag: what it opens or closes is known at its separator marker, so its marker and name wait "
                "for it")
    table = b.vocab.byte_table()
    tail = b"".join(table[i] for i in ids[max(start, end - 4) : end] if i < len(table))[-4:]
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(tail, final=False)
    if decoder.getstate()[0]:
        return "bytes of a character not complete yet: text goes out in whole characters"
    if layout:
        return ("text whose place is not known yet: newlines that may end a block or come before a call, or an "
                "answer the format reads whole when it ends")
    return "text that may still be part of a tag or an element the parser is reading"


def _marker_ids(b: Binding | TokenBinding) -> Mapping[int, Any]:
    """The ids that are the format's own: an XTML dialect's markers, a
    layout dialect's tokens that are one id in this vocabulary (one it
    spells as text is text)."""
    return b.char_of_id if isinstance(b, TokenBinding) else b.kind_of_id



def _bits(mask: bytes, size: int) -> Iterator[int]:
    """The ids set in llguidance's bitmask (32-bit little-endian words)."""
    for byte_at, byte in enumerate(mask):
        if not byte:
            continue
        base = byte_at * 8
        for bit in range(8):
            if byte >> bit & 1 and base + bit < size:
                yield base + bit


def _tokens(doc: Any, b: Binding) -> Iterator[tuple[int, bool, int, tuple[str, ...]]]:
    """Each id of a document with whether it is a marker, its message (by
    position among the rendered messages) and element path."""
    for ids, message, path in b.attributed(doc):
        for i in ids:
            yield i, i in b.kind_of_id, message, path


def _roles(doc: Any, t: Template) -> dict[int, str]:
    n = t.dialect.names
    out: dict[int, str] = {}
    k = -1
    for node in doc.nodes:
        if isinstance(node, Element):
            k += 1
            attrs = dict(node.attrs)
            role = attrs.get(n["role"])
            out[k] = f"{role} ({attrs[n['type']]})" if role and n["type"] in attrs else (role or node.tag)
    return out


def _literal_tokens(segments: Sequence[Segment], found: Sequence[Ambiguity], b: Binding) -> list[list[int]]:
    """The first and last token of each marker literal of ``found``, as
    ``[first, last]`` offsets among the render's ids.

    Each segment is encoded once (its ids and those of the segments before
    it are what the render's ids are made of), and each literal's characters
    are found among its segment's tokens by the tokens' lengths, added up
    once per segment: the cost is the render's size plus a search per
    literal, however many literals there are."""
    if not found:
        return []
    per_segment = [b.encode_segments([s]) for s in segments]
    first: list[int] = []
    total = 0
    for ids in per_segment:
        first.append(total)
        total += len(ids)
    starts: list[int] = []
    at = 0
    for s in segments:
        starts.append(at)
        at += len(s.text)
    by_segment: dict[int, list[int]] = {}
    for k, a in enumerate(found):
        by_segment.setdefault(a.segment, []).append(k)
    out: list[list[int]] = [[] for _ in found]
    for seg, which in by_segment.items():
        ids = per_segment[seg]  # never empty: the segment holds the literal
        text = segments[seg].text
        spans = [(found[k].offset - starts[seg], found[k].offset - starts[seg] + len(found[k].marker)) for k in which]
        ends, where = _token_ends(text, ids, [p for span in spans for p in span], b)
        for k, (lo_at, hi_at) in zip(which, zip(where[::2], where[1::2], strict=True), strict=True):
            # The first token ending past the literal's start, and the first
            # ending at or past its end (the segment's last for a literal
            # that runs on into the next segment).
            lo = min(bisect_right(ends, lo_at), len(ids) - 1)
            hi = min(bisect_left(ends, hi_at), len(ids) - 1)
            out[k] = [first[seg] + lo, first[seg] + hi]
    return out


def _token_ends(text: str, ids: Sequence[int], chars: Sequence[int], b: Binding) -> tuple[list[int], list[int]]:
    """Where each token of ``text`` (encoded as ``ids``) ends, and where
    each character offset of ``chars`` is, in the same unit: UTF-8 bytes
    when the vocabulary has a byte table (a token may hold part of a
    character), else characters, from the tokenizer's own offsets."""
    table = b.vocab.byte_table()
    if table and all(i < len(table) for i in ids):
        ends: list[int] = []
        n = 0
        for i in ids:
            n += len(table[i])
            ends.append(n)
        # Characters to bytes in one walk of the text, in offset order.
        order = sorted(range(len(chars)), key=chars.__getitem__)
        where = [0] * len(chars)
        pos = nbytes = 0
        for j in order:
            c = min(max(chars[j], 0), len(text))
            nbytes += len(text[pos:c].encode("utf-8", "surrogatepass"))
            pos = c
            where[j] = nbytes
        return ends, where
    encoding = b.vocab.tokenizer.encode(text, add_special_tokens=False)
    return [end for _, end in encoding.offsets], list(chars)
