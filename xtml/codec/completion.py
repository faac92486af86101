"""The grammar of a completion, for constrained decoding.

From a template and one request, :func:`completion_grammar` writes the
token-level grammar of everything the assistant may generate after the
generation prompt, in the syntax a constrained-decoding library loads:

* ``llguidance``: Lark text in llguidance's dialect, which
  ``llguidance.LLMatcher(tokenizer, text)`` takes as it is (so do engines
  that pass Lark grammars to it: vLLM, SGLang, llama.cpp);
* ``xgrammar``: EBNF for ``xgrammar.Grammar.from_ebnf`` (root rule ``root``),
  which cannot express everything: what it leaves out is listed in the
  grammar's header comment.

What the grammar holds, read from the dialect and the request: the channels
in the dialect's order, the first one opened by the generation prompt; the
think channel as the prompt's mode has it; tool calls to the request's tools
only, numbered from 1, each argument's key and type from the tool's JSON
schema (required keys present, no key twice, no unknown key when
``additionalProperties`` is false, enums, integers, nested values as JSON);
``tool_choice`` (``auto``, ``required``, ``none``, a named function) and
``parallel_tool_calls``; ``response_format`` (the response holds JSON); the
elements content plugins declare (:meth:`ContentExtension.completion_grammar`)
inside the response; the close of the message and its end marker.

Markers are always special-token references (``<|open|>``, or ``<[ID]>`` with
the id from the tokenizer binding; ``Token(ID)`` for xgrammar), never string
literals: text that spells a marker stays text here as everywhere in xtml.
Text bodies are any text; a text terminal never matches a special token.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..chat.dialect import Dialect
from ..chat.request import prepare, split_request
from ..errors import OptionError, RequestError, TemplateError, TokenizerError
from ..markup.header import escape
from ..plugins.api import ContentExtension
from ..vocab.binding import Binding

__all__ = ["FORMATS", "MAX_CALLS", "completion_grammar"]

FORMATS = ("llguidance", "xgrammar")
MAX_CALLS = 64
"""Calls a message may make by default: each index is spelled out in the
grammar, so the count is bounded (``max_calls=`` raises it)."""
TRACKED = {"llguidance": 64, "xgrammar": 6}
"""How many argument keys of a tool the grammar tracks exactly (each key at
most once, required ones present). llguidance tracks them in a 64-bit rule
parameter; xgrammar needs one rule per subset of keys, so 2**6 rules at most.
With more keys, only the required ones are tracked when they fit, and the
other keys may repeat."""

_MAX_LENGTH = 1000
_TEXT_TYPES = ("string", "number", "boolean", "null", "object", "array")
_ALL_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
# A marker llguidance can reference by name: `<...>` without spaces or
# brackets inside, and not its numeric `<[...]>` form.
_NAMED = re.compile(r"<(?!\[)[^<>\s\[\]]+>\Z")


def completion_grammar(d: Dialect, binding: Binding | None, request: Any, *,
                       format: str = "llguidance", max_calls: int = MAX_CALLS, json_fallback: bool = True,
                       token_refs: str = "auto", **options: Any) -> str:
    """The grammar of what the assistant may generate for ``request`` after
    the generation prompt, as text in ``format`` (see :data:`FORMATS`).

    ``request`` is what :meth:`~xtml.Template.render` takes (a body or a list
    of messages); ``options`` override its options as there. ``tokenizer``
    (a :class:`~xtml.Vocabulary`, a ``tokenizers.Tokenizer`` or a path) checks
    that every marker is one special token and gives the ids of markers that
    are referenced by id: all of them with ``token_refs="id"`` or for
    xgrammar, and those not spelled ``<...>`` otherwise. ``max_calls`` bounds
    the calls of one message; ``json_fallback`` admits the dialect's json
    block in a call, holding the arguments as one JSON object of the tool's
    schema. Bad requests raise :class:`~xtml.RequestError`; a marker that is
    not one special token raises :class:`~xtml.TokenizerError`.
    """
    if format not in FORMATS:
        raise OptionError(f"format must be one of {', '.join(FORMATS)}, not {format!r}", option="format")
    if token_refs not in ("auto", "name", "id"):
        raise OptionError(f"token_refs must be auto, name or id, not {token_refs!r}", option="token_refs")
    if type(max_calls) is not int or max_calls < 1:
        raise OptionError(f"max_calls must be a positive integer, not {max_calls!r}", option="max_calls")
    try:
        plan = _plan(d, request, options, max_calls=max_calls, json_fallback=json_fallback)
        if binding is not None:
            plan.text_ids = _text_ids(binding)
        refs = _marker_refs(d, binding, format, token_refs)
        if format == "llguidance":
            return _Lark(plan, refs).write()
        assert binding is not None  # _marker_refs refused xgrammar without one
        specials = sorted(binding.vocab.special_ids())
        return _Ebnf(plan, refs, specials).write()
    except RecursionError:
        # Past Python's recursion limit: a schema no engine's compiler would
        # take either.
        raise RequestError("a tool's parameters schema (or the response format's) is nested too deeply to write "
                           "as a grammar", location="tools") from None


# -- what may be generated -------------------------------------------------------------


@dataclass(frozen=True)
class _Str:
    """One way to write a string value (raw, as string arguments are)."""

    texts: tuple[str, ...] | None = None
    """Exactly one of these; None: any text within the lengths."""
    min_len: int = 0
    max_len: int | None = None


@dataclass
class _Value:
    """How one argument's value may be written: the ``type`` attributes it
    may carry and, for each, what follows."""

    schema: Any
    """The property's schema (for the JSON of non-string values)."""
    root: Any
    """The tool's parameters schema, whose ``$defs`` the schema may use."""
    strings: list[_Str]
    """Ways to write a string value; empty: no string."""
    others: list[tuple[str, str]]
    """(type attribute, JSON type) of the non-string values it may be:
    ``("number", "integer")`` for a schema of integers."""


