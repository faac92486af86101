"""The command line in process: ``run(argv)`` -> (exit status, stdout, stderr)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from xtml.cli import main

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "chat.json"


def run(argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        code = main(argv)
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()
