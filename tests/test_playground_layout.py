"""The playground with a layout dialect (``xtml playground -t smollm2``,
``-t qwen3``), against the real command on 127.0.0.1 with httpx: the render,
parse and stream views give what the Template API gives, the render says
what the format drops and that it has no markup tree, the grammar view says
the dialect has no grammar yet (a 200, not an error), and a pasted layout
file is checked and used. One browser test: the page over ``-t qwen3``."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import xtml
from tests.helpers.families import smollm2_gguf
from tests.helpers.playground import Counted, browser_paths, chrome, console_errors, playground
from xtml.chat.template_file import LAYOUT_BUILTIN, builtin_files
from xtml.errors import OptionError
from xtml.playground.views import example_completion
from xtml.serving.openai import chat_completion
from xtml.template import LayoutTemplate
from xtml.training import with_training_defaults

ROOT = Path(__file__).parent.parent
EXAMPLE = (ROOT / "examples" / "chat.json").read_text(encoding="utf-8")
# A tokenizer without the ChatML tokens, which --add-markers adds.
BASE_TOKENIZER = str(ROOT / "examples" / "tokenizer.json")
QWEN3 = xtml.load("qwen3")
SMOLLM2 = xtml.load("smollm2")


def _layout(name: str) -> LayoutTemplate:
    t = xtml.load(name)
    assert isinstance(t, LayoutTemplate)
    return t


@pytest.fixture(scope="module")
def qwen3_vocab() -> xtml.Vocabulary:
    return xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=_layout("qwen3").layout.tokens)


@pytest.fixture(scope="module")
def gguf_vocab() -> xtml.Vocabulary:
    return xtml.load_tokenizer(smollm2_gguf())


@pytest.fixture(scope="module")
def qwen3() -> Iterator[httpx.Client]:
    """``-t qwen3`` over a base tokenizer with the tokens added: every token of
    the format is one id."""
    with playground("-t", "qwen3", "--tokenizer", BASE_TOKENIZER, "--add-markers") as base, \
            httpx.Client(base_url=base, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def smollm2() -> Iterator[httpx.Client]:
    """``-t smollm2`` over the model's own vocabulary, from its GGUF."""
    with playground("-t", "smollm2", "--tokenizer", smollm2_gguf()) as base, \
            httpx.Client(base_url=base, timeout=60) as c:
        yield c


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


# -- the command starts, with the opening template's own example --------------------------


def test_the_command_opens_with_the_layout_dialect_and_its_example(smollm2: httpx.Client) -> None:
    info = ok(smollm2.get("/api/info"))
    assert info["template"] == {"name": "smollm2"}
    # A completion in the format's own spelling, not K3's: it parses with no repair.
    assert info["completion"] == example_completion(SMOLLM2) == "Yes: rain is forecast for day 2.<|im_end|>"
    listed = {t["name"]: t for t in info["templates"]}
    assert set(LAYOUT_BUILTIN) <= set(listed)
    for name in LAYOUT_BUILTIN:
        assert listed[name]["layout"] is True
        assert listed[name]["options"] == dict(_layout(name).layout.options)
        assert listed[name]["path"] == str(builtin_files(layout=True)[name])
    assert listed["qwen3"]["options"] == {"enable_thinking": True}
    assert listed["kimi-k3"]["layout"] is False and listed["kimi-k3"]["options"] == {}


