"""Gemma 4's key:value syntax as Jinja macros (the ``jinja`` operation of
the ``gemma`` value syntax): the writer of :mod:`.gemma_values` for a chat
template that renders in transformers' jinja2, ``@huggingface/jinja`` and
llama.cpp's engine alike, or raises.

``{P}declare(tools)`` writes the tools' declarations and ``{P}write(arguments,
at)`` an object's arguments, each raising with the message and location
:mod:`.gemma_values` raises. What the engines do not share is spelt here:

* ``dictsort``: llama.cpp's engine has none, and neither it nor
  ``@huggingface/jinja`` compares strings with ``<``, so outside jinja2 keys
  are sorted by a table of printable ASCII (lowercased, ties in the given
  order, as Python's sort is stable); a key of other characters among
  others raises there;
* a key named like a method (``items``, ``get``): llama.cpp's engine reads
  the method for ``m['items']``, so a value is looked up by subscript and,
  where that is undefined, by a walk of ``m.items()``
  (``@huggingface/jinja`` cannot call ``items()`` on such an object);
* ``str()`` of a number: integers by ``tojson``, floats by the template's
  ``x_pfloat`` (Python's repr, or a raise where the engine's digits read
  back as another number); ``str()`` of a list or an object, and
  ``upper()`` of other than printable ASCII, only in jinja2 (elsewhere: a
  raise).
"""

from __future__ import annotations

import re

from .gemma_read import KEY_ENDS, QUOTE

__all__ = ["LIMIT", "macros"]

LIMIT = "this engine's Jinja cannot write what the gemma value syntax writes here"
"""The start of every raise where an engine cannot write what Python
writes."""

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_BRACES = re.compile(r"(?<=\{)|(?=\})")
_STANDARD = ("description", "type", "properties", "required", "nullable")
_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))


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


class _Writer:
    def __init__(self, p: str) -> None:
        self.p = p
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return f"{self.p}n{self.n}"

    def get(self, m: str, key: str, into: str) -> str:
        """Statements setting ``into.v`` to ``m[key]`` (``key`` in ``m``)."""
        return ("{%- if " + m + "[" + key + "] is defined -%}{%- set " + into + ".v = " + m + "[" + key + "] -%}"
                "{%- else -%}{%- for k2, v2 in " + m + ".items() -%}{%- if k2 == " + key + " -%}{%- set " + into
                + ".v = v2 -%}{%- endif -%}{%- endfor -%}{%- endif -%}")

    def field(self, m: str, key: str, into: str) -> str:
        """Statements setting ``into.v`` to ``m[key]`` where ``m`` is an
        object holding ``key``, else ``''`` (Jinja's undefined as the
        template reads it: falsy, written as nothing)."""
        return ("{%- set " + into + " = namespace(v='') -%}{%- if " + m + " is mapping and " + _q(key) + " in " + m
                + " -%}" + self.get(m, _q(key), into) + "{%- endif -%}")

    def sorted_keys(self, m: str, into: str, at: str) -> str:
        """Statements setting ``into.ord`` to ``m``'s keys as Python's
        ``sorted(key=str.lower)`` orders them."""
        p = self.p
        return "".join([
            "{%- set " + into + " = namespace(ord=[], all=[], taken=[], best=-1) -%}",
            "{%- if x_py -%}{%- for k, y in " + m + " | dictsort -%}{%- set " + into + ".ord = " + into
            + ".ord + [k] -%}{%- endfor -%}",
            "{%- else -%}",
            "{%- for k in " + m + " -%}{%- set " + into + ".all = " + into + ".all + [k] -%}",
            "{%- if (" + m + " | length) > 1 and (k is not string or x_ascii(k) != 'y') -%}",
            _raise(_q(LIMIT + ": sort keys of other than printable ASCII as Python does (render with xtml)"), at),
            "{%- endif -%}{%- endfor -%}",
            "{%- for k0 in " + into + ".all -%}{%- set " + into + ".best = -1 -%}",
            "{%- for k in " + into + ".all -%}{%- if loop.index0 not in " + into + ".taken and (" + into
            + ".best < 0 or " + p + "lt(k | lower, " + into + ".all[" + into + ".best] | lower) == 'y') -%}"
            "{%- set " + into + ".best = loop.index0 -%}{%- endif -%}{%- endfor -%}",
            "{%- set " + into + ".taken = " + into + ".taken + [" + into + ".best] -%}",
            "{%- set " + into + ".ord = " + into + ".ord + [" + into + ".all[" + into + ".best]] -%}",
            "{%- endfor -%}",
            "{%- endif -%}"])


