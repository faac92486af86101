"""What the value-syntax tests share: the official templates the plugins
mirror (llama.cpp's sdist, pinned by sha256), rendering with transformers'
Jinja, schemas of the keywords the Gemma grammar writes, values valid under
them, and random walks of llguidance's matcher over a byte vocabulary."""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import llguidance
from hypothesis import strategies as st

from tests.helpers.families import llama_template
from xtml.vocab.vocabulary import byte_to_char, byte_vocabulary

GEMMA = ("google-gemma-4-31B-it.jinja", "85a08664d16d8f3be4416c92427b3ac10df1024ac566cc0b4bc3bab409393f98")
GPT_OSS = ("openai-gpt-oss-120b.jinja", "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146")
QUOTE = '<|"|>'


def template(which: tuple[str, str]) -> str:
    return llama_template(*which)


@cache
def _tokenizer() -> Any:
    # apply_chat_template needs a tokenizer object; with tokenize=False only
    # the special tokens passed explicitly reach the template.
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))


def hf_render(text: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw: Any) -> str:
    """``messages`` and ``tools`` through the chat template ``text`` as
    transformers renders it; raises what the template raises."""
    out = _tokenizer().apply_chat_template(messages, tools=tools, chat_template=text, tokenize=False,
                                           add_generation_prompt=False, **kw)
    assert isinstance(out, str)
    return out


# -- schemas and values of the keywords the Gemma grammar writes ----------------------------------

KEYS = st.text(alphabet="abAB_k", min_size=1, max_size=3)
TEXT = st.text(st.characters(codec="utf-8"), max_size=12).filter(lambda s: QUOTE not in s)


@st.composite
def _bounds(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    # Bounds leave 0 and 1 between them (llguidance refuses a schema no number
    # satisfies); some are fractions, as a schema may hold.
    s: dict[str, Any] = {}
    for k, lo, hi in (("minimum", -50, 0), ("exclusiveMinimum", -50, -1), ("maximum", 1, 50),
                      ("exclusiveMaximum", 2, 50)):
        if draw(st.integers(0, 3)) == 0:
            n = draw(st.integers(lo, hi))
            s[k] = n + 0.5 if kind == "number" and draw(st.booleans()) and lo <= n + 0.5 <= hi else n
    return s


@st.composite
def schemas(draw: st.DrawFn, depth: int = 0) -> Any:
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "allOf", "nullable", "any"]
    if depth < 2:
        kinds += ["array", "object", "anyOf"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("integer", "number"):
        return {"type": kind, **draw(_bounds(kind))}
    if kind == "string":
        s: dict[str, Any] = {"type": "string"}
        if draw(st.booleans()):
            s["minLength"] = draw(st.integers(0, 3))
        if draw(st.booleans()):
            s["maxLength"] = draw(st.integers(s.get("minLength", 0), 6))
        return s
    if kind == "enum":
        members = st.one_of(st.text(alphabet="pq <", max_size=3), st.integers(-3, 3), st.none(), st.booleans(),
                            st.lists(st.integers(0, 2), max_size=2))
        return {"enum": draw(st.lists(members, min_size=1, max_size=4, unique_by=repr))}
    if kind == "const":
        return {"const": draw(st.one_of(st.text(alphabet="xy", max_size=2), st.integers(-2, 2), st.floats(-2, 2)))}
    if kind == "allOf":
        return {"allOf": [{"type": "string", "minLength": draw(st.integers(0, 3))},
                          {"maxLength": draw(st.integers(3, 6))}]}
    if kind == "nullable":
        return {"type": ["string", "null"], "description": "maybe"}
    if kind == "array":
        s = {"type": "array", "items": draw(schemas(depth + 1))}
        if draw(st.booleans()):
            s["minItems"] = draw(st.integers(0, 2))
        s["maxItems"] = draw(st.integers(s.get("minItems", 0), 3))
        return s
    if kind == "object":
        return draw(objects(depth + 1))
    if kind == "anyOf":
        return {"anyOf": draw(st.lists(schemas(depth + 1), min_size=1, max_size=3))}
    if kind == "any":
        return {}
    return {"type": kind}


@st.composite
def objects(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    # Required keys only where no other key may come: a random walk past
    # its budget would otherwise write other keys forever, almost never
    # spelling the required one.
    props = draw(st.dictionaries(KEYS, schemas(depth), max_size=4))
    extra = draw(st.sampled_from(["closed", "open", "typed"]))
    out: dict[str, Any] = {"type": "object", "properties": props,
                           "required": [k for k in props if extra == "closed" and draw(st.booleans())]}
    if extra == "closed":
        out["additionalProperties"] = False
    elif extra == "typed":
        out["additionalProperties"] = {"type": "integer"}
    return out


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="xyZ _-", min_size=1, max_size=3),
                                                                inner, max_size=3),
    max_leaves=6)


