"""The playground as its tests and the screenshot script use it: the real
``xtml playground`` command started on 127.0.0.1 (port 0), and a headless
Chromium driven by selenium through Debian's chromedriver; and the views'
tokenizer work, counted."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.engines import stop_process

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).parent.parent.parent
STATIC = ROOT / "xtml" / "playground" / "static"
SHOTS = ROOT / "docs" / "playground"
"""Where the screenshots of docs/playground.md are, with screenshots.json."""
VIEWS = ("render", "training", "parse", "stream", "grammar")
START = 60.0
"""Seconds the command may take to listen (the tokenizer loads first)."""


def browser_paths() -> tuple[str, str]:
    """Debian's chromium and chromedriver, or a skip (a failure under
    ``CI=true``, where tests/run installs them)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        message = (f"{' and '.join(missing)} missing; to set them up: apt-get install -y chromium chromium-driver "
                   "(tests/run does)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (with CI=true a missing tool is an error)", pytrace=False)
        pytest.skip(message)
    return CHROMIUM, CHROMEDRIVER


@contextmanager
def playground(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``xtml playground --port 0 ARGS`` running; yields its base URL
    (``http://127.0.0.1:PORT``) and stops it at the end. ``env``: variables
    set for it on top of this process's."""
    with playground_printing(*args, env=env) as (url, _):
        yield url


@contextmanager
def playground_printing(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, list[str]]]:
    """:func:`playground`, yielding also the lines it prints (on stderr),
    those to come included."""
    proc = subprocess.Popen([sys.executable, "-m", "xtml", "playground", "--port", "0", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env} if env is not None else None)
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.match(r"xtml playground: (http://\S+?)/?$", line.strip())
            if m and not url:
                url.append(m.group(1))
                found.set()
        found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        found.wait(START)
        assert url, f"xtml playground did not start: {''.join(lines)[-2000:]}"
        yield url[0], lines
    finally:
        stop_process(proc)
        reader.join(10)


def chrome(width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium whose console messages can be read
    (``driver.get_log("browser")``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--force-device-scale-factor=1", "--lang=en-US",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """The console messages of level SEVERE since the last call."""
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def static_hash() -> str:
    """What screenshots were made from: the page's files, by content."""
    h = hashlib.sha256()
    for f in sorted(STATIC.iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class Counted:
    """A vocabulary's encode and decode calls counted by what they are
    handed: characters to encode, ids to decode."""

    def __init__(self, vocab: xtml.Vocabulary, monkeypatch: pytest.MonkeyPatch) -> None:
        self.chars = 0
        self.ids = 0
        for name in ("ids_of", "encode_texts"):
            monkeypatch.setattr(vocab, name, self._count_chars(getattr(vocab, name)))
        for name in ("decode_batch", "decode_runs"):
            monkeypatch.setattr(vocab, name, self._count_runs(getattr(vocab, name)))
        monkeypatch.setattr(vocab, "decode", self._count_ids(vocab.decode))
        tok = vocab.tokenizer
        monkeypatch.setattr(vocab, "_tok", _CountedTokenizer(tok, self))

    def _count_chars(self, f: Callable[[Sequence[str]], Any]) -> Callable[[Sequence[str]], Any]:
        def counted(texts: Sequence[str]) -> Any:
            self.chars += sum(map(len, texts))
            return f(texts)
        return counted

    def _count_runs(self, f: Callable[[list[Sequence[int]]], Any]) -> Callable[[list[Sequence[int]]], Any]:
        def counted(runs: list[Sequence[int]]) -> Any:
            self.ids += sum(map(len, runs))
            return f(runs)
        return counted

    def _count_ids(self, f: Callable[[Sequence[int]], Any]) -> Callable[[Sequence[int]], Any]:
        def counted(ids: Sequence[int]) -> Any:
            self.ids += len(ids)
            return f(ids)
        return counted

    @property
    def work(self) -> int:
        return self.chars + self.ids


class _CountedTokenizer:
    """The library tokenizer under a vocabulary, its encode counted too (the
    views may ask it for offsets directly)."""

    def __init__(self, tok: Any, counts: Counted) -> None:
        self._tok = tok
        self._counts = counts

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self._counts.chars += len(text)
        return self._tok.encode(text, *args, **kwargs)

    def decode(self, ids: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        self._counts.ids += len(ids)
        return self._tok.decode(ids, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)
