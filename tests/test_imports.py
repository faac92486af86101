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


def _public_modules() -> list[str]:
    import pkgutil

    import xtml

    return ["xtml", *(m.name for m in pkgutil.walk_packages(xtml.__path__, "xtml.")
                      if not any(part.startswith("_") for part in m.name.split(".")[1:]))]


def test_every_name_in_every_all_exists() -> None:
    import importlib

    missing: list[str] = []
    checked = 0
    for name in _public_modules():
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            # An extra that is not installed here (vllm); xtml's own modules must import.
            assert e.name is not None and not e.name.startswith("xtml"), f"{name}: {e}"
            continue
        names = getattr(mod, "__all__", None)
        if names is None:
            continue
        checked += 1
        assert len(set(names)) == len(names), f"{name}.__all__ names one twice"
        missing += [f"{name}.{n}" for n in names if not hasattr(mod, n)]
    assert missing == []
    assert checked > 20  # the walk found the package's modules


def test_star_import_gives_every_public_name() -> None:
    import xtml

    namespace: dict[str, object] = {}
    exec("from xtml import *", namespace)
    assert set(xtml.__all__) <= set(namespace)
    assert namespace["Encoded"] is xtml.template.Encoded
