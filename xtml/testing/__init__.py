"""Fuzz your own XTML template: hypothesis strategies, ready-made properties,
the template checker (``xtml validate``) and the fuzz runner (``xtml fuzz``).

Needs ``hypothesis``; ``import xtml`` does not import this package.
"""

from .strategies import *  # noqa: F403
from .strategies import __all__ as _strategies_all

__all__ = list(_strategies_all)
