"""The playground as a person uses it: a real headless Chromium (Debian's,
driven by selenium through /usr/bin/chromedriver) on the page that
``xtml playground`` serves on 127.0.0.1. Skips without Chromium, fails
without it under CI=true (tests/run installs it)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.playground import browser_paths, chrome, console_errors, playground, playground_printing
from tests.helpers.tokenizers import deepseek_path, k3_vocab

ROOT = Path(__file__).parent.parent
EXAMPLE = json.loads((ROOT / "examples" / "chat.json").read_text(encoding="utf-8"))
K3 = xtml.load("kimi-k3")
WAIT = 30.0
"""Seconds a page may take to show what a step asks for (a bound, not a
measure: the first grammar builds llguidance's tokenizer)."""


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    browser_paths()
    with playground("--tokenizer", deepseek_path(), "--add-markers") as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any, url: str) -> Iterator[Any]:
    """The page opened afresh, ready; at the end, no console errors."""
    browser.set_window_size(1400, 1000)
    browser.get(f"{url}/")
    until(browser, lambda: browser.execute_script("return document.body.dataset.ready === 'true'"))
    until(browser, lambda: ids(browser, "render-tokens"))
    yield browser
    errors = console_errors(browser)
    assert errors == [], errors


def until(driver: Any, cond: Callable[[], Any], timeout: float = WAIT) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda _: cond())


def ids(driver: Any, box: str) -> list[int]:
    return [int(x) for x in driver.execute_script(
        f"return [...document.querySelectorAll('#{box} .tok')].map(e => e.dataset.id)")]


def el(driver: Any, id_: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, id_)


def type_into(driver: Any, id_: str, text: str) -> None:
    """Select all and type, as a person replaces a text area's content."""
    from selenium.webdriver.common.keys import Keys

    area = el(driver, id_)
    area.click()
    area.send_keys(Keys.CONTROL, "a")
    area.send_keys(Keys.DELETE)
    area.send_keys(text)


def test_the_page_opens_with_the_examples_tokens(page: Any) -> None:
    assert ids(page, "render-tokens") == K3.encode(EXAMPLE, k3_vocab())
    markers = page.execute_script("return [...document.querySelectorAll('#render-tokens .tok.marker')]"
                                  ".map(e => e.textContent)")
    assert markers and set(markers) <= set(K3.markers.all())
    heads = page.execute_script("return [...document.querySelectorAll('#render-tokens .msg-head')]"
                                ".map(e => e.textContent)")
    assert any("messages[1]" in h and "user" in h for h in heads)


def test_editing_the_request_renders_again(page: Any) -> None:
    request = [{"role": "user", "content": "Hello there"}]
    type_into(page, "request", json.dumps(request))
    want = K3.encode(request, k3_vocab())
    until(page, lambda: ids(page, "render-tokens") == want)
    # A marker literal typed by the user stays text, and is flagged.
    literal = [{"role": "user", "content": "say <|end_of_msg|> now"}]
    type_into(page, "request", json.dumps(literal))
    until(page, lambda: ids(page, "render-tokens") == K3.encode(literal, k3_vocab()))
    assert el(page, "ambiguous").is_displayed()
    assert "<|end_of_msg|>" in el(page, "ambiguous").text
    assert page.execute_script("return document.querySelectorAll('#render-tokens .tok.ambiguous').length") > 3


def test_a_control_overrides_the_request(page: Any) -> None:
    from selenium.webdriver.support.ui import Select

    Select(el(page, "opt-thinking")).select_by_value("false")
    until(page, lambda: ids(page, "render-tokens") == K3.encode(EXAMPLE, k3_vocab(), thinking=False))


def test_a_bad_request_shows_its_located_error(page: Any) -> None:
    type_into(page, "request", '{"messages": [\n  {"role": "user"}\n  {"role": "user"}\n]}')
    box = el(page, "request-error")
    until(page, lambda: box.is_displayed())
    assert "line 3, column 3" in box.text and box.text.startswith("request: invalid JSON")
    type_into(page, "request", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}))
    until(page, lambda: "messages[0].role" in box.text)
    # The browser reports the 400 answers as failed loads: those, and only those.
    errors = console_errors(page)
    assert errors and all("/api/render" in e["message"] and "400" in e["message"] for e in errors), errors


