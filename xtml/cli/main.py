"""The ``xtml`` command.

``main(argv) -> int``: 0 on success, 1 on invalid input (one line on stderr,
no traceback), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .. import __version__
from ..chat.layout_pattern import Tok
from ..errors import ParseError, XtmlError
from ..template import LayoutTemplate, Rendered, Template, load
from ..vocab.load import load_tokenizer
from ..vocab.vocabulary import Vocabulary
from . import dataset, export, playground, serve
from .common import TOKENIZER_HELP, added_tokens, at_least, boolean, json_input, read_input, require
from .output import Output, UsageError

EPILOG_RENDER = """examples:
  xtml render examples/chat.json
  xtml render examples/chat.json --format segments
  xtml render examples/chat.json --tokenizer path/to/tokenizer.json --format ids
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
  xtml inspect examples/chat.json -t xtml-base --tokenizer tok.json --add-markers | less -R
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
  xtml render examples/chat.json --tokenizer tok.json --format ids | xtml parse --tokenizer tok.json
  xtml parse examples/prompt.txt --from text
  xtml parse output_ids.json --tokenizer tok.json --completion --lenient
  xtml parse output_ids.json --tokenizer tok.json --completion --openai           # a chat.completion object
  xtml parse output_ids.json --tokenizer tok.json --completion --openai --stream  # one chunk per line
  xtml parse examples/completion.txt --from text --tokenizer tok.json --completion --stream --sse
  xtml parse answer.txt -t glm-4.6 --completion --tools request.json     # arguments typed by the tools

