"""Random JSON schemas of tools' parameters, for the completion grammar's
sampling tests: numbers with bounds that leave values between them, strings
with lengths, enums, ``allOf``, arrays and nested objects."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = ["objects", "schemas"]

KEYS = st.text(alphabet="abk_", min_size=1, max_size=3)


def _number(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    # Bounds that leave values between them (0 and 1 always): llguidance
    # refuses a schema no number satisfies.
    s: dict[str, Any] = {"type": kind}
    for k, lo, hi in (("minimum", -50, 0), ("exclusiveMinimum", -50, -1), ("maximum", 1, 50),
                      ("exclusiveMaximum", 2, 50)):
        if draw(st.integers(0, 3)) == 0:
            s[k] = draw(st.integers(lo, hi) if kind == "integer" else
                        st.one_of(st.integers(lo, hi), st.floats(lo, hi)))
    return s


@st.composite
def schemas(draw: st.DrawFn, depth: int = 0) -> Any:
    kind = draw(st.sampled_from(["number", "integer", "string", "enum", "allOf", "boolean", "null", "array",
                                 "any", *(["object"] if depth < 2 else [])]))
    if kind in ("number", "integer"):
        return _number(draw, kind)
    if kind == "string":
        s: dict[str, Any] = {"type": "string"}
        if draw(st.booleans()):
            s["minLength"] = draw(st.integers(0, 4))
        if draw(st.booleans()):
            s["maxLength"] = draw(st.integers(s.get("minLength", 0), 8))
        return s
    if kind == "enum":
        return {"enum": draw(st.lists(st.one_of(st.text(alphabet="pq ", max_size=3), st.integers(-3, 3)),
                                      min_size=1, max_size=3, unique=True))}
    if kind == "allOf":
        return {"allOf": [{"type": "string", "minLength": draw(st.integers(0, 3))},
                          {"maxLength": draw(st.integers(3, 6))}]}
    if kind == "array":
        return {"type": "array", "items": draw(schemas(depth + 1)), "maxItems": 3}
    if kind == "any":
        return {}
    if kind == "object":
        return draw(objects(depth + 1))
    return {"type": kind}


@st.composite
def objects(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    # Required keys only where no other key may come (at a call's top): a
    # walk past its budget would otherwise write unlisted keys forever,
    # almost never spelling the required one.
    props = draw(st.dictionaries(KEYS, schemas(depth), max_size=3))
    closed = draw(st.booleans())
    out: dict[str, Any] = {"type": "object", "properties": props,
                           "required": [k for k in props if (closed or depth > 0) and draw(st.booleans())]}
    if closed:
        out["additionalProperties"] = False
    return out