@dataclass
class _Arg:
    key: str
    required: bool
    value: _Value


@dataclass
class _Tool:
    name: str
    args: list[_Arg]
    """Known keys, required ones first."""
    extra: _Value | None
    """Values of keys the schema does not list; None when there may be none."""
    params: Any
    """The parameters schema, for the json block."""


@dataclass
class _Plan:
    d: Dialect
    thinking: bool
    first: str
    """Key of the channel the generation prompt opened, or ``""``."""
    order: list[str]
    """Keys of the channels that may follow, in order, ``first`` included."""
    variants: list[dict[str, str]]
    """Each a way the channels may go together: channel key → ``text``,
    ``json``, ``empty`` (response), ``yes``, ``opt`` (tools)."""
    tools: list[_Tool]
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


def _plan(d: Dialect, request: Any, options: Mapping[str, Any], *, max_calls: int, json_fallback: bool) -> _Plan:
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
    tools: list[_Tool] = []
    if o.tool_choice != "none":
        for name, fn in declared.items():
            if named is None or name == named:
                t = _tool(name, fn, notes)
                if t is not None:
                    tools.append(t)
    mode = "none" if not tools else "yes" if o.tool_choice == "required" or named else "opt"
    if mode == "none" and (o.tool_choice == "required" or named):
        raise OptionError("no declared tool can be called with its schema", option="tool_choice")
    thinking = o.thinking
    first = d.prompt_channel[thinking]
    present = [k for k in d.channel_order if k != "think" or thinking]
    if first:
        present = present[present.index(first):]
    if "response" not in present:
        raise TemplateError("the generation prompt opens a channel after the response", location=d.path)
    if "tools" not in present:
        mode = "none"
    rf = o.response_format
    response = "text" if rf is None else "json"
    schema: Any = None
    if rf is not None:
        schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
    tools_state = {"none": "no", "opt": "opt", "yes": "yes"}[mode]
    variants = [{"response": response, "tools": tools_state}]
    if response == "json" and mode != "none":
        # A message that calls tools need not also answer in JSON.
        variants = [{"response": "json", "tools": tools_state}, {"response": "empty", "tools": "yes"}]
    order = [k for k in present if k != "tools" or mode != "none"]
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
    return _Plan(d, thinking, first, order, variants, tools, 1 if parallel is False else max_calls, json_fallback,
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
    declaration of a name wins, as a later declaration replaces it)."""
    out: dict[str, Any] = {}
    lists: list[tuple[str, Sequence[Any]]] = [("tools", top or ())]
    lists += [(f"messages[{i}].tools", ts) for i, ts in dynamic]
    for where, ts in lists:
        for i, t in enumerate(ts):
            fn = t.get("function", t) if isinstance(t, Mapping) else None
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str) or not name:
                raise RequestError("a tool needs a name (function.name) to be called", location=f"{where}[{i}]")
            out[name] = fn
    return out


def _tool(name: str, fn: Mapping[str, Any], notes: list[str]) -> _Tool | None:
    params = fn.get("parameters")
    if params is None:
        params = {}
    any_value = _value(True, {}, notes, "")
    if not isinstance(params, Mapping) or not _plain_object(params):
        if params not in ({}, True):
            notes.append(f"tool {name!r}: its parameters are not a plain object schema, so any arguments go")
        return _Tool(name, [], any_value, params if isinstance(params, Mapping) else {})
    props = params.get("properties")
    if not isinstance(props, Mapping):
        props = {}
    req = params.get("required")
    required = [k for k in dict.fromkeys(req) if isinstance(k, str)] if isinstance(req, list) else []
    addl = params.get("additionalProperties", True)
    if params.get("patternProperties"):
        notes.append(f"tool {name!r}: patternProperties are not enforced")
        addl = True
    for k in ("minProperties", "maxProperties", "propertyNames", "dependentRequired", "dependencies"):
        if k in params:
            notes.append(f"tool {name!r}: {k} is not enforced")
    extra = _value(addl, params, notes, f"tool {name!r}, other arguments") if addl is not False else None
    args: list[_Arg] = []
    keys = list(dict.fromkeys([*required, *props]))
    for key in keys:
        sub = props[key] if key in props else (addl if addl is not False else True)
        v = _value(sub, params, notes, f"tool {name!r}, argument {key!r}")
        if not v.strings and not v.others:
            if key in required:
                notes.append(f"tool {name!r}: required argument {key!r} can have no value, so the tool is left out")
                return None
            continue
        args.append(_Arg(key, key in required, v))
    args.sort(key=lambda a: not a.required)
    return _Tool(name, args, extra, params)


def _plain_object(s: Mapping[str, Any]) -> bool:
    """Whether a parameters schema is an object schema read key by key (no
    combinators or references at its top)."""
    t = s.get("type", "object")
    if t != "object" and not (isinstance(t, list) and "object" in t):
        return False
    return not any(k in s for k in ("anyOf", "oneOf", "allOf", "$ref", "not", "if"))


def _value(schema: Any, root: Any, notes: list[str], where: str) -> _Value:
    types = _types(schema, root, 0)
    strings = _strings(schema, root, 0, notes, where) if "string" in types else []
    others: list[tuple[str, str]] = []
    for attr in _TEXT_TYPES[1:]:
        if attr == "number":
            jt = "number" if "number" in types else "integer" if "integer" in types else ""
        else:
            jt = attr if attr in types else ""
        if jt:
            others.append((attr, jt))
    return _Value(schema, root, strings, others)


def _deref(s: Mapping[str, Any], root: Any) -> Any:
    ref = s.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#"):
        return True
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return True
    return node


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _types(s: Any, root: Any, depth: int) -> frozenset[str]:
    """JSON types a schema admits, over-approximated (``number`` means
    non-integers too)."""
    if s is False:
        return frozenset()
    if not isinstance(s, Mapping) or depth > 32:
        return _ALL_TYPES
    out = set(_ALL_TYPES)
    t = s.get("type")
    if isinstance(t, str | list):
        want = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)}
        if "number" in want:
            want.add("integer")
        out &= want
    if isinstance(s.get("enum"), list):
        # An integer value is a number too; "number" stands for the others.
        values = {_json_type(v) for v in s["enum"]}
        out &= values | ({"integer"} if "number" in values else set())
    if "const" in s:
        out &= {_json_type(s["const"])}
    if "$ref" in s:
        out &= _types(_deref(s, root), root, depth + 1)
    for k in ("anyOf", "oneOf"):
        if isinstance(s.get(k), list):
            out &= set().union(*[_types(b, root, depth + 1) for b in s[k]]) if s[k] else set()
    if isinstance(s.get("allOf"), list):
        for b in s["allOf"]:
            out &= _types(b, root, depth + 1)
    return frozenset(out)


def _strings(s: Any, root: Any, depth: int, notes: list[str], where: str) -> list[_Str]:
    """Ways a schema's strings may be written, over-approximated."""
    if not isinstance(s, Mapping) or depth > 32:
        return [_Str()]
    if "$ref" in s:
        return _strings(_deref(s, root), root, depth + 1, notes, where)
    siblings = {k: v for k, v in s.items() if k not in ("anyOf", "oneOf", "allOf")}
    for k in ("anyOf", "oneOf"):
        if isinstance(s.get(k), list):
            out: list[_Str] = []
            for b in s[k]:
                merged = {**siblings, **b} if isinstance(b, Mapping) else b
                if "string" in _types(merged, root, depth + 1):
                    out += _strings(merged, root, depth + 1, notes, where)
            return out
    if isinstance(s.get("allOf"), list):
        # Every part applies: the strings of any one part hold all of them.
        parts = [siblings, *s["allOf"]]
        found = [_strings(p, root, depth + 1, notes, where) for p in parts]
        exact = [f for f in found if f and all(x.texts is not None for x in f)]
        return exact[0] if exact else found[0]
    texts: list[str] | None = None
    if isinstance(s.get("enum"), list):
        texts = [v for v in s["enum"] if isinstance(v, str)]
    if "const" in s:
        c = s["const"]
        texts = [c] if isinstance(c, str) and (texts is None or c in texts) else []
    if texts is not None:
        return [_Str(tuple(dict.fromkeys(texts)))] if texts else []
    for k in ("pattern", "format", "contentEncoding"):
        if k in s:
            notes.append(f"{where}: string {k} is not enforced")
    lo = s.get("minLength", 0)
    hi = s.get("maxLength")
    lo = lo if type(lo) is int and lo > 0 else 0
    hi = hi if type(hi) is int and hi >= lo else None
    if lo > _MAX_LENGTH or (hi is not None and hi > _MAX_LENGTH):
        # A bounded repetition is unrolled by the libraries' regex engines.
        notes.append(f"{where}: string lengths above {_MAX_LENGTH} are not enforced")
        lo, hi = min(lo, _MAX_LENGTH), None
    return [_Str(None, lo, hi)]


