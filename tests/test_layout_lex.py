"""The lexing of ids for a layout dialect (``TokenBinding.lex``, what every
parse on ids reads): each token id is its character, each run of other ids
its bytes decoded whole; a bad id is refused at its offset. Its Python work
goes over the tokens, not over every id."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import xtml
from xtml.errors import ParseError
from xtml.vocab.tokens import TokenBinding

ROOT = Path(__file__).parent.parent
BASE_TOKENIZER = str(ROOT / "examples" / "tokenizer.json")
QWEN3 = xtml.load("qwen3")


@pytest.fixture(scope="module", params=["all", "special"])
def binding(request: pytest.FixtureRequest) -> TokenBinding:
    """qwen3 over a base tokenizer: every token added (each one id), or only
    the special ones (the others spelled as text)."""
    layout = QWEN3.layout  # type: ignore[attr-defined]
    tokens = layout.tokens if request.param == "all" else layout.special
    b = QWEN3.bind(xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=tokens))
    assert isinstance(b, TokenBinding)
    return b


def reference(b: TokenBinding, ids: Sequence[Any]) -> tuple[str, list[int], list[int]]:
    """The lexing as its docstring says it, id by id."""
    size = b.vocab.size
    table = b.vocab.byte_table()
    pieces: list[tuple[str, int]] = []
    run: list[int] = []
    run_at = 0
    finder = "|".join(b.text_tokens)

    def flush() -> None:
        if run:
            text = b"".join(table[i] for i in run).decode("utf-8", "replace")
            for t in sorted(b.text_tokens, key=len, reverse=True) if finder else ():
                text = text.replace(t, chr(0xD800 + b.tokens.index(t)))
            pieces.append((text, run_at))
            run.clear()

    for k, t in enumerate(ids):
        if type(t) is not int or not 0 <= t < size:
            raise ParseError(f"{t!r} is not a token id", offset=k)
        if t in b.char_of_id:
            flush()
            pieces.append((b.char_of_id[t], k))
        else:
            if not run:
                run_at = k
            run.append(t)
    flush()
    starts, pos = [], 0
    for text, _ in pieces:
        starts.append(pos)
        pos += len(text)
    return "".join(p for p, _ in pieces), starts, [k for _, k in pieces]


def test_lex_is_the_reference_on_any_ids(binding: TokenBinding) -> None:
    rng = random.Random(11)
    tokens = list(binding.char_of_id)
    table = binding.vocab.byte_table()
    # Ids of lone bytes that start or continue a multi-byte character: runs
    # cut inside characters, and bytes that spell a surrogate's encoding.
    odd = [i for i, raw in enumerate(table) if len(raw) == 1 and raw[0] >= 0x80]
    assert odd
    for trial in range(600):
        n = rng.choice([0, 1, 2, 7, 60, 400])
        pool = odd if trial % 2 else range(binding.vocab.size)
        ids: list[Any] = [rng.choice(tokens) if rng.random() < 0.2 else rng.choice(pool) for _ in range(n)]
        bad = trial % 25 == 0 and n > 0
        if bad:
            at = rng.randrange(n)
            ids[at] = rng.choice([-1, binding.vocab.size, True, False, "7", 1.0, None])
            with pytest.raises(ParseError) as e:
                binding.lex(ids)
            assert e.value.offset == at
            continue
        assert binding.lex(tuple(ids) if trial % 3 else ids) == reference(binding, ids), ids


def _lines(f: Any, *args: Any) -> int:
    """Python lines run inside ``TokenBinding`` methods during ``f(*args)``."""
    count = 0
    code = {TokenBinding.lex.__code__, TokenBinding.decode_runs.__code__}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if frame.f_code not in code:
            return None

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal count
            if event == "line":
                count += 1
            return local

        return local

    sys.settrace(tracer)
    try:
        f(*args)
    finally:
        sys.settrace(None)
    return count


def test_the_python_work_of_lex_goes_over_the_tokens_not_the_ids(binding: TokenBinding) -> None:
    text = binding.vocab.encode_texts(["the quick brown fox jumps over the lazy dog. "])[0]
    start, end = binding.token_ids["<|im_start|>"], binding.token_ids["<|im_end|>"]
    lines = []
    for reps in (50, 200):
        ids = [start, *text * reps, end] * 10
        lines.append(_lines(binding.lex, ids))
    # Four times the text between the same tokens: the same Python work (a
    # loop over every id made it four times).
    assert lines[1] == lines[0], lines


def test_the_one_join_is_the_lex_where_it_is_taken(binding: TokenBinding) -> None:
    """``lex_whole``, the lex of most prompts in one join: the reference's
    string wherever it gives one, nothing for a bad id, and the same map
    from a character to its token offset, made when asked."""
    from xtml.codec.layout import lex_ids

    rng = random.Random(12)
    tokens = list(binding.char_of_id)
    table = binding.vocab.byte_table()
    odd = [i for i, raw in enumerate(table) if len(raw) == 1 and raw[0] >= 0x80]
    whole = binding.vocab.encode_texts(["Hello, world: the quick brown fox.\n\n  x = 1"])[0]
    taken = 0
    for trial in range(600):
        n = rng.choice([0, 1, 2, 7, 60, 400])
        pool = odd if trial % 4 == 0 else whole if trial % 2 else range(binding.vocab.size)
        ids: list[Any] = [rng.choice(tokens) if rng.random() < 0.2 else rng.choice(pool) for _ in range(n)]
        if trial % 25 == 0 and n > 0:
            ids[rng.randrange(n)] = rng.choice([-1, -binding.vocab.size - 1, binding.vocab.size,
                                               2 * binding.vocab.size, True, "7", 1.0, None])
            assert binding.lex_whole(ids) is None
            continue
        s = binding.lex_whole(ids)
        if s is None:
            continue
        taken += 1
        text, starts, offsets = reference(binding, ids)
        assert s == text
        lx = lex_ids(binding, ids)
        assert lx.text == text
        want = xtml.vocab.tokens.locate(starts, offsets, len(ids), text)
        assert [lx.offset(at) for at in range(len(text) + 1)] == [want(at) for at in range(len(text) + 1)]
    if not binding.text_tokens:
        assert taken > 100
    else:
        assert taken == 0  # a token spelled as text: the lex finds it in the runs
