"""The plan of a completion for a layout dialect (spec.md §12): what the
assistant may generate after the generation prompt, read from the dialect's
data and one request, ready for a writer (:mod:`.layout_writer`) to spell in
one grammar syntax (:data:`~.plan.FORMATS`).

It is the answer as :func:`~xtml.chat.layout_parse.parse_completion` reads one
strictly, from the same data: the reasoning block (the two tokens of
``[reasoning] split``) where the generation prompt leaves it to the model,
the content, the calls as ``[calls] each`` writes one (its tokens, its
literal text, the tool's name and its arguments as a JSON object of the
tool's schema, :mod:`.schema`; an id of ``[calls] id``'s spelling, with the
call's index where the format generates ids), the section around the calls,
the separator between calls, and the stop tokens. Where the format lays the
answer out with text of its own (GLM-4.6: a newline before the reasoning
block it writes on every answer, before content, before each call), writes
arguments as key/value pairs (:mod:`.layout_pairs`) or in a value syntax
of its own (:mod:`.layout_syntax`), writes its calls as one JSON array
after a token (:mod:`.layout_array`), writes an answer as several messages
(:mod:`.layout_messages`) or has a stop after which the model waits for
its calls' results, those are in the plan too.
The request holds it to ``tool_choice`` (``auto``, ``none``, ``required``,
a named function: calls to declared tools only, and with ``required`` or a
name the answer is its calls), ``parallel_tool_calls`` (false: one call)
and ``response_format`` (the content is JSON).

A token of the dialect is referenced as a token where the vocabulary has it
as one id, and is literal text where the vocabulary spells it as text (a
vocabulary without the format's added tokens): free text then spells none
of those, as a parse would read such a spelling as the token.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...chat.fields import tool_function
from ...chat.layout import EACH, HISTORY, SYNTAX, LayoutDialect
from ...chat.layout_pattern import Builder, Cond, Item, Lit, Slot, Tok
from ...chat.layout_request import read_request
from ...errors import OptionError, RequestError, TokenizerError
from ...vocab.tokens import TokenBinding
from .layout_array import ArrayCalls, array_pattern
from .layout_messages import Messages, split_messages
from .layout_pairs import pair_tool, pairs_pattern
from .layout_syntax import body_block, syntax_arguments, syntax_call_items
from .plan import FORMATS, MAX_CALLS, deep_schemas_refused
from .schema import Tool, typed_tool

__all__ = ["LayoutPlan", "layout_plan"]

# A token llguidance can reference by name: `<...>` without spaces or
# brackets inside.
_NAMED = re.compile(r"<(?!\[)[^<>\s\[\]]+>\Z")


@dataclass
class LayoutPlan:
    """What an answer of a layout dialect may hold, for one grammar syntax."""

    d: LayoutDialect
    format: str
    reasoning: tuple[str, str] | None
    """The reasoning block's two tokens, when the answer may open with one."""
    after_reasoning: bool
    """The grammar starts where the reasoning ended (newlines may lead)."""
    call_open: str
    """The token that opens a call (``""``: the format writes no calls)."""
    call_rest: tuple[Item, ...]
    """What follows it in a call: literal text, tokens, the slots ``name``,
    ``arguments`` and ``id`` (spelled by :attr:`id_items`)."""
    separator: str
    """The text between two calls (and before a first one after content)."""
    tools: list[Tool]
    calls: str
    """``no``, ``opt`` (content, then maybe calls) or ``yes`` (calls only)."""
    max_calls: int | None
    """None: no bound."""
    response_schema: Any
    """The content's JSON schema under ``response_format``, else None."""
    stops: tuple[str, ...]
    summary: str
    section: tuple[str, str] | None = None
    """The two tokens of the section the calls are written in."""
    id_items: tuple[Item, ...] = ()
    """A call id's spelling: literal text and the slots ``name`` and
    ``index``."""
    indexed: bool = False
    """The id spells the call's index in the answer (the format generates
    ids: the grammar counts the calls); else any numeral (ids the model
    gives)."""
    exact: bool = False
    """The reasoning block is on every answer, as written (no newline
    around it)."""
    refs: dict[str, str] = field(default_factory=dict)
    """Token → how the grammar references it; a token absent here is text."""
    token_ids: dict[str, int] = field(default_factory=dict)
    text_tokens: tuple[str, ...] = ()
    """Tokens this vocabulary spells as text: free text spells none of them."""
    notes: list[str] = field(default_factory=list)
    specials: list[int] = field(default_factory=list)
    """Ids of the vocabulary's special tokens, which free text never is."""
    text_ids: list[int] = field(default_factory=list)
    """Kept empty: what the llguidance writer's text admits besides text."""
    opened: str = ""
    """The token that closes a reasoning block the generation prompt opened:
    the answer is reasoning up to it, then the rest."""
    bare: bool = False
    """A call is bare text (:attr:`call_rest` from its first character) and
    is the whole answer; free text never reads as one (:attr:`guards`)."""
    builtin: tuple[str, ...] = ()
    """The built-in tools a bare format's answer may call, each as
    ``[calls] builtin`` writes a call (:attr:`builtin_items`), with at most
    one argument of ``builtin_argument``'s spelling."""
    builtin_items: tuple[Item, ...] = ()
    argument_items: tuple[Item, ...] = ()
    end_stops: tuple[str, ...] = ()
    """The stop tokens that end an answer of content (the others, meaning
    a call waits for its results, end calls only)."""
    guards: tuple[str, ...] = ()
    """Spellings free text never holds: a parse would read a call there."""
    reasoning_lead: str | None = None
    """Where the format writes the reasoning block on every answer, after
    this text (the body opens with them): the model writes both."""
    content_lead: str = ""
    """The text the format writes before content, where there is some."""
    call_lead: str = ""
    """The text the format writes before every call, the first included."""
    pair_items: tuple[Item, ...] = ()
    """One argument as ``[calls] pair`` writes it (slots ``key`` and
    ``value``), where the arguments are key/value pairs, not JSON."""
    wait_stops: tuple[str, ...] = ()
    """The stop tokens after which the model waits for its calls' results:
    they end calls; :attr:`end_stops` end the other answers."""
    unnamed: dict[str, str] = field(default_factory=dict)
    """Token → why llguidance's syntax cannot name it, where the grammar is
    asked to name tokens: refused where the grammar references it (a
    format's head, which an answer never holds, is not)."""
    array: ArrayCalls | None = None
    """Where the calls are one JSON array after a token (:attr:`call_open`,
    no token of each call's own): how it is written."""
    fragments: dict[str, str] = field(default_factory=dict)
    """Where a value syntax writes the arguments (:mod:`.layout_syntax`):
    each tool's arguments as its grammar writes them, by tool name."""
    reasoning_label: str = ""
    """The text the reasoning block opens with after its token."""
    messages: Messages | None = None
    """Where the format writes an answer as several messages
    (:mod:`.layout_messages`): what they are made of."""

    @property
    def led(self) -> bool:
        """The answer is laid out by its leads, pairs and stops (the
        structure of :meth:`~.layout_writer._Layout.led_answer`)."""
        return bool(self.reasoning_lead is not None or self.content_lead or self.call_lead or self.pair_items
                    or self.wait_stops or bool(self.fragments))


