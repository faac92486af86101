"""The harness of tests/helpers/jinja_engines.py works: a small hand-written
template (not one of xtml's formats) renders the same in each real engine,
with the request's variables reaching it and add_generation_prompt both
ways, and raise_exception's message comes back as the engine's error.

The engines are set up by tests/run: transformers is in the test extra,
@huggingface/jinja is installed with npm (``XTML_HFJINJA``), llama-server is
built from llama.cpp's source (``XTML_LLAMA_SERVER``); without one its tests
skip, or fail under ``CI=true``."""

from __future__ import annotations

import pytest

from tests.helpers.jinja_engines import ENGINES, Rendered, need_engine, render_all

pytestmark = pytest.mark.engines

TEMPLATE = ("{%- for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}[gen]{% endif %}{{ thinking }}")

REQUESTS = [
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True, "thinking": "T"},
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
     "add_generation_prompt": False, "thinking": "x"},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": "c"}],
     "add_generation_prompt": True, "thinking": 7},
]
EXPECTED = ["[user]hi[gen]T", "[system]S[user]hix", "[user]a[assistant]b[user]c[gen]7"]

# llama.cpp renders the template once at start-up with one user message and
# refuses to start when that raises, so the template raises only when told to.
RAISING = "{% if fail %}{{ raise_exception('boom') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
ALWAYS_RAISING = "{{ raise_exception('boom') }}"


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    need_engine(request.param)
    return str(request.param)


def test_variables_reach_the_template(engine: str) -> None:
    assert render_all(engine, TEMPLATE, REQUESTS) == [Rendered(text, None) for text in EXPECTED]


def test_raise_exception_is_the_engines_error(engine: str) -> None:
    requests = [{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False, "fail": fail}
                for fail in (True, False)]
    raised, fine = render_all(engine, RAISING, requests)
    assert raised.text is None and raised.error is not None and "boom" in raised.error, raised
    assert fine == Rendered("hi", None)


def test_a_template_that_always_raises(engine: str) -> None:
    # llama-server does not start with it: every request of the batch has
    # the start-up refusal, which holds the template's message.
    out = render_all(engine, ALWAYS_RAISING, [{"messages": [{"role": "user", "content": "hi"}]}] * 2)
    assert len(out) == 2
    for r in out:
        assert r.text is None and r.error is not None and "boom" in r.error, r
