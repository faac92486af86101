"""``xtml export grammar``: the grammar of a completion for constrained
decoding (:mod:`xtml.codec.completion`, through the facade)."""

from __future__ import annotations

import argparse
import itertools
import json
import re
from typing import Any, TextIO

from ..codec.completion import FORMATS, MAX_CALLS
from ..exports.jinja import jinja_template
from ..template import load
from ..vocab.load import load_tokenizer
from .common import TOKENIZER_HELP, InputError, added_tokens, at_least, boolean, json_input, read_input
from .output import UsageError

COMMANDS = ("export",)

EPILOG = """examples:
  xtml export grammar request.json --tokenizer path/to/model > grammar.lark
  xtml export grammar request.json --format xgrammar --tokenizer tok.json -o grammar.ebnf
  xtml export grammar request.json --format xgrammar-tag --tokenizer tok.json -o tag.json
  xtml export grammar request.json --format gbnf --tokenizer tok.json -o grammar.gbnf
  xtml export grammar request.json -t xtml-base --tokenizer tok.json --add-markers --thinking true

The llguidance grammar is Lark text: llguidance.LLMatcher(LLTokenizer, text) loads it as it is
(--json prints it as llguidance's {"grammars": [{"lark_grammar": ...}]} instead). The xgrammar
grammar is EBNF for xgrammar.Grammar.from_ebnf; xgrammar-tag is an xgrammar structural tag (JSON for
xgrammar.Grammar.from_structural_tag, vLLM's structured_outputs "structural_tag", SGLang's
response_format {"type": "structural_tag", ...}); the gbnf grammar is GBNF for llama.cpp's own grammar
sampler (llama-server's "grammar" field, --grammar-file). Their headers (the structural tag's "xtml"
member) list what they cannot express.
"""


def add_commands(sub: Any) -> None:
    """Add ``export`` (with its ``grammar`` subcommand) to the ``xtml`` parser."""
    e = sub.add_parser("export", help="export what a template knows to other tools: grammar (the grammar of a "
                                      "completion, for constrained decoding: llguidance, xgrammar, xgrammar-tag, "
                                      "gbnf), jinja (a Jinja chat template), hf (a Hugging Face tokenizer folder)",
                       description="Export what a template knows to other tools, in their own formats: "
                                   "grammar (--format llguidance, xgrammar, xgrammar-tag or gbnf: the grammar of a "
                                   "completion of one request, for constrained decoding), jinja (the template as a "
                                   "Jinja chat template), hf (a Hugging Face tokenizer folder: tokenizer.json, the "
                                   "chat template and a response template). docs/exports.md and docs/grammar.md "
                                   "say who reads each.")
    what = e.add_subparsers(dest="what", required=True, metavar="WHAT")
    g = what.add_parser(
        "grammar", help="the grammar of everything the assistant may generate after the generation prompt",
        description="Print the token-level grammar of a completion of REQUEST (a chat-completions body, as "
                    "xtml render takes): the channels in the template's order, calls to the request's tools "
                    "only with arguments typed by their JSON schemas, tool_choice, parallel_tool_calls and "
                    "response_format, the close of the message and its end marker. Markers are special-token "
                    "references, never text.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("file", metavar="REQUEST", help="a request (JSON), or - for stdin")
    g.add_argument("-f", "--format", choices=FORMATS, default="llguidance",
                   help="llguidance (Lark text, default), xgrammar (EBNF), xgrammar-tag (an xgrammar structural "
                        "tag, JSON) or gbnf (llama.cpp's GBNF)")
    g.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="built-in template name or template file (default: kimi-k3)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="checks every marker is one special token, and gives the ids of markers referenced by id "
                        "(needed by every format but llguidance, and for markers not spelled <...>): " + TOKENIZER_HELP)
    g.add_argument("--add-markers", action="store_true",
                   help="add the template's markers to the tokenizer as special tokens first")
    g.add_argument("--thinking", type=_bool, metavar="BOOL", help="override the request's thinking option")
    g.add_argument("--max-calls", type=at_least(1, 4096, " (each index is spelled out in the grammar)"),
                   default=MAX_CALLS, metavar="N",
                   help=f"calls one message may make (default: {MAX_CALLS})")
    g.add_argument("--no-json-fallback", dest="json_fallback", action="store_false",
                   help="refuse the json block in calls (arguments then go key by key)")
    g.add_argument("--token-refs", choices=("auto", "name", "id"), default="auto",
                   help="llguidance: write markers as <|name|> (name), <[id]> (id), or by name when they are "
                        "spelled <...> (auto, default)")
    g.add_argument("--json", action="store_true",
                   help="llguidance: print the grammar as {\"grammars\": [{\"lark_grammar\": ...}]}")
    g.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    j = what.add_parser(
        "jinja", help="the template as a Jinja chat template (transformers, vLLM, llama.cpp --jinja, the hub)",
        description="Print the template as a Jinja chat template, written from its dialect file: it reads "
                    "messages, tools, add_generation_prompt and the template's options as keyword arguments "
                    "(thinking, thinking_effort, reasoning_effort, tool_choice, response_format, response_schema, "
                    "image_prompts, continue_final_message), and renders what xtml renders or raises where xtml "
                    "refuses the request or Jinja cannot do what xtml does (tool-call arguments given as a JSON "
                    "string; media prompts xtml computes). A layout dialect's template (smollm2, qwen3, ...) reads "
                    "the dialect's own options under the official template's names (enable_thinking for qwen3). "
                    "docs/exports.md says what each engine hands the template and what a Jinja template cannot "
                    "give.",
        epilog="examples:\n  xtml export jinja > chat_template.jinja\n  xtml export jinja -t my-format.toml -o "
               "chat_template.jinja", formatter_class=argparse.RawDescriptionHelpFormatter)
    j.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="built-in template name or template file (default: kimi-k3)")
    j.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    h = what.add_parser(
        "hf", help="a Hugging Face tokenizer folder: tokenizer.json with the markers, the chat template and the "
                   "response template (works with no xtml installed)",
        description="Write DIR as a Hugging Face tokenizer folder: tokenizer.json (the tokenizer, the template's "
                    "markers as special tokens), tokenizer_config.json (chat_template: the template as Jinja; "
                    "response_template: transformers' spec to parse a completion; none for a layout dialect) and "
                    "XTML.md (what the folder cannot do that xtml does). AutoTokenizer.from_pretrained(DIR) "
                    "loads it. A tiktoken vocabulary is converted and checked id for id, or refused. DIR must be "
                    "new or empty (--force replaces only the files this writes). docs/exports.md has the details.",
        epilog="examples:\n  xtml export hf k3-tokenizer --tokenizer path/to/model\n"
               "  xtml export hf base-tokenizer -t xtml-base --tokenizer tokenizer.json --add-markers",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_argument("folder", metavar="DIR", help="the folder to write (new, or empty)")
    h.add_argument("--tokenizer", metavar="PATH", required=True, help=TOKENIZER_HELP)
    h.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="built-in template name or template file (default: kimi-k3)")
    h.add_argument("--add-markers", action="store_true",
                   help="add the template's markers to the tokenizer as special tokens first")
    h.add_argument("--force", action="store_true",
                   help="write into a folder that is not empty, replacing only the files this export writes")


