"""harmony's TypeScript namespace as Jinja macros (the ``jinja`` operation of
the ``typescript`` value syntax): :meth:`~.typescript.TypeScriptNamespace.
declare` for a chat template that renders in transformers' jinja2,
``@huggingface/jinja`` and llama.cpp's engine alike, or raises.

``{P}declare(tools)`` writes ``## functions`` and the namespace, raising with
the message and location :mod:`.typescript` raises. What the engines do not
share is spelt here:

* Python's truth of a value and ``str()`` of one: written out (a boolean as
  ``True``, a float by the template's ``x_pfloat``); ``str()`` of a list or
  an object only in jinja2, whose ``string`` filter is Python's;
* a key named like a method (``items``): llama.cpp's engine reads the
  method for ``m['items']`` and ``@huggingface/jinja`` cannot call
  ``items()`` on an object holding that key, so an object's keys are
  iterated and each value looked up by subscript and, where that is
  undefined, by a walk of ``m.items()``;
* the length of a type (an array of a type longer than fifty characters is
  ``any[]``): the engines count other units than Python's characters
  outside printable ASCII, so there, outside jinja2, the template raises.
"""

from __future__ import annotations

import re

__all__ = ["LIMIT", "macros"]

LIMIT = "this engine's Jinja cannot write what the typescript value syntax writes here"
"""The start of every raise where an engine cannot write what Python
writes."""

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_BRACES = re.compile(r"(?<=\{)|(?=\})")


def _q(s: str) -> str:
    """``s`` as a string literal every engine reads alike: no brace beside
    another character inside one literal (``@huggingface/jinja`` rewrites
    the source before it tokenizes it)."""
    pieces = [p for p in _BRACES.split(s) if p] or [""]
    lits = ["'" + "".join(_ESCAPES.get(ch, ch) for ch in p) + "'" for p in pieces]
    return lits[0] if len(lits) == 1 else "(" + " ~ ".join(lits) + ")"


def _raise(message: str, at: str) -> str:
    """A raise of ``message`` (a Jinja expression) located at ``at`` (one)."""
    return "{{ raise_exception(" + message + " ~ ' (at ' ~ " + at + " ~ ')') }}"


def _field(m: str, key: str, into: str) -> str:
    """Statements setting ``into.h`` to whether ``m`` is an object holding
    ``key`` and ``into.v`` to its value (a JSON null is held: none)."""
    k = _q(key)
    return ("{%- set " + into + " = namespace(v=none, h=false) -%}{%- if " + m + " is mapping and " + k + " in " + m
            + " -%}{%- set " + into + ".h = true -%}" + _get(m, k, into) + "{%- endif -%}")


def _get(m: str, key: str, into: str) -> str:
    """Statements setting ``into.v`` to ``m[key]`` (``key`` in ``m``)."""
    return ("{%- if " + m + "[" + key + "] is defined -%}{%- set " + into + ".v = " + m + "[" + key + "] -%}"
            "{%- else -%}{%- for k2, v2 in " + m + ".items() -%}{%- if k2 == " + key + " -%}{%- set " + into
            + ".v = v2 -%}{%- endif -%}{%- endfor -%}{%- endif -%}")


def _is(f: str, word: str) -> str:
    """A field holding the string ``word``."""
    return f"({f}.h and {f}.v is string and {f}.v == {_q(word)})"


