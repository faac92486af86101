"""``xtml render-dataset`` and ``xtml lint-dataset``: their arguments (the
jobs themselves are :mod:`xtml.training.dataset`)."""

from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from .common import TOKENIZER_HELP, at_least
from .output import Output, UsageError

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
    # Imported when the command runs: the job machinery (worker processes,
    # Parquet) is no part of any other command's start-up.
    from ..training.dataset import run

    return run(args, out, parquet=parquet, errors=errors)
