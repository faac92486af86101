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

from . import __version__
from .errors import XtmlError
from .template import Template, load
from .tokenizer import Vocabulary, load_tokenizer

EPILOG_RENDER = """examples:
  xtml render examples/chat.json
  xtml render chat.json --format segments
  xtml render chat.json --tokenizer path/to/tokenizer.json --format ids
  echo '[{"role": "user", "content": "hi"}]' | xtml render - --thinking false
"""

EPILOG_FUZZ = """examples:
  xtml fuzz
  xtml fuzz --template my-model.toml --tokenizer path/to/model --examples 1000 --seed 7
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


def _tokenizer(args: argparse.Namespace, tpl: Template) -> Vocabulary:
    if not args.tokenizer:
        raise _UserError("this needs --tokenizer PATH (a tokenizer.json or a folder with one)")
    extra = tpl.markers.all() if args.add_markers else ()
    return load_tokenizer(args.tokenizer, add_special_tokens=extra)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", default="-", help="input file, or - for stdin (default)")
    p.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="built-in template name or template file (default: kimi-k3)")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json, or a model folder holding one")
    p.add_argument("--add-markers", action="store_true",
                   help="add the template's markers to the tokenizer as special tokens "
                        "(for fine-tuning a base model on XTML)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="xtml", description="Render chat requests to XTML and parse them back.")
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
    z = sub.add_parser("fuzz", help="fuzz a template: round trip, injection, stream == batch, never crash",
                       description="Run xtml's properties against a template with generated requests, "
                                   "adversarial text and random ids; print the smallest failing input as JSON.",
                       epilog=EPILOG_FUZZ, formatter_class=argparse.RawDescriptionHelpFormatter)
    z.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="built-in template name or template file (default: kimi-k3)")
    z.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or model folder (without: text form only)")
    z.add_argument("--add-markers", action="store_true", help="add the template's markers as special tokens")
    z.add_argument("-n", "--examples", type=_positive, default=200, metavar="N",
                   help="examples per property (default: 200)")
    z.add_argument("--seed", type=int, metavar="S", help="seed, to repeat a run")
    return ap


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {s!r}")
    return v


def _fuzz(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from .fuzz import run
    except ImportError as e:
        raise _UserError(f"xtml fuzz needs hypothesis ({e.name} is missing): pip install 'xtml[testing]'") from None
    tpl = load(args.template)
    vocab = _tokenizer(args, tpl) if args.tokenizer else None
    return run(tpl, vocab, examples=args.examples, seed=args.seed, out=out, err=sys.stderr)


def _render(args: argparse.Namespace, out: TextIO) -> None:
    tpl = load(args.template)
    request = _json(_read(args.file), "input" if args.file == "-" else args.file)
    options: dict[str, Any] = {}
    if args.thinking is not None:
        options["thinking"] = args.thinking
    if args.add_generation_prompt is not None:
        options["add_generation_prompt"] = args.add_generation_prompt
    if args.format == "text":
        out.write(tpl.render(request, **options).text + "\n")
    elif args.format == "segments":
        segs = tpl.render(request, **options).segments
        out.write(json.dumps([[s.text, s.special] for s in segs], ensure_ascii=False) + "\n")
    else:
        vocab = _tokenizer(args, tpl)
        ids = tpl.encode(request, vocab, **options)
        if args.format == "ids":
            out.write(json.dumps(ids) + "\n")
        else:
            _tokens(ids, tpl, vocab, out)


def _tokens(ids: list[int], tpl: Template, vocab: Vocabulary, out: TextIO) -> None:
    b = tpl.bind(vocab)
    markers = set(b.kind_of_id)
    colour = out.isatty()
    for i, t in enumerate(ids):
        piece = vocab.decode([t])
        shown = json.dumps(piece, ensure_ascii=False)
        if t in markers and colour:
            shown = f"\x1b[1;36m{piece}\x1b[0m"
        elif t in markers:
            shown = piece
        out.write(f"{i:>6} {t:>8} {shown}\n")


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
        else:
            code = _fuzz(args, out)
        out.flush()
        return code
    except (XtmlError, _UserError) as e:
        print(f"xtml: error: {e}", file=sys.stderr)
        return 1
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
