"""The command line: ``main(argv) -> int`` and the ``xtml`` entry point."""

from .main import _parser as _parser  # the tests read the parser
from .main import entry, main

__all__ = ["entry", "main"]