def _number_ok(s: dict[str, Any], x: float) -> bool:
    return all({"minimum": x >= v, "exclusiveMinimum": x > v, "maximum": x <= v, "exclusiveMaximum": x < v}[k]
               for k, v in s.items() if k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"))


@st.composite
def values(draw: st.DrawFn, s: Any) -> Any:
    """A value valid under ``s`` (one of :func:`schemas`)."""
    if s == {}:
        return draw(_JSON)
    if "enum" in s:
        return draw(st.sampled_from(s["enum"]))
    if "const" in s:
        return s["const"]
    if "allOf" in s:
        lo, hi = s["allOf"][0]["minLength"], s["allOf"][1]["maxLength"]
        return draw(TEXT.filter(lambda t: lo <= len(t) <= hi)) if lo else draw(st.text(max_size=hi).filter(
            lambda t: QUOTE not in t))
    if "anyOf" in s:
        return draw(values(draw(st.sampled_from(s["anyOf"]))))
    t = s["type"]
    if isinstance(t, list):
        return draw(st.one_of(st.none(), TEXT))
    if t == "string":
        lo, hi = s.get("minLength", 0), s.get("maxLength", 12)
        return draw(st.text(st.characters(codec="utf-8"), min_size=lo, max_size=hi).filter(lambda x: QUOTE not in x))
    if t == "boolean":
        return draw(st.booleans())
    if t == "null":
        return None
    if t == "integer":
        return draw(st.integers(-60, 60).filter(lambda x: _number_ok(s, x)) | st.integers().filter(
            lambda x: _number_ok(s, x)))
    if t == "number":
        return draw(st.one_of(st.integers(-60, 60), st.floats(-60, 60), st.floats(allow_nan=False,
                                                                                 allow_infinity=False),
                              st.sampled_from([1e-05, -2.5e-07, 1e16, -3.25e300, 0.0001, -0.0, 5e-324]))
                    .filter(lambda x: _number_ok(s, x)))
    if t == "array":
        lo, hi = s.get("minItems", 0), s.get("maxItems", 3)
        return draw(st.lists(values(s["items"]), min_size=lo, max_size=hi))
    out = {}
    for k, sub in s["properties"].items():
        if k in s["required"] or draw(st.booleans()):
            out[k] = draw(values(sub))
    extra = s.get("additionalProperties", True)
    if extra is not False:
        more = draw(st.dictionaries(st.text(alphabet="xyZ _-", min_size=1, max_size=3),
                                    values(extra) if isinstance(extra, dict) else _JSON, max_size=2))
        out.update({k: v for k, v in more.items() if k not in s["properties"]})
    return out


# -- walks ---------------------------------------------------------------------------------------

BUDGET = 60
MAX_STEPS = 2000
_CLOSERS = frozenset(b"}]:")


@cache
def vocab() -> Any:
    return byte_vocabulary(["<eos>"])


@cache
def lltok() -> llguidance.LLTokenizer:
    v = vocab()
    return llguidance.LLTokenizer(v.tokenizer.to_str(), eos_token=v.special_id("<eos>"))


@cache
def _bytes() -> dict[int, bytes]:
    """Each byte token's byte (the special ones: none)."""
    v = vocab()
    char_byte = {c: b for b, c in byte_to_char().items()}
    return {i: bytes([char_byte[t]]) if (t := v.tokenizer.id_to_token(i)) in char_byte else b""
            for i in range(v.tokenizer.get_vocab_size())}


def walk(grammar: str, rng: random.Random) -> str:
    """A text the grammar admits, byte by byte at random; past the budget
    the walk goes on spelling a delimiter it started, else starts one (which
    inside a string closes it, and elsewhere makes a string it then
    closes), else closes a list or an object, so that it ends."""
    m = llguidance.LLMatcher(lltok(), grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    table = _bytes()
    eos = vocab().special_id("<eos>")
    out = bytearray()
    quote = QUOTE.encode()
    for step in range(MAX_STEPS):
        bias = m.compute_logit_bias()
        allowed = [i for i, b in enumerate(bias) if b]
        assert allowed, f"nothing allowed after {bytes(out)!r}: {m.get_error()}"
        if eos in allowed and (step >= BUDGET or rng.random() < 0.2):
            return out.decode()
        choices = [i for i in allowed if i != eos] or allowed
        if step >= BUDGET:
            going = [i for i in choices for k in range(1, len(quote))
                     if out.endswith(quote[:k]) and table[i] == quote[k:k + 1]]
            closing = [i for i in choices if table[i] and table[i][0] in _CLOSERS]
            opening = [i for i in choices if table[i] == b"<"]
            choices = going or opening or closing or choices
        t = rng.choice(choices)
        if t == eos:
            return out.decode()
        assert m.consume_token(t), f"the matcher refused {t} after {bytes(out)!r}: {m.get_error()}"
        out += table[t]
    raise AssertionError(f"a walk did not end within {MAX_STEPS} steps: {bytes(out[-80:])!r}")


def takes(grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(lltok(), grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    ids = vocab().tokenizer.encode(text, add_special_tokens=False).ids
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()