def macros(p: str) -> str:
    """The macros, each named with the prefix ``p`` (see the module's doc).
    They call the template's ``x_py``, ``x_ascii``, ``x_repr`` and
    ``x_pfloat``."""
    w = _Writer(p)
    q = _q(QUOTE)
    rank = "{" + ", ".join(_q(ch) + ": " + str(ord(ch)) for ch in _PRINTABLE + "\t\n\r") + "}"
    ends = "[" + ", ".join(_q(ch) for ch in sorted(KEY_ENDS)) + "]"
    out = [
        # a < b, for printable ASCII, by code point.
        "{%- macro " + p + "lt(a, b) -%}",
        "{%- set r = " + rank + " -%}",
        "{%- set n = namespace(r='', done=false) -%}",
        "{%- for i in range((a | length) if (a | length) < (b | length) else (b | length)) -%}",
        "{%- if not n.done and a[i] != b[i] -%}{%- set n.done = true -%}"
        "{%- set n.r = 'y' if r[a[i]] < r[b[i]] else '' -%}{%- endif -%}",
        "{%- endfor -%}",
        "{%- if not n.done and (a | length) < (b | length) -%}{%- set n.r = 'y' -%}{%- endif -%}",
        "{{ n.r }}",
        "{%- endmacro -%}",
        # Python's truth of a JSON value.
        "{%- macro " + p + "t(v) -%}",
        "{{ '' if v is none or (v is boolean and not v) or (v is number and v == 0) or ((v is string or v is "
        "mapping or (v is iterable and v is not string)) and (v | length) == 0) else 'y' }}",
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
        # str(x).upper().
        "{%- macro " + p + "upper(x, at) -%}",
        "{%- set s = " + p + "str(x, at) ~ '' -%}",
        "{%- if not x_py and x_ascii(s) != 'y' -%}",
        _raise(_q(LIMIT + ": Python's upper() of other than printable ASCII (render with xtml)"), "at"),
        "{%- endif -%}",
        "{{ s | upper }}",
        "{%- endmacro -%}",
        # _text: str(x), refused where it holds the quote.
        "{%- macro " + p + "text(x, at) -%}",
        "{%- set s = " + p + "str(x, at) ~ '' -%}",
        "{%- if " + q + " in s -%}",
        _raise(_q(f"a text holding {QUOTE} cannot be written: the format has no escape for it"), "at"),
        "{%- endif -%}{{ s }}",
        "{%- endmacro -%}",
        "{%- macro " + p + "quoted(s, at) -%}",
        "{%- if " + q + " in s -%}",
        _raise(_q(f"a string holding {QUOTE} cannot be written: the format has no escape for it, so it would end "
                  "the string"), "at"),
        "{%- endif -%}{{ " + q + " ~ s ~ " + q + " }}",
        "{%- endmacro -%}",
        "{%- macro " + p + "key(k, at) -%}",
        "{%- if k is not string -%}" + _raise("'key ' ~ x_repr(k) ~ ' is not a string'", "at") + "{%- endif -%}",
        "{%- set n = namespace(bad=" + q + " in k) -%}",
        "{%- for c in " + ends + " -%}{%- if c in k -%}{%- set n.bad = true -%}{%- endif -%}{%- endfor -%}",
        "{%- if n.bad -%}",
        _raise("'key ' ~ x_repr(k) ~ " + _q(f" cannot be written bare: it holds one of : , {{ }} [ ] or {QUOTE}, "
                                             "which end a key"), "at"),
        "{%- endif -%}{{ k }}",
        "{%- endmacro -%}",
        # _path: .key where the key is an identifier, else ["key"].
        "{%- macro " + p + "path(where, key) -%}",
        "{%- set n = namespace(id=(key | length) > 0) -%}",
        "{%- for i in range(key | length) -%}",
        "{%- if key[i] not in 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_' and (i == 0 or key[i] not in "
        "'0123456789') -%}{%- set n.id = false -%}{%- endif -%}",
        "{%- endfor -%}",
        "{{ where ~ '.' ~ key if n.id else where ~ '[' ~ (key | tojson) ~ ']' }}",
        "{%- endmacro -%}",
        # _argument.
        "{%- macro " + p + "arg(x, at, qk) -%}",
        "{%- if x is string -%}{{ " + p + "quoted(x, at) }}",
        "{%- elif x is boolean -%}{{ 'true' if x else 'false' }}",
        "{%- elif x is mapping -%}",
        w.sorted_keys("x", "s", "at"),
        "{{ '{' }}",
        "{%- for k in s.ord -%}",
        "{%- set g = namespace(v=none) -%}" + w.get("x", "k", "g"),
        "{%- set here = " + p + "path(at, k) ~ '' -%}",
        "{{ ',' if not loop.first else '' }}{{ " + p + "quoted(k, here) if qk else " + p + "key(k, here) }}{{ ':' }}"
        "{{ " + p + "arg(g.v, here, qk) }}",
        "{%- endfor -%}",
        "{{ '}' }}",
        "{%- elif x is none -%}{{ 'None' }}",
        "{%- elif x is number -%}{{ " + p + "str(x, at) }}",
        "{%- elif x is iterable -%}",
        "{{ '[' }}{%- for y in x -%}{{ ',' if not loop.first else '' }}{{ " + p + "arg(y, at ~ '[' ~ loop.index0 ~ "
        "']', qk) }}{%- endfor -%}{{ ']' }}",
        "{%- else -%}" + _raise("x_repr(x) ~ ' is not a JSON value'", "at"),
        "{%- endif -%}",
        "{%- endmacro -%}",
        # _iterate, each item quoted: _quoted_list.
        "{%- macro " + p + "qlist(items, at) -%}",
        "{%- if items is string -%}",
        "{%- if not x_py and x_ascii(items) != 'y' -%}",
        _raise(_q(LIMIT + ": the characters of a string of other than printable ASCII (render with xtml)"), "at"),
        "{%- endif -%}",
        "{%- for i in range(items | length) -%}{{ ',' if i > 0 else '' }}{{ " + q + " ~ " + p + "text(items[i], at) ~ "
        + q + " }}{%- endfor -%}",
        "{%- elif items is mapping or (items is iterable and items is not string) -%}",
        "{%- for y in items -%}{{ ',' if not loop.first else '' }}{{ " + q + " ~ " + p + "text(y, at) ~ " + q + " }}"
        "{%- endfor -%}",
        "{%- else -%}" + _raise("x_repr(items) ~ ' is not a list (the template iterates it)'", "at"),
        "{%- endif -%}",
        "{%- endmacro -%}",
    ]
    out += _parameters(w, q) + _items(w) + _declaration(w, q)
    out += [
        "{%- macro " + p + "declare(tools) -%}",
        "{%- if tools is string or tools is mapping or tools is not iterable -%}",
        _raise("'tools are a list, not ' ~ x_repr(tools)", "'tools'"),
        "{%- endif -%}",
        "{%- for t in tools -%}{{ '<|tool>' ~ " + p + "decl(t, 'tools[' ~ loop.index0 ~ ']') ~ '<tool|>' }}"
        "{%- endfor -%}",
        "{%- endmacro -%}",
        "{%- macro " + p + "write(arguments, at) -%}",
        "{%- if arguments is not mapping -%}",
        _raise("'arguments are an object, not ' ~ x_repr(arguments)", "at"),
        "{%- endif -%}",
        "{{ " + p + "arg(arguments, at, false) }}",
        "{%- endmacro -%}",
    ]
    return "".join(out)


