"""Arguments written as key/value pairs (``[calls] arguments = "pairs"``)
in the Jinja chat template of a layout dialect, as
:func:`~xtml.chat.layout_render.render` writes them: each call's arguments
an object (none or empty: no pairs; anything else is refused as xtml
refuses it), each pair by the dialect's pair pattern, a string value as it
is and any other as ``json.dumps(value, ensure_ascii=False)`` writes the
value read back from the arguments' JSON.

The engines' ``tojson`` filters write strings, integers, booleans and null
as Python's ``json.dumps`` does (the three engines' outputs were compared);
they do not agree on floats: ``@huggingface/jinja`` writes JavaScript's
spelling (``0.00001`` and ``1e-7`` where Python writes ``1e-05`` and
``1e-07``), llama.cpp's engine six significant digits (``1`` for ``1.0``,
``1e+06`` for ``1000000.0``, ``0.123457`` for ``0.1234567891``). So a float
is spelt by :data:`MACROS` from the digits the engine's ``tojson`` gives, in
Python's form (shortest digits, a fixed point from 1e-4 to 1e16, else an
exponent of at least two digits); where those digits read back as another
number (llama.cpp's six), the template raises rather than write a number
xtml does not write.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..chat.layout import LayoutDialect
from .jinja_text import quote as _q


def _raise(message: str) -> str:
    # The reader of messages (layout_jinja_base) imports this module: its
    # helpers are not imported back.
    return "{{ raise_exception(" + message + ") }}"


__all__ = ["MACROS", "pair_arguments", "pair_values", "pairs", "read_arguments"]

# x_jkey: a key as json.dumps writes a key that is not a string. x_pfloat:
# a finite float in Python's repr. x_pjson(v, true): json.dumps(json.loads(json.dumps(v))):
# keys made strings, and of keys that became the same string the first's
# place with the last's value (only a Python caller gives other keys, so the
# pass over the others runs only then); x_pjson(v, false): json.dumps(v),
# every key written.
MACROS = "".join((
    "{%- macro x_jkey(k) -%}",
    "{%- if k is string -%}{{ k }}",
    "{%- elif k is none -%}{{ 'null' }}",
    "{%- elif k is boolean -%}{{ 'true' if k else 'false' }}",
    "{%- else -%}{{ k ~ '' }}",
    "{%- endif -%}",
    "{%- endmacro -%}",
    "{%- macro x_pfloat(v) -%}",
    "{%- set t = v | tojson -%}",
    "{%- if (t | float) != v -%}",
    _raise(_q("this engine's tojson writes the number ") + " ~ t ~ "
           + _q(", which reads back as another: the template cannot write it as xtml does (render with xtml)")),
    "{%- endif -%}",
    "{%- set n = namespace(t=t, neg=false, x=0, ip='', fp='', lz=0, d='', e=0, out='') -%}",
    "{%- if n.t.startswith('-') -%}{%- set n.neg = true -%}{%- set n.t = n.t[1:] -%}{%- endif -%}",
    "{%- if 'e' in n.t -%}{%- set n.x = n.t.split('e')[1] | int -%}{%- set n.t = n.t.split('e')[0] -%}{%- endif -%}",
    "{%- if '.' in n.t -%}{%- set n.ip = n.t.split('.')[0] -%}{%- set n.fp = n.t.split('.')[1] -%}",
    "{%- else -%}{%- set n.ip = n.t -%}{%- endif -%}",
    # The significant digits, and the power of ten of the first.
    "{%- set a = n.ip ~ n.fp -%}",
    "{%- for i in range(a | length) -%}",
    "{%- if n.d == '' and a[i] == '0' -%}{%- set n.lz = n.lz + 1 -%}",
    "{%- else -%}{%- set n.d = n.d ~ a[i] -%}{%- endif -%}",
    "{%- endfor -%}",
    "{%- set m = namespace(k=0) -%}",
    "{%- for i in range(n.d | length) -%}{%- if n.d[i] != '0' -%}{%- set m.k = i + 1 -%}{%- endif -%}{%- endfor -%}",
    "{%- set n.d = n.d[:m.k] -%}",
    "{%- set n.e = (n.ip | length) - n.lz - 1 + n.x -%}",
    "{%- if n.d == '' -%}{%- set n.out = '0.0' -%}",
    "{%- elif n.e >= 0 and n.e <= 15 -%}",
    "{%- set n.out = n.d[:n.e + 1] -%}",
    "{%- for i in range(n.e + 1 - (n.out | length)) -%}{%- set n.out = n.out ~ '0' -%}{%- endfor -%}",
    "{%- set n.out = n.out ~ '.' ~ (n.d[n.e + 1:] if (n.d | length) > n.e + 1 else '0') -%}",
    "{%- elif n.e < 0 and n.e >= -4 -%}",
    "{%- set n.out = '0.' -%}",
    "{%- for i in range(0 - n.e - 1) -%}{%- set n.out = n.out ~ '0' -%}{%- endfor -%}",
    "{%- set n.out = n.out ~ n.d -%}",
    "{%- else -%}",
    "{%- set n.out = n.d[:1] ~ ('.' ~ n.d[1:] if (n.d | length) > 1 else '') ~ 'e' ~ ('-' if n.e < 0 else '+') -%}",
    "{%- set n.x = 0 - n.e if n.e < 0 else n.e -%}",
    "{%- set n.out = n.out ~ ('0' if n.x < 10 else '') ~ n.x -%}",
    "{%- endif -%}",
    "{{ ('-' if n.neg else '') ~ n.out }}",
    "{%- endmacro -%}",
    "{%- macro x_pjson(v, merge) -%}",
    "{%- if v is none -%}{{ 'null' }}",
    "{%- elif v is boolean -%}{{ 'true' if v else 'false' }}",
    "{%- elif v is number and v != v -%}{{ 'NaN' }}",
    "{%- elif v is number and v * 0 != 0 -%}{{ 'Infinity' if v > 0 else '-Infinity' }}",
    "{%- elif v is string or v is integer -%}{{ v | tojson }}",
    "{%- elif v is number -%}{{ x_pfloat(v) }}",
    "{%- elif v is mapping -%}",
    "{%- set w = namespace(plain=true, n=0) -%}",
    "{%- for k in v -%}{%- if k is not string -%}{%- set w.plain = false -%}{%- endif -%}{%- endfor -%}",
    "{{ '{' }}",
    "{%- for k, y in v.items() -%}",
    "{%- set u = namespace(first=true, y=y, at=loop.index0, k=x_jkey(k) ~ '') -%}",
    "{%- if merge and not w.plain -%}{%- for k2, y2 in v.items() -%}{%- if (x_jkey(k2) ~ '') == u.k -%}",
    "{%- if loop.index0 < u.at -%}{%- set u.first = false -%}{%- endif -%}{%- set u.y = y2 -%}",
    "{%- endif -%}{%- endfor -%}{%- endif -%}",
    "{%- if u.first -%}",
    "{{ (', ' if w.n > 0 else '') ~ (u.k | tojson) ~ ': ' }}{{ x_pjson(u.y, merge) }}{%- set w.n = w.n + 1 -%}",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{{ '}' }}",
    "{%- else -%}",
    "{{ '[' }}",
    "{%- for y in v -%}{{ x_pjson(y, merge) }}{%- if not loop.last -%}{{ ', ' }}{%- endif -%}{%- endfor -%}",
    "{{ ']' }}",
    "{%- endif -%}",
    "{%- endmacro -%}",
))
"""The macros a template with pairs calls (see the module's doc)."""


def pair_arguments(d: LayoutDialect) -> str:
    """Each call of message ``x_m`` (index ``x_i``) checked for pairs before
    anything else of the calls, as xtml reads them: arguments that are none
    or empty are no pairs, an object is read, anything else is refused."""
    return "".join([
        "{%- for x_call in x_m.tool_calls -%}",
        "{%- set x_f = (x_call.function if 'function' in x_call else x_call) if x_call is mapping else none -%}",
        "{%- if x_f is mapping and 'arguments' in x_f and not " + _no_pairs("x_f.arguments")
        + " and x_f.arguments is not mapping -%}",
        _raise(_q(f"the {d.name} format writes arguments as key/value pairs: give them as an object, not ")
               + " ~ x_pytype(x_f.arguments) ~ "
               + _q(" (the template raises on it) (at messages[") + " ~ x_i ~ '].tool_calls[' ~ loop.index0 ~ "
               + _q("].function.arguments)")),
        "{%- endif -%}",
        "{%- endfor -%}"])


def _no_pairs(v: str) -> str:
    """Whether arguments ``v`` are false to Python (none, empty, zero,
    false): no pairs."""
    return f"({v} is none or ({v} is boolean and not {v}) or ({v} is number and {v} == 0) or x_given({v}) != 'y')"


def read_arguments() -> str:
    """The arguments a pairs call is read with: an object, ``{}`` for none."""
    return ("{%- set x_a = x_f.arguments if 'arguments' in x_f else none -%}"
            "{%- set x_a = {} if " + _no_pairs("x_a") + " else x_a -%}")


def pairs(pair_code: str) -> str:
    """Call ``x_call``'s arguments (``x_call[1]``, an object) written pair
    by pair; ``pair_code``: the pair pattern written with ``x_pk`` and
    ``x_pv`` as its key and value."""
    return "".join([
        "{%- set x_w2 = namespace(plain=true) -%}",
        "{%- for x_pk in x_call[1] -%}{%- if x_pk is not string -%}{%- set x_w2.plain = false -%}{%- endif -%}"
        "{%- endfor -%}",
        "{%- for x_k0, x_v0 in x_call[1].items() -%}",
        "{%- set x_u = namespace(first=true, v=x_v0, at=loop.index0, k=x_jkey(x_k0) ~ '') -%}",
        "{%- if not x_w2.plain -%}{%- for x_k2, x_v2 in x_call[1].items() -%}{%- if (x_jkey(x_k2) ~ '') == x_u.k -%}",
        "{%- if loop.index0 < x_u.at -%}{%- set x_u.first = false -%}{%- endif -%}{%- set x_u.v = x_v2 -%}",
        "{%- endif -%}{%- endfor -%}{%- endif -%}",
        "{%- if x_u.first -%}",
        "{%- set x_pk = x_u.k -%}",
        "{%- set x_pv = x_u.v if x_u.v is string else x_pjson(x_u.v, true) ~ '' -%}",
        pair_code,
        "{%- endif -%}",
        "{%- endfor -%}"])


def pair_values() -> Mapping[str, str]:
    """The pair pattern's slots."""
    return {"key": "x_pk", "value": "x_pv"}
