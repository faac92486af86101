"""``xtml playground``: the page that shows a chat as the model sees it
(:mod:`xtml.playground`). Starlette and uvicorn are imported only when the
command runs: they are the optional ``serve`` extra."""

from __future__ import annotations

import argparse
from typing import Any, TextIO
from urllib.parse import quote

from ..template import load
from ..vocab.load import load_tokenizer
from .common import TOKENIZER_HELP, added_tokens, require
from .output import UsageError
from .serve import SERVE_MODULES, port_number, serve_app

COMMANDS = ("playground",)

EPILOG = """examples:
  xtml playground                                   # http://127.0.0.1:8765, a small tokenizer made on the spot
  xtml playground --tokenizer path/to/model -t kimi-k3
  xtml playground --tokenizer tok.json --add-markers -t my-model.toml --port 9000
  xtml playground -t qwen3 --tokenizer model.gguf      # a layout dialect: render, parse and stream views

Open the address it prints in a browser. The page renders examples/chat.json to start with: edit the
request, pick a template (or paste one), and look at its tokens, the training mask, a parse of a
completion, the stream replayed delta by delta, and the tokens the completion grammar allows next (with
llguidance installed). It loads nothing from another host. It listens on 127.0.0.1 unless --host says
otherwise: the page runs whatever templates and requests it is sent, so keep it off shared networks.
It answers only requests that name the address it listens on (a page of another site is refused) and
JSON sent as such; with --api-key (or XTML_API_KEY) its API also needs the key, and it prints the
address to open with the key in it (after #, which a browser never sends: the page keeps it).
"""


def add_commands(sub: Any) -> None:
    """Add ``playground`` to the ``xtml`` parser."""
    p = sub.add_parser("playground", help="a page in the browser that shows a chat token by token: render, "
                                          "training mask, parse, stream, grammar",
                       description="Serve the xtml playground: one page and the JSON API behind it.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="the template the page opens with: a built-in name or a template file (default: kimi-k3)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help=TOKENIZER_HELP + " (default: a small byte-level BPE made on the spot, with the "
                                         "template's markers)")
    p.add_argument("--add-markers", action="store_true",
                   help="add the template's markers to the tokenizer as special tokens (a base model's tokenizer)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8765, help="port to listen on (default: 8765; 0: any free one)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another host name the page may be reached by (a proxy's, say); repeat for more. The "
                        "address it listens on, localhost and the loopback addresses are always allowed")
    p.add_argument("--api-key", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on the API (/api/*); the page takes the key from the "
                        "address printed. Default: the XTML_API_KEY environment variable, which, unlike the command "
                        "line, other users of the machine cannot read; none: no key is asked for")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="warning",
                   help="uvicorn's log level (default: warning)")


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the playground until interrupted; returns the exit status."""
    require("xtml playground", "serve", *SERVE_MODULES)
    from ..playground.app import create_app
    from ..serving.auth import API_KEY_ENV, api_key_from, check_api_key
    from ..serving.limits import Limits

    key = api_key_from(args.api_key)
    if key is not None:
        try:
            check_api_key(key)
        except ValueError as e:
            raise UsageError(f"{'--api-key' if args.api_key is not None else API_KEY_ENV}: {e}") from None

    tpl = load(args.template)  # a bad template file is one line, before anything listens
    vocab = None
    if args.tokenizer:
        vocab = load_tokenizer(args.tokenizer, add_special_tokens=added_tokens(tpl) if args.add_markers else ())
        tpl.bind(vocab)
    name = None
    if args.tokenizer:
        name = args.tokenizer + (" (markers added)" if args.add_markers else "")
    app = create_app(vocab, template=args.template, tokenizer_name=name, host=args.host,
                     allow_hosts=args.allow_host, api_key=key)

    def banner(url: str) -> str:
        if key is None:
            return f"xtml playground: {url}"
        # The fragment stays in the browser: the page reads the key from it,
        # keeps it for the tab, and takes it out of the address bar.
        return f"xtml playground: {url}\nxtml playground: open {url}#key={quote(key, safe='')}"

    return serve_app(app, args.host, args.port, Limits(), args.log_level, banner)
