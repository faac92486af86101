"""The playground's JSON API and page, against the real ``xtml playground``
command on 127.0.0.1, with httpx: what each view computes is what the facade
gives, bad input is a 400 naming the field (never a 500), bodies and heads
are bounded as the gateway's, and the page loads nothing from elsewhere."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

import xtml
from tests.helpers.playground import SHOTS, VIEWS, playground, static_hash
from tests.helpers.tokenizers import deepseek_path, k3_vocab
from xtml.chat.template_file import LAYOUT_BUILTIN
from xtml.serving.gateway import MAX_BODY
from xtml.serving.openai import chat_completion

ROOT = Path(__file__).parent.parent
STATIC = ROOT / "xtml" / "playground" / "static"
EXAMPLE = (ROOT / "examples" / "chat.json").read_text(encoding="utf-8")
COMPLETION = (ROOT / "examples" / "completion.txt").read_text(encoding="utf-8")
K3 = xtml.load("kimi-k3")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with playground("--tokenizer", deepseek_path(), "--add-markers") as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    return client.post(path, json=body)


def tool_call_completion() -> tuple[dict[str, Any], str]:
    """A request that must call its tool, and the text of a completion that
    calls it."""
    request = json.loads((ROOT / "examples" / "request.json").read_text(encoding="utf-8"))
    call = {"role": "assistant", "reasoning_content": "Call it.", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": json.dumps({"city": "Paris", "days": 3})}}]}
    # Without tool_choice, whose option message follows the history, the
    # prompt is a prefix of the history with the answer.
    base = {k: v for k, v in request.items() if k != "tool_choice"}
    prompt = K3.render(base).text
    whole = K3.render({**base, "messages": [*base["messages"], call], "add_generation_prompt": False}).text
    assert whole.startswith(prompt)
    return request, whole[len(prompt):]


# -- what the views compute --------------------------------------------------------------


def test_render_gives_the_ids_of_encode_with_their_sources(client: httpx.Client) -> None:
    r = post(client, "/api/render", {"request": EXAMPLE})
    assert r.status_code == 200, r.text
    data = r.json()
    request = json.loads(EXAMPLE)
    ids = K3.encode(request, k3_vocab())
    assert [t["id"] for t in data["tokens"]] == ids == data["ids"]
    markers = set(K3.bind(k3_vocab()).kind_of_id)
    assert [t["marker"] for t in data["tokens"]] == [i in markers for i in ids]
    # Each token's bytes are its own; together they are the text of the render.
    assert b"".join(bytes.fromhex(t["bytes"]) for t in data["tokens"]).decode() == K3.render(request).text
    assert sum(m["tokens"] for m in data["messages"]) == len(ids)
    sources = [m["source"] for m in data["messages"]]
    assert [s for s in sources if s is not None] == list(range(len(request["messages"])))
    assert data["ambiguous"] == []
    think = [t for t in data["tokens"] if t["path"] == "message/think"]
    assert think and all(not t["marker"] or t["text"] in K3.markers.all() for t in think)


def test_marker_literals_in_user_text_are_flagged(client: httpx.Client) -> None:
    request = {"messages": [{"role": "user", "content": "say <|end_of_msg|> please"}]}
    data = post(client, "/api/render", {"request": json.dumps(request)}).json()
    rendered = K3.render(request)
    assert [(a["offset"], a["marker"]) for a in data["ambiguous"]] == [(a.offset, a.marker) for a in rendered.ambiguous]
    first, last = data["ambiguous"][0]["tokens"]
    literal = "".join(t["text"] for t in data["tokens"][first : last + 1])
    assert "<|end_of_msg|>" in literal and not any(t["marker"] for t in data["tokens"][first : last + 1])


def test_options_override_the_request(client: httpx.Client) -> None:
    request = json.loads(EXAMPLE)
    data = post(client, "/api/render", {"request": EXAMPLE,
                                        "options": {"thinking": False, "tool_choice": "none"}}).json()
    assert data["ids"] == K3.encode(request, k3_vocab(), thinking=False, tool_choice="none")
    assert data["ids"] != K3.encode(request, k3_vocab())


def test_training_mask_and_budget_check_are_lint_datasets(client: httpx.Client) -> None:
    from xtml.training import overruns, with_training_defaults

    request = json.loads(EXAMPLE)
    training = post(client, "/api/render", {"request": EXAMPLE}).json()["training"]
    ex = K3.encode_training(with_training_defaults(request), k3_vocab())
    assert training["ids"] == ex.ids and training["mask"] == list(ex.mask_bytes)
    assert training["trained"] == sum(ex.mask_bytes) > 0
    assert training["effort"] == "high" and training["overruns"] == []
    # Over the low budget: the same check lint-dataset makes.
    long_think = {**request, "thinking_effort": "low"}
    long_think["messages"] = [*request["messages"][:-1],
                              {"role": "assistant", "reasoning_content": "hmm " * 5000, "content": "Yes."}]
    got = post(client, "/api/render", {"request": json.dumps(long_think)}).json()["training"]
    want = overruns(K3.encode_training(with_training_defaults(long_think), k3_vocab()), K3.dialect)
    assert got["overruns"] == [{"message": o.message, "effort": o.effort, "tokens": o.tokens, "budget": o.budget}
                               for o in want]
    assert got["overruns"] and got["overruns"][0]["budget"] == K3.dialect.training.budgets["low"]


def test_parse_of_a_cut_completion_locates_each_diagnostic(client: httpx.Client) -> None:
    cut = COMPLETION[: COMPLETION.index("day 2.<|close|>response")]
    data = post(client, "/api/parse", {"completion": cut}).json()
    ids = K3.completion_ids(cut, k3_vocab())
    parsed = K3.parse(ids, k3_vocab(), completion=True, lenient=True)
    assert [t["id"] for t in data["tokens"]] == ids
    assert data["diagnostics"] == parsed["diagnostics"] and data["diagnostics"]
    assert all(0 <= d["offset"] <= len(ids) for d in data["diagnostics"])
    assert data["message"] == {k: v for k, v in parsed.items() if k != "diagnostics"}
    want = chat_completion(parsed, model="kimi-k3")
    got = data["openai"]
    assert got["object"] == "chat.completion"
    assert got["choices"] == want["choices"]


def test_parse_of_ids_and_of_text_agree(client: httpx.Client) -> None:
    ids = K3.completion_ids(COMPLETION, k3_vocab())
    by_ids = post(client, "/api/parse", {"completion": json.dumps(ids), "from": "ids"}).json()
    by_text = post(client, "/api/parse", {"completion": COMPLETION}).json()
    assert by_ids["message"] == by_text["message"] == {
        "role": "assistant", "content": "Yes: rain is forecast for day 2.",
        "reasoning_content": "Rain is forecast for day 2."}


@pytest.mark.parametrize("delta,random_sizes", [(1, False), (4, False), (7, True)])
def test_stream_replay_adds_up_to_the_parse(client: httpx.Client, delta: int, random_sizes: bool) -> None:
    _, text = tool_call_completion()
    data = post(client, "/api/stream", {"completion": text, "delta": delta, "random": random_sizes,
                                        "seed": 3}).json()
    ids = K3.completion_ids(text, k3_vocab())
    steps = data["steps"]
    assert [i for s in steps for i in s["ids"]] == ids
    sizes = [len(s["ids"]) for s in steps[:-1]]
    assert steps[-1]["closed"] and all(1 <= n <= delta for n in sizes)
    if not random_sizes:
        assert all(n == delta for n in sizes[:-1])
    ends = [e for s in steps for e in s["events"] if e["type"] == "message_end"]
    assert len(ends) == 1
    parsed = K3.parse(ids, k3_vocab(), completion=True, lenient=True)
    assert parsed.pop("diagnostics") == []
    assert ends[0]["message"] == parsed
    calls = [c for s in steps for c in s["chunks"] for ch in c["choices"] for c in ch["delta"].get("tool_calls", [])]
    assert "".join(c["function"].get("arguments", "") for c in calls) == json.dumps({"city": "Paris", "days": 3})
    # Ids held back are those read after the last event, each with its reason.
    for s in steps:
        end = s["start"] + len(s["ids"])
        shown = max([e["offset"] + 1 for t in steps[: steps.index(s) + 1] for e in t["events"]], default=0)
        held = data["tokens"][s["held_from"] : s["held_from"] + s["held"]]
        assert [t["id"] for t in held] == (ids[shown:end] if not s["closed"] else [])
        assert bool(s["why"]) == bool(s["held"])


JSON_REQUEST = {"messages": [{"role": "user", "content": "Weather in Paris? Answer in JSON."}],
                "response_format": {"type": "json_object"}}


def test_grammar_pages_the_tokens_allowed_inside_a_json_string(client: httpx.Client) -> None:
    request, text = JSON_REQUEST, 'Ok.<|close|>think<|sep|><|open|>response<|sep|>{"answer": "Par'
    ids = K3.completion_ids(text, k3_vocab())
    body = {"request": json.dumps(request), "completion": text, "position": len(ids), "limit": 1000}
    first = post(client, "/api/grammar", body).json()
    assert first["available"] and first["consumed"] == len(ids)
    assert first["grammar"] == K3.completion_grammar(request, k3_vocab())
    # Inside a JSON string almost every token may come next.
    assert 100_000 < first["allowed_count"] < k3_vocab().size
    assert len(first["allowed"]) == 1000
    second = post(client, "/api/grammar", {**body, "offset": 1000}).json()
    a, b = [t["id"] for t in first["allowed"]], [t["id"] for t in second["allowed"]]
    assert a == sorted(a) and b == sorted(b) and a[-1] < b[0]
    last = post(client, "/api/grammar", {**body, "offset": first["allowed_count"] - 5}).json()
    assert len(last["allowed"]) == 5
    # At the start the completion opens with its think channel's text: the
    # generation prompt opened it; a response before thinking is refused.
    closed = K3.completion_ids("<|open|>response<|sep|>", k3_vocab())
    refused = post(client, "/api/grammar", {**body, "completion": json.dumps(closed), "from": "ids",
                                            "position": len(closed)}).json()
    assert refused["refused"]["offset"] < len(closed) and refused["allowed"] == []


def test_a_pasted_template_renders_as_the_builtin(client: httpx.Client) -> None:
    from xtml.chat.template_file import builtin_files

    toml = builtin_files()["kimi-k3"].read_text(encoding="utf-8")
    builtin = post(client, "/api/render", {"request": EXAMPLE}).json()
    pasted = post(client, "/api/render", {"request": EXAMPLE, "template": {"toml": toml}}).json()
    assert pasted["ids"] == builtin["ids"]


# -- bad input: a 400 naming the field ------------------------------------------------------


def test_bad_json_in_the_request_is_located_as_the_cli_says(client: httpx.Client, tmp_path: Path) -> None:
    bad = '{\n  "messages": [\n    {"role": "user", "content": "hi"},\n  ]\n}'
    r = post(client, "/api/render", {"request": bad})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["field"], error["line"], error["column"]) == ("request", 4, 3)
    f = tmp_path / "bad.json"
    f.write_text(bad, encoding="utf-8")
    cli = subprocess.run([sys.executable, "-m", "xtml", "render", str(f)], capture_output=True, text=True)
    assert cli.returncode == 1
    # The same words after the name of what was read: the file, or the field.
    assert cli.stderr.strip() == f"xtml: error: {f}: " + error["message"].removeprefix("request: ")


BAD: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("/api/render", {"request": json.dumps({"messages": [{"role": "wizard", "content": "x"}]})}, "request",
     "messages[0].role"),
    ("/api/render", {"request": json.dumps({"messages": [{"role": "user", "content": "x"}]}),
                     "options": {"thinking_effort": "enormous"}}, "request", "thinking_effort"),
    ("/api/render", {"request": ["not", "text"]}, "request", None),
    ("/api/render", {"request": EXAMPLE, "options": [1]}, "options", None),
    ("/api/render", {"request": EXAMPLE, "template": {"name": "no-such"}}, "template", None),
    ("/api/render", {"request": EXAMPLE, "template": "kimi-k3"}, "template", None),
    ("/api/render", {"request": EXAMPLE, "template": {"toml": "[markers\nopen = 1"}}, "template", None),
    ("/api/parse", {"completion": "[1, 2, \"x\"]", "from": "ids"}, "completion", "[2]"),
    ("/api/parse", {"completion": "[1, 99999999]", "from": "ids"}, "completion", "[1]"),
    ("/api/parse", {"completion": "[1, 2", "from": "ids"}, "completion", None),
    ("/api/parse", {"completion": "hi", "from": "bytes"}, "from", None),
    ("/api/parse", {"completion": "hi", "thinking": "yes"}, "thinking", None),
    ("/api/parse", {"completion": 12}, "completion", None),
    ("/api/stream", {"completion": "hi", "delta": 0}, "delta", None),
    ("/api/stream", {"completion": "hi", "delta": "2"}, "delta", None),
    ("/api/grammar", {"request": EXAMPLE, "completion": "hi", "position": 99}, "position", None),
    ("/api/grammar", {"request": EXAMPLE, "completion": "", "limit": 5000}, "limit", None),
    ("/api/grammar", {"request": EXAMPLE, "completion": "", "offset": -1}, "offset", None),
    ("/api/grammar", {"completion": ""}, "request", None),
]


@pytest.mark.parametrize("path,body,field,param", BAD, ids=[f"{p}:{f}:{k}" for k, (p, _, f, _) in enumerate(BAD)])
def test_bad_fields_are_400s_naming_the_field(client: httpx.Client, path: str, body: dict[str, Any], field: str,
                                              param: str | None) -> None:
    r = post(client, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["field"] == field and error["message"]
    # Said in the request's terms, never Python's.
    assert not re.search(r"NoneType|\b(list|dict|str|int|float|bool)\b", error["message"]), error["message"]
    if param is not None:
        assert error["param"] == param


def test_a_bad_template_file_is_located(client: httpx.Client) -> None:
    error = post(client, "/api/render", {"request": EXAMPLE,
                                         "template": {"toml": "name = 'x'\n[markers\nopen = 1\n"}}).json()["error"]
    assert error["field"] == "template" and error["line"] == 2 and "template.toml:2:" in error["param"]


@pytest.mark.parametrize("raw,why", [(b"not json", "not JSON"), (b"[1, 2]", "a JSON object"),
                                     (b"\xff\xfe", "not UTF-8"), (b"[" * 100_000, "nested too deeply")])
def test_bodies_that_are_not_json_objects_are_400s(client: httpx.Client, raw: bytes, why: str) -> None:
    r = client.post("/api/render", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and why in r.json()["error"]["message"]


def test_the_body_and_head_limits_are_the_gateways(client: httpx.Client) -> None:
    big = b'{"request": "' + b"x" * MAX_BODY + b'"}'
    r = client.post("/api/render", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and f"{MAX_BODY:,} bytes" in r.json()["error"]["message"]
    r = client.get("/", headers={"x-long": "y" * (70 << 10)})
    assert r.status_code == 431


# -- the page and where it listens -----------------------------------------------------------


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs += [v for k, v in attrs if k in ("src", "href", "action", "srcset", "poster") and v is not None]


def test_the_page_loads_nothing_from_elsewhere(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp
    refs = _Refs()
    refs.feed(page.text)
    assert refs.refs and all(r.startswith("/static/") or r.startswith("data:") for r in refs.refs), refs.refs
    for name in ("app.js", "app.css"):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200
        # No address of another host, no import from one, no CSS url() at all.
        assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/|@import|url\(", r.text), name
    js = client.get("/static/app.js").text
    assert set(re.findall(r"api\(\"([^\"]+)\"", js)) == {"/api/info", "/api/render", "/api/parse", "/api/stream",
                                                          "/api/grammar"}
    assert client.get("/static/secret.py").status_code == 404
    assert client.get("/static/..%2Fapp.py").status_code == 404


def test_the_page_starts_from_the_examples(client: httpx.Client) -> None:
    info = client.get("/api/info").json()
    assert info["example"] == EXAMPLE and info["completion"] == COMPLETION
    # The XTML dialects, then the layout dialects (one entry per file).
    assert [t["name"] for t in info["templates"]] == ["kimi-k3", "xtml-base", *LAYOUT_BUILTIN]
    assert [t["layout"] for t in info["templates"]] == [False, False, *(True for _ in LAYOUT_BUILTIN)]
    assert "markers added" in info["tokenizer"]


def test_it_listens_on_the_loopback_address_unless_told_otherwise() -> None:
    from xtml.cli.main import _parser

    assert _parser().parse_args(["playground"]).host == "127.0.0.1"
    with playground() as base:  # no --host, no --tokenizer: the one made on the spot
        assert base.startswith("http://127.0.0.1:")
        data = httpx.post(f"{base}/api/render", json={"request": EXAMPLE}, timeout=60).json()
        assert data["consistent"] and len(data["tokens"]) > 100
        assert "made on the spot" in data["tokenizer"]


def test_a_bad_template_file_stops_the_command_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n[markers\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "xtml", "playground", "-t", str(bad), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("xtml: error:") and len(r.stderr.strip().splitlines()) == 1


def test_the_shipped_examples_are_the_repositorys() -> None:
    assert (STATIC / "example.json").read_text(encoding="utf-8") == EXAMPLE
    assert (STATIC / "completion.txt").read_text(encoding="utf-8") == COMPLETION


# -- the screenshots in docs/playground.md -----------------------------------------------------


def test_the_screenshots_show_every_view_of_the_current_page() -> None:
    record = json.loads((SHOTS / "screenshots.json").read_text(encoding="utf-8"))
    assert record["static"] == static_hash(), (
        "the page changed since docs/playground/*.png were made: run "
        ".venv/bin/python -m pytest -p no:cacheprovider -m screenshots tests/test_playground_screenshots.py")
    doc = (ROOT / "docs" / "playground.md").read_text(encoding="utf-8")
    for view in VIEWS:
        png = SHOTS / f"{view}.png"
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n", png
        width, height = struct.unpack(">II", head[16:24])
        assert width >= 1200 and height >= 700, (png, width, height)
        assert f"playground/{view}.png" in doc


HOSTILE: list[Any] = [None, True, 0, -1, 10**30, 1.5, "", "x", "[1,", [], [1, "a"], {}, {"a": [[[[]]]]},
                      {"name": 3}, {"toml": 3}, "<|open|>" * 50, json.dumps(["x"]), "\ud800"]
FIELDS = {
    "/api/render": ("request", "options", "template"),
    "/api/parse": ("completion", "from", "thinking", "template"),
    "/api/stream": ("completion", "from", "delta", "random", "seed", "thinking"),
    "/api/grammar": ("request", "options", "completion", "from", "position", "offset", "limit"),
}
GOOD: dict[str, dict[str, Any]] = {
    "/api/render": {"request": EXAMPLE},
    "/api/parse": {"completion": COMPLETION},
    "/api/stream": {"completion": COMPLETION, "delta": 2},
    "/api/grammar": {"request": EXAMPLE, "completion": COMPLETION, "position": 3, "limit": 10},
}


@pytest.mark.parametrize("path", FIELDS)
def test_no_value_of_any_field_makes_a_500(client: httpx.Client, path: str) -> None:
    for field in FIELDS[path]:
        for value in HOSTILE:
            body = json.dumps({**GOOD[path], field: value}, ensure_ascii=True)
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code in (200, 400), (path, field, value, r.status_code, r.text[:300])
            if r.status_code == 400:
                error = r.json()["error"]
                assert error["message"] and error["field"] in (*FIELDS[path], "template", "request", "completion"), \
                    (field, value, error)


def test_without_llguidance_the_grammar_view_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from xtml.playground.views import Session

    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now raises ImportError
    got = Session(k3_vocab()).grammar({"request": EXAMPLE, "completion": ""})
    assert got["available"] is False and "llguidance" in got["install"]
    assert got["grammar"] == K3.completion_grammar(json.loads(EXAMPLE), k3_vocab())
