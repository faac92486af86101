"""Dataset jobs: JSONL or table rows of requests to Parquet training data,
and think-channel budget checks (the jobs behind ``xtml render-dataset`` and
``xtml lint-dataset``, whose arguments and reports are :mod:`xtml.cli.dataset`).

The input is streamed in chunks of lines; each chunk is rendered by a worker
(in this process, or in a pool of ``--workers`` processes that each load the
template and tokenizer once) and the results are written in input order, one
Parquet row group per chunk. Chunks depend only on the input, so the output
is the same bytes whatever the number of workers. At most two chunks per
worker are in flight, so memory stays bounded however large the input.

A row that cannot be rendered (invalid JSON, a request the template refuses)
is skipped and reported with its line number and the reason; it never stops
the run, and the counts at the end always include it.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import lzma
import os
import queue
import struct
import sys
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import accumulate
from typing import IO, Any, cast

from ..chat.layout_file import load_any_dialect
from ..errors import CallerError, XtmlError
from ..plugins.jsonfmt import BadInput, input_json
from ..vocab.load import load_tokenizer
from .rows import RowError, bind_dialect, dialect_tokens, encode_row, row_overruns, row_request, with_training_defaults

__all__ = ["DatasetError", "Job", "ParquetSink", "Report", "init_worker", "open_rows", "run_job"]


# Lines per chunk (and Parquet rows per row group), and the most bytes a
# chunk gathers before it is handed out: long rows make smaller chunks.
CHUNK_ROWS = 512
CHUNK_BYTES = 16 << 20


class DatasetError(CallerError):
    """A dataset command cannot run: unreadable input, unwritable output, a
    missing package."""


@dataclass(frozen=True, slots=True)
class Job:
    """What a worker needs: everything is loaded from these, so a job
    pickles small."""

    template: str
    tokenizer: str
    add_markers: bool = False
    train: str | None = None
    ids: bool = True
    """Collect ids and masks (render-dataset); lint only counts."""
    budgets: bool = False
    """Check think channels against the template's budgets."""


@dataclass(slots=True)
class Chunk:
    """A worker's result for one chunk of lines."""

    rows: int = 0
    lines: list[int] = field(default_factory=list)
    """Source line of each rendered row."""
    lengths: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    ids: bytes = b""
    """The rows' ids, concatenated, as int32."""
    mask: bytes = b""
    """The rows' loss masks, concatenated, one byte per id."""
    skipped: list[tuple[int, str]] = field(default_factory=list)
    overruns: list[tuple[int, int, str, int, int]] = field(default_factory=list)
    """(line, message index, effort, think tokens, budget)."""
    efforts: Counter[str] = field(default_factory=Counter)
    """Rendered rows per thinking effort (``off`` without thinking)."""


@dataclass(slots=True)
class Report:
    """What a dataset command found, for the summary and for ``--format json``."""

    rows: int = 0
    written: int = 0
    tokens: int = 0
    trained: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    overruns: list[tuple[int, int, str, int, int]] = field(default_factory=list)
    efforts: Counter[str] = field(default_factory=Counter)
    over_by_effort: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    unit: str = "line"
    """How rows are numbered: ``line`` (of a JSONL file, from 1) or ``row``
    (of a table, from 0)."""

    def add(self, c: Chunk) -> None:
        self.rows += c.rows
        self.written += len(c.lines)
        self.tokens += sum(c.lengths)
        self.trained += sum(c.trained)
        self.skipped += c.skipped
        self.overruns += c.overruns
        self.efforts.update(c.efforts)
        # A row counts once per effort, however many of its messages overrun.
        self.over_by_effort.update(e for _, e in {(line, e) for line, _, e, _, _ in c.overruns})

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "written": self.written, "tokens": self.tokens, "trained": self.trained,
            "skipped": [{self.unit: ln, "error": e} for ln, e in self.skipped],
            "efforts": {e: {"rows": n, "over_budget": self.over_by_effort.get(e, 0)}
                        for e, n in sorted(self.efforts.items())},
            "overruns": [{self.unit: ln, "message": m, "effort": e, "tokens": t, "budget": b}
                         for ln, m, e, t, b in self.overruns],
            "seconds": round(self.seconds, 3),
        }


