"""``xtml validate``: everything wrong with a template, before it is used.

:func:`validate` runs the checks in order and collects findings instead of
stopping at the first: TOML syntax; keys, types and values of every section
(:func:`xtml.chat.template_file.check_text`); plugins and their settings; the
grammar built strictly; with a tokenizer, that every marker is one special id
and splits cleanly out of surrounding text; finally a self-test that renders
generated requests and parses them back. A layout dialect's file is checked
by the layout reader (:func:`xtml.chat.layout_file.check_any_text`) and its
tokens against the tokenizer; its self-test is not yet available.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..chat.dialect import Dialect
from ..chat.keys import locate
from ..chat.layout import LayoutDialect
from ..chat.layout_file import check_any_text
from ..chat.template_file import Problem, read_template
from ..errors import TemplateError, XtmlError

__all__ = ["Finding", "Report", "validate"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem, located."""

    check: str
    """Which check found it: ``toml``, ``template``, ``grammar``,
    ``tokenizer`` or ``self-test``."""
    message: str
    file: str
    line: int | None = None
    column: int | None = None
    key: str = ""
    """Dotted key path in the template, when the problem has one."""
    hint: str = ""

    def where(self) -> str:
        pos = f"{self.file}:{self.line}:{self.column}" if self.line is not None else self.file
        return f"{pos}: {self.key}" if self.key else pos

    def line_text(self) -> str:
        """The finding as one line (the hint, if any, follows after ``--``)."""
        hint = f" -- {self.hint}" if self.hint else ""
        return f"{self.where()}: {self.message}{hint}"


@dataclass
class Report:
    """What :func:`validate` found."""

    template: str
    findings: list[Finding] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    """The checks that ran, in order."""
    self_test_examples: int = 0
    dialect: Dialect | None = None
    not_yet: list[str] = field(default_factory=list)
    """Checks that do not run on this kind of template yet."""

    @property
    def valid(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        n = len(self.findings)
        state = "valid" if not n else f"{n} problem{'s' if n != 1 else ''}"
        ran = ", ".join(self.checks)
        later = f"; not yet for layout dialects: {', '.join(self.not_yet)}" if self.not_yet else ""
        return f"{self.template}: {state} (checked: {ran}{later})"

    def to_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "valid": self.valid,
            "checks": self.checks,
            "self_test_examples": self.self_test_examples,
            "findings": [asdict(f) for f in self.findings],
            **({"not_yet": self.not_yet} if self.not_yet else {}),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, indent=2)


def validate(template: str | Path, *, tokenizer: str | Path | None = None, examples: int = 50,
             seed: int = 0, add_markers: bool = False) -> Report:
    """Check a template (a built-in name or a file) and return every finding.

    ``tokenizer``: also check the markers against this vocabulary and run the
    self-test on its token ids (``add_markers``: after adding the template's
    markers to it as special tokens, as for a base model). ``examples``: requests the self-test renders and
    parses back (0 skips it); ``seed`` makes it reproducible."""
    try:
        text, where = read_template(template)
    except TemplateError as e:
        return Report(str(template), [Finding("template", e.msg, str(template))], ["file"])
    report = Report(where)
    report.checks.append("toml")
    dialect, problems = check_any_text(text, where)
    report.findings += [_finding("toml" if p.message.startswith("invalid TOML") else "template", p, where)
                        for p in problems]
    if report.findings and report.findings[0].check == "toml":
        return report
    if isinstance(dialect, LayoutDialect) or (dialect is None and _is_layout_text(text)):
        return _layout(report, dialect, text, where, tokenizer, add_markers, examples)
    report.checks += ["keys", "markers", "names", "placeholders", "plugins"]
    if dialect is None:
        return report
    report.dialect = dialect
    report.checks.append("grammar")
    report.findings += _grammar(dialect, where)
    vocab = None
    if tokenizer is not None:
        report.checks.append("tokenizer")
        vocab, found = _tokenizer(dialect, tokenizer, text, where, add_markers)
        report.findings += found
    if examples > 0 and not report.findings:
        report.checks.append("self-test")
        found, report.self_test_examples = _self_test(dialect, vocab, examples, seed, where, tokenizer)
        report.findings += found
    return report


def _is_layout_text(text: str) -> bool:
    from ..chat.template_file import is_layout
    from ..chat.toml_text import read_toml

    try:
        return is_layout(read_toml(text))
    except ValueError:  # tomllib's errors, and nesting past its reach
        return False


def _layout(report: Report, d: LayoutDialect | None, text: str, where: str, tokenizer: str | Path | None,
            add_markers: bool, examples: int) -> Report:
    """The rest of :func:`validate` for a layout dialect: its file was
    checked whole by the layout reader (sections, tokens, stop tokens,
    roles, frames, patterns and policies); with a tokenizer, every declared
    token must fit it."""
    report.checks += ["keys", "tokens", "patterns"]
    if d is None:
        return report
    if tokenizer is not None:
        from ..codec.layout import bind
        from ..vocab.load import load_tokenizer

        report.checks.append("tokenizer")
        try:
            bind(d, load_tokenizer(tokenizer, add_special_tokens=d.tokens if add_markers else ()))
        except XtmlError as e:
            pos = locate(text, "tokens")
            line, column = pos if pos else (None, None)
            report.findings.append(Finding("tokenizer", e.msg, where, line, column, "tokens",
                                           "for a base model's tokenizer, add the tokens as special tokens: xtml "
                                           "validate --add-markers"))
    if examples > 0:
        report.not_yet.append("self-test")
    return report


