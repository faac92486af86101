"""Fuzz your own XTML template: hypothesis strategies, ready-made properties,
the template checker (``xtml validate``) and the fuzz runner (``xtml fuzz``)::

    from hypothesis import given, settings
    import xtml
    from xtml import testing as xt

    T = xtml.load("my-template.toml")
    TOK = xtml.load_tokenizer("tokenizer.json")

    @settings(deadline=None)
    @given(xt.requests(T))
    def test_round_trip(request):
        xt.check_round_trip(T, request, TOK)

The modules, by what they hold:

* :mod:`~xtml.testing.strategies` — what to generate: :func:`requests`,
  :func:`markup`, :func:`token_ids`, :func:`stream_cases`,
  :func:`chunk_sizes` (and ``assistant_messages``);
* :mod:`~xtml.testing.adversarial` — the nasty text every text field gets:
  :func:`texts` (and JSON built from it);
* :mod:`~xtml.testing.checks` — what must hold: :func:`check_round_trip`,
  :func:`check_injection_free`, :func:`check_stream_equals_batch` (with
  :func:`completion_case`), :func:`check_never_crash`,
  :func:`check_markup_parses`;
* :mod:`~xtml.testing.runner` — :func:`find_failure`, which runs one property
  outside a test suite and shrinks its failure (:class:`Outcome`,
  :class:`Failure`);
* :mod:`~xtml.testing.validate` — ``xtml validate``.

docs/testing.md is the guide. Needs ``hypothesis``; ``import xtml`` does not
import this package.
"""

from .adversarial import texts
from .checks import (
    check_injection_free,
    check_markup_parses,
    check_never_crash,
    check_round_trip,
    check_stream_equals_batch,
    completion_case,
)
from .runner import Failure, Outcome, find_failure
from .strategies import chunk_sizes, markup, requests, stream_cases, token_ids

__all__ = [
    "Failure",
    "Outcome",
    "check_injection_free",
    "check_markup_parses",
    "check_never_crash",
    "check_round_trip",
    "check_stream_equals_batch",
    "chunk_sizes",
    "completion_case",
    "find_failure",
    "markup",
    "requests",
    "stream_cases",
    "texts",
    "token_ids",
]
