"""What ``import xtml`` costs: the core only. The HTTP edge, the grammar
writers, Lark and rich are imported by the commands and functions that use
them, so a library user (or a worker process rendering a dataset) starts in
milliseconds and needs none of the extras."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

# Modules, and the packages under them, that `import xtml` must leave unloaded.
LAZY = (
    "xtml.serving",   # the gateway and the engines: the serve extra
    "xtml.codec.completion.llguidance",   # grammar writers, for constrained decoding only
    "xtml.codec.completion.xgrammar",
    "starlette",
    "uvicorn",
    "aiohttp",
    "lark",           # the reference grammar: text-form errors and tests
    "rich",           # xtml inspect and progress bars
)

CHECK = """
import json, sys
{setup}
lazy = {lazy!r}
print(json.dumps(sorted(m for m in sys.modules if any(m == x or m.startswith(x + ".") for x in lazy))))
"""


def _loaded(setup: str) -> list[str]:
    code = CHECK.format(setup=setup, lazy=LAZY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_import_xtml_loads_only_the_core() -> None:
    assert _loaded("import xtml") == []


@pytest.mark.parametrize("setup", [
    # Rendering and reading ids back: the library's everyday path.
    "import xtml; k3 = xtml.load('kimi-k3'); k3.render({'messages': [{'role': 'user', 'content': 'hi'}]})",
    # The command line's module, before any command runs.
    "import xtml.cli",
])
def test_everyday_paths_stay_light(setup: str) -> None:
    assert _loaded(setup) == []