def layout_plan(d: LayoutDialect, binding: TokenBinding | None, request: Any, *, format: str = "llguidance",
                max_calls: int | None = None, json_fallback: bool = True, token_refs: str = "auto",
                after_reasoning: bool = False, **options: Any) -> LayoutPlan:
    """The plan of what the assistant may generate for ``request`` after the
    generation prompt of layout dialect ``d``. ``json_fallback`` is taken
    for the XTML engine's signature: a layout format has no json block.
    Bad requests raise :class:`~xtml.RequestError`; a token the grammar must
    reference by id without a tokenizer raises :class:`~xtml.TokenizerError`."""
    if format not in FORMATS:
        raise OptionError(f"format must be one of {', '.join(FORMATS)}, not {format!r}", option="format")
    if token_refs not in ("auto", "name", "id"):
        raise OptionError(f"token_refs must be auto, name or id, not {token_refs!r}", option="token_refs")
    if max_calls is not None and (type(max_calls) is not int or max_calls < 1):
        raise OptionError(f"max_calls must be a positive integer, not {max_calls!r}", option="max_calls")
    parallel = options.pop("parallel_tool_calls",
                           request.get("parallel_tool_calls") if isinstance(request, Mapping) else None)
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError("parallel_tool_calls must be true or false", location="parallel_tool_calls")
    with deep_schemas_refused():
        plan = _plan(d, request, options, max_calls=1 if parallel is False else max_calls,
                     after_reasoning=after_reasoning, fmt=format)
        _bind(plan, binding, token_refs)
        if d.split is not None:
            split_messages(plan)
        if plan.tools and d.arguments == SYNTAX:
            # The syntax's grammar references the format's tokens as bound.
            plan.tools, plan.fragments = syntax_arguments(d, format, plan.tools, plan.refs, request, plan.notes)
            if not plan.tools and plan.calls == "yes":
                raise OptionError("no declared tool can be called with its schema", option="tool_choice")
            plan.calls = plan.calls if plan.tools else "no"
        _refuse_spellings(plan)
    return plan


