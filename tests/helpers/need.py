"""A tool the test command sets up, or what to do without it.

tests/run sets up every tool the tests run, so under ``CI=true`` (where
tests/run is the command) a missing one is a broken set-up and the test
fails; anywhere else it skips and names the command that sets it up."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def need(tool: str, how_to_get: str, *, env: str | None = None) -> str:
    """The path of ``tool``: the one in environment variable ``env`` if it
    is set, else the one beside this interpreter (the venv's), else the one
    on PATH."""
    if env and os.environ.get(env):
        path = os.environ[env]
        found = path if os.access(path, os.X_OK) else None
        where = f"{env}={path} is not an executable file"
    else:
        beside = Path(sys.executable).parent / tool
        found = str(beside) if os.access(beside, os.X_OK) else shutil.which(tool)
        where = f"no {tool} in {beside.parent} or on PATH"
    if found:
        return found
    message = f"{where}; to set it up: {how_to_get}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (with CI=true a missing tool is an error)", pytrace=False)
    pytest.skip(message)