def _parameters(w: _Writer, q: str) -> list[str]:
    """``format_parameters``."""
    p = w.p
    return [
        "{%- macro " + p + "params(props, where) -%}",
        w.sorted_keys("props", "s", "where"),
        "{%- set o = namespace(out=[]) -%}",
        "{%- for key in s.ord -%}{%- if key not in [" + ", ".join(_q(k) for k in _STANDARD) + "] -%}",
        "{%- set g = namespace(v=none) -%}" + w.get("props", "key", "g"),
        "{%- set value = g.v -%}",
        "{%- set at = " + p + "path(where, key) ~ '' -%}",
        "{%- set parts = namespace(v=[]) -%}",
        w.field("value", "description", "fd"),
        "{%- if " + p + "t(fd.v) == 'y' -%}{%- set parts.v = parts.v + ['description:' ~ " + q + " ~ " + p
        + "text(fd.v, at) ~ " + q + "] -%}{%- endif -%}",
        w.field("value", "type", "ft"),
        "{%- set typ = " + p + "upper(ft.v, at) ~ '' -%}",
        "{%- if typ == 'STRING' -%}",
        w.field("value", "enum", "fe"),
        "{%- if " + p + "t(fe.v) == 'y' -%}{%- set parts.v = parts.v + ['enum:' ~ " + p + "arg(fe.v, at ~ '.enum', "
        "true)] -%}{%- endif -%}",
        "{%- elif typ == 'ARRAY' -%}",
        w.field("value", "items", "fi"),
        "{%- if fi.v is mapping and (fi.v | length) > 0 -%}{%- set parts.v = parts.v + ['items:{' ~ " + p
        + "items(fi.v, at ~ '.items') ~ '}'] -%}{%- endif -%}",
        "{%- endif -%}",
        w.field("value", "nullable", "fn"),
        "{%- if " + p + "t(fn.v) == 'y' -%}{%- set parts.v = parts.v + ['nullable:true'] -%}{%- endif -%}",
        "{%- if typ == 'OBJECT' -%}",
        w.field("value", "properties", "fp"),
        "{%- if fp.v is mapping -%}{%- set parts.v = parts.v + ['properties:{' ~ " + p + "params(fp.v, at ~ "
        "'.properties') ~ '}'] -%}",
        "{%- elif value is mapping -%}{%- set parts.v = parts.v + ['properties:{' ~ " + p + "params(value, at) ~ "
        "'}'] -%}{%- endif -%}",
        w.field("value", "required", "fr"),
        "{%- if " + p + "t(fr.v) == 'y' -%}{%- set parts.v = parts.v + ['required:[' ~ " + p + "qlist(fr.v, at ~ "
        "'.required') ~ ']'] -%}{%- endif -%}",
        "{%- endif -%}",
        "{%- set parts.v = parts.v + ['type:' ~ " + q + " ~ " + p + "text(typ, at) ~ " + q + "] -%}",
        "{%- set o.out = o.out + [" + p + "text(key, at) ~ ':{' ~ (parts.v | join(',')) ~ '}'] -%}",
        "{%- endif -%}{%- endfor -%}",
        "{{ o.out | join(',') }}",
        "{%- endmacro -%}",
    ]


