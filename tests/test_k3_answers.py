"""K3's answers as the families' table counts them (tests/helpers/vllm_families.py:
Kimi K2 Thinking's seeded requests rendered by K3, and hostile answers of
K3's own channels and typed arguments): xtml's own lenient parse of their
ids reads every generated answer without a repair, and differs from what a
hostile answer meant only where it says so. The same answers go through
vLLM's parsers in tests/test_vllm_families.py and the benches."""

from __future__ import annotations

import pytest

import xtml
from tests.helpers import vllm_families as vf
from tests.helpers.vllm import parsed_message

K3 = vf.K3


@pytest.fixture(scope="module")
def t_v() -> tuple[xtml.Template, xtml.Vocabulary]:
    return vf.template(K3), vf.vocab(K3)


def test_generated_answers_hold_reasoning_calls_and_text(t_v: tuple[xtml.Template, xtml.Vocabulary]) -> None:
    found = vf.generated(K3)
    assert len(found) == vf.N_GENERATED
    meant = [vf.expected(K3, c) for c in found]
    assert sum(bool(m["tool_calls"]) for m in meant) >= 5
    assert sum(bool(m["content"]) for m in meant) >= 5
    assert sum(bool(m["reasoning"]) for m in meant) >= 1
    t, v = t_v
    for c in found:
        msg = t.parse(c["completion"], v, completion=True, lenient=True, thinking=True)
        assert not msg.get("diagnostics"), c
        assert c["completion"][-1] in vf.stops(K3)


def test_hostile_answers_lose_nothing_unsaid(t_v: tuple[xtml.Template, xtml.Vocabulary]) -> None:
    t, v = t_v
    said = 0
    for what, c, want in vf.hostile(K3):
        got = parsed_message(t, v, c["completion"], True)
        msg = t.parse(c["completion"], v, completion=True, lenient=True, thinking=True)
        if vf.losses(got, want):
            assert msg.get("diagnostics"), what
            said += 1
    # Marker text spelled with ordinary ids is text: those lose nothing.
    assert said < len(vf.hostile(K3))


def test_marker_text_in_an_argument_stays_whole(t_v: tuple[xtml.Template, xtml.Vocabulary]) -> None:
    t, v = t_v
    what, c, want = vf.hostile(K3)[0]
    assert what == "marker text in arguments (ordinary ids)"
    assert parsed_message(t, v, c["completion"], True) == want
    assert want["tool_calls"] == [["get_weather", {"city": "a <|close|>argument<|sep|> b"}]]