# -- workers ---------------------------------------------------------------------

_state: tuple[Job, Any, Any] | None = None
# The loaded tokenizer, by path and added markers: templates that share
# markers share it.
_vocabs: dict[tuple[str, tuple[str, ...]], Any] = {}


def init_worker(job: Job, quiet_threads: bool) -> None:
    """Load the template and tokenizer of ``job`` in this process."""
    global _state
    if quiet_threads:
        # Several worker processes already use every core; the tokenizer's
        # own thread pool in each would only compete with them.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    same = _state is not None and (_state[0].template, _state[0].tokenizer, _state[0].add_markers) == (
        job.template, job.tokenizer, job.add_markers)
    if same:
        assert _state is not None
        _state = (job, _state[1], _state[2])
        return
    d = load_any_dialect(job.template)
    key = (os.path.abspath(job.tokenizer), dialect_tokens(d) if job.add_markers else ())
    vocab = _vocabs.get(key)
    if vocab is None:
        vocab = load_tokenizer(job.tokenizer, add_special_tokens=key[1])
        _vocabs.clear()  # one tokenizer at a time: a large vocabulary is hundreds of MB
        _vocabs[key] = vocab
    # A tokenizer that does not fit fails here, once.
    _state = (job, d, bind_dialect(d, vocab))
    if quiet_threads:
        # A worker process of ours: what it loaded lives as long as it does,
        # so the collector need not walk it again on every collection of the
        # render loop (frozen after a collection: no garbage is kept).
        gc.collect()
        gc.freeze()


def _request(raw: bytes) -> Any:
    try:
        row = input_json(raw)
    except UnicodeDecodeError:
        raise RowError("the line is not UTF-8 text") from None
    except BadInput as e:
        raise RowError(str(e)) from None
    if isinstance(row, list):
        return with_training_defaults(row)
    if not isinstance(row, dict):
        raise RowError(f"a row must be a request object or a list of messages, not {_json_type(row)}")
    return row_request(row, plain=True)


def _json_type(v: Any) -> str:
    return {str: "a string", int: "a number", float: "a number", bool: "true or false"}.get(type(v), "null")


def _process(lines: list[tuple[int, Any]]) -> Chunk:
    """Render one chunk of ``(number, row)``, a row being a JSON line
    (bytes) or a table row (a dict); bad rows are recorded, never raised."""
    assert _state is not None, "worker not initialised"
    job, d, binding = _state
    out = Chunk(rows=len(lines))
    ids: list[bytes] = []
    mask = bytearray()
    for line, raw in lines:
        try:
            req = _request(raw) if type(raw) is bytes else row_request(raw, plain=True)
            ex = encode_row(d, binding, req, job.train)
        except XtmlError as e:
            out.skipped.append((line, str(e)))
            continue
        except Exception as e:  # a bug must not cost the rest of the run; the row is reported
            out.skipped.append((line, f"unexpected {type(e).__name__}: {e}"))
            continue
        out.lines.append(line)
        out.lengths.append(len(ex.ids))
        out.trained.append(ex.trained)
        out.efforts[ex.effort or "off"] += 1
        if job.ids:
            # Native-order int32, as Arrow reads the buffer; struct packs a
            # list of ints about twice as fast as array.extend.
            ids.append(struct.pack(f"={len(ex.ids)}i", *ex.ids))
            mask += ex.mask_bytes
        if job.budgets:
            out.overruns += [(line, o.message, o.effort, o.tokens, o.budget) for o in row_overruns(ex, d)]
    out.ids = b"".join(ids)
    out.mask = bytes(mask)
    return out


# -- input -----------------------------------------------------------------------


