"""Training: dataset rows and the map function for Hugging Face ``datasets``
and Ray Data (:mod:`.rows`), and the jobs behind ``xtml render-dataset`` and
``xtml lint-dataset`` (:mod:`.dataset`). Loss masks and spans are the codec's
(:mod:`xtml.codec.training`); :func:`encode_training` takes a template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..codec.training import IGNORE_INDEX, Overrun, Span, Train, TrainingExample, encode_example, overruns
from .rows import REQUEST_COLUMNS, MapFunction, RowError, row_request, with_training_defaults

if TYPE_CHECKING:
    from ..template import Template

__all__ = ["IGNORE_INDEX", "REQUEST_COLUMNS", "MapFunction", "Overrun", "RowError", "Span", "TrainingExample",
           "encode_example", "encode_training", "overruns", "row_request", "with_training_defaults"]


def encode_training(template: Template, request: Any, tokenizer: Any, *, train: Train = None,
                    **options: Any) -> TrainingExample:
    """:meth:`xtml.Template.encode_training`: ids (equal to
    ``template.encode(request, tokenizer, **options)``), loss mask and spans
    of a request; ``train`` as :func:`~xtml.codec.training.encode_example`
    reads it."""
    return template.encode_training(request, tokenizer, train=train, **options)
