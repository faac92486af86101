"""Request fields are checked against their JSON type in the one field
table (``xtml/chat/fields.py``), through every door a request comes in by:
the gateway's chat and Responses APIs, and the render options. Depth is
measured once where a request is read, so the code past that point does
not catch ``RecursionError`` itself."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import xtml
from tests.helpers.playground import playground
from tests.helpers.serve import Rig, answer_of
from tests.helpers.tokenizers import deepseek_path
from xtml.chat import fields
from xtml.errors import MAX_DEPTH
from xtml.template import check_fields
from xtml.training.rows import row_request

ROOT = Path(__file__).resolve().parent.parent
K3 = xtml.load("kimi-k3")
HI = [{"role": "user", "content": "Hi"}]

# The wording clients have been told all along, per JSON type.
WORDING = {"boolean": "must be true or false", "string": "must be a string", "number": "must be a finite number",
           "integer": "must be an integer", "object": "must be an object"}


def _bad(kind: fields.Kind) -> list[tuple[Any, str]]:
    """Values of the wrong type (or out of range) and what each is told."""
    if kind.what == "count":
        said = f"must be a whole number from {kind.lo} to {kind.hi}" if kind.hi is not None else \
            f"must be a whole number, {kind.lo} or more"
        out = [(kind.lo - 1, said), ("1", said), (True, said), (1.0, said)]
        return out + ([(kind.hi + 1, said)] if kind.hi is not None else [])
    said = WORDING[kind.what]
    if kind.what == "boolean":
        return [("yes", said), (1, said)]
    if kind.what == "string":
        return [(5, said), (["a"], said)]
    if kind.what == "number":
        return [("1", said), (True, said), (float("nan"), said), (float("inf"), said)]
    if kind.what == "integer":
        return [(1.5, said), ("1", said), (False, said), (2**63, "must fit in 64 bits")]
    return [([], said), ("{}", said)]


def _cases(api: str) -> list[tuple[str, str, Any, str]]:
    """(location, name, bad body, message) for every typed field of ``api``."""
    table = fields.RESPONSES if api == "responses" else [
        (f.name, f.json) for f in fields.FIELDS
        if f.json is not None and (f.effect == fields.PROMPT) == (api == "options")]
    out = []
    for name, kind in table:
        for v, said in _bad(kind):
            out.append((name, name, {name: v}, f"{name} {said}"))
        for member, k in kind.members:
            for v, said in _bad(k):
                out.append((f"{name}.{member}", member, {name: {member: v}}, f"{member} {said}"))
    return out


def test_the_table_gives_a_type_to_each_field_checked_today() -> None:
    typed = {f.name for f in fields.FIELDS if f.json is not None}
    assert {"stream", "stream_options", "temperature", "top_p", "seed", "max_tokens", "max_completion_tokens",
            "n", "ignore_eos", "thinking", "enable_thinking", "add_generation_prompt",
            "continue_final_message"} <= typed
    assert dict(fields.RESPONSES).keys() >= {"stream", "store", "instructions", "previous_response_id", "user",
                                             "max_tool_calls", "parallel_tool_calls"}
    n = fields.BY_NAME["n"].json
    assert n is not None and (n.lo, n.hi) == (1, 16)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_facade_refuses_each_typed_field_by_its_table_entry(api: str) -> None:
    cases = _cases(api)
    assert cases
    for at, _, body, message in cases:
        with pytest.raises(xtml.RequestError) as e:
            check_fields(body, api=api)
        assert message in str(e.value), (body, str(e.value))
        assert e.value.location == at, body
    # Null reads as left out, and good values pass.
    check_fields({name: None for name, *_ in _cases(api)}, api=api)
    check_fields({"stream": True, "stream_options": {"include_usage": False}, "n": 16, "temperature": 0.5,
                  "seed": -(2**63)}, api="chat")
    with pytest.raises(ValueError):
        check_fields({}, api="options")


@pytest.mark.parametrize("level", ["body", "chat_template_kwargs"])
def test_render_options_are_refused_by_the_same_table(level: str) -> None:
    cases = _cases("options")
    assert {name for _, name, _, _ in cases} >= {"thinking", "add_generation_prompt"}
    for at, _, body, message in cases:
        request = {"messages": HI, **(body if level == "body" else {"chat_template_kwargs": body})}
        with pytest.raises(xtml.OptionError) as e:
            K3.render(request)
        assert message in str(e.value) and e.value.option == at, (request, str(e.value))
        with pytest.raises(xtml.OptionError, match=re.escape(message)):
            K3.render({"messages": HI}, **body)
    # Null reads as left out, except add_generation_prompt's, which is false.
    assert K3.render({"messages": HI, "thinking": None}).text == K3.render({"messages": HI}).text
    assert K3.render({"messages": HI, "add_generation_prompt": None}).text == \
        K3.render({"messages": HI, "add_generation_prompt": False}).text


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    r = Rig("vllm")
    r.engine.answer = answer_of({"role": "assistant", "content": "Hello."})
    yield r
    r.close()


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_gateway_answers_each_bad_field_with_a_400_naming_it(rig: Rig, api: str) -> None:
    path = "/v1/chat/completions" if api == "chat" else "/v1/responses"
    base = {"messages": HI} if api == "chat" else {"input": "Hi"}
    seen = 0
    for at, _, body, message in _cases(api):
        r = httpx.post(rig.url + path, content=json.dumps({**base, **body}).encode(),
                       headers={"content-type": "application/json"}, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 400 and err["message"].startswith(message) and err["param"] == at, (body, err)
        seen += 1
    assert seen >= 20 if api == "chat" else seen >= 14


def test_no_edge_checks_a_fields_type_by_hand() -> None:
    """The wording of a type check lives in the table's checker only."""
    edge = ["xtml/serving/checks.py", "xtml/serving/sampling.py", "xtml/serving/responses_request.py",
            "xtml/chat/options.py"]
    for path in edge:
        text = (ROOT / path).read_text(encoding="utf-8")
        assert "must be true or false" not in text and "must be an integer" not in text, path


