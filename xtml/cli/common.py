"""Argument types and help shared by the command-line modules."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer not below ``minimum``."""
    what = "a positive integer" if minimum == 1 else "a whole number" if minimum == 0 else f"an integer ≥ {minimum}"

    def convert(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, not {s!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, not {s!r}")
        return v

    return convert


TOKENIZER_HELP = ("tokenizer.json, a tiktoken BPE file, or a model folder (tokenizer.json, or a tiktoken "
                  "vocabulary with tokenizer_config.json)")
