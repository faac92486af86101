"""A dialect as a transformers ``response_template``: the declarative output
parser that ``tokenizer.parse_response`` and ``tokenizer.get_response_parser``
read from ``tokenizer_config.json`` (transformers 5).

A model shipped with only transformers' tooling has no xtml to read its
output; the response template lets transformers (and the servers built on
it) turn a completion into ``content``, ``reasoning_content`` and
``tool_calls`` without xtml. The template is written from the dialect: every
marker, element name and attribute name is read from it, so it works for
any dialect, not only Kimi K3.

The format is a set of regions found by delimiters, each read by a content
parser; it cannot say everything the dialect says. :func:`response_template`
returns, with the template, one line per rule of the dialect that the
template does not keep (attribute unescaping, the json fallback block,
marker literals in text, the checks of a strict parse ...): the places
where ``parse_response`` and :meth:`xtml.Template.parse` may disagree.
tests/test_export_response_template.py checks that they agree everywhere
else.

This module only writes a dict: it does not import transformers (which
xtml does not depend on). The regular expressions are written for the
``regex`` module transformers compiles them with; where that module and
``re`` differ (a group name used twice), the comment says so.
"""

from __future__ import annotations

import re
from typing import Any

from ..chat.dialect import Dialect
from ..chat.prompt import generation_prompt
from ..markup.header import NAME_RE
from ..plugins import jsonfmt

__all__ = ["response_template"]

# Message keys of transformers' parsed message, by what a channel holds.
_FIELDS = {"reasoning": "reasoning_content", "content": "content", "tool_calls": "tool_calls"}

# One attribute as the renderer writes it: values are escaped, so a raw
# double quote always ends one.
_ATTR = f' {NAME_RE}="[^"]*"'

# Body text is kept byte for byte, as xtml keeps it: the text parser strips
# by default.
_RAW_TEXT: dict[str, Any] = {"name": "text", "args": {"strip": False}}

# A typed value that is not JSON is kept as the text it is (xtml's lenient
# parse does the same) instead of failing the whole parse, which is what
# the json parser does without allow_non_json.
_JSON_OR_TEXT: dict[str, Any] = {"name": "json", "args": {"allow_non_json": True, "strip": False}}


def _lit(s: str) -> str:
    return re.escape(s)


def _header(opener: str, tag: str, sep: str, wanted: dict[str, str], optional: dict[str, str] | None = None) -> str:
    """A pattern for the tag ``tag`` with its attributes in any order:
    ``wanted`` maps attribute names to the pattern their value must match
    (a capture, or a fixed value), each required; ``optional`` the same for
    attributes that may be missing.

    xtml reads attributes in any order, so the pattern does too: each named
    attribute is found by a lookahead over the header. A wanted capture must
    not be optional: a match without it would reach the transform without
    the placeholder it fills, and the KeyError there fails the whole parse."""
    looks = "".join(f'(?=(?:{_ATTR})*? {_lit(k)}="{v}")' for k, v in wanted.items())
    looks += "".join(f'(?:(?=(?:{_ATTR})*? {_lit(k)}="{v}"))?' for k, v in (optional or {}).items())
    return f"{_lit(opener + tag)}{looks}(?:{_ATTR})*{_lit(sep)}"


def _capture(group: str) -> str:
    return f'(?P<{group}>[^"]*)'


def _start_anchor(d: Dialect) -> str:
    """The assistant message's open tag: where the message the model writes
    starts. A pattern, not the generation prompt's literal text, so that a
    prefilled message (one with a ``name``) is found too."""
    prompt = generation_prompt(d, False)
    wanted = {k: _lit(v) for k, v in prompt.attrs}
    return _header(d.markers.open, prompt.tag, d.markers.sep, wanted)


def _channel(d: Dialect, tag: str) -> dict[str, Any]:
    m = d.markers
    return {"open": m.open + tag + m.sep, "close": m.close + tag + m.sep, "content": "text",
            "content_args": dict(_RAW_TEXT["args"])}