def macros(p: str) -> str:
    """The macros, each named with the prefix ``p`` (see the module's doc).
    They call the template's ``x_py``, ``x_ascii``, ``x_repr`` and
    ``x_pfloat``."""
    t = p + "t"
    nl = _q("\n")
    out = [
        # Python's truth of a value the field holds (absent: false).
        "{%- macro " + t + "(f) -%}",
        "{%- set v = f.v -%}",
        "{{ '' if not f.h or v is none or (v is boolean and not v) or (v is number and v == 0) or ((v is string or "
        "v is mapping or (v is iterable and v is not string)) and (v | length) == 0) else 'y' }}",
        "{%- endmacro -%}",
        # str(x).
        "{%- macro " + p + "str(x, at) -%}",
        "{%- if x is string -%}{{ x }}",
        "{%- elif x is boolean -%}{{ 'True' if x else 'False' }}",
        "{%- elif x is none -%}{{ 'None' }}",
        "{%- elif x is integer -%}{{ x | tojson }}",
        "{%- elif x is number -%}{{ x_pfloat(x) }}",
        "{%- elif x_py -%}{{ x | string }}",
        "{%- else -%}" + _raise(_q(LIMIT + ": Python's str() of a list or an object (render with xtml)"), "at"),
        "{%- endif -%}",
        "{%- endmacro -%}",
        # repr(x) of a JSON value; a string of other than printable ASCII only
        # in jinja2 (Python escapes what it does not print by a table the
        # template cannot read).
        "{%- macro " + p + "repr(x, at) -%}",
        "{%- if x is string -%}",
        "{%- if not x_py and x_ascii(x) != 'y' -%}",
        _raise(_q(LIMIT + ": Python's repr() of a string of other than printable ASCII (render with xtml)"), "at"),
        "{%- endif -%}",
        "{%- set e = x | replace('\\\\', '\\\\\\\\') | replace('\\n', '\\\\n') | replace('\\r', "
        "'\\\\r') | replace('\\t', '\\\\t') -%}",
        "{%- if \"'\" in e and '\"' not in e -%}{{ '\"' ~ e ~ '\"' }}",
        "{%- else -%}{{ \"'\" ~ (e | replace(\"'\", \"\\\\'\")) ~ \"'\" }}{%- endif -%}",
        "{%- elif x is mapping -%}",
        "{{ '{' }}{%- for k in x -%}{%- set g = namespace(v=none) -%}" + _get("x", "k", "g")
        + "{{ (', ' if not loop.first else '') ~ " + p + "repr(k, at) ~ ': ' ~ " + p + "repr(g.v, at) }}"
        "{%- endfor -%}{{ '}' }}",
        "{%- elif x is iterable -%}",
        "{{ '[' }}{%- for y in x -%}{{ (', ' if not loop.first else '') ~ " + p + "repr(y, at) }}{%- endfor -%}"
        "{{ ']' }}",
        "{%- else -%}{{ " + p + "str(x, at) }}",
        "{%- endif -%}",
        "{%- endmacro -%}",
        # shown(x), bounded as xtml bounds it.
        "{%- macro " + p + "shown(x, at) -%}",
        "{%- if x is string -%}{{ x_repr(x) }}",
        "{%- elif x is mapping or (x is iterable and x is not string) -%}",
        "{%- set s = (x | string if x_py else " + p + "repr(x, at)) ~ '' -%}",
        "{{ s if (s | length) <= 40 else s[:40] ~ '… (' ~ (s | length) ~ ' characters)' }}",
        "{%- else -%}{{ " + p + "str(x, at) }}",
        "{%- endif -%}",
        "{%- endmacro -%}",
        # json.dumps(v, ensure_ascii=False).
        "{%- macro " + p + "json(v) -%}",
        "{%- if v is none -%}{{ 'null' }}",
        "{%- elif v is boolean -%}{{ 'true' if v else 'false' }}",
        "{%- elif v is number and v != v -%}{{ 'NaN' }}",
        "{%- elif v is number and v * 0 != 0 -%}{{ 'Infinity' if v > 0 else '-Infinity' }}",
        "{%- elif v is string or v is integer -%}{{ v | tojson }}",
        "{%- elif v is number -%}{{ x_pfloat(v) }}",
        "{%- elif v is mapping -%}",
        "{{ '{' }}{%- for k in v -%}{%- set g = namespace(v=none) -%}" + _get("v", "k", "g")
        + "{{ (', ' if not loop.first else '') ~ ((k if k is string else " + p + "str(k, '') ~ '') | tojson) ~ ': ' }}"
        "{{ " + p + "json(g.v) }}{%- endfor -%}{{ '}' }}",
        "{%- else -%}",
        "{{ '[' }}{%- for y in v -%}{{ ', ' if not loop.first else '' }}{{ " + p + "json(y) }}{%- endfor -%}"
        "{{ ']' }}",
        "{%- endif -%}",
        "{%- endmacro -%}",
        # _cat: a value added to text, which must be there and a string.
        "{%- macro " + p + "cat(f, at) -%}",
        "{%- if not f.h -%}" + _raise(_q("missing: the template adds it to text (it raises without it)"), "at"),
        "{%- elif f.v is not string -%}"
        + _raise(p + "shown(f.v, at) ~ " + _q(" is not a string: the template adds it to text (it raises)"), "at"),
        "{%- endif -%}{{ f.v }}",
        "{%- endmacro -%}",
        # _required: name in (required or []), as Python tests it.
        "{%- macro " + p + "req(name, f, at) -%}",
        "{%- if " + t + "(f) == 'y' -%}",
        "{%- if f.v is string or f.v is mapping or f.v is iterable -%}{{ 'y' if name in f.v else '' }}",
        "{%- else -%}" + _raise("'required is ' ~ " + p + "shown(f.v, at) ~ "
                                + _q(": the template tests names' membership in it"), "at"),
        "{%- endif -%}",
        "{%- endif -%}",
        "{%- endmacro -%}",
        # _iterate: a list's items, an object's keys, a string's characters.
        "{%- macro " + p + "items(x, at) -%}",
        "{%- if x is string and not x_py and x_ascii(x) != 'y' -%}",
        _raise(_q(LIMIT + ": the characters of a string of other than printable ASCII (render with xtml)"), "at"),
        "{%- elif x is not string and x is not mapping and x is not iterable -%}",
        _raise(p + "shown(x, at) ~ ' is not a list (the template iterates it)'", "at"),
        "{%- endif -%}",
        "{%- endmacro -%}",
        # _type: render_typescript_type.
        "{%- macro " + p + "type(spec, where) -%}",
        _field("spec", "type", "ty"),
        "{%- if " + _is("ty", "array") + " -%}",
        _field("spec", "items", "it"),
        "{%- set n = namespace(out='any[]') -%}",
        "{%- if " + t + "(it) == 'y' -%}",
        _field("it.v", "type", "iy"),
        "{%- if " + _is("iy", "string") + " -%}{%- set n.out = 'string[]' -%}",
        "{%- elif " + _is("iy", "number") + " or " + _is("iy", "integer") + " -%}{%- set n.out = 'number[]' -%}",
        "{%- elif " + _is("iy", "boolean") + " -%}{%- set n.out = 'boolean[]' -%}",
        "{%- else -%}",
        "{%- set inner = " + p + "type(it.v, where ~ '.items') ~ '' -%}",
        "{%- if not x_py and x_ascii(inner) != 'y' -%}",
        _raise(_q(LIMIT + ": the length of a type of other than printable ASCII (render with xtml)"), "where"),
        "{%- endif -%}",
        "{%- set n.out = 'any[]' if inner == 'object | object' or (inner | length) > 50 else inner ~ '[]' -%}",
        "{%- endif -%}",
        "{%- endif -%}",
        _field("spec", "nullable", "nu"),
        "{{ n.out ~ (' | null' if " + t + "(nu) == 'y' else '') }}",
        "{%- elif ty.h and ty.v is not string and ty.v is not mapping and ty.v is iterable and (ty.v | length) > 0 "
        "-%}",
        "{%- for x in ty.v -%}{{ ' | ' if not loop.first else '' }}{{ " + p + "str(x, where ~ '.type') }}"
        "{%- endfor -%}",
        "{%- else -%}",
        _field("spec", "oneOf", "of"),
        "{%- if " + t + "(of) == 'y' -%}",
        "{{ " + p + "items(of.v, where ~ '.oneOf') }}",
        "{%- for v in of.v -%}",
        "{%- set at = where ~ '.oneOf[' ~ loop.index0 ~ ']' -%}",
        "{{ (' | ' ~ " + nl + ") if not loop.first else '' }}{{ " + p + "type(v, at) }}",
        _field("v", "description", "de"),
        "{%- if " + t + "(de) == 'y' -%}{{ '// ' ~ " + p + "cat(de, at ~ '.description') }}{%- endif -%}",
        _field("v", "default", "df"),
        "{%- if df.h -%}{{ " + _q(" " * 20 + "// default: ") + " ~ " + p + "json(df.v) }}{%- endif -%}",
        "{%- endfor -%}",
        "{%- elif " + _is("ty", "string") + " -%}",
        _field("spec", "enum", "en"),
        "{%- if " + t + "(en) == 'y' -%}",
        "{{ " + p + "items(en.v, where ~ '.enum') }}",
        "{{ '\"' }}{%- for x in en.v -%}{{ '\" | \"' if not loop.first else '' }}{{ " + p
        + "str(x, where ~ '.enum') }}{%- endfor -%}{{ '\"' }}",
        "{%- else -%}",
        _field("spec", "nullable", "nu"),
        "{{ 'string' ~ (' | null' if " + t + "(nu) == 'y' else '') }}",
        "{%- endif -%}",
        "{%- elif " + _is("ty", "number") + " or " + _is("ty", "integer") + " -%}{{ 'number' }}",
        "{%- elif " + _is("ty", "boolean") + " -%}{{ 'boolean' }}",
        "{%- elif " + _is("ty", "object") + " -%}",
        _field("spec", "properties", "pr"),
        "{%- if " + t + "(pr) != 'y' -%}{{ 'object' }}",
        "{%- elif pr.v is not mapping -%}",
        _raise("'properties are an object, not ' ~ " + p + "shown(pr.v, where)", "where ~ '.properties'"),
        "{%- else -%}",
        _field("spec", "required", "rq"),
        "{{ '{' ~ " + nl + " }}",
        "{%- for name in pr.v -%}",
        "{%- set g = namespace(v=none) -%}" + _get("pr.v", "name", "g"),
        "{%- set opt = '' if " + p + "req(name, rq, where ~ '.required') == 'y' else '?' -%}",
        "{{ (', ' if not loop.first else '') ~ name ~ opt ~ ': ' ~ " + nl + " ~ " + _q(" " * 16) + " }}"
        "{{ " + p + "type(g.v, where ~ '.properties.' ~ name) }}",
        "{%- endfor -%}",
        "{{ '}' }}",
        "{%- endif -%}",
        "{%- else -%}{{ 'any' }}",
        "{%- endif -%}",
        "{%- endif -%}",
        "{%- endmacro -%}",
        # _tool.
        "{%- macro " + p + "tool(tool, where) -%}",
        _field("tool", "function", "fn"),
        "{%- if not fn.h or fn.v is not mapping -%}",
        _raise(_q('a tool is {"type": "function", "function": {...}}'), "where"),
        "{%- endif -%}",
        "{%- set w = where ~ '.function' -%}",
        _field("fn.v", "description", "de"),
        "{{ '// ' ~ " + p + "cat(de, w ~ '.description') ~ " + nl + " }}",
        _field("fn.v", "name", "nm"),
        "{{ 'type ' ~ " + p + "cat(nm, w ~ '.name') ~ ' = ' }}",
        _field("fn.v", "parameters", "pa"),
        _field("pa.v", "properties", "pr"),
        "{%- if not (" + t + "(pa) == 'y' and " + t + "(pr) == 'y') -%}{{ '() => any;' ~ " + nl + " ~ " + nl + " }}",
        "{%- else -%}",
        "{%- set at = w ~ '.parameters' -%}",
        "{%- if pr.v is not mapping -%}",
        _raise("'properties are an object, not ' ~ " + p + "shown(pr.v, at)", "at ~ '.properties'"),
        "{%- endif -%}",
        _field("pa.v", "required", "rq"),
        "{{ '(_: ' ~ '{' ~ " + nl + " }}",
        "{%- for name in pr.v -%}",
        "{%- set g = namespace(v=none) -%}" + _get("pr.v", "name", "g"),
        "{%- set ps = at ~ '.properties.' ~ name -%}",
        _field("g.v", "description", "pd"),
        "{%- if " + t + "(pd) == 'y' -%}{{ '// ' ~ " + p + "cat(pd, ps ~ '.description') ~ " + nl + " }}"
        "{%- endif -%}",
        "{%- set opt = '' if " + p + "req(name, rq, at ~ '.required') == 'y' else '?' -%}",
        "{{ name ~ opt ~ ': ' }}{{ " + p + "type(g.v, ps) }}",
        _field("g.v", "default", "df"),
        "{%- if df.h -%}",
        _field("g.v", "enum", "en"),
        _field("g.v", "oneOf", "of"),
        "{%- if " + t + "(en) == 'y' -%}{{ ', // default: ' ~ " + p + "cat(df, ps ~ '.default') }}",
        "{%- elif " + t + "(of) == 'y' -%}{{ '// default: ' ~ " + p + "cat(df, ps ~ '.default') }}",
        "{%- else -%}{{ ', // default: ' ~ " + p + "json(df.v) }}",
        "{%- endif -%}",
        "{%- endif -%}",
        "{{ ',' ~ " + nl + " }}",
        "{%- endfor -%}",
        "{{ '}' ~ ') => any;' ~ " + nl + " ~ " + nl + " }}",
        "{%- endif -%}",
        "{%- endmacro -%}",
        # declare: the namespace of the tools.
        "{%- macro " + p + "declare(tools) -%}",
        "{{ '## functions' ~ " + nl + " ~ " + nl + " ~ 'namespace functions ' ~ '{' ~ " + nl + " ~ " + nl + " }}",
        "{%- for x_tool in tools -%}{{ " + p + "tool(x_tool, 'tools[' ~ loop.index0 ~ ']') }}{%- endfor -%}",
        "{{ '}' ~ ' // namespace functions' }}",
        "{%- endmacro -%}",
    ]
    return "".join(out)