def _plan(d: LayoutDialect, request: Any, options: Mapping[str, Any], *, max_calls: int | None,
          after_reasoning: bool, fmt: str) -> LayoutPlan:
    _refuse_unmirrored(d)
    msgs, resolved, _, opts = read_request(d, request, options)  # the same checks (and errors) as render
    notes: list[str] = []
    # What the generation prompt leaves: a reasoning block it closed is not
    # the model's to write again; one it did not open the model may open.
    # The prompt is the one render writes after this request's last message.
    conds = {k: v for k, v in resolved.items() if k in d.options}
    if d.message_conds:
        prev = next((m.role for m in reversed(msgs) if m.role != "system"), "")
        conds.update(after_user=prev == "user", after_tool=prev == "tool")
    # A prompt the format writes only where the last answer made no calls.
    conds["after_calls"] = bool(next((m.calls for m in reversed(msgs) if m.role != "tool"), None))
    b = Builder()
    d.prompt.render({}, conds, b)
    written = [s.text for s in b.finish() if s.special]
    opened = ""
    if d.reasoning_opened is not None and not after_reasoning:
        o, c = d.reasoning_opened
        if o in written and c not in written[written.index(o):]:
            opened = c
    reasoning: tuple[str, str] | None = None
    split = d.reasoning_split or d.reasoning_block
    block = body_block(d) if split is None else None
    if block is not None:
        split = (block[0], block[2])
    if d.reasoning == HISTORY and split is not None and not after_reasoning:
        in_prompt = split[0] in written
        if in_prompt and split[1] not in written[written.index(split[0]):]:
            raise OptionError(f"the completion grammar of a generation prompt that leaves the reasoning block open "
                              f"is not yet available for the layout dialect {d.name!r}", option="tool_choice")
        if not in_prompt and not _closed_after_calls(d, conds, split):
            reasoning = split
    bare = d.header_turns is not None
    array = None if bare else array_pattern(d)
    call_rest: tuple[Item, ...]
    if array is not None:
        # The array's token opens the calls; each call is JSON text.
        call_open, call_rest, sep, call_lead = array.token, (), "", ""
    else:
        call_open, call_rest, sep, call_lead = _bare_pattern(d) if bare else _call_pattern(d)
    pair_items = pairs_pattern(d) if call_open and d.arguments == "pairs" else ()
    section = _section(d) if call_open and array is None else None
    indexed = d.call_ids == "generated" and any(isinstance(i, Slot) and i.name == "id" for i in call_rest)
    if indexed and max_calls is None:
        max_calls = MAX_CALLS  # each index is spelled out: the count is bounded
    body = d.roles["assistant"].body if "assistant" in d.roles else None
    callable_ = bool(call_open) or bool(bare and call_rest)
    if body is not None and "calls" not in body.slots() and not bare:
        call_open, callable_ = "", False
    declared: dict[str, Any] = {}
    tools_given = opts.get("tools")
    if isinstance(tools_given, list | tuple):
        for t in tools_given:
            fn = tool_function(t)
            declared[fn["name"]] = fn
    choice = opts.get("tool_choice")
    named: str | None = None
    if isinstance(choice, Mapping):
        given = choice.get("function")
        named = given.get("name") if isinstance(given, Mapping) else choice.get("name")
        if not isinstance(named, str) or not named:
            raise OptionError("a named tool_choice needs function.name", option="tool_choice")
        if named not in declared:
            raise OptionError(f"tool_choice names {named!r}, which the request does not declare",
                              option="tool_choice")
    elif choice not in (None, "auto", "none", "required"):
        raise OptionError(f"tool_choice must be auto, none, required or a named function, not {choice!r}",
                          option="tool_choice")
    must = choice == "required" or named is not None
    if must and not declared:
        raise OptionError("tool_choice is required, but the request declares no tools", option="tool_choice")
    if must and not callable_:
        raise OptionError(f"the {d.name} format has no tool calls: tool_choice cannot be "
                          f"{'required' if named is None else 'a named function'}", option="tool_choice")
    tools: list[Tool] = []
    if callable_ and choice != "none":
        for name, fn in declared.items():
            if named is None or name == named:
                t = typed_tool(name, fn, notes)
                if t is not None and pair_items:
                    t = pair_tool(t, notes) if _name_read(name, call_rest, notes) else None
                if t is not None:
                    tools.append(t)
    if must and not tools:
        raise OptionError("no declared tool can be called with its schema", option="tool_choice")
    builtin = _builtin_names(d, resolved, opts, notes) if bare and choice in (None, "auto") else ()
    calls = "no" if not tools and not builtin else "yes" if must else "opt"
    rf = opts.get("response_format")
    schema: Any = None
    if isinstance(rf, Mapping) and rf.get("type") in ("json_schema", "json_object"):
        schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
        if bare and may_spell_call(schema):
            raise OptionError(f"the {d.name} format reads a JSON object of the keys 'name' and 'parameters' as a "
                              "tool call: a response_format whose JSON may hold one cannot be held (give its "
                              "objects properties without both keys and additionalProperties false)",
                              option="response_format")
    choice_text = f"named {named!r}" if named else choice or "auto"
    opts_text = "".join(f"; {k} {'on' if v else 'off'}" for k, v in resolved.items() if k in d.options)
    summary = (f"template {d.name}{opts_text}; tools {', '.join(repr(t.name) for t in tools) or 'none'}; "
               f"tool_choice {choice_text}" + ("; one call at most" if max_calls == 1 else "")
               + (f"; response_format {rf['type']}" if schema is not None and isinstance(rf, Mapping) else ""))
    if bare and max_calls is None and d.header_turns is not None and d.header_turns.calls.max:
        max_calls = d.header_turns.calls.max
    return LayoutPlan(d, fmt, reasoning, after_reasoning, call_open, call_rest, sep, tools, calls, max_calls,
                      schema, tuple(d.stops), summary, section=section,
                      id_items=d.call_id.items if d.call_id is not None else (), indexed=indexed,
                      exact=d.reasoning_block is not None or d.reasoning_opened is not None, notes=notes,
                      opened=opened, bare=bare, builtin=builtin, **_builtin_pattern(d),
                      end_stops=tuple(t for t, m in d.stops.items() if m == "end"),
                      guards=_guards(call_rest) if bare else (), reasoning_lead=_reasoning_lead(d, split),
                      content_lead=_content_lead(d), call_lead=call_lead, pair_items=pair_items,
                      wait_stops=() if bare else tuple(t for t, m in d.stops.items() if m == "tool_wait"),
                      array=array, reasoning_label=block[1] if block is not None and reasoning is not None else "")


