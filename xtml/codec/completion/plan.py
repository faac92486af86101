"""The plan of a completion: what the assistant may generate after the
generation prompt, read from the dialect and one request, checked, and
ready for a writer to spell in one grammar syntax (:data:`FORMATS`).

What the plan holds: the channels in the dialect's order, the first one
opened by the generation prompt; the think channel as the prompt's mode has
it; tool calls to the request's tools only, numbered from 1, each argument's
key and type from the tool's JSON schema (:mod:`.schema`); ``tool_choice``
(``auto``, ``required``, ``none``, a named function) and
``parallel_tool_calls``; ``response_format`` (the response holds JSON); the
elements content plugins declare (:meth:`ContentExtension.completion_grammar`)
inside the response; the close of the message and its end marker.

Markers are always special-token references (``<|open|>``, or ``<[ID]>`` with
the id from the tokenizer binding; ``Token(ID)`` for xgrammar), never string
literals: text that spells a marker stays text here as everywhere in xtml.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...chat.dialect import Dialect
from ...chat.fields import tool_function
from ...chat.request import prepare, split_request
from ...errors import OptionError, RequestError, TemplateError, TokenizerError
from ...plugins.api import ContentExtension
from ...vocab.binding import Binding
from .schema import Tool, typed_tool

__all__ = ["FORMATS", "FRAGMENT_NAMES", "MAX_CALLS", "Plan", "completion_plan", "deep_schemas_refused",
           "fragment_rules", "marker_id"]

FORMATS = ("llguidance", "xgrammar", "xgrammar-tag", "gbnf")
"""The grammar syntaxes a plan is made for:

* ``llguidance``: Lark text in llguidance's dialect, which
  ``llguidance.LLMatcher(tokenizer, text)`` takes as it is (so do engines
  that pass Lark grammars to it: vLLM, SGLang, llama.cpp);
* ``xgrammar``: EBNF for ``xgrammar.Grammar.from_ebnf`` (root rule ``root``),
  which cannot express everything: what it leaves out is listed in the
  grammar's header comment;
* ``xgrammar-tag``: an xgrammar structural tag (JSON), xgrammar's own door
  for chat formats, which vLLM and SGLang pass through: markers as tokens,
  text as tokens that are not special, the calls as one EBNF grammar
  inside it;