class TableRows:
    """Rows of a table: a Parquet or Arrow file, or a folder of them — a
    Hugging Face ``datasets`` dataset saved with ``save_to_disk``, or Parquet
    shards (read in name order). Rows are numbered from 0 in that order,
    read a batch at a time, and only the columns a request is made of
    (``messages`` or ``request``, and the option columns) are read."""

    unit = "row"

    def __init__(self, path: str) -> None:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise DatasetError("reading tables needs pyarrow: pip install 'xtml[data]'") from None
        self.path = path
        self.files = self._files(path)
        if not self.files:
            raise DatasetError(f"no .parquet or .arrow files in {path}")

    @staticmethod
    def _files(path: str) -> list[str]:
        if not os.path.isdir(path):
            return [path]
        if os.path.exists(os.path.join(path, "dataset_dict.json")):
            splits = sorted(e for e in os.listdir(path) if os.path.isdir(os.path.join(path, e)))
            raise DatasetError(f"{path} holds several splits ({', '.join(splits)}): give one, e.g. "
                               f"{os.path.join(path, splits[0] if splits else 'train')}")
        state = os.path.join(path, "state.json")
        if os.path.exists(state):
            # save_to_disk lists its Arrow files, in order, in state.json.
            try:
                with open(state, encoding="utf-8") as f:
                    files = [d["filename"] for d in json.load(f)["_data_files"]]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise DatasetError(f"cannot read {state}: {e}") from None
            return [os.path.join(path, f) for f in files]
        return sorted(os.path.join(path, e) for e in os.listdir(path) if e.endswith((".parquet", ".arrow")))

    def _batches(self, file: str) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if not file.endswith(".arrow"):
                pf = pq.ParquetFile(file)
                cols = self._wanted(pf.schema_arrow.names)
                yield from pf.iter_batches(batch_size=CHUNK_ROWS, columns=cols)
                return
            source = pa.memory_map(file)
            try:
                reader: Any = pa.ipc.open_stream(source)  # what save_to_disk writes
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                batches: Iterator[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = iter(reader)
            cols = self._wanted(reader.schema.names)
            for b in batches:
                yield b.select(cols)
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"cannot read {file}: {e}") from None

    def _wanted(self, names: list[str]) -> list[str]:
        from .rows import REQUEST_COLUMNS

        cols = [n for n in names if n in REQUEST_COLUMNS]
        if not cols:
            raise DatasetError(f"the table has no 'messages' or 'request' column (columns: {', '.join(names)})")
        return cols

    def total(self) -> int | None:
        """The number of rows, when the files say it cheaply (Parquet)."""
        import pyarrow.parquet as pq

        try:
            if all(not f.endswith(".arrow") for f in self.files):
                return sum(int(pq.ParquetFile(f).metadata.num_rows) for f in self.files)
        except Exception:  # the count only feeds the progress bar; reading reports real errors
            return None
        return None

    def chunks(self, progress: Any) -> Iterator[list[tuple[int, Any]]]:
        n = 0
        for file in self.files:
            for batch in self._batches(file):
                for off in range(0, batch.num_rows, CHUNK_ROWS):
                    rows = batch.slice(off, CHUNK_ROWS).to_pylist()
                    progress(len(rows))
                    yield list(enumerate(rows, start=n))
                    n += len(rows)


class JsonLines:
    """Requests as JSON lines, numbered from 1 as lines of the file."""

    unit = "line"

    def __init__(self, f: IO[bytes], name: str = "the input") -> None:
        self.f = f
        self.name = name

    def total(self) -> int | None:
        """The size in bytes, for a regular file."""
        return _size(self.f)

    def chunks(self, progress: Any) -> Iterator[list[tuple[int, Any]]]:
        try:
            yield from _chunks(self.f, progress)
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:  # a cut or corrupt compressed file, say
            raise DatasetError(f"cannot read {self.name}: {e}") from None