def _has_properties(s: Any) -> bool:
    """Whether a schema describes object properties anywhere in it."""
    if isinstance(s, Mapping):
        return "properties" in s or any(_has_properties(v) for v in s.values())
    if isinstance(s, list):
        return any(_has_properties(v) for v in s)
    return False


def _inline(s: Any, root: Any, depth: int = 0) -> Any:
    """``s`` with every local ``$ref`` but those into ``$defs`` and
    ``definitions`` replaced by what it points at, so that ``s`` can stand as
    a schema of its own beside a copy of those."""
    if isinstance(s, list):
        return [_inline(x, root, depth) for x in s]
    if not isinstance(s, Mapping):
        return s
    ref = s.get("$ref")
    if isinstance(ref, str) and not ref.startswith(("#/$defs/", "#/definitions/")):
        if depth > 16:
            return {}  # a reference cycle: any value (a wider grammar)
        rest = {k: v for k, v in s.items() if k != "$ref"}
        target = _inline(_deref(s, root), root, depth + 1)
        return {"allOf": [target, _inline(rest, root, depth)]} if rest else target
    return {k: _inline(v, root, depth) for k, v in s.items()}


def _restricted(v: _Value, jtype: str) -> dict[str, Any]:
    """The value's schema narrowed to one JSON type, as a schema of its own
    (the ``$defs`` it refers to copied along)."""
    s = _inline(v.schema, v.root)
    base: dict[str, Any] = dict(s) if isinstance(s, Mapping) else {}
    defs = {k: v.root[k] for k in ("$defs", "definitions")
            if isinstance(v.root, Mapping) and k in v.root and k not in base and v.root is not s}
    if "type" in base and not any(k in base for k in ("anyOf", "oneOf", "allOf", "$ref", "not", "if")):
        out = {**base, "type": jtype}
    elif base:
        out = {"allOf": [base, {"type": jtype}]}
    else:
        out = {"type": jtype}
    return {**defs, **out}


