"""The README's examples run as written: the Python blocks, and, in a fresh
copy of the clone, the set-up block and then each command of the
command-line block, typed as a newcomer types them (in a shell where no
`xtml` is on PATH until the set-up puts one there)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import xtml
from tests.helpers.docs import run_examples

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
TOKENIZER = EXAMPLES / "tokenizer.json"
SET_UP_SECONDS = 900
"""A bound on the set-up block (a venv and `pip install -e .`: about 20 s
with a warm index), not a measure."""


def test_readme_python_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The examples name files of the clone by relative paths, as run from it.
    monkeypatch.chdir(ROOT)
    run_examples(README)


def _sh_block(heading: str) -> list[str]:
    """The first ```sh block under ``heading``, a command a line (a comment
    starts after two spaces or more)."""
    text = README.read_text(encoding="utf-8")
    assert heading in text, f"the README lost its section {heading!r}"
    block = re.search(r"```sh\n(.*?)```", text[text.index(heading):], re.S)
    assert block is not None, f"the section {heading!r} lost its commands"
    return [re.split(r"\s{2,}#", line)[0].strip() for line in block.group(1).splitlines() if line.strip()]


SET_UP = _sh_block("## Set up and run")
COMMANDS = _sh_block("## The command line")


def _clone_files() -> list[str]:
    """The files a clone has: those git tracks, and new ones it does not
    ignore (so a file not yet committed is tried too)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        message = f"a fresh clone is copied from git's list of files, which is not available here ({e})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (with CI=true a missing tool is an error)", pytrace=False)
        pytest.skip(message)
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh copy of the clone, set up by the README's set-up block as
    written, and the shell environment that block leaves behind (the venv it
    activates, if it does), in which the commands are typed."""
    where = tmp_path_factory.mktemp("readme") / "xtml"
    for name in _clone_files():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, where / name)
    # A newcomer's shell: a Python >= 3.11 as `python3`, and no xtml on PATH
    # or importable from elsewhere.
    shims = where.parent / "shims"
    shims.mkdir()
    (shims / "python3").symlink_to(sys.executable)
    path = [str(shims)] + [p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "xtml").exists()]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(path)
    saved = where.parent / "env"
    script = "\n".join(SET_UP) + '\nenv -0 > "$0"'
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", script, str(saved)], cwd=where, env=env,
                          capture_output=True, text=True, timeout=SET_UP_SECONDS)
    assert done.returncode == 0, f"the set-up block failed: {done.stderr[-3000:]}"
    assert "<|open|>message" in done.stdout, f"the set-up block rendered nothing: {done.stdout[-2000:]}"
    after = dict(item.split("=", 1) for item in saved.read_text().split("\0") if "=" in item)
    return where, after


def test_readme_commands_run_as_written_in_a_fresh_clone(clone: tuple[Path, dict[str, str]]) -> None:
    where, env = clone
    assert len(COMMANDS) >= 10
    # In order, in one folder: `parse ids.json` reads what the render before it wrote.
    for command in COMMANDS:
        done = subprocess.run(["bash", "-eo", "pipefail", "-c", command], cwd=where, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert (done.stdout + done.stderr).strip() or ">" in command, f"{command}: printed nothing"
        assert "warning" not in done.stderr, f"{command}: {done.stderr}"


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command of the command line, ``export hf`` as ("export", "hf")."""
    out: set[tuple[str, ...]] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out |= _commands(sub, (*prefix, name)) or {(*prefix, name)}
    return out


def test_readme_commands_show_every_command() -> None:
    """Each command has a line in the block, or is shown in a section of its
    own (those that need a server, an engine or a dataset)."""
    from xtml.cli import _parser

    shown: set[tuple[str, ...]] = set()
    for command in COMMANDS:
        for part in command.split("&&"):
            words = part.split()
            shown |= {tuple(words[1:3]), tuple(words[1:2])}
    elsewhere = {("serve",), ("playground",), ("render-dataset",), ("lint-dataset",)}
    missing = _commands(_parser()) - elsewhere - shown
    assert not missing, f"commands the README's block does not show: {sorted(missing)}"


def test_the_example_tokenizer_is_what_its_script_makes(tmp_path: Path) -> None:
    """examples/tokenizer.json is made by examples/make_tokenizer.py, stays
    small, and has the kimi-k3 markers as special tokens."""
    made = tmp_path / "tokenizer.json"
    done = subprocess.run([sys.executable, str(EXAMPLES / "make_tokenizer.py"), str(made)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert made.read_bytes() == TOKENIZER.read_bytes(), "stale: run examples/make_tokenizer.py to remake it"
    assert TOKENIZER.stat().st_size < 300_000
    vocab = xtml.load_tokenizer(TOKENIZER)
    k3 = xtml.load("kimi-k3")
    special = {t["content"] for t in json.loads(TOKENIZER.read_text(encoding="utf-8"))["added_tokens"]
               if t["special"]}
    assert set(k3.markers.all()) <= special
    request = json.loads((EXAMPLES / "chat.json").read_text(encoding="utf-8"))
    assert k3.parse(k3.encode(request, vocab), vocab) == k3.normalize(request)


def test_the_serve_extra_gives_the_playground_its_grammar_view() -> None:
    """`pip install 'xtml[serve]'` is all the README asks for `xtml
    playground`: its Grammar view runs llguidance, at the version the tests
    run."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]

    def pins(extra: str) -> dict[str, str]:
        return {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower(): spec for spec in extras[extra]}

    assert "llguidance" in pins("serve"), "the serve extra lacks llguidance: the Grammar view says it is missing"
    assert pins("serve")["llguidance"] == pins("test")["llguidance"]
