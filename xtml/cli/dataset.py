"""``xtml render-dataset`` and ``xtml lint-dataset``: their arguments, the
progress bar and the reports (the jobs themselves are
:mod:`xtml.training.dataset`, imported when a command runs: worker processes
and Parquet are no part of any other command's start-up)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from .common import TOKENIZER_HELP, at_least
from .output import Output, UsageError

if TYPE_CHECKING:
    from ..training.dataset import Report

# Skipped rows and overruns printed in the text report; --errors or
# --format json give all of them.
SHOWN = 20

COMMANDS = ("render-dataset", "lint-dataset")

EPILOG_RENDER = """examples:
  xtml render-dataset chats.jsonl -o train.parquet --tokenizer path/to/model
  xtml render-dataset chats.jsonl -o train.parquet --tokenizer tok.json --workers 8 --train last --labels
  xtml render-dataset chats.jsonl -o train.parquet --tokenizer tok.json --check-budgets --errors bad.jsonl
  xtml render-dataset my_dataset/ -o train.parquet --tokenizer tok.json   # saved with Dataset.save_to_disk
"""

EPILOG_LINT = """examples:
  xtml lint-dataset chats.jsonl --tokenizer path/to/model
  xtml lint-dataset chats.jsonl -t my-model.toml --tokenizer tok.json --workers 4 --format json
"""


# More worker processes than this only wait on each other.
_workers = at_least(1, 4 * max(os.cpu_count() or 1, 1), f" (4 for each of the {os.cpu_count() or 1} CPUs)")


def add_commands(sub: Any) -> None:
    """Add ``render-dataset`` and ``lint-dataset`` to the subcommands of the
    ``xtml`` parser."""
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", metavar="IN",
                       help="a JSONL file (.gz, .bz2 and .xz read too), one request per line: a request object "
                            "or a list of messages (- for stdin); or a table whose rows hold a 'messages' column "
                            "(a list or JSON text) and option columns, or a 'request' column: a .parquet or "
                            ".arrow file, or a folder of them (a Hugging Face dataset saved with save_to_disk, or "
                            "Parquet shards). Table rows are numbered from 0 ('row' in the output), lines from 1 "
                            "('line')")
        p.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                       help="built-in template name or template file (default: kimi-k3)")
        p.add_argument("--tokenizer", metavar="PATH", required=True, help=TOKENIZER_HELP)
        p.add_argument("--add-markers", action="store_true",
                       help="add the template's markers to the tokenizer as special tokens")
        p.add_argument("--workers", type=_workers, default=1, metavar="N",
                       help="worker processes (default: 1, this process); the output does not depend on it")
        p.add_argument("--errors", metavar="FILE", dest="errors_file",
                       help="write every skipped row (and overrun) as JSON lines to FILE")

    r = sub.add_parser(
        "render-dataset", help="render JSONL requests to Parquet: ids, loss mask, labels",
        description="Render a JSONL file of requests to a Parquet file of training samples: line, input_ids, "
                    "loss_mask (1 = trained, from the template's [training] rules), labels (with --labels), "
                    "length and trained. Rows end with their last message (add_generation_prompt is false unless "
                    "a row sets it). Bad rows are skipped and reported with their line; exit status 1 when any "
                    "was (the file is complete either way).",
        epilog=EPILOG_RENDER, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(r)
    r.add_argument("-o", "--output", dest="parquet", required=True, metavar="OUT.parquet",
                   help="the Parquet file to write (replaced when the run ends)")
    r.add_argument("--train", choices=("all", "last"), default="all",
                   help="all: every message of the trained roles (default); last: only the last turn")
    r.add_argument("--labels", action="store_true", help="also write labels (ids, -100 where not trained)")
    r.add_argument("--check-budgets", action="store_true",
                   help="also report think channels over the budget of their effort (exit 1 when any)")

    lint = sub.add_parser(
        "lint-dataset", help="report think channels over the budget of their thinking effort",
        description="Check a JSONL file of requests against the template's think-channel budgets "
                    "([training.budgets]): the rows whose think channel in any assistant message has more tokens "
                    "than the budget of the row's effort, and counts per effort. Rows that cannot be rendered are "
                    "reported too. Exit 0 when there are none, 1 when there are some.",
        epilog=EPILOG_LINT, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(lint)
    lint.add_argument("-f", "--format", choices=("text", "json"), default="text", help="report format")


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run a dataset command; returns the exit status. The outputs are
    checked before the template, the tokenizer or the input is read."""
    # Parquet on standard output would mix with the report printed there.
    parquet = Output(args.parquet, "-o", streams=False) if args.command == "render-dataset" else None
    errors = Output(args.errors_file, "--errors") if args.errors_file else None
    if parquet is not None and errors is not None and errors.target == parquet.target:
        # The second file moved into place would replace the first.
        raise UsageError(f"--errors {args.errors_file} and -o {args.parquet} are one file")
    # The rows are read while the outputs are written: an output moved over
    # the input would replace the dataset.
    if args.file != "-":
        source = os.path.realpath(args.file)
        for option, o in (("-o", parquet), ("--errors", errors)):
            if o is not None and o.target and (o.target == source or o.target.startswith(source + os.sep)):
                raise UsageError(f"{option} {o.path} is the input {args.file}: name another file")
    return _run(args, out, parquet=parquet, errors=errors)


class _Progress:
    """A rich progress bar on stderr (a terminal only): bytes read, rows,
    tokens."""

    def __init__(self, total: int | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=True)
        self.task = self.bar.add_task("rendering", total=total, stats="")

    def start(self) -> None:
        self.bar.start()

    def advance(self, n: int) -> None:
        self.bar.advance(self.task, n)

    def update(self, r: Report) -> None:
        self.bar.update(self.task, stats=f"{r.written:,} rows, {r.tokens:,} tokens, {len(r.skipped):,} skipped")

    def stop(self) -> None:
        self.bar.stop()