# Arguments a parse reads back as the object the grammar writes: as given,
# through tojson (a JSON string holding the object is read too), or as the
# text given (which a completion's parse reads as a JSON object).
_ARGUMENTS = ("as_given", "tojson", "string")
# A content cut (``[content] cut``) is a policy of history, not of answers:
# an answer's text spells none of the format's tokens, so holds no cut.


def _closed_after_calls(d: LayoutDialect, conds: Mapping[str, bool], split: tuple[str, str]) -> bool:
    """Where the format writes no prompt after calls (the answer goes on
    from the results), whether the prompt the options ask for elsewhere
    closes the reasoning block: the answer then opens none either."""
    if not conds.get("after_calls"):
        return False
    b = Builder()
    d.prompt.render({}, {**conds, "after_calls": False}, b)
    asked = [s.text for s in b.finish() if s.special]
    return split[0] in asked and split[1] in asked[asked.index(split[0]):]


def _refuse_unmirrored(d: LayoutDialect) -> None:
    used: list[str] = []
    if d.arguments not in _ARGUMENTS and not (d.arguments == "pairs" and d.call_pair is not None) and \
            not (d.arguments == SYNTAX and d.calls_syntax):
        used.append(f"arguments {d.arguments}")
    if d.reasoning_split is not None and d.reasoning_block is not None:
        used.append("reasoning split out of content and in a block of its own")
    if d.header_turns is None and d.split is None:
        # A stop that means the model waits for its calls' results ends
        # calls (the others end answers of content); what the other
        # meanings end is not read. A message written as several closes
        # each of its own (:mod:`.layout_messages`).
        used += [f"stop {t!r} ({m})" for t, m in d.stops.items() if m not in ("end", "tool_wait")]
    if used:
        raise OptionError(f"the completion grammar is not yet available for the layout dialect {d.name!r} (it "
                          f"writes answers with: {', '.join(used)})", option="tool_choice")