_bool = boolean


def _request(path: str) -> Any:
    return json_input(read_input(path), "standard input" if path == "-" else path)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``xtml export``; returns the exit status."""
    if args.what == "jinja":
        out.write(jinja_template(load(args.template).dialect))
        return 0
    if args.what == "hf":
        from ..exports.hf import FILES, export_hf

        template = load(args.template)
        loaded = load_tokenizer(args.tokenizer, add_special_tokens=added_tokens(template) if args.add_markers else ())
        folder = export_hf(template, loaded, args.folder, force=args.force)
        out.write(f"wrote {', '.join(FILES)} to {folder}\n")
        return 0
    if args.format != "llguidance" and not args.tokenizer:
        raise UsageError(f"--format {args.format} writes markers by token id: it needs --tokenizer PATH")
    if args.json and args.format != "llguidance":
        raise UsageError("--json is for --format llguidance")
    tpl = load(args.template)
    request = _request(args.file)
    vocab = None
    if args.tokenizer:
        vocab = load_tokenizer(args.tokenizer, add_special_tokens=added_tokens(tpl) if args.add_markers else ())
    options: dict[str, Any] = {}
    if args.thinking is not None:
        options["thinking"] = args.thinking
    text = tpl.completion_grammar(request, vocab, format=args.format, max_calls=args.max_calls,
                              json_fallback=args.json_fallback, token_refs=args.token_refs, **options)
    if args.format == "llguidance":
        _check_with_llguidance(text)
    if args.json:
        text = json.dumps({"grammars": [{"lark_grammar": text}]}, ensure_ascii=False) + "\n"
    out.write(text if text.endswith("\n") else text + "\n")
    return 0


def _check_with_llguidance(text: str) -> None:
    """Compile the grammar with llguidance, when it is installed: what an
    engine would refuse at its first request (a tool schema's pattern that
    is no regular expression, a $ref to nowhere) is refused here, in one
    line, instead."""
    try:
        import llguidance
    except ImportError:
        return
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(llguidance.grammar_from("lark", text))
    if failed:
        # llguidance quotes the grammar's lines ("  17 | ...") after its
        # message: the message and where it points are what a person needs.
        lines = (messages[0] if messages else "no reason given").splitlines()
        head = " ".join(x.strip() for x in itertools.takewhile(lambda x: not _QUOTED.match(x), lines) if x.strip())
        raise InputError(f"llguidance cannot compile this grammar: {head}")


_QUOTED = re.compile(r"\s*\d+ \|")
