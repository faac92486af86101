"""``python -m xtml``: the ``xtml`` command."""

from .cli import entry

entry()