def _call_pattern(d: LayoutDialect) -> tuple[str, tuple[Item, ...], str, str]:
    """The opening token of a call, what follows it, the separator before a
    call (a leading ``{?cond}TEXT{/}``, or the text before every call), and
    the text written before every call, as the parse reads them."""
    each = d.calls_each
    if d.calls != EACH or each is None:
        return "", (), "", ""
    items = list(syntax_call_items(d) if d.arguments == SYNTAX else each.items)
    sep = lead = ""
    if items and isinstance(items[0], Cond) and all(isinstance(i, Lit) for i in items[0].body):
        sep = "".join(i.text for i in items[0].body if isinstance(i, Lit))
        items = items[1:]
    while not sep and items and isinstance(first_lit := items[0], Lit):
        lead += first_lit.text
        items = items[1:]
    slots = sorted(i.name for i in items if isinstance(i, Slot))
    if not items or not isinstance(items[0], Tok) or not isinstance(items[-1], Tok) or \
            any(isinstance(i, Cond) for i in items) or \
            slots not in (["arguments", "name"], ["arguments", "id"], ["arguments", "id", "name"]) or \
            ("id" in slots and not _spelled_ids(d, named="name" in slots)):
        raise OptionError(f"the completion grammar of the calls of the layout dialect {d.name!r} is not yet "
                          "available (a call is read between two tokens, with its name, or an id of the "
                          "format's spelling, and its arguments)", option="tool_choice")
    first = items[0]
    assert isinstance(first, Tok)
    # Text before every call is the separator between two as well.
    return first.token, tuple(items[1:]), sep or lead, lead


def _name_read(name: str, rest: tuple[Item, ...], notes: list[str]) -> bool:
    """Whether a parse reads ``name`` back whole where the name runs up to
    the literal text after it (a pairs format reads it up to a newline)."""
    at = next((k for k, i in enumerate(rest) if i == Slot("name")), len(rest))
    after = rest[at + 1] if at + 1 < len(rest) else None
    if isinstance(after, Lit) and after.text and after.text[0] in name:
        notes.append(f"tool {name!r}: its name holds {after.text[0]!r}, which ends a name in this format, so the "
                     "tool is left out")
        return False
    return True


def _reasoning_lead(d: LayoutDialect, split: tuple[str, str] | None) -> str | None:
    """The text before the reasoning block where the assistant's body opens
    with the block, outside any condition: it is on every answer."""
    body = d.roles["assistant"].body if "assistant" in d.roles else None
    if split is None or d.reasoning_block is not None or body is None:
        return None
    lead = ""
    for item in body.items:
        if isinstance(item, Lit):
            lead += item.text
            continue
        return lead if item == Tok(split[0]) else None
    return None


def _content_lead(d: LayoutDialect) -> str:
    """The text a condition of the assistant's body writes before the
    content and nothing else (``{?has_text}\\n{content}{/}``)."""
    body = d.roles["assistant"].body if "assistant" in d.roles else None
    for item in body.items if body is not None else ():
        if isinstance(item, Cond) and not item.negate and len(item.body) == 2:
            lead, slot = item.body
            if isinstance(lead, Lit) and isinstance(slot, Slot) and slot.name == "content":
                return lead.text
    return ""