* ``gbnf``: GBNF for llama.cpp's own grammar sampler (root rule ``root``),
  for a llama.cpp built without llguidance; its header lists what it
  cannot express."""
MAX_CALLS = 64
"""Calls a message may make by default: each index is spelled out in the
grammar, so the count is bounded (``max_calls=`` raises it)."""

# A marker llguidance can reference by name: `<...>` without spaces or
# brackets inside, and not its numeric `<[...]>` form.
_NAMED = re.compile(r"<(?!\[)[^<>\s\[\]]+>\Z")


def completion_plan(d: Dialect, binding: Binding | None, request: Any, *,
                    format: str = "llguidance", max_calls: int = MAX_CALLS, json_fallback: bool = True,
                    token_refs: str = "auto", after_reasoning: bool = False, **options: Any) -> Plan:
    """The plan of what the assistant may generate for ``request`` after the
    generation prompt, for a grammar in ``format`` (see :data:`FORMATS`).

    ``request`` is what :meth:`~xtml.Template.render` takes (a body or a list
    of messages); ``options`` override its options as there. ``binding``
    checks that every marker is one special token and gives the ids of
    markers that are referenced by id: all of them with ``token_refs="id"``
    or for xgrammar, and those not spelled ``<...>`` otherwise. ``max_calls``
    bounds the calls of one message; ``json_fallback`` admits the dialect's
    json block in a call, holding the arguments as one JSON object of the
    tool's schema. ``after_reasoning`` starts the grammar where the
    reasoning channel the generation prompt opened has closed, for engines
    that constrain only the answer (vLLM starts structured output after the
    reasoning parser says the reasoning ended); with thinking off it
    changes nothing. Bad requests raise :class:`~xtml.RequestError`; a marker
    that is not one special token raises :class:`~xtml.TokenizerError`.
    """
    if format not in FORMATS:
        raise OptionError(f"format must be one of {', '.join(FORMATS)}, not {format!r}", option="format")
    if token_refs not in ("auto", "name", "id"):
        raise OptionError(f"token_refs must be auto, name or id, not {token_refs!r}", option="token_refs")
    if type(max_calls) is not int or max_calls < 1:
        raise OptionError(f"max_calls must be a positive integer, not {max_calls!r}", option="max_calls")
    with deep_schemas_refused():
        plan = _plan(d, request, options, max_calls=max_calls, json_fallback=json_fallback)
        if after_reasoning and plan.first and plan.first in plan.order and plan.thinking and \
                plan.d.n(plan.first) == plan.d.channel_tag("reasoning"):
            # The reasoning was written and closed: the grammar starts at the
            # next channel, which the model opens itself.
            plan.order = [k for k in plan.order if k != plan.first]
            plan.first = ""
        plan.format = format
        if format == "llguidance":
            _refuse_special_spellings(plan, request, _special_texts(d, binding))
        if binding is not None:
            plan.text_ids = _text_ids(binding)
            plan.specials = sorted(binding.vocab.special_ids())
        plan.refs = _marker_refs(d, binding, format, token_refs)
        if binding is not None:
            m = d.markers
            plan.marker_ids = {k: binding.marker_ids[s] for k, s in
                               (("open", m.open), ("close", m.close), ("sep", m.sep), ("end", m.end))
                               if s in binding.marker_ids}
    return plan


def marker_id(plan: Plan, key: str, writer: str) -> int:
    """The id of marker ``key`` (``open``, ``close``, ``sep``, ``end``) for a
    writer that spells ids its own way; a plan made without a tokenizer has
    none."""
    got = plan.marker_ids.get(key)
    if got is None:
        raise OptionError(f"the {writer} writer references markers by id: make the plan with the tokenizer",
                          option="format")
    return got


@contextmanager
def deep_schemas_refused() -> Iterator[None]:
    """Python's recursion limit, reached while a schema is read or written,
    raised as the request's fault: a schema nested that deeply no engine's
    compiler would take either."""
    try:
        yield
    except RecursionError:
        raise RequestError("a tool's parameters schema (or the response format's) is nested too deeply to write "
                           "as a grammar", location="tools") from None


@dataclass
class Plan:
    """What a completion may hold, for one grammar syntax: what every writer
    walks, channel by channel."""

    d: Dialect
    thinking: bool
    first: str
    """Key of the channel the generation prompt opened, or ``""``."""
    order: list[str]
    """Keys of the channels that may follow, in order, ``first`` included."""
    variants: list[dict[str, str]]
    """Each a way the channels may go together: channel key → ``text``,
    ``json``, ``empty`` (response), ``yes``, ``opt`` (tools)."""
    tools: list[Tool]
    max_calls: int
    json_fallback: bool
    response_schema: Any
    """The response's JSON schema under ``response_format``, else None."""
    elements: list[tuple[str, str]]
    """(plugin name, fragment) of the elements a response may hold."""
    summary: str
    notes: list[str] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)
    """Ids of added tokens that text may be encoded to (see :func:`_text_ids`)."""
    format: str = "llguidance"
    """The syntax the marker references are spelled for (see :data:`FORMATS`)."""
    refs: dict[str, str] = field(default_factory=dict)
    """How the grammar writes each marker: ``open``, ``close``, ``sep``, ``end``."""
    marker_ids: dict[str, int] = field(default_factory=dict)
    """The id of each of those markers, where the tokenizer binding gives it
    (for writers that spell ids their own way)."""
    specials: list[int] = field(default_factory=list)
    """Ids of the vocabulary's special tokens, which free text never is
    (empty without a tokenizer)."""