def _chunks(f: IO[bytes], progress: Any) -> Iterator[list[tuple[int, Any]]]:
    """Non-blank lines with their 1-based numbers, in chunks; reads the
    input as it goes."""
    chunk: list[tuple[int, Any]] = []
    size = 0
    for n, raw in enumerate(f, start=1):
        progress(len(raw))
        if raw.isspace() or not raw:
            continue  # blank lines are not rows (isspace, unlike strip, copies nothing)
        chunk.append((n, raw))
        size += len(raw)
        if len(chunk) >= CHUNK_ROWS or size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def run_job(job: Job, source: IO[bytes] | JsonLines | TableRows, *, workers: int = 1, sink: Any = None,
            progress: Any = None) -> Report:
    """Render every chunk of ``source`` (a binary file of JSON lines, or a
    :class:`JsonLines` or :class:`TableRows`) with ``workers`` processes (1:
    in this process) and hand the results to ``sink`` in input order.
    ``progress`` (optional) is started once the workers are up, then told
    of what was read (``advance``: bytes of JSON lines, or rows) and of each
    chunk done (``update``)."""
    rows = source if isinstance(source, JsonLines | TableRows) else JsonLines(source)
    report = Report(unit=rows.unit)
    started = time.perf_counter()
    tick = progress.advance if progress is not None else (lambda n: None)

    def take(c: Chunk) -> None:
        report.add(c)
        if sink is not None:
            sink(c)
        if progress is not None:
            progress.update(report)

    if workers <= 1:
        init_worker(job, quiet_threads=False)
        if progress is not None:
            progress.start()
        for chunk in rows.chunks(tick):
            take(_process(chunk))
    else:
        import multiprocessing as mp

        # On Linux the workers are forks of this process: they start at once
        # and share the tokenizer it loaded. They are forked before any other
        # thread of ours exists (the progress bar's starts after), so no lock
        # can be copied held. Elsewhere they start afresh and load their own.
        frozen = False
        if sys.platform == "linux":
            init_worker(job, quiet_threads=False)
            ctx = mp.get_context("fork")
            # Frozen, the objects the forks share stay out of the collector's
            # walks in every worker, and their memory pages stay shared rather
            # than copied. This process is the caller's: thawed at the end.
            gc.collect()
            gc.freeze()
            frozen = True
        else:
            ctx = mp.get_context("spawn")
        with contextlib.ExitStack() as stack:
            if frozen:
                stack.callback(gc.unfreeze)  # after the pool has shut down
            pool = stack.enter_context(
                ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker, initargs=(job, True)))
            pool.submit(int).result()  # with fork, every worker starts on the first task
            if progress is not None:
                progress.start()
            pending: deque[Future[Chunk]] = deque()
            try:
                for chunk in rows.chunks(tick):
                    pending.append(pool.submit(_process, chunk))
                    if len(pending) >= 2 * workers:
                        take(pending.popleft().result())
                while pending:
                    take(pending.popleft().result())
            except BaseException:
                for p in pending:
                    p.cancel()
                raise
    report.seconds = time.perf_counter() - started
    return report


# -- output ----------------------------------------------------------------------