--openai reads the completion leniently and prints what an OpenAI-compatible server returns for it
(docs/serving.md): a chat.completion object, or with --stream one chat.completion.chunk object per
line, as a server sends them token by token (--sse: as server-sent events, each "data: {...}" and a
blank line, ending with "data: [DONE]"). Streaming needs token ids: text is turned into ids with
--tokenizer (markers as special ids). Call ids are random, as OpenAI's.
"""


class _UserError(Exception):
    """Invalid input found by the CLI itself (a file it cannot read, say)."""


# Input files are read by one function for every command.
_read = read_input
_json = json_input


_bool = boolean


_UsageError = UsageError


def _tokenizer(args: argparse.Namespace, tpl: Template) -> Vocabulary:
    if not args.tokenizer:
        raise _UsageError("this needs --tokenizer PATH (a tokenizer.json, a tiktoken file, or a model folder)")
    extra = added_tokens(tpl) if args.add_markers else ()
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
                   help="what to print (default: text): the text form; [text, special] pairs; a JSON array of "
                        "token ids; or one token per line, its id, a tab and its piece as a JSON string (for "
                        "programs; xtml inspect is the view for people). ids and tokens need --tokenizer")
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
    p.add_argument("--tools", metavar="FILE",
                   help="with --completion: the request's tools (a JSON list, or a request holding one), which "
                        "type the arguments of a format that writes them untyped (glm-4.6's key/value pairs)")
    p.add_argument("--openai", action="store_true",
                   help="with --completion: print the OpenAI chat.completion object (lenient parse)")
    p.add_argument("--stream", action="store_true",
                   help="print the chat.completion.chunk objects, one per line (implies --openai)")
    p.add_argument("--sse", action="store_true",
                   help="as server-sent events: 'data: ' lines, then 'data: [DONE]' (implies --stream)")
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
    v.add_argument("-n", "--examples", type=_examples0, default=50, metavar="N",
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
    z.add_argument("-n", "--examples", type=_examples1, default=200, metavar="N",
                   help="examples per property (default: 200)")
    z.add_argument("--seed", type=int, metavar="S", help="seed, to repeat a run")
    dataset.add_commands(sub)
    export.add_commands(sub)
    serve.add_commands(sub)
    playground.add_commands(sub)
    return ap


_count = at_least(0)
_positive = at_least(1)
# A run of a million examples takes hours; past that a count is a typo.
_EXAMPLES = 1_000_000
_examples0 = at_least(0, _EXAMPLES, " examples")
_examples1 = at_least(1, _EXAMPLES, " examples")


def _fuzz(args: argparse.Namespace, out: TextIO) -> int:
    require("xtml fuzz", "testing", "hypothesis")
    from .fuzz import run

    tpl = load(args.template)
    vocab = _tokenizer(args, tpl) if args.tokenizer else None
    return run(tpl, vocab, examples=args.examples, seed=args.seed, out=out, err=sys.stderr)


def _request(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    request = _json(_read(args.file), "input" if args.file == "-" else args.file)
    # An unset flag is None, meaning "not given"; an option given as None
    # means something else (add_generation_prompt=None is false), so unset
    # flags are left out.
    flags = {"thinking": args.thinking, "add_generation_prompt": args.add_generation_prompt}
    return request, {k: v for k, v in flags.items() if v is not None}


def _render(args: argparse.Namespace, out: TextIO) -> None:
    tpl = load(args.template)
    request, options = _request(args)
    if args.format == "text":
        rendered = tpl.render(request, **options)
        _warn_ambiguous(tpl, request, options, rendered)
        _warn_dropped(rendered)
        out.write(rendered.text + "\n")
    elif args.format == "segments":
        rendered = tpl.render(request, **options)
        _warn_dropped(rendered)
        out.write(json.dumps([[s.text, s.special] for s in rendered.segments], ensure_ascii=False) + "\n")
    else:
        vocab = _tokenizer(args, tpl)
        ids = tpl.encode(request, vocab, **options)
        if isinstance(tpl, LayoutTemplate):
            _warn_dropped(tpl.render(request, **options))
        if args.format == "ids":
            out.write(json.dumps(ids) + "\n")
        else:
            # For programs (cut, awk, a diff of two renders): the token and its
            # piece, one per line. `xtml inspect` is the view for people.
            out.writelines(f"{t}\t{json.dumps(vocab.decode([t]), ensure_ascii=False)}\n" for t in ids)


def _warn_dropped(rendered: Rendered) -> None:
    """Say what the request held that a layout dialect's format does not
    write (its declared drops): never silent, in one line."""
    if rendered.dropped:
        what = ", ".join(dict.fromkeys(d.field if d.message < 0 else f"messages[{d.message}].{d.field}"
                                       for d in rendered.dropped))
        print(f"xtml: warning: the format does not write {what}: left out, as its own template leaves them out",
              file=sys.stderr)


def _warn_ambiguous(tpl: Template, request: Any, options: dict[str, Any], rendered: Rendered) -> None:
    """Say so when the text form does not read back as rendered: some text
    holds a marker literal (spec.md §5). Each is named where the user wrote
    it (``messages[0]``), not by its place among the rendered messages,
    which count the template's own."""
    found = rendered.ambiguous
    if not found:
        return
    where = _input_message(tpl, request, options, rendered)
    named = dict.fromkeys(where(a.message) for a in found)
    literals = ", ".join(dict.fromkeys(repr(a.marker) for a in found))
    print(f"xtml: warning: the text of {' and '.join(named)} holds marker literals ({literals}): read back as text "
          "it becomes markup; token ids read back exactly (--format ids)", file=sys.stderr)


def _input_message(tpl: Template, request: Any, options: dict[str, Any], rendered: Rendered) -> Callable[[int], str]:
    """A function from a message's place in ``rendered`` to its name in the
    request. Each input message renders as one message, in order, after the
    template's head (tools, thinking effort); with continue_final_message
    the last one is written at the very end, after the option messages."""
    from ..chat.render import RenderState, render_head
    from ..chat.request import prepare
    from ..markup.nodes import Element
    from ..markup.sink import TreeSink

    o, msgs = prepare(tpl.dialect, request, {**options, "max_chars": tpl.max_chars})
    sink = TreeSink()
    render_head(RenderState(tpl.dialect, o, sink))
    head = sum(isinstance(n, Element) for n in sink.finish())
    middle = len(msgs) - 1 if o.continue_final else len(msgs)
    last = sum(1 for s in rendered.segments if s.special and s.text == tpl.markers.end)

    def name(k: int) -> str:
        if head <= k < head + middle:
            return f"messages[{k - head}]"
        if o.continue_final and k == last:
            return f"messages[{len(msgs) - 1}]"
        return "the template's own messages (from the tools and options)"

    return name