class OutputFile(Protocol):
    """A file a dataset command writes (:class:`xtml.cli.output.Output`):
    filled through a temporary file that :meth:`commit` moves over it, or,
    for standard output or error, written to ``stream``."""

    path: str

    @property
    def stream(self) -> TextIO | None: ...

    def temporary(self) -> str: ...

    def commit(self) -> None: ...

    def discard(self) -> None: ...


def _run(args: argparse.Namespace, out: TextIO, *, parquet: OutputFile | None = None,
        errors: OutputFile | None = None) -> int:
    """Run a dataset command; returns the exit status. Raises
    :class:`~xtml.errors.XtmlError` for input the command cannot use.
    ``parquet`` (render-dataset) and ``errors`` (``--errors``) are where the
    rows and the skipped rows go; each existing file is replaced only when
    the run is complete, and left as it was otherwise."""
    from ..training.dataset import Job, ParquetSink, init_worker, open_rows, run_job

    render = args.command == "render-dataset"
    if render and parquet is None:
        raise ValueError("render-dataset needs a Parquet output")
    init_worker(Job(args.template, args.tokenizer, args.add_markers), quiet_threads=False)  # fail fast, in one line
    job = Job(args.template, args.tokenizer, args.add_markers, train=args.train if render else None,
              ids=render, budgets=not render or args.check_budgets)
    source, opened = open_rows(args.file)
    sink: ParquetSink | None = None
    progress: _Progress | None = None
    try:
        if parquet is not None:
            sink = ParquetSink(parquet.temporary(), args.labels, index=source.unit, name=parquet.path)
        if sys.stderr.isatty():
            progress = _Progress(source.total())
        try:
            report = run_job(job, source, workers=args.workers, sink=sink, progress=progress)
        finally:
            if progress is not None:
                progress.stop()
        if sink is not None:
            sink.close()
            sink = None
        # Both files complete before either replaces what was there.
        if errors is not None:
            _write_errors(errors, report)
        if parquet is not None:
            parquet.commit()
        if errors is not None and errors.stream is None:
            errors.commit()
    finally:
        if sink is not None:
            # Only reached with an error on its way out: the file is left
            # unfinished, and a second error must not hide the first.
            with contextlib.suppress(Exception):
                sink.close()
        for f in (parquet, errors):
            if f is not None:
                f.discard()
        if opened is not None:
            opened.close()
    if getattr(args, "format", "text") == "json":
        out.write(json.dumps(report.as_dict(), ensure_ascii=False, indent=2) + "\n")
    else:
        _write_report(out, report, render, job.budgets, args)
    return 1 if report.skipped or report.overruns else 0


def _write_errors(dest: OutputFile, r: Report) -> None:
    """Every skipped row and overrun, a JSON line each, to ``dest``'s stream
    or to its temporary file (committed by the caller)."""
    from ..training.dataset import DatasetError

    stream = dest.stream
    try:
        with contextlib.ExitStack() as stack:
            f = stream if stream is not None else stack.enter_context(
                open(dest.temporary(), "w", encoding="utf-8"))
            for line, err in r.skipped:
                f.write(_json_line({r.unit: line, "error": err}))
            for line, m, e, t, b in r.overruns:
                f.write(_json_line({r.unit: line, "error": f"message {m}: think channel of {t} tokens is over the "
                                    f"{e} budget of {b}", "message": m, "effort": e, "tokens": t, "budget": b}))
    except OSError as e:
        raise DatasetError(f"cannot write {dest.path}: {e.strerror or e}") from None


def _json_line(obj: Any) -> str:
    s = json.dumps(obj, ensure_ascii=False)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from the input, quoted in a reason: escaped, it can be written
        s = json.dumps(obj)
    return s + "\n"


def _write_report(out: TextIO, r: Report, render: bool, budgets: bool, args: argparse.Namespace) -> None:
    share = f" ({100 * r.trained / r.tokens:.1f}%)" if r.tokens else ""
    rate = f", {r.rows / r.seconds:,.0f} rows/s" if r.seconds > 0 else ""
    written = f"{r.written:,}" + (f" to {args.parquet}" if render else "")
    for label, value in (("rows read", f"{r.rows:,}"), ("rows written" if render else "rows rendered", written),
                         ("rows skipped", f"{len(r.skipped):,}"), ("tokens", f"{r.tokens:,}"),
                         ("trained", f"{r.trained:,}{share}"), ("time", f"{r.seconds:.1f} s{rate}")):
        out.write(f"{label:<15}{value}\n")
    if budgets:
        out.write("think budgets (rows over budget / rows, per effort):\n")
        for effort, n in sorted(r.efforts.items()):
            out.write(f"  {effort:<12} {r.over_by_effort.get(effort, 0):,} / {n:,}\n")
    for line, err in r.skipped[:SHOWN]:
        out.write(f"{r.unit} {line}: skipped: {err}\n")
    if budgets:
        for line, m, e, t, b in r.overruns[:SHOWN]:
            out.write(f"{r.unit} {line}: message {m}: think channel of {t:,} tokens is over the {e} budget of {b:,}\n")
    hidden = max(0, len(r.skipped) - SHOWN) + (max(0, len(r.overruns) - SHOWN) if budgets else 0)
    if hidden:
        out.write(f"... and {hidden:,} more" + (f" (all in {args.errors_file})" if args.errors_file
                                                 else " (--errors FILE writes them all)") + "\n")