# -- markers ---------------------------------------------------------------------------


def _text_ids(binding: Binding) -> list[int]:
    """Ids of the added tokens that are not special and that the tokenizer
    makes of their own spelling in ordinary text (Hugging Face tokenizers
    match such tokens in text; xtml's encoding leaves only special ones as
    text). Engines' grammar libraries treat every added token as special."""
    got = _TEXT_IDS.get(binding)
    if got is None:
        decoder = getattr(binding.vocab.tokenizer, "get_added_tokens_decoder", None)
        markers = set(binding.marker_ids.values())
        found = [(i, t.content) for i, t in decoder().items() if not t.special and i not in markers] \
            if decoder is not None else []
        encoded = binding.vocab.ids_of([c for _, c in found])
        got = _TEXT_IDS[binding] = sorted(i for (i, _), ids in zip(found, encoded) if ids == [i])
    return got


_TEXT_IDS: weakref.WeakKeyDictionary[Binding, list[int]] = weakref.WeakKeyDictionary()


def _id_ranges(ids: list[int]) -> str:
    """Ids as llguidance's token ranges (``1,5-9``)."""
    out: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], -2]:
        if i != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    return ",".join(out)



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


def _fragment_rules(plugin: str, index: int, frag: str) -> list[tuple[str, list[str]]]:
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


# -- llguidance ------------------------------------------------------------------------


# Built once: json.dumps with an option builds an encoder per call, and a
# grammar spells hundreds of literals.
_STRING = json.JSONEncoder(ensure_ascii=False)
_SCHEMA = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _lark_str(s: str) -> str:
    return _STRING.encode(s)


def _json_text(schema: Any) -> str:
    """A schema as the text after ``%json``."""
    # Lenient: a keyword or format llguidance does not know is then ignored
    # (a wider grammar), where it would otherwise refuse the whole grammar.
    # Any \uXXXX escape is JSON (llguidance admits only those of control
    # characters unless told).
    body = dict(schema) if isinstance(schema, Mapping) else {}
    body["x-guidance"] = {**(body.get("x-guidance") or {}), "lenient": True,
                          "json_allow_general_unicode_escapes": True}
    return _SCHEMA.encode(body)