def _inspect(args: argparse.Namespace, out: TextIO) -> None:
    from .inspect import tokens, write

    tpl = load(args.template)
    request, options = _request(args)
    vocab = _tokenizer(args, tpl)
    if args.colour == "auto":
        # Buffered until the command is done: the buffer is no terminal.
        stream = args.destination.stream
        colour = stream is not None and stream.isatty()
    else:
        colour = args.colour == "always"
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
    from ..chat.template_file import BUILTIN, LAYOUT_BUILTIN, builtin_files

    rows = []
    for engine, table, files in (("xtml", BUILTIN, builtin_files()),
                                 ("layout", LAYOUT_BUILTIN, builtin_files(layout=True))):
        aliases: dict[str, list[str]] = {}
        for name, file in table.items():
            aliases.setdefault(file, []).append(name)
        rows += [{"name": names[0], "aliases": names[1:], "engine": engine,
                  "description": load(names[0]).dialect.description, "path": str(files[names[0]])}
                 for names in aliases.values()]
    if args.format == "json":
        out.write(json.dumps(rows, ensure_ascii=False, indent=2) + "\n")
        return
    for r in rows:
        also = f" (also: {', '.join(r['aliases'])})" if r["aliases"] else ""
        kind = " (layout dialect)" if r["engine"] == "layout" else ""
        out.write(f"{r['name']}{also}{kind}\n  {r['description']}\n  {r['path']}\n")
    from ..plugins import broken, installed

    out.write(f"installed plugins: {', '.join(sorted(installed()))}\n")
    for why in sorted(broken().values()):
        out.write(f"  not usable: {why}\n")


def _new_template(args: argparse.Namespace, out: TextIO) -> None:
    from ..chat.template_file import starter_template
    from ..markup.header import is_name

    if not is_name(args.name):
        raise _UserError(f"{args.name!r} is not a valid template name (letters, digits, _ - . :)")
    path = f"{args.name}.toml" if args.path is None else args.path
    text = starter_template(args.name)
    target = Output(path)
    if target.stream is not None:
        out.write(text)
        return
    if not args.force and os.path.lexists(path):
        raise _UserError(f"{path} exists; pass --force to overwrite it")
    target.write_text(text)
    out.write(f"wrote {path}; check it with: xtml validate {path}\n")


def _parse(args: argparse.Namespace, out: TextIO) -> None:
    args.stream = args.stream or args.sse
    args.openai = args.openai or args.stream
    if args.openai and not args.completion:
        raise _UsageError("--openai reads what a model generated: add --completion")
    if args.thinking is not None and not args.completion:
        raise _UsageError("--thinking says how the prompt before a completion was rendered: add --completion")
    tpl = load(args.template)
    source = args.source or ("ids" if args.tokenizer else "text")
    raw = _read(args.file)
    data: Any
    vocab = None
    if source == "ids":
        data = _json(raw, "input" if args.file == "-" else args.file)
        if not isinstance(data, list):
            raise _UserError(f"expected a JSON array of token ids, not {type(data).__name__}")
        bad = next((k for k, x in enumerate(data) if type(x) is not int), None)
        if bad is not None:
            raise _UserError(f"expected a JSON array of token ids: element {bad} is {json.dumps(data[bad])[:40]}")
        vocab = _tokenizer(args, tpl)
    else:
        # A trailing newline from an editor or `echo` is not part of the text.
        data = raw.removesuffix("\n").removesuffix("\r") if raw.endswith("\n") else raw
    tools = _tools(args.tools)
    if args.openai:
        _openai(args, tpl, data, vocab, out, tools)
        return
    try:
        result = tpl.parse(data, vocab, completion=args.completion, lenient=args.lenient, thinking=args.thinking,
                           tools=tools)
    except ParseError as e:
        if args.completion or not _looks_like_completion(tpl, data, vocab) or (
                vocab is not None and any(not 0 <= t < vocab.size for t in data)):
            raise  # an id past the vocabulary is the error, wherever the input starts
        raise _UserError(f"{e}; {_COMPLETION_HINT}") from None
    if not args.completion and result.get("diagnostics") and _looks_like_completion(tpl, data, vocab):
        print(f"xtml: hint: {_COMPLETION_HINT}", file=sys.stderr)
    out.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")


_COMPLETION_HINT = ("the input starts inside a message, as what a model generates after the generation prompt "
                    "does: to read it as a completion, add --completion")


