"""Running one property outside a test suite: :func:`find_failure` draws
inputs, runs a check on each and, on the first failure, shrinks it to the
minimal failing input. ``xtml fuzz`` and the self-test of ``xtml validate``
run on it; in a test suite, use ``@given`` instead. Needs ``hypothesis``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

__all__ = ["Failure", "Outcome", "find_failure"]

_V = TypeVar("_V")


@dataclass
class Failure:
    """The minimal failing example of a property and what it raised."""

    example: Any
    """The shrunk input (None if the failure happened while generating it)."""
    error: BaseException


@dataclass
class Outcome:
    """What :func:`find_failure` found."""

    examples: int
    """How many inputs the property ran on (shrinking included)."""
    failure: Failure | None


def find_failure(strategy: st.SearchStrategy[_V], check: Callable[[_V], None], *, examples: int,
                 seed: int | None = None) -> Outcome:
    """Run ``check`` on up to ``examples`` inputs drawn from ``strategy``;
    on failure, shrink and return the minimal failing input.

    No example database, no deadline, no health checks; ``seed`` makes the
    run reproducible. This is what ``xtml fuzz`` runs; in a test suite, use
    ``@given`` instead."""
    count = 0
    last: list[Any] = [None]

    def prop(x: _V) -> None:
        nonlocal count
        count += 1
        last[0] = copy.deepcopy(x)
        check(x)
        last[0] = None

    # No explain phase: it re-runs the minimal example many times to say
    # which parts of it matter, which we do not report.
    phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
    run = settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck),
                   report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False,
                   phases=phases)(given(strategy)(prop))
    if seed is not None:
        run = hypothesis_seed(seed)(run)
    try:
        run()
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        return Outcome(count, Failure(last[0], e))
    return Outcome(count, None)