def _plan(d: Dialect, request: Any, options: Mapping[str, Any], *, max_calls: int, json_fallback: bool) -> Plan:
    # An API key render ignores, but it bounds the calls.
    parallel = options.get("parallel_tool_calls",
                           request.get("parallel_tool_calls") if isinstance(request, Mapping) else None)
    options = {k: v for k, v in options.items() if k != "parallel_tool_calls"}
    o, msgs = prepare(d, request, options)  # the same checks (and errors) as render
    _, opts = split_request(request, options)
    notes: list[str] = []
    declared = _declared_tools(o.tools, [(m.index, m.tools) for m in msgs if m.tools is not None])
    choice = opts.get("tool_choice")
    named: str | None = None
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        # Chat completions nest the name under "function"; the Responses API does not.
        named = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        if not isinstance(named, str) or not named:
            raise OptionError("a named tool_choice needs function.name", option="tool_choice")
        if named not in declared:
            raise OptionError(f"tool_choice names {named!r}, which the request does not declare",
                              option="tool_choice")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError("parallel_tool_calls must be true or false", location="parallel_tool_calls")
    if o.tool_choice == "required" and not declared:
        raise OptionError("tool_choice is required, but the request declares no tools", option="tool_choice")
    tools: list[Tool] = []
    if o.tool_choice != "none":
        for name, fn in declared.items():
            if named is None or name == named:
                t = typed_tool(name, fn, notes)
                if t is not None:
                    tools.append(t)
    mode = "none" if not tools else "yes" if o.tool_choice == "required" or named else "opt"
    if mode == "none" and (o.tool_choice == "required" or named):
        raise OptionError("no declared tool can be called with its schema", option="tool_choice")
    thinking = o.thinking
    first = d.prompt_channel[thinking]
    # Channels are named by their keys (rule names follow them) and read by
    # what they hold.
    key_of = {ch.holds: ch.key for ch in d.assistant_channels}
    answer, calls = key_of["content"], key_of["tool_calls"]
    present = [ch.key for ch in d.assistant_channels if ch.holds != "reasoning" or thinking]
    if first:
        present = present[present.index(first):]
    if answer not in present:
        raise TemplateError("the generation prompt opens a channel after the response", location=d.path)
    if calls not in present:
        mode = "none"
    rf = o.response_format
    response = "text" if rf is None else "json"
    schema: Any = None
    if rf is not None:
        schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
    tools_state = {"none": "no", "opt": "opt", "yes": "yes"}[mode]
    variants = [{answer: response, calls: tools_state}]
    if response == "json" and mode != "none":
        # A message that calls tools need not also answer in JSON.
        variants = [{answer: "json", calls: tools_state}, {answer: "empty", calls: "yes"}]
    order = [k for k in present if k != calls or mode != "none"]
    elements: list[tuple[str, str]] = []
    if response == "text":
        for ext in d.content:
            frag = _fragment(ext)
            if frag:
                elements.append((ext.name, frag))
    choice_text = (f"named {named!r}" if named else o.tool_choice or "auto")
    summary = (f"template {d.name}; thinking {'on' if thinking else 'off'}; tools "
               f"{', '.join(repr(t.name) for t in tools) or 'none'}; tool_choice {choice_text}"
               + ("; one call at most" if parallel is False else "")
               + (f"; response_format {rf['type']}" if rf else ""))
    return Plan(d, thinking, first, order, variants, tools, 1 if parallel is False else max_calls, json_fallback,
                schema, elements, summary, notes)


def _fragment(ext: ContentExtension) -> str | None:
    method: Callable[[Mapping[str, str]], str | None] | None = getattr(ext, "completion_grammar", None)
    if method is None:
        return None
    try:
        frag = method(FRAGMENT_NAMES)
    except Exception as e:  # a plugin's own bug must not pass for a grammar
        raise TemplateError(f"plugin {ext.name!r} failed to give its completion grammar: {type(e).__name__}: {e}",
                            location=f"plugins.{ext.name}") from None
    if frag is not None and not isinstance(frag, str):
        raise TemplateError(f"plugin {ext.name!r} gave a completion grammar that is not a string",
                            location=f"plugins.{ext.name}")
    return frag


def _declared_tools(top: Sequence[Any] | None, dynamic: list[tuple[int, list[Any]]]) -> dict[str, Any]:
    """Name → function object of every tool the request declares (the last
    declaration of a name wins, as a later declaration replaces it). The
    lists are the checked ones of :func:`prepare`, which refuses what is not
    a tool as render does."""
    out: dict[str, Any] = {}
    for ts in [top or (), *(ts for _, ts in dynamic)]:
        for t in ts:
            fn = tool_function(t)
            out[fn["name"]] = fn
    return out


def _text_ids(binding: Binding) -> list[int]:
    """Ids of the added tokens that are not special and that the tokenizer
    makes of their own spelling in ordinary text (Hugging Face tokenizers
    match such tokens in text; xtml's encoding leaves only special ones as
    text). Engines' grammar libraries treat every added token as special."""
    got: list[int] | None = binding.derived.get(_text_ids)
    if got is None:
        decoder = getattr(binding.vocab.tokenizer, "get_added_tokens_decoder", None)
        markers = set(binding.marker_ids.values())
        found = [(i, t.content) for i, t in decoder().items() if not t.special and i not in markers] \
            if decoder is not None else []
        encoded = binding.vocab.ids_of([c for _, c in found])
        got = binding.derived[_text_ids] = sorted(i for (i, _), ids in zip(found, encoded) if ids == [i])
    return got


