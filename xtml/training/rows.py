"""Dataset rows → training examples: the request a row holds, and the batched
map function for Hugging Face ``datasets`` and Ray Data."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..chat.dialect import Dialect, Training
from ..chat.layout import LayoutDialect
from ..chat.layout_file import load_any_dialect
from ..chat.options import OPTION_NAMES
from ..codec.layout import bind as bind_layout
from ..codec.layout_training import encode_layout_example
from ..codec.training import IGNORE_INDEX, Overrun, Train, TrainingExample, encode_example, overruns
from ..errors import MAX_DEPTH, CallerError, XtmlError, too_deep
from ..lru import Lru
from ..plugins.jsonfmt import BadInput, input_json
from ..vocab.binding import Binding
from ..vocab.load import load_tokenizer
from ..vocab.tokens import TokenBinding
from ..vocab.vocabulary import Vocabulary

__all__ = ["REQUEST_COLUMNS", "AnyDialect", "MapFunction", "RowError", "bind_dialect", "dialect_tokens", "encode_row",
           "load_bound", "row_overruns", "row_request", "with_training_defaults"]


# -- batches (datasets, Ray Data) ----------------------------------------------

# Columns of a row that make up its request; others (ids, sources) are left alone.
_REQUEST_KEYS = frozenset({"messages", *OPTION_NAMES, "chat_template_kwargs"})
REQUEST_COLUMNS = _REQUEST_KEYS | {"request"}
"""The columns of a dataset row that :func:`row_request` reads."""

AnyDialect = Dialect | LayoutDialect
"""A template's dialect: XTML-shaped, or a layout dialect."""


def dialect_tokens(d: AnyDialect) -> tuple[str, ...]:
    """The tokens a format writes (what ``--add-markers`` adds)."""
    return d.tokens if isinstance(d, LayoutDialect) else tuple(d.markers.all())


def bind_dialect(d: AnyDialect, vocab: Vocabulary) -> Binding | TokenBinding:
    """The binding of a format to a tokenizer (it checks the tokens now)."""
    return bind_layout(d, vocab) if isinstance(d, LayoutDialect) else Binding(d.markers, vocab)


def encode_row(d: AnyDialect, binding: Binding | TokenBinding, request: Any, train: Train) -> TrainingExample:
    """The training example of a request, for either kind of format."""
    if isinstance(d, LayoutDialect):
        assert isinstance(binding, TokenBinding)
        return encode_layout_example(d, binding, request, train=train)
    assert isinstance(binding, Binding)
    return encode_example(d, binding, request, train=train)


def row_overruns(ex: TrainingExample, d: AnyDialect) -> list[Overrun]:
    """The think channels over budget (a layout format declares no budgets)."""
    return [] if isinstance(d, LayoutDialect) else overruns(ex, d)


_loaded: Lru[tuple[str, str, bool], tuple[AnyDialect, Binding | TokenBinding]] = Lru()


def load_bound(template: str, tokenizer: str, add_markers: bool = False,
               vocab: Vocabulary | None = None) -> tuple[AnyDialect, Binding | TokenBinding]:
    """A template's dialect and its binding to a tokenizer, loaded once per
    process (``vocab``: a tokenizer already loaded from ``tokenizer``)."""
    key = (template, tokenizer, add_markers)
    hit = _loaded.get(key)
    if hit is None:
        d = load_any_dialect(template)
        if vocab is None:
            vocab = load_tokenizer(tokenizer, add_special_tokens=dialect_tokens(d) if add_markers else ())
        # The binding checks the tokens now, not on the first row.
        hit = _loaded.put(key, (d, bind_dialect(d, vocab)))
    return hit


def row_request(row: Mapping[str, Any], *, plain: bool = False) -> Any:
    """The request in a dataset row: its ``messages`` (a list, or JSON text)
    with the option columns that are set (``tools``, ``thinking`` ...), or a
    ``request`` column (an object or JSON text). Other columns are ignored.
    Training rows end with their last message: ``add_generation_prompt`` is
    false unless the row says otherwise. ``plain``: the values are already
    plain Python (parsed JSON), with no numpy arrays or pandas NA to convert.
    """
    conv = _keep if plain else _plain
    if "messages" in row:
        req: Any = {k: _json_text(v, k, conv) if k in ("messages", "tools") else conv(v)
                    for k, v in row.items() if k in _REQUEST_KEYS and not _missing(v)}
    elif "request" in row:
        req = _json_text(row["request"], "request", conv)
    else:
        raise RowError("the row has no 'messages' or 'request' column")
    return with_training_defaults(req)


def with_training_defaults(request: Any) -> Any:
    """``request`` with ``add_generation_prompt`` false unless it sets it."""
    if isinstance(request, list):
        return {"messages": request, "add_generation_prompt": False}
    if isinstance(request, dict) and "add_generation_prompt" not in request:
        ctk = request.get("chat_template_kwargs")
        if not (isinstance(ctk, dict) and "add_generation_prompt" in ctk):
            return {**request, "add_generation_prompt": False}
    return request


class RowError(CallerError):
    """A dataset row that holds no request (no ``messages`` column, invalid
    JSON text)."""


def _json_text(v: Any, column: str, conv: Callable[[Any], Any]) -> Any:
    if isinstance(v, str | bytes):
        try:
            return input_json(v)
        except UnicodeDecodeError:
            raise RowError(f"column {column!r} is not UTF-8 text") from None
        except BadInput as e:
            raise RowError(f"column {column!r}: {e}") from None
    return conv(v)


def _keep(v: Any) -> Any:
    return v


def _missing(v: Any) -> bool:
    """A value a column holds for "not set": None, pandas' NA and NaT, or
    NaN (which no request field can hold)."""
    return v is None or type(v).__name__ in ("NAType", "NaTType") or (isinstance(v, float) and math.isnan(v))