def _calls(d: Dialect) -> dict[str, Any]:
    m, n = d.markers, d.names
    # The argument types xtml writes, from the function that names them, so
    # the two cannot drift apart.
    samples: tuple[object, ...] = (0, True, None, {}, [])
    json_types = sorted({jsonfmt.value_type(v) for v in samples})
    string_type = jsonfmt.value_type("")
    # An unset type (a header without one, or the json block's branch) or
    # an unknown one falls back to raw text, as xtml reads it.
    argument = (_header(m.open, n["argument"], m.sep, {n["key"]: _capture("key")}, {n["type"]: _capture("type")})
                + f"(?P<value>.*?){_lit(m.close + n['argument'] + m.sep)}")
    # The json fallback block reads as one argument named after its tag: the
    # content parser needs a `key` group, and a call's arguments are a dict.
    # The group names repeat across the two branches, which `regex` allows
    # (and `re` does not).
    block = (f"{_lit(m.open)}(?P<key>{_lit(n['json'])})(?:{_ATTR})*{_lit(m.sep)}"
             f"(?P<value>.*?){_lit(m.close + n['json'] + m.sep)}")
    return {
        "open_pattern": _header(m.open, n["call"], m.sep, {n["tool"]: _capture("name")}),
        "close": m.close + n["call"] + m.sep,
        "repeats": True,
        "content": "xml-inline",
        "content_args": {
            "tag_pattern": f"{argument}|{block}",
            "value_parser": _RAW_TEXT,
            "value_parser_by": {
                "group": "type",
                "parsers": {string_type: _RAW_TEXT, **{t: _JSON_OR_TEXT for t in json_types}},
            },
        },
        "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
    }


def _limits(d: Dialect) -> list[str]:
    m, n = d.markers, d.names
    tools = d.channel_tag("tool_calls")
    out = [
        f"attribute values are not unescaped: a tool name ({n['tool']}=) or argument key ({n['key']}=) holding "
        '& or " comes back as written, with &amp; and &quot;',
        f"a call's json fallback block ({m.open}{n['json']} ...{m.sep}, arguments that are not a JSON object) "
        f'comes back as the one argument {{"{n["json"]}": RAW}}, not as the raw arguments string',
        "typed argument values are not checked: one that is not standard JSON comes back as its text, one of "
        "another type than its type attribute (or NaN, Infinity, 1e999) as what Python's json reads; xtml's "
        "strict parse refuses both",
        "a typed value Python's json cannot read at all (an integer of more than 4300 digits, nesting deeper "
        "than the recursion limit) fails the whole parse: transformers' json parser lets those errors through "
        "allow_non_json; xtml keeps the value as text (lenient) or reports it (strict)",
        "marker literals: parsing decoded text reads every marker string in body text as markup; only token ids, "
        "with the markers as the tokenizer's special tokens, keep a marker the model spelled in text as text",
        f"markup is not checked and nothing is reported: channels out of order or repeated (the last one wins), "
        f"text outside a channel (dropped), calls outside the {tools} channel (read), call indices, unknown "
        "attributes, a think channel in non-thinking mode; xtml's strict parse refuses these, its lenient parse "
        "repairs them with a diagnostic",
        f"a call without a {n['tool']} attribute and an argument without a {n['key']} attribute are dropped "
        "(a transform cannot fill a missing value); xtml reads them with an empty name or key",
        "content parts: embeds (images) and content plugins' elements in a channel come back as their markup text "
        "inside the content string, not as content parts",
        "U+FDD2 in the model's text is dropped when parsing token ids: transformers writes that noncharacter "
        "into spelled markers to defuse them and strips every one from the values",
        "calls get no id (xtml numbers them call_0_K)",
        f"output after the message's end ({m.end}) is read into the same message; xtml reports it "
        "(trailing-output) and reads only the first message",
    ]
    return out


def response_template(d: Dialect) -> tuple[dict[str, Any], list[str]]:
    """The transformers ``response_template`` dict for dialect ``d``, and the
    limits: one line for each rule of the dialect the template cannot
    express, where ``tokenizer.parse_response`` may read a completion
    otherwise than :meth:`xtml.Template.parse` (``completion=True``).

    Set it as ``tokenizer.response_template`` (it is saved with the
    tokenizer) and parse with the prompt as ``prefix``: the region the
    generation prompt opened (the think channel, or the response channel
    without thinking) is read from the prompt, so one template serves both
    modes. Parse token ids with the dialect's markers as the tokenizer's
    special tokens: then a marker literal in the model's text stays text."""
    fields: dict[str, Any] = {}
    for ch in d.assistant_channels:
        key = _FIELDS[ch.holds]
        # The tools channel's own tags are left to the null region: each
        # call is a region of its own, read as it closes.
        fields[key] = _calls(d) if ch.holds == "tool_calls" else _channel(d, ch.tag)
    template: dict[str, Any] = {
        "version": 1,
        "start_anchor_pattern": _start_anchor(d),
        # xtml always gives content (the response channel is always written);
        # a default keeps an empty one, which the parser otherwise drops.
        "defaults": {"role": "assistant", **({"content": ""} if "content" in fields else {})},
        "fields": fields,
    }
    return template, _limits(d)