def _looks_like_completion(tpl: Template, data: Any, vocab: Vocabulary | None) -> bool:
    """Whether the input starts otherwise than a document does (with an open
    tag): text or a close tag, as a completion starts inside the prompt's
    channel."""
    if isinstance(tpl, LayoutTemplate):
        # A prompt of a layout dialect starts with its frame's first token.
        first = tpl.layout.frame_open.items[0] if tpl.layout.frame_open.items else None
        opening = first.token if isinstance(first, Tok) else ""
        if isinstance(data, str):
            return bool(data.strip()) and bool(opening) and not data.lstrip().startswith(opening)
        if not data or vocab is None or not 0 <= data[0] < vocab.size:
            return False
        return bool(data[0] != tpl.bind(vocab).token_ids.get(opening))
    if isinstance(data, str):
        return bool(data.strip()) and not data.lstrip().startswith(tpl.markers.open)
    if not data or vocab is None or not 0 <= data[0] < vocab.size:
        return False
    return tpl.bind(vocab).kind_of_id.get(data[0], ("", ""))[1] != tpl.markers.open


def _tools(path: str | None) -> Any:
    """The tools ``--tools`` names: a JSON list, or a request holding one."""
    if path is None:
        return None
    found = _json(_read(path), path)
    if isinstance(found, dict):
        found = found.get("tools")
    if not isinstance(found, list):
        raise _UserError(f"{path}: expected a JSON list of tools, or a request with \"tools\"")
    return found


def _openai(args: argparse.Namespace, tpl: Template, data: Any, vocab: Vocabulary | None, out: TextIO,
            tools: Any = None) -> None:
    from ..serving.openai import SSE_DONE, ChunkStream, chat_completion, sse

    model = tpl.name
    if not args.stream:
        parsed = tpl.parse(data, vocab, completion=True, lenient=True, thinking=args.thinking, tools=tools)
        out.write(json.dumps(chat_completion(parsed, model=model), ensure_ascii=False, indent=2) + "\n")
        return
    if vocab is None:
        if not args.tokenizer:
            raise _UsageError("--stream streams token ids: give --tokenizer (text is turned into ids with it)")
        vocab = _tokenizer(args, tpl)
        data = tpl.completion_ids(data, vocab)
    parser = tpl.stream(vocab, thinking=args.thinking, tools=tools)
    chunks = ChunkStream(model=model, template=tpl)
    # Token by token, as a server streams: each chunk is what one token completed.
    for events in (*(parser.feed(t) for t in data), parser.close()):
        for c in chunks.feed(events):
            out.write(sse(c) if args.sse else json.dumps(c, ensure_ascii=False) + "\n")
    if args.sse:
        out.write(SSE_DONE)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            try:
                return _run(args)
            finally:
                # A library warning (a plugin shadowed by a built-in, say) as
                # one line, like every other message of the command.
                for w in caught:
                    print(f"xtml: warning: {w.message}", file=sys.stderr)
    except (XtmlError, _UserError) as e:
        print(f"xtml: error: {e}", file=sys.stderr)
        return 1
    except _UsageError as e:
        print(f"xtml: usage error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as e:
        # Writing what a command reports (standard output on a full disk,
        # say): the system's reason, in one line. Files a command reads or
        # writes by name say so in their own errors.
        what = f"{e.filename}: " if e.filename else "cannot write the output: "
        print(f"xtml: error: {what}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# The commands whose output is kept until they are done: a failure writes
# nothing, and a file may be both their input and their output. The others
# report as they go.
_BUFFERED = ("render", "parse", "inspect", "validate", "templates", "new-template", "export")


def _run(args: argparse.Namespace) -> int:
    # Checked before any input is read.
    if getattr(args, "add_markers", False) and not getattr(args, "tokenizer", None):
        raise _UsageError("--add-markers adds the template's markers to a tokenizer: add --tokenizer PATH")
    output = getattr(args, "output", None)
    args.destination = Output("-" if output is None else output)
    out: TextIO = io.StringIO() if args.command in _BUFFERED else sys.stdout
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
        if args.command == "render-dataset":
            # Checked before the template and tokenizer take their time to load.
            require("xtml render-dataset", "data", "pyarrow")
        code = dataset.run(args, out)
    elif args.command in export.COMMANDS:
        code = export.run(args, out)
    elif args.command in serve.COMMANDS:
        code = serve.run(args, out)
    elif args.command in playground.COMMANDS:
        code = playground.run(args, out)
    else:
        code = _fuzz(args, out)
    if isinstance(out, io.StringIO):
        args.destination.write_text(out.getvalue())
    else:
        out.flush()
    return code


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
