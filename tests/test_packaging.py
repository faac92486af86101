"""What ships, and what a checkout runs: the wheel holds every package and
the grammar, and a clone on PYTHONPATH, with xtml not installed, parses
text (it reads grammar/xtml.lark where it is)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

PARSE_TEXT = ("import xtml; print(xtml.__file__); "
              "xtml.load('kimi-k3').parse('<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|>"
              "<|end_of_msg|>')")


def test_a_checkout_on_the_path_parses_text() -> None:
    # -S keeps site's .pth files out, and with them the editable install's
    # finder: xtml comes from the folder on the path, the dependencies from
    # site-packages.
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {sysconfig.get_paths()['purelib']!r}]; {PARSE_TEXT}")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT / "xtml" / "__init__.py")


def test_the_wheel_holds_every_package_and_the_grammar(tmp_path: Path) -> None:
    # As pip builds it for an install: the build requirements of pyproject.toml, isolated.
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode and "No matching distribution found for setuptools" in done.stderr:
        pytest.skip("no package index to fetch the build requirements from")
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("xtml-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "xtml/grammar/xtml.lark" in names
    assert "xtml/py.typed" in names
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "xtml").rglob("__init__.py")}
    assert packages and all(f"{p}/__init__.py" in names for p in packages), packages - {
        n.rsplit("/", 1)[0] for n in names}
    assert {n for n in names if n.startswith("xtml/dialects/")} >= {
        f"xtml/dialects/{p.name}" for p in (ROOT / "xtml" / "dialects").glob("*.toml")}
