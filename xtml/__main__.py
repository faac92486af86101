"""``python -m xtml``: the ``xtml`` command."""

from .cli.main import entry

entry()