def _items(w: _Writer) -> list[str]:
    """An array's ``items``, key by key."""
    p = w.p
    return [
        "{%- macro " + p + "items(items, where) -%}",
        w.sorted_keys("items", "s", "where"),
        "{%- set o = namespace(out=[]) -%}",
        "{%- for k in s.ord -%}",
        "{%- set g = namespace(v=none) -%}" + w.get("items", "k", "g"),
        "{%- if g.v is not none -%}",
        "{%- set at = " + p + "path(where, k) ~ '' -%}",
        "{%- if k == 'properties' -%}{%- set o.out = o.out + ['properties:{' ~ (" + p + "params(g.v, at) if g.v is "
        "mapping else '') ~ '}'] -%}",
        "{%- elif k == 'required' -%}{%- set o.out = o.out + ['required:[' ~ " + p + "qlist(g.v, at) ~ ']'] -%}",
        "{%- elif k == 'type' -%}",
        "{%- if g.v is string -%}{%- set o.out = o.out + ['type:' ~ " + p + "arg(" + p + "upper(g.v, at) ~ '', at, "
        "true)] -%}",
        "{%- else -%}",
        "{%- if g.v is mapping or (g.v is iterable and g.v is not string) -%}",
        "{%- set u = namespace(v=[]) -%}{%- for y in g.v -%}{%- set u.v = u.v + [" + p + "upper(y, at) ~ ''] -%}"
        "{%- endfor -%}",
        "{%- set o.out = o.out + ['type:' ~ " + p + "arg(u.v, at, true)] -%}",
        "{%- else -%}" + _raise("x_repr(g.v) ~ ' is not a list (the template iterates it)'", "at"),
        "{%- endif -%}",
        "{%- endif -%}",
        "{%- else -%}{%- set o.out = o.out + [" + p + "text(k, at) ~ ':' ~ " + p + "arg(g.v, at, true)] -%}",
        "{%- endif -%}",
        "{%- endif -%}",
        "{%- endfor -%}",
        "{{ o.out | join(',') }}",
        "{%- endmacro -%}",
    ]