# -- render ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_render_gives_the_ids_of_encode_grouped_by_turn(name: str, qwen3: httpx.Client, smollm2: httpx.Client,
                                                         qwen3_vocab: xtml.Vocabulary,
                                                         gguf_vocab: xtml.Vocabulary) -> None:
    client, vocab = (qwen3, qwen3_vocab) if name == "qwen3" else (smollm2, gguf_vocab)
    t = _layout(name)
    request = json.loads(EXAMPLE)
    data = ok(client.post("/api/render", json={"request": EXAMPLE, "template": {"name": name}}))
    ids = t.encode(request, vocab)
    assert [x["id"] for x in data["tokens"]] == ids == data["ids"]
    assert data["consistent"] is True and data["layout"] is True
    rendered = t.render(request)
    assert data["text"] == rendered.text
    # Each token's bytes are its own; together they are the text of the render.
    assert b"".join(bytes.fromhex(x["bytes"]) for x in data["tokens"]).decode() == rendered.text
    # The format's tokens are the ids bound to them; the rest is text.
    bound = t.bind(vocab)
    assert [x["marker"] for x in data["tokens"]] == [i in bound.char_of_id for i in ids]
    assert all(x["path"] is None for x in data["tokens"]) and "no markup tree" in data["tree"]
    # Turns: each starts at <|im_start|>, and names its role; the request's
    # messages are matched to the turns that write them.
    start = bound.token_ids["<|im_start|>"]
    heads = [k for k, i in enumerate(ids) if i == start]
    assert [data["tokens"][k]["message"] for k in heads] == list(range(len(heads)))
    assert sum(m["tokens"] for m in data["messages"]) == len(ids)
    roles = [m["role"] for m in data["messages"]]
    messages = request["messages"]
    # qwen3 writes tool results in a user turn: one turn for the run of them.
    want_roles = [m["role"] if not (name == "qwen3" and m["role"] == "tool") else "user" for m in messages]
    assert roles == [*want_roles, "assistant"]  # the generation prompt last
    assert [m["source"] for m in data["messages"]] == [*range(len(messages)), None]
    # What the format leaves out is said, not silent.
    assert data["dropped"] == [{"message": d.message, "field": d.field, "why": d.why} for d in rendered.dropped]
    assert data["dropped"]
    # The training view is the facade's training example, or its error.
    try:
        ex = t.encode_training(with_training_defaults(request), vocab)
    except xtml.XtmlError as e:
        assert data["training"] == {"error": str(e)}
    else:
        assert data["training"]["ids"] == ex.ids and data["training"]["mask"] == list(ex.mask_bytes)
        assert data["training"]["same_ids"] and data["training"]["overruns"] == []


def test_the_template_written_turns_have_no_source(smollm2: httpx.Client, gguf_vocab: xtml.Vocabulary) -> None:
    request = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                            {"role": "user", "content": "Bye"}]}
    data = ok(smollm2.post("/api/render", json={"request": json.dumps(request)}))
    assert data["ids"] == SMOLLM2.encode(request, gguf_vocab)
    # The default system prompt, the three messages, the generation prompt.
    assert [(m["role"], m["source"]) for m in data["messages"]] == [
        ("system", None), ("user", 0), ("assistant", 1), ("user", 2), ("assistant", None)]
    assert data["dropped"] == []
    # Tools declared without a system message: qwen3's own system turn.
    tool = {"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}
    data = ok(smollm2.post("/api/render", json={"request": json.dumps({**request, "tools": [tool]}),
                                                "template": {"name": "qwen3"}}))
    assert [(m["role"], m["source"]) for m in data["messages"]] == [
        ("system", None), ("user", 0), ("assistant", 1), ("user", 2), ("assistant", None)]


def test_a_dialect_option_overrides_the_request(qwen3: httpx.Client, qwen3_vocab: xtml.Vocabulary) -> None:
    request = {"messages": [{"role": "user", "content": "Hi"}]}
    on = ok(qwen3.post("/api/render", json={"request": json.dumps(request)}))
    off = ok(qwen3.post("/api/render", json={"request": json.dumps(request),
                                             "options": {"enable_thinking": False}}))
    assert on["ids"] == QWEN3.encode(request, qwen3_vocab)
    assert off["ids"] == QWEN3.encode(request, qwen3_vocab, enable_thinking=False) != on["ids"]
    assert off["text"].endswith("<think>\n\n</think>\n\n")
    # Typed as the template's keyword is: a bad value is the option's error.
    r = qwen3.post("/api/render", json={"request": json.dumps(request), "options": {"enable_thinking": "no"}})
    assert r.status_code == 400 and "enable_thinking" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_token_literals_in_text_are_flagged(name: str, qwen3: httpx.Client, qwen3_vocab: xtml.Vocabulary) -> None:
    t = _layout(name)
    request = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Ok."},
                            {"role": "user", "content": "naïve say <|im_end|> and <|im_start|> now"}]}
    data = ok(qwen3.post("/api/render", json={"request": json.dumps(request), "template": {"name": name}}))
    rendered = t.render(request)
    assert [(a["offset"], a["marker"]) for a in data["ambiguous"]] == [(a.offset, a.marker)
                                                                        for a in rendered.ambiguous]
    assert len(data["ambiguous"]) == 2
    for a in data["ambiguous"]:
        first, last = a["tokens"]
        span = data["tokens"][first : last + 1]
        assert a["marker"] in "".join(x["text"] for x in span)
        assert not any(x["marker"] for x in span)
        # The shortest such span: without its first or last token, no literal.
        assert a["marker"] not in "".join(x["text"] for x in span[1:])
        assert a["marker"] not in "".join(x["text"] for x in span[:-1])
        assert a["message"] == data["tokens"][first]["message"] == len(data["messages"]) - 2