def _marker_refs(d: Dialect, binding: Binding | None, fmt: str, how: str) -> dict[str, str]:
    """How the grammar writes each marker it uses (open, close, sep, end)."""
    m = d.markers
    out: dict[str, str] = {}
    for key, s in (("open", m.open), ("close", m.close), ("sep", m.sep), ("end", m.end)):
        sid = binding.marker_ids.get(s) if binding is not None else None
        if fmt == "llguidance" and how != "id" and (how == "name" or _NAMED.match(s)):
            if how == "name" and not _NAMED.match(s):
                raise TokenizerError(f"marker {s!r} cannot be referenced by name in llguidance's syntax; "
                                     "use token_refs='id' with a tokenizer")
            out[key] = s
        elif sid is None:
            raise TokenizerError(f"marker {s!r} is referenced by its token id here: pass the tokenizer "
                                 f"(--tokenizer) to {fmt}")
        else:
            out[key] = f"<[{sid}]>" if fmt == "llguidance" else f"Token({sid})"
    return out


class _Specials(NamedTuple):
    pattern: re.Pattern[str] | None
    """Any spelling of a marker or of a special token of the vocabulary."""
    plain: bool
    """Whether no spelling holds a character JSON writes escaped (so a
    schema's JSON text holds each spelling as it is)."""


def _special_texts(d: Dialect, binding: Binding | None) -> _Specials:
    """The spellings of the markers and of the vocabulary's special tokens
    (made once per binding: a large vocabulary has a thousand of them, and a
    gateway asks for a grammar per request)."""
    if binding is not None:
        hit: _Specials | None = binding.derived.get(_special_texts)
        if hit is not None:
            return hit
    out = set(d.markers.all())
    if binding is not None:
        decoder = getattr(binding.vocab.tokenizer, "get_added_tokens_decoder", None)
        if decoder is not None:
            special = binding.vocab.special_ids()
            out |= {t.content for i, t in decoder().items() if i in special and t.content}
    found = _Specials(re.compile("|".join(re.escape(x) for x in sorted(out))) if out else None,
                      not any(_ESCAPED.search(x) for x in out))
    if binding is not None:
        binding.derived[_special_texts] = found
    return found


# Characters JSON writes escaped.
_ESCAPED = re.compile(r'["\\\x00-\x1f]')


def _refuse_special_spellings(plan: Plan, request: Any, specials: _Specials) -> None:
    """A fixed string of the grammar (a tool name, an argument or property
    name, an enum or const string) that spells a special token: llguidance
    forces its bytes, its tokenizer makes them the special token, and the
    matcher then refuses the very token it forced (an error state
    mid-completion). Such a request is refused here, where its place can be
    named."""
    pattern = specials.pattern
    if pattern is None:
        return
    # Most schemas hold no such string: one search of their JSON text (in C)
    # rules that out before the walk that names a place, unless a spelling
    # holds a character JSON escapes.
    if specials.plain:
        # The request's depth was measured when it was read, so this
        # recurses no deeper than that.
        try:
            text = json.dumps([[t.name, t.params] for t in plan.tools] + [plan.response_schema], ensure_ascii=False)
        except (TypeError, ValueError):
            text = None
        if text is not None and not pattern.search(text):
            return
    places: dict[str, str] = {}
    if isinstance(request, Mapping):
        for i, t in enumerate(request.get("tools") or []):
            fn = t.get("function", t) if isinstance(t, Mapping) else None
            if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
                places[fn["name"]] = f"tools[{i}]" + (".function" if "function" in t else "")
    for t in plan.tools:
        where = places.get(t.name, f"tools ({t.name!r})")
        if pattern.search(t.name):
            raise RequestError(f"tool name {t.name!r} spells a special token, which a grammar cannot force as text",
                               location=f"{where}.name")
        _scan(t.params, pattern, f"{where}.parameters")
    if plan.response_schema is not None:
        _scan(plan.response_schema, pattern, "response_format.json_schema.schema")