class _Writer:
    """What both syntaxes share: the plan walked channel by channel."""

    comment = "//"

    def __init__(self, plan: _Plan, refs: dict[str, str]) -> None:
        self.p = plan
        self.n = plan.d.names
        self.o, self.c, self.s, self.e = refs["open"], refs["close"], refs["sep"], refs["end"]
        self.rules: list[str] = []
        self.defined: set[str] = set()
        self.notes = list(plan.notes)
        self.calls_ref = ""
        self.elements_ref = ""

    def rule(self, name: str, body: str) -> None:
        raise NotImplementedError

    def lit(self, s: str) -> str:
        raise NotImplementedError

    def open_tag(self, tag: str) -> str:
        return f"{self.o} {self.lit(tag)} {self.s}"

    def close_tag(self, tag: str) -> str:
        return f"{self.c} {self.lit(tag)} {self.s}"

    def header(self, what: str, extra: Iterable[str] = ()) -> str:
        c = self.comment
        lines = [f"{c} xtml completion grammar ({what}): {self.p.summary}",
                 f"{c} Markers are special-token references; text never matches them.", *extra]
        lines += [f"{c} limit: {x}" for x in dict.fromkeys(self.notes)]
        return "\n".join(lines) + "\n"

    def channels(self) -> str:
        """The body of the start rule: the channels, then the close of the
        message and its end marker."""
        alts = []
        for variant in self.p.variants:
            parts = []
            for key in self.p.order:
                kind = variant.get(key, "text")
                if key == "tools" and kind == "no":
                    continue
                ref = self.channel(key, kind, opened=key == self.p.first)
                parts.append(f"{ref}?" if kind == "opt" and key != self.p.first else ref)
            alts.append(" ".join(parts))
        body = alts[0] if len(alts) == 1 else "(" + " | ".join(f"({a})" for a in alts) + ")"
        return f"{body} {self.close_tag(self.n['message'])} {self.e}"

    def channel(self, key: str, kind: str, opened: bool) -> str:
        name = f"ch_{key}_{kind}" + ("_opened" if opened else "")
        if name in self.defined:
            return name
        self.defined.add(name)
        tag = self.n[key]
        if key == "think":
            body = self.text_opt()
        elif key == "response":
            body = self.response(kind)
        elif "calls" in self.defined:
            body = self.calls_ref
        else:
            self.defined.add("calls")
            body = self.calls_ref = self.calls()
        inner = f"{body} {self.close_tag(tag)}".strip()
        self.rule(name, inner if opened else f"{self.open_tag(tag)} {inner}")
        return name

    def response(self, kind: str) -> str:
        if kind == "empty":
            return ""
        if kind == "json":
            return self.json_response()
        if not self.p.elements:
            return self.text_opt()
        if "elements" in self.defined:
            return self.elements_ref
        self.defined.add("elements")
        names = []
        for k, (plugin, frag) in enumerate(self.p.elements):
            for name, body in _fragment_rules(plugin, k, frag):
                self.rule(name, self.fragment_body(body))
            names.append(f"x{k}_{FRAGMENT_NAMES['start']}")
        self.fragment_support()
        els = names[0] if len(names) == 1 else "(" + " | ".join(names) + ")"
        self.elements_ref = f"{self.text_opt()} ({els} {self.text_opt()})*"
        return self.elements_ref

    def fragment_body(self, body: list[str]) -> str:
        return " ".join(body)

    def text_opt(self) -> str:
        raise NotImplementedError

    def json_response(self) -> str:
        raise NotImplementedError

    def fragment_support(self) -> None:
        raise NotImplementedError

    def calls(self) -> str:
        raise NotImplementedError

    # -- arguments (shared shape) -------------------------------------------------------

    def call_open(self) -> str:
        return f'{self.o} {self.lit(self.n["call"] + " " + self.n["tool"] + "=" + chr(34))}'

    def name_then_index(self, t: _Tool) -> str:
        """The tool name and the index attribute up to its value."""
        return self.lit(escape(t.name) + f'" {self.n["index"]}="')

    def indexed(self, t: _Tool, k: int) -> str:
        """The tool name and index ``k``, to the end of the header."""
        return self.lit(escape(t.name) + f'" {self.n["index"]}="{k}"')

    def call_close(self) -> str:
        return self.close_tag(self.n["call"])

    def tracked(self, t: _Tool, limit: int) -> list[int]:
        """Indexes (into ``t.args``) of the keys tracked exactly."""
        if len(t.args) <= limit:
            return list(range(len(t.args)))
        req = [k for k, a in enumerate(t.args) if a.required]
        self.notes.append(f"tool {t.name!r}: {len(t.args)} arguments are more than {limit}; "
                          + ("optional ones may repeat" if len(req) <= limit else "keys may repeat or be missing"))
        return req if len(req) <= limit else []

    def argument(self, rule: str, key_expr: str, v: _Value) -> None:
        alts = []
        for attr in _TEXT_TYPES:
            if attr == "string":
                if v.strings:
                    alts.append(f"{self.lit('string' + chr(34))} {self.s} {self.strings(v.strings)}".rstrip())
                continue
            jt = dict(v.others).get(attr)
            if jt:
                alts.append(f"{self.lit(attr + chr(34))} {self.s} {self.json_value(v, jt)}")
        body = alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
        head = self.lit(f'{self.n["argument"]} {self.n["key"]}="')
        self.rule(rule, f"{self.o} {head} {key_expr} {body} {self.close_tag(self.n['argument'])}")

    def key_literal(self, key: str) -> str:
        return self.lit(escape(key) + f'" {self.n["type"]}="')

    def strings(self, alts: list[_Str]) -> str:
        raise NotImplementedError

    def tool_body(self, i: int, t: _Tool, args: str) -> None:
        """A call's body: its typed arguments (rule ``args``), or, where the
        dialect allows it, the json block holding the arguments' object."""
        body = args
        if self.p.json_fallback:
            head = self.lit(f'{self.n["json"]} {self.n["type"]}="{escape(self.p.d.json_fallback_type)}"')
            params = t.params if isinstance(t.params, Mapping) and t.params else {"type": "object"}
            self.rule(f"json_t{i}", f"{self.o} {head} {self.s} {self.json_object_value(params)} "
                                    f"{self.close_tag(self.n['json'])}")
            body += f" | json_t{i} {self.call_close()}"
        self.rule(f"body_t{i}", body)

    def json_object_value(self, schema: Any) -> str:
        """An expression for a JSON object matching ``schema``."""
        raise NotImplementedError

    def json_value(self, v: _Value, jtype: str) -> str:
        raise NotImplementedError