def _plain(v: Any, depth: int = 0) -> Any:
    """Python values from what batch formats hold: numpy arrays (Ray's numpy
    and pandas batches), numpy scalars, tuples, pandas' missing values.
    Nested past :data:`~xtml.errors.MAX_DEPTH`, the value is refused here,
    as the request's own check would refuse it."""
    if depth > MAX_DEPTH and isinstance(v, dict | list | tuple):
        raise too_deep(())
    if isinstance(v, dict):
        return {k: _plain(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x, depth + 1) for x in v]
    if isinstance(v, str | int | bool) or v is None:
        return v
    if _missing(v):
        return None
    if hasattr(v, "tolist"):
        return _plain(v.tolist(), depth)
    return v


class MapFunction:
    """A batched map function: rows of requests → ids, loss mask, labels.

    ``fn = MapFunction("kimi-k3", "path/to/tokenizer.json")``, then
    ``dataset.map(fn, batched=True, num_proc=4, remove_columns=...)`` with
    Hugging Face ``datasets``, or ``ds.map_batches(fn)`` with Ray Data (any
    ``batch_format``). A row's request is its ``messages`` column plus the
    option columns it has (see :func:`row_request`).

    Output columns: ``input_ids``, ``loss_mask``, ``labels`` (unless
    ``labels=False``), ``length`` and ``error``. A row that cannot be
    rendered does not raise: it comes back with empty ids and the reason in
    ``error`` (``""`` for good rows), so a run over millions of rows is not
    lost to one bad one; filter on ``error``. Missing values (None, pandas'
    NA) in option columns mean "not set".

    The function pickles as its arguments; each process loads the template
    and tokenizer once, on its first batch.
    """

    def __init__(self, template: str | os.PathLike[str] = "kimi-k3",
                 tokenizer: str | os.PathLike[str] | None = None, *, train: Train = None,
                 add_markers: bool = False, labels: bool = True) -> None:
        if tokenizer is None:
            raise TypeError("MapFunction needs a tokenizer path (a tokenizer.json or a folder with one)")
        self.template = os.fspath(template)
        self.tokenizer = os.fspath(tokenizer)
        self.train = train if train is None or isinstance(train, str | Training) else tuple(train)
        self.add_markers = add_markers
        self.labels = labels

    def __getstate__(self) -> dict[str, Any]:
        return {"template": self.template, "tokenizer": self.tokenizer, "train": self.train,
                "add_markers": self.add_markers, "labels": self.labels}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"MapFunction({self.template!r}, {self.tokenizer!r}, train={self.train!r})"

    def one(self, row: Mapping[str, Any], *, plain: bool = False) -> TrainingExample:
        """The training example of one row (raises on a bad row); ``plain``
        as for :func:`row_request`."""
        d, binding = load_bound(self.template, self.tokenizer, self.add_markers)
        return encode_row(d, binding, row_request(row, plain=plain), self.train)

    def __call__(self, batch: Any) -> Any:
        cols, kind = _columns(batch)
        # Python lists and dicts (datasets, Ray's default and pyarrow
        # formats) need no conversion; numpy and pandas values do.
        plain = kind in ("dict", "pyarrow")
        size = len(next(iter(cols.values()))) if cols else 0
        out: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "length": [], "error": []}
        if self.labels:
            out["labels"] = []
        names = list(cols)
        for i in range(size):
            row = {k: cols[k][i] for k in names}
            ids: list[int]
            mask: list[int]
            try:
                ex = self.one(row, plain=plain)
            except XtmlError as e:
                ids, mask, err = [], [], str(e)
            except Exception as e:  # one odd value must not fail the whole map; the row says why
                ids, mask, err = [], [], f"unexpected {type(e).__name__}: {e}"
            else:
                ids, mask, err = ex.ids, ex.mask, ""
            out["input_ids"].append(ids)
            out["loss_mask"].append(mask)
            out["length"].append(len(ids))
            out["error"].append(err)
            if self.labels:
                out["labels"].append([t if m else IGNORE_INDEX for t, m in zip(ids, mask)])
        return _as(kind, out)


def _columns(batch: Any) -> tuple[dict[str, Sequence[Any]], str]:
    """The columns of a batch in any of the formats the libraries hand out."""
    if isinstance(batch, Mapping):
        numpy = any(type(v).__module__ == "numpy" for v in batch.values())
        return dict(batch), "numpy" if numpy else "dict"
    module = type(batch).__module__
    if module.startswith("pandas"):
        return {str(c): batch[c].tolist() for c in batch.columns}, "pandas"
    if module.startswith("pyarrow"):
        return batch.to_pydict(), "pyarrow"
    raise TypeError(f"a batch must be a dict of columns, a pandas DataFrame or a pyarrow Table, "
                    f"not {type(batch).__name__}")


def _as(kind: str, out: dict[str, list[Any]]) -> Any:
    """The output in the input's format (Ray Data wants them to match)."""
    if kind == "dict":
        return out
    if kind == "pyarrow":
        import pyarrow as pa

        return pa.table(out)
    import numpy as np

    cols: dict[str, Any] = {}
    for k, v in out.items():
        if k in ("input_ids", "loss_mask", "labels"):
            # Rows differ in length: an object array of per-row arrays.
            arr = np.empty(len(v), dtype=object)
            for i, row in enumerate(v):
                arr[i] = np.asarray(row, dtype=np.int8 if k == "loss_mask" else np.int64)
            cols[k] = arr
        else:
            cols[k] = np.asarray(v, dtype=np.int64 if k == "length" else object)
    if kind == "pandas":
        import pandas as pd

        return pd.DataFrame(cols)
    return cols