def _scan(s: Any, pattern: re.Pattern[str], where: str) -> None:
    if isinstance(s, list):
        for k, x in enumerate(s):
            _scan(x, pattern, f"{where}[{k}]")
        return
    if not isinstance(s, Mapping):
        return
    fixed: list[tuple[str, Any]] = []
    props = s.get("properties")
    if isinstance(props, Mapping):
        fixed += [(f"{where}.properties[{json.dumps(k)}]", k) for k in props]
    for key in ("required", "enum"):
        if isinstance(s.get(key), list):
            fixed += [(f"{where}.{key}[{k}]", x) for k, x in enumerate(s[key])]
    if "const" in s:
        fixed.append((f"{where}.const", s["const"]))
    for place, x in fixed:
        if isinstance(x, str) and pattern.search(x):
            raise RequestError(f"{x!r} spells a special token, which a grammar cannot force as text", location=place)
    for k, x in s.items():
        if k == "properties" and isinstance(x, Mapping):
            for name, sub in x.items():
                _scan(sub, pattern, f"{where}.properties[{json.dumps(name)}]")
        elif k not in ("enum", "const", "required", "default", "examples"):
            _scan(x, pattern, f"{where}.{k}")


# -- plugin fragments ------------------------------------------------------------------

FRAGMENT_NAMES: Mapping[str, str] = {
    "start": "element", "open": "m_open", "close": "m_close", "sep": "m_sep", "text": "body_text",
    "value": "attr_value", "nonempty_value": "attr_value1",
}
"""The rule names a plugin's fragment uses (see
:meth:`~xtml.plugins.api.ContentExtension.completion_grammar`)."""

_FRAG_TOKEN = re.compile(r'\s+|//[^\n]*|"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|.', re.S)


def _fragment_tokens(plugin: str, frag: str) -> list[str]:
    """A fragment's tokens, checked: rules ``name: expression`` over string
    literals, rule names, ``( ) | ? * +``."""
    toks: list[str] = []
    for m in _FRAG_TOKEN.finditer(frag):
        t = m.group()
        if t.isspace() or t.startswith("//"):
            continue
        ok = t in (":", "|", "(", ")", "?", "*", "+") or re.fullmatch(r"[a-z_][a-z0-9_]*", t) is not None or (
            t[0] == '"' and _json_string(t))
        if not ok or (t == ":" and not (toks and (toks[-1][0].islower() or toks[-1][0] == "_"))):
            raise TemplateError(f"plugin {plugin!r}: completion grammar: unexpected {t[:20]!r} (rules are "
                                "'name: expression' over string literals, rule names and ( ) | ? * +)",
                                location=f"plugins.{plugin}")
        toks.append(t)
    return toks


def _json_string(t: str) -> bool:
    try:
        return isinstance(json.loads(t), str)
    except ValueError:
        return False


def fragment_rules(plugin: str, index: int, frag: str) -> list[tuple[str, list[str]]]:
    """(rule name, body tokens) of a fragment, its own rule names prefixed so
    that fragments of several plugins cannot collide."""
    toks = _fragment_tokens(plugin, frag)
    rules: list[tuple[str, list[str]]] = []
    for k, t in enumerate(toks):
        if k + 1 < len(toks) and toks[k + 1] == ":":
            rules.append((t, []))
        elif t != ":":
            if not rules:
                raise TemplateError(f"plugin {plugin!r}: completion grammar must start with a rule",
                                    location=f"plugins.{plugin}")
            rules[-1][1].append(t)
    own = {name for name, _ in rules}
    if FRAGMENT_NAMES["start"] not in own:
        raise TemplateError(f"plugin {plugin!r}: completion grammar must define {FRAGMENT_NAMES['start']!r}",
                            location=f"plugins.{plugin}")
    shared = set(FRAGMENT_NAMES.values()) - {FRAGMENT_NAMES["start"]}
    for name in own & shared:
        raise TemplateError(f"plugin {plugin!r}: completion grammar redefines {name!r}", location=f"plugins.{plugin}")
    out = []
    for name, body in rules:
        for t in body:
            if t[0].islower() or t[0] == "_":
                if t not in own and t not in shared:
                    raise TemplateError(f"plugin {plugin!r}: completion grammar uses undefined rule {t!r}",
                                        location=f"plugins.{plugin}")
        if not body:
            raise TemplateError(f"plugin {plugin!r}: completion grammar rule {name!r} is empty",
                                location=f"plugins.{plugin}")
        rename = {n: f"x{index}_{n}" for n in own}
        out.append((rename[name], [rename.get(t, t) for t in body]))
    return out

