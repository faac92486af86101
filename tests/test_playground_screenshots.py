"""Remakes the screenshots of docs/playground.md, one per view, with the
browser tests' headless Chromium 1400 by 1000 pixels (the training view
taller), and records the hash of the page's files they show
(docs/playground/screenshots.json; a default test in
tests/test_playground_api.py compares it). Not a default test: run

    .venv/bin/python -m pytest -p no:cacheprovider -m screenshots tests/test_playground_screenshots.py
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.playground import SHOTS, VIEWS, browser_paths, chrome, console_errors, playground, static_hash
from tests.helpers.tokenizers import deepseek_path, k3_vocab

pytestmark = pytest.mark.screenshots

ROOT = Path(__file__).parent.parent
K3 = xtml.load("kimi-k3")
EXAMPLE = (ROOT / "examples" / "chat.json").read_text(encoding="utf-8")
COMPLETION = (ROOT / "examples" / "completion.txt").read_text(encoding="utf-8")
REQUEST = (ROOT / "examples" / "request.json").read_text(encoding="utf-8")
# A completion of examples/request.json cut inside its tool call: the parse
# repairs it and says where.
CUT_CALL = ('The user wants a forecast: call get_weather.<|close|>think<|sep|><|open|>response<|sep|><|close|>response'
            '<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
            'type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key="days" type="number"<|sep|>3')
JSON_REQUEST = json.dumps({"messages": [{"role": "user", "content": "Weather in Paris? Answer in JSON."}],
                           "response_format": {"type": "json_object"}}, indent=2)
IN_STRING = 'Ok.<|close|>think<|sep|><|open|>response<|sep|>{"answer": "Par'


def link(base: str, **state: Any) -> str:
    raw = json.dumps({"template": {"name": "kimi-k3"}, "options": {}, "from": "text", "thinking": "",
                      "delta": 1, "random": False, "seed": 0, "position": 0, **state}).encode()
    return f"{base}/#s={base64.urlsafe_b64encode(raw).decode().rstrip('=')}"


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[str, Any]]:
    browser_paths()
    with playground("--tokenizer", deepseek_path(), "--add-markers") as base:
        driver = chrome(1400, 1000)
        try:
            yield base, driver
        finally:
            driver.quit()


def _open(driver: Any, url: str, box: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get(url)
    WebDriverWait(driver, 60, 0.05).until(lambda d: d.execute_script(
        f"return document.body.dataset.ready === 'true' && document.querySelectorAll('#{box} .tok').length > 0"))


def test_make_the_screenshots(setup: tuple[str, Any]) -> None:
    base, d = setup
    SHOTS.mkdir(parents=True, exist_ok=True)
    for f in SHOTS.glob("*.png"):
        f.unlink()

    _open(d, link(base, request=EXAMPLE, completion=COMPLETION, tab="render"), "render-tokens")
    user = d.find_elements("css selector", "#render-tokens .msg")[3].find_elements("css selector", ".tok")[10]
    d.execute_script("arguments[0].focus()", user)
    d.save_screenshot(str(SHOTS / "render.png"))

    # Taller: the budget check above, the trained assistant turns below.
    d.set_window_size(1400, 1650)
    _open(d, link(base, request=EXAMPLE, completion=COMPLETION, tab="training"), "training-tokens")
    d.save_screenshot(str(SHOTS / "training.png"))
    d.set_window_size(1400, 1000)

    _open(d, link(base, request=REQUEST, completion=CUT_CALL, tab="parse"), "parse-tokens")
    d.execute_script("document.querySelector('#parse-tokens .tok.diag').focus()")
    d.save_screenshot(str(SHOTS / "parse.png"))

    _open(d, link(base, request=REQUEST, completion=CUT_CALL, tab="stream", delta=3), "stream-tokens")
    for _ in range(40):  # on to a step that gave events and holds ids back
        if d.execute_script("return document.querySelectorAll('#stream-tokens .tok.held').length > 0 && "
                            "document.querySelectorAll('#events li:not(.none)').length > 0 && "
                            "document.querySelectorAll('#stream-tokens .tok.fed').length > 20"):
            break
        d.find_element("id", "step-next").click()
    d.save_screenshot(str(SHOTS / "stream.png"))

    n = len(K3.completion_ids(IN_STRING, k3_vocab()))
    _open(d, link(base, request=JSON_REQUEST, completion=IN_STRING, tab="grammar", position=n), "allowed")
    d.save_screenshot(str(SHOTS / "grammar.png"))

    assert console_errors(d) == []
    assert sorted(p.stem for p in SHOTS.glob("*.png")) == sorted(VIEWS)
    (SHOTS / "screenshots.json").write_text(json.dumps({
        "static": static_hash(), "size": [1400, 1000], "browser": d.capabilities.get("browserVersion"),
        "made_by": "tests/test_playground_screenshots.py"}, indent=2) + "\n", encoding="utf-8")