def _bare_pattern(d: LayoutDialect) -> tuple[str, tuple[Item, ...], str, str]:
    """A bare call, as the parse of a format of header turns reads one: the
    whole answer, from literal text to literal text, its name and its
    arguments (a JSON object) in between."""
    each = d.calls_each
    if each is None:
        return "", (), "", ""
    items = each.items
    if not items or not isinstance(items[0], Lit) or not isinstance(items[-1], Lit) or \
            any(not isinstance(i, Lit | Slot) for i in items) or \
            sorted(i.name for i in items if isinstance(i, Slot)) != ["arguments", "name"]:
        raise OptionError(f"the completion grammar of the calls of the layout dialect {d.name!r} is not yet "
                          "available (a bare call is read from literal text to literal text, with its name and "
                          "its arguments)", option="tool_choice")
    return "", tuple(items), "", ""


def _guards(items: tuple[Item, ...]) -> tuple[str, ...]:
    """What free text never spells: the literal text a bare call opens
    with, which a parse takes for a call wherever a call then runs to the
    end of the answer."""
    first = items[0] if items else None
    return (first.text,) if isinstance(first, Lit) else ()


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _builtin_names(d: LayoutDialect, resolved: Mapping[str, Any], opts: Mapping[str, Any],
                   notes: list[str]) -> tuple[str, ...]:
    """The built-in tools the request turns on (``[calls] builtin_when``):
    names a parse reads back whole (identifiers)."""
    t = d.header_turns
    if t is None or t.calls.builtin is None:
        return ()
    given = opts.get(t.calls.builtin_when, resolved.get(t.calls.builtin_when))
    if not isinstance(given, list | tuple):
        return ()
    names = []
    for n in given:
        if isinstance(n, str) and _IDENT.match(n):
            names.append(n)
        else:
            notes.append(f"the built-in tool {n!r} is not a name a call can spell: it is left out")
    return tuple(dict.fromkeys(names))


def _builtin_pattern(d: LayoutDialect) -> dict[str, Any]:
    t = d.header_turns
    if t is None or t.calls.builtin is None or t.calls.builtin_argument is None:
        return {}
    return {"builtin_items": t.calls.builtin.items, "argument_items": t.calls.builtin_argument.items}


def may_spell_call(schema: Any) -> bool:
    """Whether JSON of ``schema`` may spell what a format of bare JSON calls
    reads as a call: the keys ``name`` and ``parameters`` anywhere in it
    (its reader finds a call's opening text and the text between its two
    keys wherever they are, in whichever objects). False only where the
    schema admits no value of its own choosing (every object closed by
    ``additionalProperties: false``, every array's items given, every node
    typed) and its properties and fixed values do not name both keys. Any
    node of the document may be a reference's target, so each is read."""
    keys: set[str] = set()
    free = False

    def named(value: Any) -> None:
        if isinstance(value, Mapping):
            keys.update(k for k in value if isinstance(k, str))
            for x in value.values():
                named(x)
        elif isinstance(value, list):
            for x in value:
                named(x)

    def walk(s: Any) -> None:
        nonlocal free
        if free:
            return
        if not isinstance(s, Mapping):
            if isinstance(s, list):
                for x in s:
                    walk(x)
            elif s is not False:
                free = True  # true, or something that is not a schema: any value
            return
        if "const" in s or "enum" in s:
            named([s.get("const"), s.get("enum")])
            return
        ref = s.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            free = True  # not of this document: any value
            return
        t = s.get("type")
        combined = any(k in s for k in ("$ref", "anyOf", "oneOf", "allOf"))
        if t is None and not combined:
            free = True  # untyped: any value, objects of any keys among them
            return
        types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()
        given = s.get("properties")
        if isinstance(given, Mapping):
            keys.update(k for k in given if isinstance(k, str))
        if "object" in types and (s.get("additionalProperties") is not False or s.get("patternProperties")):
            free = True
            return
        if "array" in types and ("items" not in s or s["items"] is True):
            free = True  # items of any kind
            return
        for k, v in s.items():
            if k in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
                if isinstance(v, Mapping):
                    for x in v.values():
                        walk(x)
            elif k in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "additionalProperties", "contains",
                       "if", "then", "else", "additionalItems", "unevaluatedItems", "unevaluatedProperties"):
                walk(v)

    walk(schema)
    return free or {"name", "parameters"} <= keys