class _Lark(_Writer):
    comment = "//"

    def __init__(self, plan: _Plan, refs: dict[str, str]) -> None:
        super().__init__(plan, refs)
        self.terminals: dict[str, str] = {}
        self.nested = False
        self.uses_json = False

    def rule(self, name: str, body: str) -> None:
        self.rules.append(f"{name}: {body}")

    def lit(self, s: str) -> str:
        return _lark_str(s)

    def text(self) -> str:
        """Text that is not empty: ordinary tokens, and the added tokens the
        tokenizer makes of their spelling in text (llguidance takes every
        added token for a special one, which a text terminal never matches)."""
        self.terminals["TEXT"] = "/(?s:.+)/"
        if not self.p.text_ids:
            return "TEXT"
        if "text" not in self.defined:
            self.defined.add("text")
            self.rule("text", f"(TEXT | <[{_id_ranges(self.p.text_ids)}]>)+")
        return "text"

    def text_opt(self) -> str:
        return self.text() + "?"

    def json_response(self) -> str:
        self.terminals["WS"] = "/[ \\t\\r\\n]+/"
        return f"WS? {self.json_ref(self.p.response_schema)} WS?"

    def fragment_support(self) -> None:
        self.rule("m_open", self.o)
        self.rule("m_close", self.c)
        self.rule("m_sep", self.s)
        self.rule("body_text", self.text_opt())
        self.terminals["ATTR"] = '/([^"&]|&amp;|&quot;)+/'
        self.rule("attr_value", "ATTR?")
        self.rule("attr_value1", "ATTR")

    def calls(self) -> str:
        p = self.p
        bits = max(1, (p.max_calls - 1).bit_length())
        if p.max_calls == 1:
            self.rule("calls::_", "call::_")
        else:
            self.rule("calls::_", f"call::_ | call::_ calls::incr([0:{bits}]) %if lt([0:{bits}], {p.max_calls - 1})")
        self.rule("idx::_", " | ".join(f'"{k + 1}" %if eq([0:{bits}], {k})' for k in range(p.max_calls)))
        alts = []
        for i, t in enumerate(p.tools):
            self.tool(i, t)
            alts.append(f'{self.name_then_index(t)} idx::_ "\\"" {self.s} body_t{i}')
        self.rule("call::_", f"{self.call_open()} (" + " | ".join(alts) + ")")
        return "calls::0x0"

    def tool(self, i: int, t: _Tool) -> None:
        tracked = self.tracked(t, TRACKED["llguidance"])
        bit = {k: b for b, k in enumerate(tracked)}
        required = sum(1 for k in tracked if t.args[k].required)
        # The keys given so far are the bits of the rule's parameter.
        param = "::_" if tracked else ""
        done = f"{self.call_close()}" + (f" %if is_ones([0:{required}])" if required else "")
        alts = [done]
        for k, a in enumerate(t.args):
            rule = f"arg_t{i}_{k}"
            self.argument(rule, self.key_literal(a.key), a.value)
            if k in bit:
                alts.append(f"{rule} args_t{i}::set_bit({bit[k]}) %if bit_clear({bit[k]})")
            else:
                alts.append(f"{rule} args_t{i}{param}")
        if t.extra is not None:
            free = f"KEY_T{i}"
            known = " | ".join(_lark_str(escape(a.key)) for a in t.args)
            self.terminals[free] = '/([^"&]|&amp;|&quot;)*/' + (f" & ~({known})" if known else "")
            self.argument(f"arg_t{i}_x", f'{free} {self.lit(chr(34) + " " + self.n["type"] + "=" + chr(34))}',
                          t.extra)
            alts.append(f"arg_t{i}_x args_t{i}{param}")
            self.notes.append(f"tool {t.name!r}: keys the schema does not list may repeat")
        self.rule(f"args_t{i}{param}", " | ".join(alts))
        self.tool_body(i, t, f"args_t{i}" + ("::0x0" if tracked else ""))

    def strings(self, alts: list[_Str]) -> str:
        parts: list[str] = []
        empty = False
        for a in alts:
            if a.texts is not None:
                lits = [t for t in a.texts if t]
                empty = empty or len(lits) < len(a.texts)
                parts += [_lark_str(t) for t in lits]
            elif a.max_len is None and a.min_len <= 1:
                parts.append(self.text())
                empty = empty or a.min_len == 0
            else:
                hi = "" if a.max_len is None else str(a.max_len)
                name = f"TEXT_{max(1, a.min_len)}_{hi or 'N'}"
                self.terminals[name] = f"/(?s:.){{{max(1, a.min_len)},{hi}}}/"
                parts.append(name)
                empty = empty or a.min_len == 0
        if not parts:
            return ""
        expr = parts[0] if len(parts) == 1 else "(" + " | ".join(dict.fromkeys(parts)) + ")"
        return f"{expr}?" if empty else expr

    def json_value(self, v: _Value, jtype: str) -> str:
        return self.json_ref(_restricted(v, jtype))

    def json_object_value(self, schema: Any) -> str:
        return self.json_ref(schema)

    def json_ref(self, schema: Any) -> str:
        self.uses_json = True
        self.nested = self.nested or _has_properties(schema)
        return f"%json {_json_text(schema)}"

    def write(self) -> str:
        start = self.channels()
        extra = ["// Load: llguidance.LLMatcher(tokenizer, this text) (or grammar_from(\"lark\", this text))."]
        if self.uses_json:
            self.notes.append("inside JSON strings llguidance refuses a raw DEL (U+007F), which JSON allows")
        if self.p.text_ids:
            self.notes.append("text that the tokenizer turns into added tokens (its spelling of one that is not "
                              "special) is admitted in text bodies only, not in JSON values or fixed strings")
        if self.nested:
            self.notes.append("JSON objects (nested argument values, json blocks, JSON answers) take their "
                              "properties in the schema's order (llguidance's JSON)")
        head = self.header("llguidance", extra)
        terms = [f"{k}: {v}" for k, v in self.terminals.items()]
        return "%llguidance {}\n" + head + "\n".join([f"start: {start}", *self.rules, *terms]) + "\n"


# -- xgrammar --------------------------------------------------------------------------


def _ebnf_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_JSON_RULES = {
    "json_ws": "[ \\n\\t\\r]*",
    "json_char": '[^"\\\\\\x00-\\x1f] | "\\\\" ["\\\\/bfnrt] | "\\\\u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]',
    "json_string": '"\\"" json_char* "\\""',
    "json_integer": '"-"? ("0" | [1-9] [0-9]*)',
    "json_number": 'json_integer ("." [0-9]+)? ([eE] [+-]? [0-9]+)?',
    "json_boolean": '"true" | "false"',
    "json_null": '"null"',
    "json_array": '"[" json_ws (json_any (json_ws "," json_ws json_any)*)? json_ws "]"',
    "json_member": 'json_string json_ws ":" json_ws json_any',
    "json_object": '"{" json_ws (json_member (json_ws "," json_ws json_member)*)? json_ws "}"',
    "json_any": "json_string | json_number | json_boolean | json_null | json_array | json_object",
}