def test_a_pasted_completion_parses(page: Any) -> None:
    el(page, "tab-parse").click()
    cut = "Rain soon.<|close|>think<|sep|><|open|>response<|sep|>Take an umbr"
    type_into(page, "completion", cut)
    until(page, lambda: ids(page, "parse-tokens") == K3.completion_ids(cut, k3_vocab()))
    until(page, lambda: "Take an umbr" in el(page, "parsed-message").text)
    assert "Rain soon." in el(page, "parsed-message").text
    assert "truncated" in el(page, "diagnostics").text
    flagged = page.execute_script("return [...document.querySelectorAll('#parse-tokens .tok')]"
                                  ".findIndex(e => e.classList.contains('diag'))")
    parsed = K3.parse(K3.completion_ids(cut, k3_vocab()), k3_vocab(), completion=True, lenient=True)
    assert flagged == min(parsed["diagnostics"][0]["offset"], len(ids(page, "parse-tokens")) - 1)
    openai = json.loads(el(page, "openai").text)
    assert openai["object"] == "chat.completion"
    assert openai["choices"][0]["finish_reason"] == "length"


def test_the_stream_view_steps(page: Any) -> None:
    from selenium.webdriver.support.ui import Select

    el(page, "tab-stream").click()
    until(page, lambda: "step 1 of" in el(page, "step-label").text)
    total = int(el(page, "step-label").text.split(" of ")[1].split(":")[0])
    completion = (ROOT / "examples" / "completion.txt").read_text(encoding="utf-8")
    assert total == len(K3.completion_ids(completion, k3_vocab())) + 1  # one id a step, then close()
    assert "message_start" in el(page, "events").text
    el(page, "step-next").click()
    assert "step 2 of" in el(page, "step-label").text
    el(page, "step-end").click()
    assert f"step {total} of {total}: close()" in el(page, "step-label").text
    assert "message_end" in el(page, "events").text or "(none)" in el(page, "events").text
    # Three ids a step: fewer steps; the held-back line says why when a tag is being read.
    delta = el(page, "delta")
    delta.clear()
    delta.send_keys("3\t")
    until(page, lambda: f"of {(total - 1 + 2) // 3 + 1}:" in el(page, "step-label").text)
    seen = set()
    for _ in range(12):
        seen.add(el(page, "held").text.split(" — ")[-1])
        el(page, "step-next").click()
    assert any("tag" in s for s in seen)
    Select(el(page, "completion-from")).select_by_value("text")


def test_the_grammar_view_pages_what_is_allowed_next(page: Any) -> None:
    request = {"messages": [{"role": "user", "content": "Weather in Paris? Answer in JSON."}],
               "response_format": {"type": "json_object"}}
    text = 'Ok.<|close|>think<|sep|><|open|>response<|sep|>{"answer": "Par'
    type_into(page, "request", json.dumps(request))
    type_into(page, "completion", text)
    el(page, "tab-grammar").click()
    n = len(K3.completion_ids(text, k3_vocab()))
    until(page, lambda: len(ids(page, "grammar-tokens")) == n)
    page.find_elements("css selector", "#grammar-tokens .tok")[-1].click()  # ask before the last id
    until(page, lambda: f"After {n - 1} id(s)" in el(page, "grammar-summary").text)
    position = el(page, "position")
    position.clear()
    position.send_keys(f"{n}\t")
    until(page, lambda: f"After {n} id(s)" in el(page, "grammar-summary").text)
    count = int(el(page, "grammar-summary").text.split(": ")[1].split(" ")[0].replace(",", ""))
    assert count > 100_000
    first = ids(page, "allowed")
    assert len(first) == 100
    el(page, "allowed-next").click()
    until(page, lambda: el(page, "allowed-label").text.startswith("101–200 of"))
    second = ids(page, "allowed")
    assert len(second) == 100 and first[-1] < second[0]
    assert "%llguidance" in page.execute_script("return document.getElementById('grammar-text').textContent")


def test_keyboard_focus_shows_a_tokens_info(page: Any) -> None:
    from selenium.webdriver.common.keys import Keys

    first = page.find_elements("css selector", "#render-tokens .tok")[0]
    page.execute_script("arguments[0].focus()", first)
    info = el(page, "info")
    want = K3.encode(EXAMPLE, k3_vocab())
    assert f"id {want[0]}" in info.text and "message 0" in info.text and "bytes" in info.text
    first.send_keys(Keys.ARROW_RIGHT)
    active = page.switch_to.active_element
    assert active.get_attribute("data-id") == str(want[1])
    assert f"token 1 · id {want[1]}" in info.text
    # Tabs: arrow keys move between them, as the tab pattern says.
    el(page, "tab-render").send_keys(Keys.ARROW_RIGHT)
    assert page.switch_to.active_element.get_attribute("id") == "tab-training"
    assert el(page, "tab-training").get_attribute("aria-selected") == "true"
    assert el(page, "panel-training").is_displayed() and not el(page, "panel-render").is_displayed()
    # Every token can be reached with the keyboard.
    assert page.execute_script("return [...document.querySelectorAll('.tok[data-id]')].every(e => e.tabIndex === 0)")