def _spelled_ids(d: LayoutDialect, *, named: bool) -> bool:
    """Whether the grammar can spell a call's id: generated or given, of
    ``[calls] id``'s spelling (literal text, the name, the index), which
    holds the name where the call does not write it."""
    p = d.call_id
    if d.call_ids not in ("generated", "given") or p is None:
        return False
    if any(not isinstance(i, Lit | Slot) or (isinstance(i, Slot) and i.name not in ("name", "index"))
           for i in p.items):
        return False
    return named or "name" in p.slots()


def _section(d: LayoutDialect) -> tuple[str, str] | None:
    """The section's two tokens, as the parse reads them (nothing else in
    it but the calls)."""
    p = d.calls_section
    if p is None:
        return None
    items = p.items
    if len(items) != 3 or not isinstance(items[0], Tok) or not isinstance(items[2], Tok) or \
            items[1] != Slot("calls"):
        raise OptionError(f"the completion grammar of the tool-call section of the layout dialect {d.name!r} is "
                          "not yet available (a section is read between two tokens)", option="tool_choice")
    return items[0].token, items[2].token


def _bind(plan: LayoutPlan, binding: TokenBinding | None, how: str) -> None:
    """How each token is referenced: by id (or name) where the vocabulary has
    it as one id, as text where it spells it as text."""
    d = plan.d
    if binding is None:
        for t in d.tokens:
            if plan.format != "llguidance" or how == "id":
                raise TokenizerError(f"token {t!r} is referenced by its id here: pass the tokenizer (--tokenizer) "
                                     f"to {plan.format}")
            if not _NAMED.match(t):
                plan.unnamed[t] = f"token {t!r} cannot be referenced by name in llguidance's syntax; pass the tokenizer"
            plan.refs[t] = t
        return
    plan.text_tokens = tuple(binding.text_tokens)
    plan.token_ids = dict(binding.token_ids)
    for t, i in binding.token_ids.items():
        if plan.format == "llguidance":
            if how == "name" and not _NAMED.match(t):
                plan.unnamed[t] = (f"token {t!r} cannot be referenced by name in llguidance's syntax; use "
                                   "token_refs='id'")
            plan.refs[t] = t if how == "name" else f"<[{i}]>"
        elif plan.format == "gbnf":
            plan.refs[t] = f"<[{i}]>"
        else:
            plan.refs[t] = f"Token({i})"
    plan.specials = sorted(binding.vocab.special_ids() | set(binding.token_ids.values()))


def _refuse_spellings(plan: LayoutPlan) -> None:
    """A tool name that spells a token the vocabulary spells as text: the
    grammar would write it, and a parse would read the token there."""
    if not plan.text_tokens:
        return
    calls = (Tok(plan.call_open), *plan.call_rest, *plan.pair_items) if plan.led and plan.tools else ()
    spelled = [i.token for i in calls if isinstance(i, Tok) and i.token in plan.text_tokens]
    if spelled:
        # Text up to a token's spelling would be one terminal each (the
        # lexer gives back nothing it took), which these calls do not have.
        raise TokenizerError(f"this vocabulary writes {', '.join(dict.fromkeys(spelled))} as text: the completion "
                             f"grammar of the calls of the layout dialect {plan.d.name!r} needs each as one id")
    for t in plan.tools:
        for tok in plan.text_tokens:
            if tok in t.name:
                raise RequestError(f"tool name {t.name!r} spells {tok!r}, which this vocabulary writes as text: a "
                                   "parse would read the token there", location="tools")
            for a in t.args if plan.pair_items else ():
                if tok in a.key:
                    raise RequestError(f"tool {t.name!r}: argument {a.key!r} spells {tok!r}, which this vocabulary "
                                       "writes as text: a parse would read the token there", location="tools")
