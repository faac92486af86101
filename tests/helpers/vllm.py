"""What the tests that run inside vLLM's venv share."""

from __future__ import annotations

from importlib.metadata import distribution
from pathlib import Path


def dist_folder(where: Path) -> Path:
    """xtml's installed metadata (its ``vllm.general_plugins`` entry point),
    as vLLM's entry-point lookup reads it, in a folder to put on ``sys.path``
    of vLLM's venv, which has no xtml installed."""
    info = where / "xtml-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xtml\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(distribution("xtml").read_text("entry_points.txt") or "")
    return where