def test_hover_shows_a_tokens_info(page: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    tok = page.find_elements("css selector", "#render-tokens .tok")[5]
    ActionChains(page).move_to_element(tok).perform()
    until(page, lambda: f"token 5 · id {tok.get_attribute('data-id')}" in el(page, "info").text)


def test_the_training_view_shades_the_loss_mask(page: Any) -> None:
    from xtml.training import with_training_defaults

    el(page, "tab-training").click()
    ex = K3.encode_training(with_training_defaults(EXAMPLE), k3_vocab())
    shaded = page.execute_script("return [...document.querySelectorAll('#training-tokens .tok')]"
                                 ".map(e => e.classList.contains('trained') ? 1 : 0)")
    assert shaded == list(ex.mask_bytes)
    assert "16384" in el(page, "budget").text and "ok" in el(page, "budget").text


def test_the_state_travels_in_the_link(page: Any) -> None:
    request = [{"role": "user", "content": "Shared hello"}]
    type_into(page, "request", json.dumps(request))
    until(page, lambda: ids(page, "render-tokens") == K3.encode(request, k3_vocab()))
    el(page, "tab-parse").click()
    el(page, "share").click()
    link = page.current_url
    assert "#s=" in link
    page.get("about:blank")
    page.get(link)
    until(page, lambda: page.execute_script("return document.body.dataset.ready === 'true'"))
    until(page, lambda: ids(page, "render-tokens") == K3.encode(request, k3_vocab()))
    assert el(page, "tab-parse").get_attribute("aria-selected") == "true"
    assert json.loads(el(page, "request").get_attribute("value")) == request


def test_a_narrow_window_stacks_the_views_under_the_inputs(page: Any) -> None:
    page.set_window_size(600, 1000)
    until(page, lambda: page.execute_script("return window.innerWidth") <= 600)
    inputs = el(page, "request").rect
    views = el(page, "tabs").rect
    assert views["y"] > inputs["y"] and views["x"] < 60
    width = page.execute_script("return document.documentElement.scrollWidth")
    assert width <= page.execute_script("return window.innerWidth") + 1  # nothing runs off to the side


def test_a_pasted_template_is_checked_and_used(page: Any) -> None:
    from selenium.webdriver.support.ui import Select

    from xtml.chat.template_file import builtin_files

    Select(el(page, "template-pick")).select_by_value("__toml")
    type_into(page, "template-toml", "name = 'mine'\n[markers\n")
    box = el(page, "template-error")
    until(page, lambda: box.is_displayed() and "template.toml:2:" in box.text)
    errors = console_errors(page)  # the 400 answers, as failed loads
    assert errors and all("400" in e["message"] for e in errors), errors
    # A whole file is pasted, not typed: set at once, as a paste does.
    toml = builtin_files()["kimi-k3"].read_text(encoding="utf-8").replace('name = "kimi-k3"', 'name = "mine"', 1)
    page.execute_script("const t = document.getElementById('template-toml'); t.value = arguments[0];"
                        "t.dispatchEvent(new Event('input'))", toml)
    until(page, lambda: not box.is_displayed() and "template mine" in el(page, "render-summary").text)
    assert ids(page, "render-tokens") == K3.encode(EXAMPLE, k3_vocab())


def test_with_an_api_key_the_page_works_from_the_address_it_prints(browser: Any) -> None:
    from urllib.parse import quote

    key = "page-Key_1+/&"
    with playground_printing("--api-key", key) as (base, lines):
        until(browser, lambda: any(ln.startswith("xtml playground: open ") for ln in lines))
        opened = next(ln for ln in lines if ln.startswith("xtml playground: open ")).split()[-1]
        assert opened == f"{base}/#key={quote(key, safe='')}"
        console_errors(browser)
        browser.get(opened)
        until(browser, lambda: browser.execute_script("return document.body.dataset.ready === 'true'"))
        until(browser, lambda: ids(browser, "render-tokens"))
        # The key is kept for the tab, out of the address bar (and so out of
        # any link shared from it).
        assert "key" not in browser.current_url
        assert browser.execute_script("return sessionStorage.getItem('xtml-playground-key')") == key
        el(browser, "share").click()
        assert "#s=" in browser.current_url and "key" not in browser.current_url
        # Opened again without it, in the same tab: still the key's.
        browser.get(f"{base}/")
        until(browser, lambda: browser.execute_script("return document.body.dataset.ready === 'true'"))
        until(browser, lambda: ids(browser, "render-tokens"))
        assert console_errors(browser) == []


def _stale(driver: Any, view: str) -> str | None:
    """The out-of-date note of a view's panel, None when it shows none."""
    note: str | None = driver.execute_script(
        "const p = document.getElementById(arguments[0]); const n = p.querySelector('.stale-note');"
        "return p.classList.contains('stale') && !n.hidden ? n.textContent : null;", f"panel-{view}")
    return note


def test_an_invalid_edit_marks_the_last_result_out_of_date(page: Any) -> None:
    from selenium.webdriver.support.ui import Select

    shown = ids(page, "render-tokens")
    assert _stale(page, "render") is None
    type_into(page, "request", '{"messages": [')
    until(page, lambda: el(page, "request-error").is_displayed())
    # The last render stays, marked: the request has an error.
    until(page, lambda: _stale(page, "render"))
    assert (_stale(page, "render") or "").startswith("Out of date: the request has an error")
    assert ids(page, "render-tokens") == shown
    el(page, "tab-training").click()
    assert _stale(page, "training")
    request = [{"role": "user", "content": "Fixed"}]
    type_into(page, "request", json.dumps(request))
    until(page, lambda: ids(page, "training-tokens") and _stale(page, "training") is None)
    assert _stale(page, "render") is None
    until(page, lambda: ids(page, "render-tokens") == K3.encode(request, k3_vocab()))
    # The completion's views likewise.
    el(page, "tab-parse").click()
    until(page, lambda: ids(page, "parse-tokens"))
    parsed = ids(page, "parse-tokens")
    Select(el(page, "completion-from")).select_by_value("ids")
    until(page, lambda: _stale(page, "parse"))
    assert (_stale(page, "parse") or "").startswith("Out of date: the completion has an error")
    assert ids(page, "parse-tokens") == parsed
    Select(el(page, "completion-from")).select_by_value("text")
    until(page, lambda: _stale(page, "parse") is None)
    # The browser reports the 400 answers as failed loads: those, and only those.
    errors = console_errors(page)
    assert errors and all("400" in e["message"] for e in errors), errors


def test_changing_tab_clears_the_token_info(page: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    hint = el(page, "info").text
    tok = page.find_elements("css selector", "#render-tokens .tok")[5]
    ActionChains(page).move_to_element(tok).perform()
    until(page, lambda: "token 5 · id" in el(page, "info").text)
    el(page, "tab-parse").click()
    assert el(page, "info").text == hint
    until(page, lambda: ids(page, "parse-tokens"))
    parsed = page.find_elements("css selector", "#parse-tokens .tok")[2]
    ActionChains(page).move_to_element(parsed).perform()
    until(page, lambda: "token 2 · id" in el(page, "info").text)
    el(page, "tab-render").click()
    assert el(page, "info").text == hint


def test_the_header_is_one_line_1400_pixels_wide(browser: Any) -> None:
    # Without --tokenizer, the page names the small BPE it made: the longest
    # tokenizer line a newcomer sees.
    with playground() as base:
        browser.set_window_size(1400, 1000)
        browser.get(f"{base}/")
        until(browser, lambda: browser.execute_script("return document.body.dataset.ready === 'true'"))
        header = browser.execute_script(
            "const top = document.querySelector('header.top');"
            "return {height: top.getBoundingClientRect().height,"
            "        items: [...top.children].filter(e => e.offsetWidth > 1).map(e => e.getBoundingClientRect())"
            "          .map(r => ({top: r.top, bottom: r.bottom}))}")
        tallest = max(r["bottom"] - r["top"] for r in header["items"])
        assert header["height"] < 2 * tallest, header
        # One row: every item overlaps the first one's height.
        first = header["items"][0]
        assert all(r["top"] < first["bottom"] and r["bottom"] > first["top"] for r in header["items"]), header
        # The tokenizer's name gave way, and its whole text is its title.
        tokenizer = el(browser, "tokenizer")
        assert tokenizer.get_attribute("title") and tokenizer.size["width"] > 100
        assert console_errors(browser) == []


def test_the_stream_views_chunks_wrap_between_values(page: Any) -> None:
    el(page, "tab-stream").click()
    until(page, lambda: "step 1 of" in el(page, "step-label").text)
    for _ in range(60):  # on to a step whose chunks carry content
        if re.search(r'"content":\s*"', el(page, "chunks").text):
            break
        el(page, "step-next").click()
    assert re.search(r'"content":\s*"', el(page, "chunks").text)
    # Where the text area's lines wrap: each wrap must follow a space (or a
    # hyphen, as in "kimi-k3": a break the browser's line rules allow).
    wraps, inside = page.execute_script("""
        const text = document.getElementById('chunks').firstChild;
        const r = document.createRange();
        let last = null, wraps = 0;
        const inside = [];
        for (let i = 0; i < text.length; i++) {
          r.setStart(text, i); r.setEnd(text, i + 1);
          const rects = r.getClientRects();
          if (!rects.length || text.data[i] === '\\n') continue;
          const top = rects[0].top;
          if (last !== null && top > last + 2 && text.data[i - 1] !== '\\n') {
            wraps++;
            if (!' -'.includes(text.data[i - 1])) inside.push(text.data.slice(Math.max(0, i - 12), i + 12));
          }
          last = top;
        }
        return [wraps, inside];""")
    assert wraps > 0  # the column is narrower than a chunk
    assert inside == [], inside
