"""The ``xtml`` command.

``main(argv) -> int``: 0 on success, 1 on invalid input (one line on stderr,
no traceback), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from .. import __version__
from ..errors import XtmlError
from ..template import Template, load
from ..vocab.load import load_tokenizer
from ..vocab.vocabulary import Vocabulary
from . import dataset
from .common import TOKENIZER_HELP, at_least

EPILOG_RENDER = """examples:
  xtml render examples/chat.json
  xtml render chat.json --format segments
  xtml render chat.json --tokenizer path/to/tokenizer.json --format ids
  echo '[{"role": "user", "content": "hi"}]' | xtml render - --thinking false
"""

EPILOG_MAIN = """examples:
  xtml render examples/chat.json
  xtml inspect examples/chat.json --tokenizer path/to/model
  xtml parse ids.json --tokenizer path/to/model --completion --lenient
  xtml new-template my-model && xtml validate my-model.toml --tokenizer path/to/model

Each command has its own --help with examples. Exit status: 0 success, 1 invalid input (one line on
stderr), 2 usage error.
"""

EPILOG_FUZZ = """examples:
  xtml fuzz
  xtml fuzz --template my-model.toml --tokenizer path/to/model --examples 1000 --seed 7
"""

EPILOG_VALIDATE = """examples:
  xtml validate my-model.toml
  xtml validate my-model.toml --tokenizer path/to/model --examples 200
  xtml validate kimi-k3 --format json
"""

EPILOG_INSPECT = """examples:
  xtml inspect examples/chat.json --tokenizer path/to/tokenizer.json
  xtml inspect chat.json -t xtml-base --tokenizer tok.json --add-markers | less -R
"""

EPILOG_TEMPLATES = """examples:
  xtml templates
  xtml templates --format json
  cp "$(xtml templates --format json | jq -r '.[0].path')" my-model.toml
"""

EPILOG_NEW = """examples:
  xtml new-template my-model            # writes my-model.toml
  xtml new-template my-model -o formats/my-model.toml
  xtml validate my-model.toml
"""

EPILOG_PARSE = """examples:
  xtml render chat.json --tokenizer tok.json --format ids | xtml parse --tokenizer tok.json
  xtml parse prompt.txt --from text
  xtml parse output_ids.json --tokenizer tok.json --completion --lenient
