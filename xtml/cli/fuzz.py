"""``xtml fuzz``: the properties of :mod:`xtml.testing`, run on one template.

:func:`run` checks, with hypothesis, for ``examples`` generated inputs each:

* round trip (ids): ``parse(encode(x)) == normalize(x)``;
* round trip (text): the same through the text form, where it is unambiguous;
* injection: no text becomes a marker (or any special token);
* stream = batch: a streamed completion gives the batch parser's message;
* never crash (ids), never crash (text): arbitrary input ends in a result or
  an ``XtmlError``, and lenient parsing never raises;
* markup: well-formed markup from the grammar parses, the parser agrees
  with the reference grammar, and it never crashes a chat parse either.

Without a tokenizer, the id-level properties run on a byte-level vocabulary
holding the template's markers (:func:`xtml.vocab.byte_vocabulary`):
everything but a model vocabulary's own merges is checked. Progress, the
summary and errors go to ``err``; on the first failure the minimal failing
input (a request, token ids or a string) is written to ``out`` as one line of
JSON, so that ``xtml fuzz ... > case.json`` gives a file ``xtml render`` or
``xtml parse`` reads.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from ..errors import XtmlError
from ..template import Template, TokenizerLike, load
from .common import extra_missing, refuse_layout

__all__ = ["run"]


@dataclass
class _Property:
    name: str
    strategy: Any
    """A hypothesis strategy (hypothesis is imported by :mod:`xtml.testing` only)."""
    check: Callable[[Any], None]
    show: Callable[[Any], Any]
    """The input to print as JSON."""
    note: Callable[[Any], str | None] = lambda _: None
    """Anything else about a failing input, for ``err``."""


def _same(x: Any) -> Any:
    return x


def _markup_check(t: Template, s: str) -> None:
    from .. import testing as xt

    xt.check_markup_parses(t, s)
    xt.check_never_crash(t, s)


def _properties(template: Template, tokenizer: Any | None) -> list[_Property]:
    from .. import testing as xt

    t = template
    same = _same  # the input is what to show
    text_level = [
        _Property("round trip (text)", xt.requests(t), lambda r: xt.check_round_trip(t, r, None), same),
        _Property("never crash (text)", xt.texts(t), lambda s: xt.check_never_crash(t, s), same),
        _Property("markup", xt.markup(t), lambda s: _markup_check(t, s), same),
    ]
    if tokenizer is None:
        return text_level
    return [
        _Property("round trip (ids)", xt.requests(t), lambda r: xt.check_round_trip(t, r, tokenizer), same),
        text_level[0],
        _Property("injection", xt.requests(t), lambda r: xt.check_injection_free(t, r, tokenizer), same),
        _Property("stream = batch", xt.stream_cases(t),
                  lambda rc: xt.check_stream_equals_batch(t, rc[0], tokenizer, rc[1] or None),
                  lambda rc: rc[0],
                  lambda rc: f"fed in chunks of {rc[1]} ids" if rc[1] else "fed one token at a time"),
        _Property("never crash (ids)", xt.token_ids(t, tokenizer), lambda ids: xt.check_never_crash(t, ids, tokenizer),
                  same),
        *text_level[1:],
    ]


def _json(x: Any) -> str:
    try:
        return json.dumps(x, ensure_ascii=False)
    except (TypeError, ValueError):
        return json.dumps(repr(x))


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
    except UnicodeEncodeError:
        stream.write(text.encode("ascii", "backslashreplace").decode("ascii"))
    stream.flush()


def run(
    template: Template | str | os.PathLike[str],
    tokenizer: TokenizerLike | None,
    *,
    examples: int,
    seed: int | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """Fuzz ``template`` (a :class:`~xtml.Template`, built-in name or file)
    with ``tokenizer`` (a :class:`~xtml.Vocabulary`, ``tokenizers.Tokenizer``
    or path; None for the text form only).

    Returns 0 when every property held for ``examples`` inputs each, 1 on the
    first failure (after printing its minimal input as JSON to ``out``) or
    when the template or tokenizer cannot be used, 2 on a usage error
    (hypothesis missing, ``examples`` < 1). ``seed`` makes the run
    reproducible; without one, a seed is drawn and printed."""
    try:
        from .. import testing as xt
    except ImportError as e:
        _write(err, f"xtml: usage error: {extra_missing('xtml fuzz', 'testing', e.name or 'hypothesis')}\n")
        return 2
    if examples < 1:
        _write(err, "xtml: usage error: --examples must be at least 1\n")
        return 2
    try:
        tpl = template if isinstance(template, Template) else load(template)
        refuse_layout(tpl, "xtml fuzz")
        if tokenizer is None:
            from ..vocab.vocabulary import byte_vocabulary

            tokenizer = byte_vocabulary(tpl.markers.all())
        vocab = tpl.bind(tokenizer).vocab
    except XtmlError as e:
        # The one-line error every command prints.
        _write(err, f"xtml: error: {e}\n")
        return 1
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    _write(err, f"xtml fuzz: template {tpl.name}, tokenizer {vocab.source}; {examples} examples per property, "
                f"seed {seed}\n")
    props = _properties(tpl, vocab)
    width = max(len(p.name) for p in props)
    total = 0
    started = time.perf_counter()
    for p in props:
        _write(err, f"  {p.name:<{width}}  ")  # the rest of the line when it is done
        t0 = time.perf_counter()
        outcome = xt.find_failure(p.strategy, p.check, examples=examples, seed=seed)
        dt = time.perf_counter() - t0
        total += outcome.examples
        f = outcome.failure
        _write(err, f"{outcome.examples:>6} examples  {dt:7.1f} s  {'ok' if f is None else 'FAILED'}\n")
        if f is None:
            continue
        message = str(f.error) or type(f.error).__name__
        if not isinstance(f.error, AssertionError):
            message = f"{type(f.error).__name__}: {message}"
        _write(err, "".join(f"    {line}\n" for line in message.splitlines() or [""]))
        if f.example is None:
            _write(err, "the failure happened while generating an input; no example to show\n")
            _write(out, "null\n")
        else:
            note = p.note(f.example)
            if note:
                _write(err, f"    ({note})\n")
            _write(err, "minimal failing input (JSON) on stdout\n")
            _write(out, _json(p.show(f.example)) + "\n")
        _write(err, f"xtml fuzz: {p.name} FAILED; reproduce with --seed {seed}\n")
        return 1
    _write(err, f"xtml fuzz: all {len(props)} properties held ({total} examples, "
                f"{time.perf_counter() - started:.1f} s, seed {seed})\n")
    return 0
