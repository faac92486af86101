"""Training: loss masks and spans of rendered requests (:mod:`.masks`), dataset
rows and the map function for Hugging Face ``datasets`` and Ray Data
(:mod:`.rows`), and the jobs behind ``xtml render-dataset`` and
``xtml lint-dataset`` (:mod:`.dataset`)."""

from ..codec.training import IGNORE_INDEX, Overrun, Span, TrainingExample, encode_example, encode_training, overruns
from .rows import REQUEST_COLUMNS, MapFunction, RowError, row_request, with_training_defaults

__all__ = ["IGNORE_INDEX", "REQUEST_COLUMNS", "MapFunction", "Overrun", "RowError", "Span", "TrainingExample",
           "encode_example", "encode_training", "overruns", "row_request", "with_training_defaults"]