"""


class _UserError(Exception):
    """Invalid input found by the CLI itself (a file it cannot read, say)."""


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise _UserError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise _UserError(f"{path} is not UTF-8 text") from None


def _json(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _UserError(f"{source}: invalid JSON: {e.msg} (at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise _UserError(f"{source}: JSON nested too deeply") from None


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {s!r}")


class _UsageError(Exception):
    """A command line that cannot work as given (exit status 2)."""


def _tokenizer(args: argparse.Namespace, tpl: Template) -> Vocabulary:
    if not args.tokenizer:
        raise _UsageError("this needs --tokenizer PATH (a tokenizer.json, a tiktoken file, or a model folder)")
    extra = tpl.markers.all() if args.add_markers else ()
    return load_tokenizer(args.tokenizer, add_special_tokens=extra)




def _add_template(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="built-in template name or template file (default: kimi-k3; see xtml templates)")


def _add_tokenizer(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", metavar="PATH", help=TOKENIZER_HELP)
    p.add_argument("--add-markers", action="store_true",
                   help="add the template's markers to the tokenizer as special tokens "
                        "(for fine-tuning a base model on XTML)")


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", default="-", help="input file, or - for stdin (default)")
    _add_template(p)
    _add_tokenizer(p)
    _add_output(p)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="xtml", description="Render chat requests to XTML and parse them back.",
                                 epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"xtml {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("render", help="render a chat request (JSON) to text, segments or token ids",
                       description="Render a chat request: an object with 'messages', 'tools' and render "
                                   "options as top-level keys, or a bare list of messages.",
                       epilog=EPILOG_RENDER, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(r)
    r.add_argument("-f", "--format", choices=("text", "segments", "ids", "tokens"), default="text",
                   help="what to print (default: text); ids and tokens need --tokenizer")
    r.add_argument("--thinking", type=_bool, metavar="BOOL", help="override the request's thinking option")
    r.add_argument("--generation-prompt", type=_bool, metavar="BOOL", dest="add_generation_prompt",
                   help="override add_generation_prompt")

    p = sub.add_parser("parse", help="parse token ids (JSON array) or text back to a request",
                       description="Parse token ids or text back to a request (or, with --completion, to "
                                   "the assistant message a model generated).",
                       epilog=EPILOG_PARSE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    p.add_argument("--from", dest="source", choices=("ids", "text"), default=None,
                   help="input kind (default: ids when --tokenizer is given, else text)")
    p.add_argument("--completion", action="store_true",
                   help="the input is what a model generated after the generation prompt")
    p.add_argument("--thinking", type=_bool, metavar="BOOL",
                   help="with --completion: was the prompt in thinking mode (default: the template's)")
    p.add_argument("--lenient", action="store_true",
                   help="repair malformed input and report diagnostics instead of failing")
    i = sub.add_parser("inspect", help="show a rendered request token by token",
                       description="Render a chat request and show it token by token: offsets, ids, pieces, "
                                   "markers highlighted, a header per message with its role and token counts "
                                   "per channel. Plain text when piped.",
                       epilog=EPILOG_INSPECT, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(i)
    i.add_argument("--thinking", type=_bool, metavar="BOOL", help="override the request's thinking option")
    i.add_argument("--generation-prompt", type=_bool, metavar="BOOL", dest="add_generation_prompt",
                   help="override add_generation_prompt")
    i.add_argument("--colour", "--color", dest="colour", choices=("auto", "always", "never"), default="auto",
                   help="colour markers and text (default: auto, only on a terminal)")

    v = sub.add_parser("validate", help="check a template file: keys, markers, plugins, grammar, tokenizer, "
                                        "self-test",
                       description="Check a template and print every problem with its location and a hint, "
                                   "then a summary. Exit 0 when valid, 1 when not.",
                       epilog=EPILOG_VALIDATE, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("template", metavar="TEMPLATE", help="template file, or a built-in template name")
    v.add_argument("--tokenizer", metavar="PATH",
                   help="also check that every marker is one special id of this tokenizer (" + TOKENIZER_HELP + ")")
    v.add_argument("--add-markers", action="store_true",
                   help="add the template's markers to the tokenizer as special tokens first (a base model's "
                        "tokenizer): checks the rest and runs the self-test on its ids")
    v.add_argument("-f", "--format", choices=("text", "json"), default="text", help="output format (default: text)")
    v.add_argument("-n", "--examples", type=_count, default=50, metavar="N",
                   help="requests the self-test renders and parses back (default: 50; 0 skips it)")
    v.add_argument("--seed", type=int, default=0, metavar="S", help="self-test seed (default: 0)")
    _add_output(v)

    tp = sub.add_parser("templates", help="list the built-in templates and their files",
                        description="List the built-in templates with their files; copy one to start your own, "
                                    "or use xtml new-template.",
                        epilog=EPILOG_TEMPLATES, formatter_class=argparse.RawDescriptionHelpFormatter)
    tp.add_argument("-f", "--format", choices=("text", "json"), default="text", help="output format (default: text)")

    nt = sub.add_parser("new-template", help="write a commented starter template that validates",
                        description="Write a starter template file (every section, commented) for a new model.",
                        epilog=EPILOG_NEW, formatter_class=argparse.RawDescriptionHelpFormatter)
    nt.add_argument("name", metavar="NAME", help="the template's name")
    nt.add_argument("-o", "--output", metavar="FILE", dest="path", help="file to write (default: NAME.toml)")
    nt.add_argument("--force", action="store_true", help="overwrite an existing file")

    z = sub.add_parser("fuzz", help="fuzz a template: round trip, injection, stream == batch, never crash",
                       description="Run xtml's properties against a template with generated requests, "
                                   "adversarial text and random ids; print the smallest failing input as JSON.",
                       epilog=EPILOG_FUZZ, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_template(z)
    _add_tokenizer(z)
    z.add_argument("-n", "--examples", type=_positive, default=200, metavar="N",
                   help="examples per property (default: 200)")
    z.add_argument("--seed", type=int, metavar="S", help="seed, to repeat a run")
    dataset.add_commands(sub)
    return ap


_count = at_least(0)
_positive = at_least(1)


def _fuzz(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from .fuzz import run
    except ImportError as e:
        raise _UserError(f"xtml fuzz needs hypothesis ({e.name} is missing): pip install 'xtml[testing]'") from None
    tpl = load(args.template)
    vocab = _tokenizer(args, tpl) if args.tokenizer else None
    return run(tpl, vocab, examples=args.examples, seed=args.seed, out=out, err=sys.stderr)


def _request(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    request = _json(_read(args.file), "input" if args.file == "-" else args.file)
    options: dict[str, Any] = {}
    if args.thinking is not None:
        options["thinking"] = args.thinking
    if args.add_generation_prompt is not None:
        options["add_generation_prompt"] = args.add_generation_prompt
    return request, options


def _render(args: argparse.Namespace, out: TextIO) -> None:
    tpl = load(args.template)
    request, options = _request(args)
    if args.format == "text":
        out.write(tpl.render(request, **options).text + "\n")
    elif args.format == "segments":
        segs = tpl.render(request, **options).segments
        out.write(json.dumps([[s.text, s.special] for s in segs], ensure_ascii=False) + "\n")
    else:
        vocab = _tokenizer(args, tpl)
        if args.format == "ids":
            out.write(json.dumps(tpl.encode(request, vocab, **options)) + "\n")
        else:
            from .inspect import tokens, write

            write(out, tpl, tokens(tpl, request, vocab, **options))


def _inspect(args: argparse.Namespace, out: TextIO) -> None:
    from .inspect import tokens, write

    tpl = load(args.template)
    request, options = _request(args)
    vocab = _tokenizer(args, tpl)
    colour = None if args.colour == "auto" else args.colour == "always"
    write(out, tpl, tokens(tpl, request, vocab, **options), colour=colour)


def _validate(args: argparse.Namespace, out: TextIO) -> int:
    from ..testing.validate import validate

    report = validate(args.template, tokenizer=args.tokenizer, examples=args.examples, seed=args.seed,
                      add_markers=args.add_markers)
    if args.format == "json":
        out.write(report.dumps() + "\n")
    else:
        for f in report.findings:
            out.write(f"{f.line_text()}\n")
        out.write(report.summary() + "\n")
    return 0 if report.valid else 1


def _templates(args: argparse.Namespace, out: TextIO) -> None:
    from ..chat.dialect import BUILTIN, builtin_files

    files = builtin_files()
    aliases: dict[str, list[str]] = {}
    for name, file in BUILTIN.items():
        aliases.setdefault(file, []).append(name)
    rows = [{"name": names[0], "aliases": names[1:], "description": load(names[0]).dialect.description,
             "path": str(files[names[0]])} for names in aliases.values()]
    if args.format == "json":
        out.write(json.dumps(rows, ensure_ascii=False, indent=2) + "\n")
        return
    for r in rows:
        also = f" (also: {', '.join(r['aliases'])})" if r["aliases"] else ""
        out.write(f"{r['name']}{also}\n  {r['description']}\n  {r['path']}\n")
    from ..plugins import installed

    out.write(f"installed plugins: {', '.join(sorted(installed()))}\n")


def _new_template(args: argparse.Namespace, out: TextIO) -> None:
    from ..chat.dialect import starter_template
    from ..markup.header import is_name

    if not is_name(args.name):
        raise _UserError(f"{args.name!r} is not a valid template name (letters, digits, _ - . :)")
    path = args.path or f"{args.name}.toml"
    text = starter_template(args.name)
    if path == "-":
        out.write(text)
        return
    try:
        with open(path, "w" if args.force else "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise _UserError(f"{path} exists; pass --force to overwrite it") from None
    except OSError as e:
        raise _UserError(f"cannot write {path}: {e.strerror or e}") from None
    out.write(f"wrote {path}; check it with: xtml validate {path}\n")


def _parse(args: argparse.Namespace, out: TextIO) -> None:
    tpl = load(args.template)
    source = args.source or ("ids" if args.tokenizer else "text")
    raw = _read(args.file)
    data: Any
    vocab = None
    if source == "ids":
        data = _json(raw, "input" if args.file == "-" else args.file)
        if not isinstance(data, list) or not all(type(x) is int for x in data):
            raise _UserError("expected a JSON array of token ids")
        vocab = _tokenizer(args, tpl)
    else:
        # A trailing newline from an editor or `echo` is not part of the text.
        data = raw[:-1] if raw.endswith("\n") else raw
    result = tpl.parse(data, vocab, completion=args.completion, lenient=args.lenient, thinking=args.thinking)
    out.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    out: TextIO = sys.stdout
    handle = None
    try:
        if getattr(args, "output", None):
            try:
                handle = open(args.output, "w", encoding="utf-8")
            except OSError as e:
                raise _UserError(f"cannot write {args.output}: {e.strerror or e}") from None
            out = handle
        code = 0
        if args.command == "render":
            _render(args, out)
        elif args.command == "parse":
            _parse(args, out)
        elif args.command == "inspect":
            _inspect(args, out)
        elif args.command == "validate":
            code = _validate(args, out)
        elif args.command == "templates":
            _templates(args, out)
        elif args.command == "new-template":
            _new_template(args, out)
        elif args.command in dataset.COMMANDS:
            code = dataset.run(args, out)
        else:
            code = _fuzz(args, out)
        out.flush()
        return code
    except (XtmlError, _UserError) as e:
        print(f"xtml: error: {e}", file=sys.stderr)
        return 1
    except _UsageError as e:
        print(f"xtml: usage error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if handle is not None:
            handle.close()


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
