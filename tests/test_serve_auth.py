"""``xtml serve --api-key``: every path but ``/health`` answers 401 without
``Authorization: Bearer KEY``, before any endpoint runs (the chat and
Responses endpoints are served ahead of Starlette's routing, so the key is
checked in front of the whole app); the real openai SDK with the right key
is served, with a wrong or missing one gets ``openai.AuthenticationError``.
The key comes from ``--api-key`` or the ``XTML_API_KEY`` environment
variable."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.engines import running
from tests.helpers.serve import ANSWERS, K3, REQUEST, Rig
from tests.helpers.tokenizers import deepseek_path
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml.cli import serve as serve_cli
from xtml.cli.main import main as xtml_main
from xtml.errors import OptionError
from xtml.serving.auth import API_KEY_ENV, BearerGuard, api_key_from
from xtml.serving.gateway import create_app

KEY = "sk-xtml-0123456789abcdef"
# Every route of the gateway, as (method, path, body): with a key, each one
# is refused without it.
ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/kimi-k3", None),
    ("POST", "/v1/chat/completions", REQUEST),
    ("POST", "/v1/chat/completions", {**REQUEST, "stream": True}),
    ("POST", "/v1/responses", {"model": "kimi-k3", "input": "Hi"}),
    ("POST", "/v1/responses", {"model": "kimi-k3", "input": "Hi", "stream": True}),
    ("GET", "/v1/responses/resp_1", None),
    ("DELETE", "/v1/responses/resp_1", None),
    ("GET", "/v1/nowhere", None),
    ("GET", "/", None),
]


@pytest.fixture(scope="module")
def guarded() -> Iterator[Rig]:
    r = Rig("vllm", api_key=KEY)
    yield r
    r.close()


def _client(rig: Rig, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.url + "/v1", api_key=key, max_retries=0, timeout=30)


def _send(url: str, method: str, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = json.dumps(body).encode() if body is not None else None
    return httpx.request(method, url + path, content=content, timeout=30,
                         headers={"content-type": "application/json", **(headers or {})})


def test_the_right_key_is_served(guarded: Rig) -> None:
    guarded.engine.reset()
    guarded.engine.answer = ANSWERS["text"]
    with _client(guarded, KEY) as client:
        assert [m.id for m in client.models.list()] == ["kimi-k3"]
        r = client.chat.completions.create(model="kimi-k3", **REQUEST)
        assert r.choices[0].message.content
        assert "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="kimi-k3", stream=True, **REQUEST) if c.choices)
        first = client.responses.create(model="kimi-k3", input="Hi")
        assert client.responses.retrieve(first.id).id == first.id
        with client.responses.stream(model="kimi-k3", input="Hi", previous_response_id=first.id) as s:
            assert s.get_final_response().status == "completed"
        client.responses.delete(first.id)
    assert len(guarded.engine.requests) == 4


@pytest.mark.parametrize("key", ["sk-xtml-0123456789abcdeX", "sk-xtml", KEY + "0", "none"])
def test_a_wrong_key_is_an_authentication_error(guarded: Rig, key: str) -> None:
    guarded.engine.reset()
    guarded.engine.answer = ANSWERS["text"]
    with _client(guarded, key) as client:
        calls: list[Callable[[], object]] = [
                 lambda: client.models.list(),
                 lambda: client.chat.completions.create(model="kimi-k3", **REQUEST),
                 lambda: list(client.chat.completions.create(model="kimi-k3", stream=True, **REQUEST)),
                 lambda: client.responses.create(model="kimi-k3", input="Hi"),
                 lambda: client.responses.retrieve("resp_1"),
                 lambda: client.responses.delete("resp_1")]
        for call in calls:
            with pytest.raises(openai.AuthenticationError) as e:
                call()
            assert e.value.status_code == 401
            assert e.value.code == "invalid_api_key"
    assert not guarded.engine.requests


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize("authorization", [None, "", "Bearer", f"Basic {KEY}", KEY,
                                           f"Bearer {KEY[:-1]}", f"Bearer {KEY} x"])
def test_every_route_but_health_needs_the_key(guarded: Rig, method: str, path: str, body: Any,
                                              authorization: str | None) -> None:
    guarded.engine.reset()
    guarded.engine.answer = ANSWERS["text"]
    headers = {} if authorization is None else {"authorization": authorization}
    r = _send(guarded.url, method, path, body, headers)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"].startswith("Bearer")
    error = r.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert KEY not in r.text
    assert not guarded.engine.requests


@pytest.mark.parametrize("authorization", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY}"])
def test_the_scheme_is_read_as_http_reads_it(guarded: Rig, authorization: str) -> None:
    r = _send(guarded.url, "GET", "/v1/models", None, {"authorization": authorization})
    assert r.status_code == 200, r.text


def test_health_stays_open(guarded: Rig) -> None:
    assert httpx.get(guarded.url + "/health", timeout=30).status_code == 200
    assert httpx.get(guarded.url + "/health", headers={"authorization": "Bearer wrong"}, timeout=30).status_code \
        == 200


@pytest.mark.parametrize("key", ["", "two words", " leading", "tab\tbed", "clé", "line\nbreak"])
def test_a_key_no_client_can_send_is_refused(key: str) -> None:
    with pytest.raises(OptionError) as e:
        create_app(K3, vocab(), "http://127.0.0.1:1", api_key=key)
    assert e.value.option == "api_key"
    with pytest.raises(ValueError):
        BearerGuard(create_app(K3, vocab(), "http://127.0.0.1:1"), key, lambda path: True)


def test_api_key_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert api_key_from(None) is None
    assert api_key_from("given") == "given"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert api_key_from(None) == "from-env"
    assert api_key_from("given") == "given"
    monkeypatch.setenv(API_KEY_ENV, "")
    assert api_key_from(None) is None


# -- the command line ---------------------------------------------------------------------------

def _served(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, Any, str]:
    """Run ``xtml serve`` up to serving: the app it would serve, and its banner."""
    got: dict[str, Any] = {}

    def serve_app(app: Any, host: str, port: int, limits: Any, log_level: str, banner: Any) -> int:
        got["app"] = app
        got["banner"] = banner("http://127.0.0.1:8000/")
        return 0

    monkeypatch.setattr(serve_cli, "serve_app", serve_app)
    status = xtml_main(["serve", "--backend", "http://127.0.0.1:1", "--tokenizer", deepseek_path(),
                        "--add-markers", *args])
    return status, got.get("app"), got.get("banner", "")


@pytest.mark.parametrize(("env", "flag", "key"), [
    ("from-the-environment", None, "from-the-environment"),
    ("from-the-environment", "from-the-flag", "from-the-flag"),
    (None, "from-the-flag", "from-the-flag"),
])
def test_the_command_takes_the_key_from_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch, env: str | None, flag: str | None, key: str) -> None:
    if env is None:
        monkeypatch.delenv(API_KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(API_KEY_ENV, env)
    status, app, banner = _served(monkeypatch, *(["--api-key", flag] if flag is not None else []))
    assert status == 0 and "API key required" in banner
    with running(app) as server:
        assert httpx.get(server.url + "/v1/models", timeout=30).status_code == 401
        wrong = env if key != env else flag
        if wrong is not None:
            assert httpx.get(server.url + "/v1/models", headers={"authorization": f"Bearer {wrong}"},
                             timeout=30).status_code == 401
        assert httpx.get(server.url + "/v1/models", headers={"authorization": f"Bearer {key}"},
                         timeout=30).status_code == 200
        # The engine is down: /health says so, to anyone.
        assert httpx.get(server.url + "/health", timeout=30).status_code == 503


def test_the_command_without_a_key_asks_for_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    status, app, banner = _served(monkeypatch)
    assert status == 0 and "API key" not in banner
    with running(app) as server:
        assert httpx.get(server.url + "/v1/models", timeout=30).status_code == 200


@pytest.mark.parametrize(("env", "flag", "named"), [("has space", None, API_KEY_ENV),
                                                    (None, "has space", "--api-key")])
def test_the_command_refuses_a_key_no_client_can_send(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], env: str | None,
                                                      flag: str | None, named: str) -> None:
    if env is None:
        monkeypatch.delenv(API_KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(API_KEY_ENV, env)
    status, app, _ = _served(monkeypatch, *(["--api-key", flag] if flag is not None else []))
    assert status == 2 and app is None
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