def _finding(check: str, p: Problem, file: str) -> Finding:
    return Finding(check, p.message, file, p.line, p.column, p.key, p.hint)


def _grammar(d: Dialect, file: str) -> list[Finding]:
    """The template's grammar (the core plus its plugins' fragments) must
    build as strict LALR parsers: a conflict would make parsing depend on
    rule order."""
    from lark import Lark
    from lark.exceptions import GrammarError

    for start, lexer in (("document", "basic"), ("header", "contextual")):
        try:
            Lark(d.grammar, start=start, parser="lalr", lexer=lexer, strict=True)
        except GrammarError as e:
            return [Finding("grammar", f"the grammar does not build strictly ({start}): {str(e).splitlines()[0]}",
                            file, key="plugins", hint="a plugin's grammar fragment conflicts with the core or "
                                                       "another plugin")]
    return []


def _tokenizer(d: Dialect, path: str | Path, text: str, file: str, add_markers: bool) -> tuple[Any, list[Finding]]:
    from ..vocab.load import load_tokenizer

    try:
        vocab = load_tokenizer(path, add_special_tokens=d.markers.all() if add_markers else ())
    except XtmlError as e:
        return None, [Finding("tokenizer", e.msg, str(path))]
    m = d.markers
    keyed: list[tuple[str, str]] = [("markers.open", m.open), ("markers.close", m.close), ("markers.sep", m.sep),
                                    ("markers.end", m.end)]
    for k in ("embed_begin", "embed_inner", "embed_end", "embed_mark"):
        keyed += [(f"markers.{k}", s) for s in getattr(m, k)]
    found: list[Finding] = []

    def add(key: str, message: str, hint: str) -> None:
        pos = locate(text, key)
        line, column = pos if pos else (None, None)
        found.append(Finding("tokenizer", message, file, line, column, key, hint))

    ids: dict[str, int] = {}
    for key, s in keyed:
        sid = vocab.special_id(s)
        if sid is None:
            if s in m.optional:
                continue
            added = vocab.added_id(s)
            what = "an added token but not a special one" if added is not None else "not a special token"
            add(key, f"marker {s!r} is {what} of {vocab.source}",
                "for a base model's tokenizer, add the markers as special tokens: xtml validate --add-markers "
                "(load_tokenizer(..., add_special_tokens=) in Python)")
            continue
        ids[s] = sid
        # Text holding the marker literal must never encode to its id.
        if sid in vocab.encode_texts([f"x{s}x"])[0]:
            add(key, f"text containing {s!r} encodes to the marker's id {sid}", "")
    # Encoding a rendered text whole (as engines that only see text do) must
    # give the marker's one id between the ids of its neighbours: a marker
    # that strips or merges with surrounding text would change the ids.
    whole = _whole_encoder(vocab)
    if whole is not None:
        for key, s in keyed:
            if s not in ids:
                continue
            for left, right in (("a ", " b"), ("\n", "\n"), ("x", "x")):
                got = whole(f"{left}{s}{right}")
                want = [*vocab.encode_texts([left])[0], ids[s], *vocab.encode_texts([right])[0]]
                if got != want:
                    add(key, f"marker {s!r} does not split cleanly from text {left!r}…{right!r}: "
                        f"encoding the text whole gives {got}, expected {want}",
                        "register the marker with normalized=False and no lstrip/rstrip")
                    break
    return vocab, found


def _whole_encoder(vocab: Any) -> Any:
    """A function encoding text with special tokens recognised, if the
    vocabulary offers one."""
    fn = getattr(vocab, "encode_with_specials", None)
    if fn is not None:
        return fn
    from tokenizers import Tokenizer

    tok = getattr(vocab, "tokenizer", None)
    if not isinstance(tok, Tokenizer):
        return None
    # The vocabulary's own copy encodes marker literals as text, on purpose;
    # engines that tokenize rendered text use the default, matching them.
    whole = Tokenizer.from_str(tok.to_str())
    whole.encode_special_tokens = False

    def encode(s: str) -> list[int]:
        return list(whole.encode(s, add_special_tokens=False).ids)

    return encode


def _self_test(d: Dialect, vocab: Any, examples: int, seed: int, file: str,
               tokenizer: str | Path | None) -> tuple[list[Finding], int]:
    from ..template import Template
    from ..vocab.vocabulary import byte_vocabulary
    from .checks import check_round_trip
    from .runner import find_failure
    from .strategies import requests

    t = Template(d)
    # Token ids carry no text-level ambiguity, so the self-test always runs
    # on ids: the model's vocabulary if given, else one id per byte.
    via = f"token ids of {vocab.source}" if vocab is not None else "token ids of a byte-level vocabulary"
    if vocab is None:
        vocab = byte_vocabulary(d.markers.all())
    outcome = find_failure(requests(t), lambda r: check_round_trip(t, r, vocab), examples=examples, seed=seed)
    if outcome.failure is None:
        return [], outcome.examples
    f = outcome.failure
    shown = json.dumps(f.example, ensure_ascii=False, default=repr)
    if len(shown) > 400:
        shown = shown[:400] + "…"
    again = f"xtml validate {file} --examples {examples} --seed {seed}"
    if tokenizer is not None:
        again += f" --tokenizer {tokenizer}"
    return [Finding("self-test", f"a generated request does not round-trip through {via}: "
                    f"{type(f.error).__name__}: {f.error}; request: {shown}", file,
                    hint=f"reproduce with {again}")], outcome.examples