def _declaration(w: _Writer, q: str) -> list[str]:
    """``format_function_declaration``."""
    p = w.p
    return [
        "{%- macro " + p + "decl(tool, where) -%}",
        "{%- set fn = namespace(v=none) -%}",
        "{%- if tool is mapping and 'function' in tool -%}{%- set fn.v = tool['function'] -%}{%- endif -%}",
        "{%- if fn.v is not mapping -%}",
        _raise(_q('a tool is {"type": "function", "function": {...}}'), "where"),
        "{%- endif -%}",
        "{%- set f = fn.v -%}",
        "{%- set where = where ~ '.function' -%}",
        w.field("f", "name", "fnm"),
        w.field("f", "description", "fds"),
        "{{ 'declaration:' ~ " + p + "text(fnm.v, where ~ '.name') ~ '{description:' ~ " + q + " ~ " + p
        + "text(fds.v, where ~ '.description') ~ " + q + " }}",
        w.field("f", "parameters", "fpa"),
        "{%- set at = where ~ '.parameters' -%}",
        "{%- if " + p + "t(fpa.v) == 'y' -%}",
        "{{ ',parameters:{' }}",
        w.field("fpa.v", "properties", "fpr"),
        "{%- if " + p + "t(fpr.v) == 'y' -%}",
        "{%- if fpr.v is not mapping -%}",
        _raise("'properties must be an object, not ' ~ x_repr(fpr.v)", "at ~ '.properties'"),
        "{%- endif -%}",
        "{{ 'properties:{' ~ " + p + "params(fpr.v, at ~ '.properties') ~ '},' }}",
        "{%- endif -%}",
        w.field("fpa.v", "required", "frq"),
        "{%- if " + p + "t(frq.v) == 'y' -%}{{ 'required:[' ~ " + p + "qlist(frq.v, at ~ '.required') ~ '],' }}"
        "{%- endif -%}",
        w.field("fpa.v", "type", "fty"),
        "{%- if " + p + "t(fty.v) == 'y' -%}{{ 'type:' ~ " + q + " ~ " + p + "text(" + p + "upper(fty.v, at ~ "
        "'.type'), at ~ '.type') ~ " + q + " ~ '}' }}{%- endif -%}",
        "{%- endif -%}",
        "{%- if 'response' in f -%}",
        "{%- set rs = namespace(v=none) -%}" + w.get("f", "'response'", "rs"),
        "{{ ',response:{' }}",
        w.field("rs.v", "description", "frd"),
        "{%- if " + p + "t(frd.v) == 'y' -%}{{ 'description:' ~ " + q + " ~ " + p + "text(frd.v, where ~ "
        "'.response.description') ~ " + q + " ~ ',' }}{%- endif -%}",
        w.field("rs.v", "type", "frt"),
        "{%- if (" + p + "upper(frt.v, where ~ '.response.type') ~ '') == 'OBJECT' -%}{{ 'type:' ~ " + q
        + " ~ 'OBJECT' ~ " + q + " ~ '}' }}{%- endif -%}",
        "{%- endif -%}",
        "{{ '}' }}",
        "{%- endmacro -%}",
    ]
