"""The README's examples run as written: the Python blocks, and each command
of the command-line block, in a scratch folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.docs import run_examples

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def test_readme_python_example_runs() -> None:
    run_examples(README)


def _command_line_block() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The command line"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the command-line section lost its commands"
    # A comment starts after two spaces or more.
    return [re.split(r"\s{2,}#", line)[0].strip() for line in block.group(1).splitlines() if line.strip()]


COMMANDS = _command_line_block()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that looks like the clone to the commands: examples/, and
    tok.json, a small byte-level BPE with the K3 markers as special tokens
    (what a model's tokenizer.json is); `xtml` on PATH runs this xtml."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    import xtml

    where = tmp_path_factory.mktemp("readme")
    (where / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    sample = (ROOT / "examples" / "chat.json").read_text(encoding="utf-8")
    bpe.train_from_iterator([sample], trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=list(xtml.load("kimi-k3").markers.all())))
    bpe.save(str(where / "tok.json"))
    bin_dir = where / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "xtml"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m xtml "$@"\n')
    shim.chmod(0o755)
    return where


def test_readme_commands_run_as_written(scratch: Path) -> None:
    # In order, in one folder: `parse ids.json` reads what the render before it wrote.
    env = {**os.environ, "PATH": f"{scratch / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    assert len(COMMANDS) >= 10
    for command in COMMANDS:
        done = subprocess.run(["bash", "-eo", "pipefail", "-c", command], cwd=scratch, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert (done.stdout + done.stderr).strip() or ">" in command, f"{command}: printed nothing"
        assert "warning" not in done.stderr, f"{command}: {done.stderr}"