class ParquetSink:
    """Writes chunks as Parquet row groups: ``line`` (or ``row``, as
    ``index`` says), ``input_ids``, ``loss_mask``, optionally ``labels``,
    ``length`` and ``trained``.

    Each chunk becomes an Arrow table at once; encoding and writing it to the
    file happen in a writer thread (pyarrow does both without the GIL), so
    the process can render the next chunk meanwhile. At most two tables wait.
    :meth:`close` waits for the writes and raises the first error the writer
    met; a failed write also stops the next call."""

    def __init__(self, path: str, labels: bool, index: str = "line", *, name: str | None = None) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError("render-dataset needs pyarrow: pip install 'xtml[data]'") from None
        self.pa = pa
        self.path = path
        self.name = name or path
        """The file as errors name it (``path`` may be a temporary file)."""
        self.labels = labels
        fields = [(index, pa.int64()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))]
        if labels:
            fields.append(("labels", pa.list_(pa.int32())))
        fields += [("length", pa.int32()), ("trained", pa.int32())]
        self.schema = pa.schema(fields)
        try:
            # Token ids barely repeat within a page: dictionary encoding would
            # be tried, cost time, and be given up. Min/max statistics of id
            # lists filter nothing; those of the scalar columns can.
            self.writer = pq.ParquetWriter(path, self.schema, use_dictionary=False,
                                           write_statistics=[index, "length", "trained"])
        except OSError as e:
            raise DatasetError(f"cannot write {self.name}: {e}") from None
        self._tables: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        # Started on the first chunk: run_job forks its workers before any
        # chunk exists, and a fork should copy no thread's state.
        self._thread: threading.Thread | None = None

    def __call__(self, c: Chunk) -> None:
        self._raise()
        if not c.lines:
            return
        pa = self.pa
        n = sum(c.lengths)
        offsets = pa.array(accumulate(c.lengths, initial=0), pa.int32())
        ids = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(c.ids)])
        mask = pa.Array.from_buffers(pa.int8(), n, [None, pa.py_buffer(c.mask)])
        cols = [pa.array(c.lines, pa.int64()), pa.ListArray.from_arrays(offsets, ids),
                pa.ListArray.from_arrays(offsets, mask)]
        if self.labels:
            import pyarrow.compute as pc

            labels = pc.if_else(pc.cast(mask, pa.bool_()), ids, pa.scalar(-100, pa.int32()))
            cols.append(pa.ListArray.from_arrays(offsets, labels))
        cols += [pa.array(c.lengths, pa.int32()), pa.array(c.trained, pa.int32())]
        if self._thread is None:
            self._thread = threading.Thread(target=self._write, name="xtml-parquet-writer", daemon=True)
            self._thread.start()
        self._tables.put(pa.Table.from_arrays(cols, schema=self.schema))

    def _write(self) -> None:
        while True:
            table = self._tables.get()
            if table is None:
                return
            if self._error is None:
                try:
                    self.writer.write_table(table)
                except BaseException as e:  # handed to the rendering thread, which raises it
                    self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            e = self._error
            raise DatasetError(f"cannot write {self.name}: {e}") from e

    def close(self) -> None:
        """Finish the writes and the file."""
        if self._thread is not None:
            self._tables.put(None)
            self._thread.join()
            self._thread = None
        try:
            self.writer.close()
        except OSError as e:
            if self._error is None:
                self._error = e
        self._raise()


def open_rows(path: str) -> tuple[JsonLines | TableRows, IO[bytes] | None]:
    """The rows of ``path`` and the file to close after: JSON lines (``-``
    for stdin), or a table (a folder, or a .parquet or .arrow file)."""
    if path == "-":
        stdin = sys.stdin
        if stdin is None:  # the process was started with it closed
            raise DatasetError("cannot read standard input: it is closed")
        binary = getattr(stdin, "buffer", None)
        if binary is None:  # a text stream put in place by the caller
            return JsonLines(io.BytesIO(str(stdin.read()).encode("utf-8", "surrogateescape")), "standard input"), None
        return JsonLines(binary, "standard input"), None
    if os.path.isdir(path) or path.endswith((".parquet", ".arrow")):
        if not os.path.exists(path):
            raise DatasetError(f"cannot read {path}: no such file or directory")
        return TableRows(path), None
    try:
        if path.endswith(".gz"):
            import gzip

            f: IO[bytes] = cast(IO[bytes], gzip.open(path, "rb"))
        elif path.endswith(".bz2"):
            import bz2

            f = cast(IO[bytes], bz2.open(path, "rb"))
        elif path.endswith(".xz"):
            f = cast(IO[bytes], lzma.open(path, "rb"))
        else:
            f = open(path, "rb")
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror or e}") from None
    return JsonLines(f, path), f


def _size(f: IO[bytes]) -> int | None:
    try:
        st = os.fstat(f.fileno())
    except (OSError, ValueError):
        return None
    import stat

    return st.st_size if stat.S_ISREG(st.st_mode) else None