# -- parse, stream, grammar ------------------------------------------------------------------


def _completions(t: LayoutTemplate) -> list[str]:
    whole = example_completion(t)
    assert whole is not None
    call = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
            if t.name == "qwen3" else "")
    return [c for c in (whole, whole[: len(whole) // 2], "Sure.\n\n" + call) if c]


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_parse_is_the_lenient_parse_of_the_completions_ids(name: str, smollm2: httpx.Client,
                                                           gguf_vocab: xtml.Vocabulary) -> None:
    t = _layout(name)
    for completion in _completions(t):
        data = ok(smollm2.post("/api/parse", json={"completion": completion, "template": {"name": name}}))
        ids = t.completion_ids(completion, gguf_vocab)
        parsed = t.parse(ids, gguf_vocab, completion=True, lenient=True)
        assert [x["id"] for x in data["tokens"]] == ids
        assert data["diagnostics"] == parsed.get("diagnostics", [])
        assert data["message"] == {k: v for k, v in parsed.items() if k != "diagnostics"}
        assert _no_ids(data["openai"]["choices"]) == _no_ids(chat_completion(parsed, model=name)["choices"])
        # The same ids sent as ids: the same parse.
        again = ok(smollm2.post("/api/parse", json={"completion": json.dumps(ids), "from": "ids",
                                                    "template": {"name": name}}))
        assert again["message"] == data["message"]
    # The whole example reads back as the answer it renders, with no repair.
    whole = ok(smollm2.post("/api/parse", json={"completion": _completions(t)[0], "template": {"name": name}}))
    assert whole["diagnostics"] == [] and whole["message"]["content"] == "Yes: rain is forecast for day 2."
    cut = ok(smollm2.post("/api/parse", json={"completion": _completions(t)[1], "template": {"name": name}}))
    assert [d["kind"] for d in cut["diagnostics"]] == ["truncated"]


def _no_ids(choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Choices with their calls' ids (random) left out."""
    out: list[dict[str, Any]] = json.loads(json.dumps(choices))
    for c in out:
        for call in c["message"].get("tool_calls") or ():
            assert call.pop("id").startswith("call_")
    return out


def _joined(steps: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in steps:
        for e in s["events"]:
            if e["type"] == "text":
                out[e["channel"]] = out.get(e["channel"], "") + e["text"]
    return out


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_the_stream_replays_to_the_batch_parse_in_any_grouping(name: str, qwen3: httpx.Client,
                                                               qwen3_vocab: xtml.Vocabulary) -> None:
    t = _layout(name)
    rng = random.Random(7)
    for completion in _completions(t):
        ids = t.completion_ids(completion, qwen3_vocab)
        parsed = t.parse(ids, qwen3_vocab, completion=True, lenient=True)
        diagnostics = parsed.pop("diagnostics", [])
        for delta, rand in ((1, False), (3, False), (5, True)):
            body = {"completion": completion, "template": {"name": name}, "delta": delta, "random": rand,
                    "seed": rng.randrange(1000)}
            data = ok(qwen3.post("/api/stream", json=body))
            steps = data["steps"]
            assert [x["id"] for x in data["tokens"]] == ids
            assert [i for s in steps for i in s["ids"]] == ids and steps[-1]["closed"]
            ends = [e for s in steps for e in s["events"] if e["type"] == "message_end"]
            assert len(ends) == 1 and ends[0]["message"] == parsed
            joined = _joined(steps)
            assert joined.get("response", "") == parsed.get("content", "")
            assert joined.get("think", "") == parsed.get("reasoning_content", "")
            assert [e["diagnostic"] for s in steps for e in s["events"] if e["type"] == "diagnostic"] == diagnostics
            # What a client assembles from the chunks is the message too.
            assert data["message"]["content"] == (parsed.get("content") or None) or \
                data["message"]["content"] == parsed.get("content")
            for s in steps:
                assert 0 <= s["held"] <= s["start"] + len(s["ids"])
                assert bool(s["why"]) == bool(s["held"])


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_the_grammar_view_is_the_dialects_grammar_or_says_why_not(name: str, qwen3: httpx.Client,
                                                                  qwen3_vocab: xtml.Vocabulary) -> None:
    t = _layout(name)
    completion = example_completion(t)
    assert completion is not None
    body = {"request": EXAMPLE, "completion": completion, "template": {"name": name}}
    data = ok(qwen3.post("/api/grammar", json=body))
    try:
        grammar = t.completion_grammar(json.loads(EXAMPLE), qwen3_vocab)
    except OptionError as e:
        # Not an error of the request: the view says the dialect has none.
        assert data == {"grammar": "", "available": False, "missing": str(e)}
        return
    assert data["grammar"] == grammar and data["available"] is True
    ids = t.completion_ids(completion, qwen3_vocab)
    assert [x["id"] for x in data["tokens"]] == ids
    # The example answer is one the grammar takes whole, and may end there.
    assert data["consumed"] == data["position"] == len(ids) and data["accepting"] is True


def test_a_bad_request_is_the_grammar_views_request_error(qwen3: httpx.Client) -> None:
    body = {"request": EXAMPLE, "completion": example_completion(QWEN3), "position": 0}
    # The request's own errors are still the request's.
    bad = {**body, "request": json.dumps({"messages": [{"role": "wizard", "content": "x"}]})}
    r = qwen3.post("/api/grammar", json=bad)
    assert r.status_code == 400 and r.json()["error"]["field"] == "request"
    assert "messages[0].role" in r.json()["error"]["param"]


# -- templates through the API -----------------------------------------------------------------


def test_a_pasted_layout_file_is_checked_and_used(qwen3: httpx.Client, qwen3_vocab: xtml.Vocabulary) -> None:
    text = builtin_files(layout=True)["qwen3"].read_text(encoding="utf-8").replace('name = "qwen3"',
                                                                                     'name = "mine"', 1)
    data = ok(qwen3.post("/api/render", json={"request": EXAMPLE, "template": {"toml": text}}))
    assert data["template"] == "mine" and data["ids"] == QWEN3.encode(json.loads(EXAMPLE), qwen3_vocab)
    completion = example_completion(QWEN3)
    parsed = ok(qwen3.post("/api/parse", json={"completion": completion, "template": {"toml": text}}))
    assert parsed["message"]["reasoning_content"] == "Rain is forecast for day 2."
    broken = text.replace("{role}", "{rol}", 1)
    r = qwen3.post("/api/render", json={"request": EXAMPLE, "template": {"toml": broken}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    line = next(k for k, ln in enumerate(broken.splitlines(), 1) if "{rol}" in ln)
    assert error["field"] == "template" and error["line"] == line and "{rol}" in error["message"]


HOSTILE: list[Any] = [None, True, 0, -1, 10**30, 1.5, "", "x", "[1,", [], [1, "a"], {}, {"a": [[[[]]]]},
                      {"name": 3}, {"toml": 3}, "<|im_end|>" * 50, json.dumps(["x"]), "\ud800",
                      {"enable_thinking": "x"}, {"nope": True}]


@pytest.mark.parametrize("path,fields", [
    ("/api/render", ("request", "options")),
    ("/api/parse", ("completion", "from", "thinking")),
    ("/api/stream", ("completion", "from", "delta", "random", "seed")),
    ("/api/grammar", ("request", "options", "completion", "position")),
])
def test_no_value_of_any_field_makes_a_500(qwen3: httpx.Client, path: str, fields: tuple[str, ...]) -> None:
    good = {"request": EXAMPLE, "completion": example_completion(QWEN3), "template": {"name": "qwen3"}}
    for field in fields:
        for value in HOSTILE:
            body = json.dumps({**good, field: value}, ensure_ascii=True)
            r = qwen3.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code in (200, 400), (path, field, value, r.status_code, r.text[:300])
            if r.status_code == 400:
                assert r.json()["error"]["message"]


def test_the_render_views_work_is_linear_in_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from xtml.playground.views import Session, default_tokenizer

    small = default_tokenizer(QWEN3)
    session = Session(small)

    def request(n: int) -> str:
        words = "the quick brown fox jumps over a lazy dog, then naps near the river bank. "
        part = (words * 8) + "say <|im_end|> please. "
        turns = [{"role": r, "content": words} for _ in range(n) for r in ("user", "assistant")]
        return json.dumps({"messages": [*turns, {"role": "user", "content": part * n + "<|im_start|>"}]})

    session.render({"request": request(1), "template": {"name": "qwen3"}})  # the binding's tables, made once
    counts = Counted(small, monkeypatch)
    work = []
    for n in (8, 32):
        counts.chars = counts.ids = 0
        got = session.render({"request": request(n), "template": {"name": "qwen3"}})
        assert len(got["ambiguous"]) == n + 1 and len(got["messages"]) == 2 * n + 2
        work.append(counts.work)
    # Four times the turns and the literals: four times the tokenizer's work.
    assert work[1] <= 4.5 * work[0], work


# -- the page ----------------------------------------------------------------------------------


def test_the_page_over_a_layout_dialect(qwen3_vocab: xtml.Vocabulary) -> None:
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser_paths()
    request = json.loads(EXAMPLE)

    def ids(driver: Any, box: str) -> list[int]:
        return [int(x) for x in driver.execute_script(
            f"return [...document.querySelectorAll('#{box} .tok')].map(e => e.dataset.id)")]

    with playground("-t", "qwen3", "--tokenizer", BASE_TOKENIZER, "--add-markers") as base:
        driver = chrome()
        try:
            def until(cond: Any) -> Any:
                return WebDriverWait(driver, 30, poll_frequency=0.05).until(lambda _: cond())

            el = driver.find_element
            driver.get(f"{base}/")
            until(lambda: driver.execute_script("return document.body.dataset.ready === 'true'"))
            until(lambda: ids(driver, "render-tokens") == QWEN3.encode(request, qwen3_vocab))
            assert "no markup tree" in el("id", "render-summary").text
            assert el("id", "dropped").is_displayed() and "Not written" in el("id", "dropped").text
            heads = driver.execute_script("return [...document.querySelectorAll('#render-tokens .msg-head')]"
                                          ".map(e => e.textContent)")
            assert heads[0].startswith("message 0: system") and "the generation prompt" in heads[-1]
            # The dialect's own option, a control of its own.
            Select(el("id", "opt-own-enable_thinking")).select_by_value("false")
            until(lambda: ids(driver, "render-tokens") == QWEN3.encode(request, qwen3_vocab,
                                                                       enable_thinking=False))
            # The opening completion is the format's: it parses, reasoning apart.
            el("id", "tab-parse").click()
            until(lambda: "Yes: rain is forecast" in el("id", "parsed-message").text)
            assert "Rain is forecast for day 2." in el("id", "parsed-message").text
            assert "well formed" in el("id", "diagnostics").text
            el("id", "tab-stream").click()
            until(lambda: "step 1 of" in el("id", "step-label").text)
            el("id", "step-end").click()
            assert "close()" in el("id", "step-label").text
            # The stop token, the step before close(), ends the message.
            el("id", "step-back").click()
            assert "message_end" in el("id", "events").text and '"finish_reason": "stop"' in el("id", "chunks").text
            el("id", "tab-grammar").click()
            until(lambda: el("id", "grammar-missing").is_displayed() or "id(s)" in el("id", "grammar-summary").text
                  or "refuses" in el("id", "grammar-summary").text)
            el("id", "tab-training").click()
            try:
                ex = QWEN3.encode_training(with_training_defaults(request), qwen3_vocab, enable_thinking=False)
            except xtml.XtmlError as e:
                assert el("id", "training-summary").text == f"No training example: {e}"
            else:
                assert el("id", "training-summary").text.startswith(f"{sum(ex.mask_bytes)} of {len(ex.ids)} ids")
                shaded = driver.execute_script("return [...document.querySelectorAll('#training-tokens .tok')]"
                                               ".map(e => e.classList.contains('trained') ? 1 : 0)")
                assert shaded == list(ex.mask_bytes)
            # Another template picked: its own options only (smollm2 has none).
            Select(el("id", "template-pick")).select_by_value("smollm2")
            until(lambda: ids(driver, "render-tokens") == SMOLLM2.encode(request, qwen3_vocab))
            assert not el("id", "dialect-options").is_displayed()
            assert console_errors(driver) == []
        finally:
            driver.quit()