def test_recursion_errors_are_caught_in_a_handful_of_places() -> None:
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "xtml").rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"except\b.*RecursionError", line)]
    assert len(found) <= 5, found


def test_a_dataset_row_nested_too_deeply_is_refused_as_a_request_is() -> None:
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    row = {"messages": [{"role": "user", "content": deep}]}
    with pytest.raises(xtml.RequestError, match=f"nested too deeply: more than {MAX_DEPTH} levels"):
        row_request(row, plain=False)
    # Within the bound, the value is kept as it is.
    ok: Any = "x"
    for _ in range(MAX_DEPTH - 3):
        ok = [ok]
    assert row_request({"messages": [{"role": "user", "content": ok}]}, plain=False)["messages"][0]["content"] == ok


def test_a_toml_text_nested_past_the_reader_is_a_value_error() -> None:
    from xtml.chat.toml_text import TomlTooDeep, read_toml
    from xtml.testing.validate import _is_layout_text

    text = "a = " + "[" * 5000 + "]" * 5000
    with pytest.raises(TomlTooDeep):
        read_toml(text)
    assert not _is_layout_text(text)
    assert read_toml('[template]\nengine = "layout"\n') == {"template": {"engine": "layout"}}


@pytest.fixture(scope="module")
def page() -> Iterator[str]:
    with playground("--tokenizer", deepseek_path(), "--add-markers") as base:
        yield base


def test_the_playground_measures_a_bodys_depth_where_it_reads_it(page: str) -> None:
    deep: Any = {}
    for _ in range(MAX_DEPTH + 5):
        deep = {"a": deep}
    request = json.dumps({"messages": HI})
    r = httpx.post(page + "/api/render", json={"request": request, "options": {"tools": [deep]}}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["message"].startswith(f"nested too deeply: more than {MAX_DEPTH} levels"), err
    assert err["field"] == "options"
    # The same body with a shallow option renders.
    ok = httpx.post(page + "/api/render", json={"request": request, "options": {"thinking": True}}, timeout=60)
    assert ok.status_code == 200, ok.text
