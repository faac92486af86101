"""The playground against other web pages and other users, on the real
``xtml playground`` command with httpx: a page of another site can neither
send it a body without a CORS preflight (JSON only) nor reach it through a
name of its own (the Host check, against DNS rebinding); a template sent
through the API may not read local files; and with an API key the API
answers only to those who hold it, while the page still works for them."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.helpers.playground import playground, playground_printing
from xtml.chat.template_file import builtin_files

ROOT = Path(__file__).parent.parent
EXAMPLE = (ROOT / "examples" / "chat.json").read_text(encoding="utf-8")
BASE_TEXT = builtin_files()["xtml-base"].read_text(encoding="utf-8")
READS_FILES = BASE_TEXT.replace("[plugins.image]\n", "[plugins.image]\nread_files = true\n")
KEY = "s3cret-Key_+/=#&%"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with playground("-t", "xtml-base", "--allow-host", "Proxy.Example") as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def port(url: str) -> int:
    got = urlsplit(url).port
    assert got is not None
    return got


# -- JSON only ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x", None])
def test_a_body_a_page_may_send_without_asking_is_refused(client: httpx.Client, kind: str | None) -> None:
    body = json.dumps({"request": EXAMPLE}).encode()
    headers = {"content-type": kind} if kind is not None else {}
    r = client.post("/api/render", content=body, headers=headers)
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["error"]["message"]


def test_json_with_its_charset_is_served(client: httpx.Client) -> None:
    body = json.dumps({"request": EXAMPLE}).encode()
    r = client.post("/api/render", content=body, headers={"content-type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200, r.text


def test_no_cors_preflight_is_granted(client: httpx.Client) -> None:
    r = client.options("/api/render", headers={"origin": "http://evil.example", "access-control-request-method":
                                               "POST", "access-control-request-headers": "content-type"})
    assert not r.is_success and "access-control-allow-origin" not in r.headers
    r = client.post("/api/render", json={"request": EXAMPLE}, headers={"origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers


# -- the Host check -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/static/app.js", "/api/info"])
@pytest.mark.parametrize("host", ["evil.example", "localhost.evil.example", "127.0.0.1.evil.example",
                                  "evil.example:{port}", "proxy.example.evil", ""])
def test_a_page_reaching_it_by_another_name_is_refused(client: httpx.Client, url: str, host: str, path: str) -> None:
    r = client.get(path, headers={"host": host.format(port=port(url))})
    assert r.status_code == 421, (host, r.status_code)
    assert r.json()["error"]["field"] == "host"


def test_a_rebound_name_cannot_post_either(client: httpx.Client, url: str) -> None:
    r = client.post("/api/render", json={"request": EXAMPLE}, headers={"host": f"evil.example:{port(url)}"})
    assert r.status_code == 421


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LocalHost:{port}", "[::1]:{port}",
                                  "127.0.0.1", "localhost", "proxy.example:{port}", "PROXY.EXAMPLE"])
def test_its_own_names_are_served(client: httpx.Client, url: str, host: str) -> None:
    r = client.get("/api/info", headers={"host": host.format(port=port(url))})
    assert r.status_code == 200, (host, r.text)


def test_a_request_without_a_host_is_refused(url: str) -> None:
    with socket.create_connection(("127.0.0.1", port(url)), timeout=30) as s:
        s.sendall(b"GET /api/info HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 421 "), answer[:200]


# -- templates that come through the API ---------------------------------------------------


def test_a_template_that_reads_files_is_refused_where_it_says_so(client: httpx.Client, tmp_path: Path) -> None:
    picture = tmp_path / "secret.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    request = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(picture)}}]}]}
    for path, body in [("/api/render", {"request": json.dumps(request), "template": {"toml": READS_FILES}}),
                       ("/api/parse", {"completion": "hi", "template": {"toml": READS_FILES}})]:
        r = client.post(path, json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        line = READS_FILES.splitlines().index("read_files = true") + 1
        assert (error["field"], error["line"], error["column"]) == ("template", line, 1)
        assert "plugins.image.read_files" in error["param"] and "read local files" in error["message"]
    # The same template without it is served.
    r = client.post("/api/render", json={"request": json.dumps(request), "template": {"toml": BASE_TEXT}})
    assert r.status_code == 200, r.text


def test_the_template_it_was_started_with_may_read_files(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(READS_FILES, encoding="utf-8")
    with playground("-t", str(mine)) as base, httpx.Client(base_url=base, timeout=60) as c:
        opening = c.get("/api/info").json()["template"]
        assert opening == {"toml": READS_FILES}
        r = c.post("/api/render", json={"request": EXAMPLE, "template": opening})
        assert r.status_code == 200, r.text
        # Another text that reads files is still refused.
        other = READS_FILES.replace("[plugins.image]\n", "# mine\n[plugins.image]\n")
        assert c.post("/api/render", json={"request": EXAMPLE, "template": {"toml": other}}).status_code == 400


# -- the API key --------------------------------------------------------------------------


def open_line(lines: list[str]) -> str:
    """The address the command says to open, once it has printed it."""
    for _ in range(200):
        found = [ln.strip() for ln in lines if ln.startswith("xtml playground: open ")]
        if found:
            return found[0].removeprefix("xtml playground: open ")
        time.sleep(0.05)
    raise AssertionError(f"no address to open among {lines}")


@pytest.mark.parametrize("how", ["option", "environment"])
def test_with_an_api_key_the_api_answers_only_to_its_holders(how: str) -> None:
    args, env = (("--api-key", KEY), None) if how == "option" else ((), {"XTML_API_KEY": KEY})
    with playground_printing(*args, env=env) as (base, lines), httpx.Client(base_url=base, timeout=60) as c:
        for path in ("/api/info",):
            assert c.get(path).status_code == 401
            assert c.get(path, headers={"authorization": "Bearer wrong"}).status_code == 401
            assert c.get(path, headers={"authorization": f"Bearer {KEY}"}).status_code == 200
        body = {"request": EXAMPLE}
        assert c.post("/api/render", json=body).status_code == 401
        assert c.post("/api/render", json=body, headers={"authorization": f"Bearer {KEY}x"}).status_code == 401
        r = c.post("/api/render", json=body, headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.json()["consistent"]
        # The page and its files stay open: the page asks for the key.
        assert c.get("/").status_code == 200 and c.get("/static/app.js").status_code == 200
        # The address to open carries the key in its fragment, never sent.
        opened = open_line(lines)
        assert opened == f"{base}/#key={quote(KEY, safe='')}"
        assert KEY not in opened.split("#")[0]
        # The Host check comes first: the key does not open a rebound name.
        r = c.get("/api/info", headers={"authorization": f"Bearer {KEY}", "host": "evil.example"})
        assert r.status_code == 421


def test_a_key_that_no_header_can_carry_stops_the_command() -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "xtml", "playground", "--port", "0", "--api-key", "two words"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--api-key" in r.stderr and len(r.stderr.strip().splitlines()) == 1