class _Ebnf(_Writer):
    comment = "#"

    def __init__(self, plan: _Plan, refs: dict[str, str], specials: list[int]) -> None:
        super().__init__(plan, refs)
        self.specials = specials
        self.used: set[str] = set()
        self.schemas: dict[str, str] = {}

    def rule(self, name: str, body: str) -> None:
        self.rules.append(f"{name} ::= {body}")

    def lit(self, s: str) -> str:
        return _ebnf_str(s)

    def text_opt(self) -> str:
        if "text" not in self.used:
            self.used.add("text")
            ids = ", ".join(map(str, self.specials))
            # Free text at the token level: any token but the vocabulary's
            # special ones (whose text a character class might otherwise match).
            self.rules.append(f"text ::= (ExcludeToken({ids}))*")
        return "text"

    def json_response(self) -> str:
        return f"json_ws {self.json_schema(self.p.response_schema, self.p.response_schema, None)} json_ws"

    def fragment_support(self) -> None:
        self.rule("m_open", self.o)
        self.rule("m_close", self.c)
        self.rule("m_sep", self.s)
        self.rule("body_text", self.text_opt())
        self.rule("attr_value", '([^"&] | "&amp;" | "&quot;")*')
        self.rule("attr_value1", '([^"&] | "&amp;" | "&quot;")+')

    def calls(self) -> str:
        p = self.p
        for i, t in enumerate(p.tools):
            self.tool(i, t)
        for k in range(1, p.max_calls + 1):
            alts = [f"{self.indexed(t, k)} {self.s} body_t{i}" for i, t in enumerate(p.tools)]
            self.rule(f"call_{k}", f"{self.call_open()} (" + " | ".join(alts) + ")")
            self.rule(f"calls_{k}", f"call_{k} calls_{k + 1}?" if k < p.max_calls else f"call_{k}")
        return "calls_1"

    def tool(self, i: int, t: _Tool) -> None:
        tracked = self.tracked(t, TRACKED["xgrammar"])
        bit = {k: b for b, k in enumerate(tracked)}
        need = sum(1 << bit[k] for k in tracked if t.args[k].required)
        free_alts = []
        for k, a in enumerate(t.args):
            self.argument(f"arg_t{i}_{k}", self.key_literal(a.key), a.value)
            if k not in bit:
                free_alts.append(f"arg_t{i}_{k} args_t{i}_S")
        if t.extra is not None:
            key = '([^"&] | "&amp;" | "&quot;")* ' + self.lit('" ' + self.n["type"] + '="')
            self.argument(f"arg_t{i}_x", key, t.extra)
            free_alts.append(f"arg_t{i}_x args_t{i}_S")
            self.notes.append(f"tool {t.name!r}: keys the schema does not list may repeat or spell a listed key")
        for mask in range(1 << len(tracked)):
            alts = [self.call_close()] if mask & need == need else []
            for k, b in bit.items():
                if not mask & (1 << b):
                    alts.append(f"arg_t{i}_{k} args_t{i}_{mask | (1 << b)}")
            alts += [x.replace("_S", f"_{mask}") for x in free_alts]
            self.rule(f"args_t{i}_{mask}", " | ".join(alts))
        self.tool_body(i, t, f"args_t{i}_0")

    def strings(self, alts: list[_Str]) -> str:
        parts: list[str] = []
        for a in alts:
            if a.texts is not None:
                parts += [self.lit(t) for t in a.texts]
            else:
                if a.min_len or a.max_len is not None:
                    self.notes.append("string lengths are not enforced (free text is matched by tokens)")
                parts.append(self.text_opt())
        if not parts:
            return ""
        return parts[0] if len(parts) == 1 else "(" + " | ".join(dict.fromkeys(parts)) + ")"

    def json_value(self, v: _Value, jtype: str) -> str:
        return self.json_schema(v.schema, v.root, jtype)

    # -- JSON schema → rules -------------------------------------------------------------

    def json_object_value(self, schema: Any) -> str:
        return self.json_schema(schema, schema, "object")

    def json_schema(self, s: Any, root: Any, only: str | None) -> str:
        """A rule for the JSON values of ``s`` (restricted to JSON type
        ``only``): exact for types, enums, consts, objects (properties in the
        schema's order), arrays and combinations of them; other keywords are
        listed as not enforced."""
        key = json.dumps([s, only], sort_keys=True, default=str)
        name = self.schemas.get(key)
        if name is not None:
            return name
        name = self.schemas[key] = f"js{len(self.schemas)}"
        self.json_base()
        self.rule(name, self.json_expr(s, root, only, 0))
        return name

    def json_base(self) -> None:
        if "json" not in self.used:
            self.used.add("json")
            for k, v in _JSON_RULES.items():
                self.rule(k, v)

    def json_expr(self, s: Any, root: Any, only: str | None, depth: int) -> str:
        types = _types(s, root, 0)
        if only is not None:
            types &= {only} | ({"integer"} if only == "number" else set())
        if not types:
            return '"\\x00" "\\x00"'  # nothing: no JSON starts with NUL
        if not isinstance(s, Mapping) or depth > 16:
            return self.json_any(types)
        if "$ref" in s:
            ref = s["$ref"]
            target = _deref(s, root)
            return self.json_schema(target, root, only) if isinstance(ref, str) else self.json_any(types)
        for k in ("anyOf", "oneOf"):
            if isinstance(s.get(k), list):
                sib = {x: y for x, y in s.items() if x not in ("anyOf", "oneOf")}
                alts = [self.json_expr({**sib, **b} if isinstance(b, Mapping) else b, root, only, depth + 1)
                        for b in s[k]]
                return "(" + " | ".join(alts) + ")" if alts else '"\\x00" "\\x00"'
        if "allOf" in s or "not" in s or "if" in s:
            self.notes.append("allOf, not and if/then in JSON values are not enforced beyond their types")
            return self.json_any(types)
        values = s["enum"] if isinstance(s.get("enum"), list) else [s["const"]] if "const" in s else None
        if values is not None:
            ok = [v for v in values if _json_type(v) in types or (_json_type(v) == "integer" and "number" in types)]
            return "(" + " | ".join(self.lit(json.dumps(v, ensure_ascii=False)) for v in ok) + ")" if ok \
                else '"\\x00" "\\x00"'
        alts = []
        for t in ("string", "number", "boolean", "null", "object", "array"):
            if t == "number" and "number" not in types and "integer" in types:
                alts.append("json_integer")
            elif t not in types:
                continue
            elif t == "object":
                alts.append(self.json_object(s, root, depth))
            elif t == "array":
                alts.append(self.json_array(s, root, depth))
            else:
                alts.append(f"json_{t}")
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern",
                  "format", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems"):
            if k in s:
                self.notes.append(f"{k} in JSON values is not enforced")
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def json_any(self, types: frozenset[str]) -> str:
        names = [f"json_{t}" for t in ("string", "number", "boolean", "null", "object", "array") if t in types]
        if "number" not in types and "integer" in types:
            names.insert(1, "json_integer")
        return names[0] if len(names) == 1 else "(" + " | ".join(names) + ")"

    def json_array(self, s: Mapping[str, Any], root: Any, depth: int) -> str:
        items = s.get("items", True)
        if "prefixItems" in s:
            self.notes.append("prefixItems in JSON values are not enforced")
            items = True
        item = self.json_any(_ALL_TYPES) if items is True or items == {} else self.json_schema(items, root, None)
        return f'("[" json_ws ({item} (json_ws "," json_ws {item})*)? json_ws "]")'

    def json_object(self, s: Mapping[str, Any], root: Any, depth: int) -> str:
        got = s.get("properties")
        props: Mapping[str, Any] = got if isinstance(got, Mapping) else {}
        required = [k for k in dict.fromkeys(s.get("required") or ()) if isinstance(k, str)]
        addl = s.get("additionalProperties", True)
        if "patternProperties" in s:
            addl = True
        if props:
            self.notes.append("JSON objects take their properties in the schema's order")
        members = [(k, f'{self.lit(json.dumps(k, ensure_ascii=False))} json_ws ":" json_ws '
                       f'{self.json_schema(v, root, None)}', k in required) for k, v in props.items()]
        members += [(k, f'{self.lit(json.dumps(k, ensure_ascii=False))} json_ws ":" json_ws json_any', True)
                    for k in required if k not in props]
        extra = None
        if addl is not False:
            value = "json_any" if addl is True or addl == {} else self.json_schema(addl, root, None)
            extra = f'json_string json_ws ":" json_ws {value}'
            if props:
                self.notes.append("keys JSON objects do not list may spell a listed key")
        base = f"jo{len(self.schemas)}_{depth}_{len(self.rules)}"
        sep = 'json_ws "," json_ws'
        n = len(members)
        # after_k: members k.. once something was written (each needs a comma);
        # first_k: members k.. before anything was written.
        tail = f"({sep} {extra})*" if extra else '""'
        for k in range(n, -1, -1):
            if k == n:
                self.rule(f"{base}_after{k}", tail)
                self.rule(f"{base}_first{k}", f"({extra} {base}_after{k})?" if extra else '""')
                continue
            _, m, req = members[k]
            if req:
                self.rule(f"{base}_after{k}", f"{sep} {m} {base}_after{k + 1}")
                self.rule(f"{base}_first{k}", f"{m} {base}_after{k + 1}")
            else:
                self.rule(f"{base}_after{k}", f"({sep} {m})? {base}_after{k + 1}")
                self.rule(f"{base}_first{k}", f"{m} {base}_after{k + 1} | {base}_first{k + 1}")
        return f'("{{" json_ws {base}_first0 json_ws "}}")'

    def write(self) -> str:
        start = self.channels()
        extra = [
            "# Load: xgrammar.Grammar.from_ebnf(this text) (root rule: root).",
            "# xgrammar's EBNF cannot express, so this grammar admits more than the llguidance export:",
            "#   keys an argument schema does not list are not told apart from listed ones;",
            f"#   more than {TRACKED['xgrammar']} arguments of one tool are not all tracked "
            "(each key once, required ones present);",
            "#   string lengths, patterns and formats, number bounds and allOf/not/if in JSON values;",
            "#   free text excludes the vocabulary's special tokens at the token level, but attribute values",
            "#   and JSON are character-level: whether a special token's text can match them depends on",
            "#   how the engine's TokenizerInfo lists special tokens.",
        ]
        head = self.header("xgrammar", extra)
        return head + "\n".join([f"root ::= {start}", *self.rules]) + "\n"
