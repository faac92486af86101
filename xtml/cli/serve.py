"""``xtml serve``: the OpenAI-compatible gateway in front of a token-id
engine (the gateway itself is :mod:`xtml.serving.gateway`). Starlette
and uvicorn are imported only when the command runs: they are the optional
``serve`` extra."""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import CallerError
from ..template import load
from ..vocab.load import load_tokenizer
from .common import TOKENIZER_HELP, added_tokens, extra_missing, require
from .output import UsageError

if TYPE_CHECKING:
    from ..serving.limits import Limits

COMMANDS = ("serve",)

SERVE_MODULES = ("starlette", "uvicorn", "httptools", "aiohttp", "orjson")
"""What the gateway cannot run without: the serve extra less uvloop, which
uvicorn uses only when it is there (httptools is needed: the HTTP limits,
xtml.serving.limits, are kept by uvicorn's httptools protocol)."""

UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20, "mb": 1000 ** 2,
         "g": 1 << 30, "gib": 1 << 30, "gb": 1000 ** 3}
"""Units of a size on the command line: K, M, G and KiB, MiB, GiB are powers
of 1024, kB, MB, GB powers of 1000 (case does not matter)."""

KINDS = ("vllm", "sglang", "llamacpp")
"""xtml.serving.engines.KINDS, spelled out: the serving modules are
imported only when the command runs."""

EPILOG = """examples:
  vllm serve MODEL --port 8001 --structured-outputs-config.backend guidance &
  xtml serve --backend http://127.0.0.1:8001 --tokenizer path/to/model -t kimi-k3
  xtml serve --backend http://127.0.0.1:30000 --backend-kind sglang --tokenizer tok.json
  xtml serve --backend http://127.0.0.1:8080 --backend-kind llamacpp --tokenizer tok.json --port 9000

Then point any OpenAI client at http://127.0.0.1:8000/v1. The gateway renders each request to token
ids with the template, sends the ids to the engine, and parses the ids that come back (streamed or
whole) into OpenAI objects: chat completions, or the Responses API (POST /v1/responses, whose
previous_response_id is served from the responses kept in this process).

A request that names a tool in tool_choice, sets it to "required", or
asks for a response_format, or sets tool_choice to "none" while declaring tools, also sends the
engine the grammar of the completion, unless --no-grammar: llguidance Lark for vllm and sglang (the
engine needs its llguidance backend), GBNF for llamacpp (--grammar-format llguidance for a llama.cpp
built with llguidance). docs/serving.md has the details.
"""


class ServeError(CallerError):
    """What keeps the gateway from starting."""


def add_commands(sub: Any) -> None:
    """Add ``serve`` to the ``xtml`` parser."""
    s = sub.add_parser("serve", help="an OpenAI-compatible chat endpoint in front of an engine that takes token ids "
                                     "(vLLM, SGLang, llama.cpp)",
                       description="Serve POST /v1/chat/completions and POST /v1/responses (streamed and "
                                   "not), GET /v1/models and GET /health, rendering and parsing with an XTML "
                                   "template on token ids.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--backend", required=True, metavar="URL",
                   help="the engine's base URL, e.g. http://127.0.0.1:8001")
    s.add_argument("--tokenizer", required=True, metavar="PATH", help=TOKENIZER_HELP)
    s.add_argument("-t", "--template", default="kimi-k3", metavar="NAME|PATH",
                   help="built-in template name or template file (default: kimi-k3)")
    s.add_argument("--add-markers", action="store_true",
                   help="add the template's markers to the tokenizer as special tokens first (a model "
                        "fine-tuned on XTML from a base tokenizer)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    s.add_argument("--port", type=port_number, default=8000, help="port to listen on (default: 8000; 0: any free one)")
    s.add_argument("--backend-kind", choices=KINDS, default="vllm",
                   help="the engine's API: vllm (POST /v1/completions, default), sglang (POST /generate) or "
                        "llamacpp (POST /completion)")
    s.add_argument("--backend-model", metavar="NAME",
                   help="the model name sent to the engine, and the name served in /v1/models and responses "
                        "(default: none is sent; the template's name is served)")
    s.add_argument("--backend-timeout", type=_seconds, default=600.0, metavar="SECONDS",
                   help="longest wait on the engine: to connect, and between two reads (default: 600); past it "
                        "the request fails with 504")
    s.add_argument("--no-grammar", dest="grammar", action="store_false",
                   help="never send the engine a completion grammar")
    s.add_argument("--grammar-format", choices=("llguidance", "gbnf"),
                   help="the completion grammar's syntax: gbnf (llama.cpp's own grammar sampler; the default for "
                        "llamacpp, whose builds mostly lack llguidance) or llguidance (Lark for the engine's "
                        "llguidance backend; the default for vllm and sglang, and for a llama.cpp built with "
                        "LLAMA_LLGUIDANCE)")
    limits = s.add_argument_group("limits", "What one client can make the server hold. SIZE is bytes, or a "
                                            "number with a unit: K, M, G (KiB, MiB, GiB: powers of 1024) or kB, "
                                            "MB, GB (powers of 1000)")
    limits.add_argument("--max-body", type=_size, default=32 << 20, metavar="SIZE",
                        help="largest request body (default: 32MiB); past it the answer is 413, before the rest "
                             "is read")
    limits.add_argument("--max-header-size", type=_size, default=64 << 10, metavar="SIZE",
                        help="largest request line and headers of a request (default: 64KiB); past it: 431")
    limits.add_argument("--max-header-lines", type=_count, default=100, metavar="N",
                        help="most header lines in a request (default: 100); past it: 431")
    limits.add_argument("--header-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                        help="longest time to receive a request's line and headers, from the connection's start "
                             "or the request's first byte (default: 10); past it: 408 and the connection closed")
    limits.add_argument("--body-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                        help="longest time a request body may send nothing (default: 30); past it: 408 and the "
                             "connection closed")
    limits.add_argument("--max-connections", type=_count, default=1000, metavar="N",
                        help="most connections open at once (default: 1000); one more is answered 503 and closed")
    store = s.add_argument_group("responses", "The Responses API (POST /v1/responses) keeps each response made "
                                              "with store true (the default, as OpenAI's) in this process, for a "
                                              "later request's previous_response_id")
    store.add_argument("--store-entries", type=_entries, default=1000, metavar="N",
                       help="most responses kept (default: 1000; the oldest goes first; 0: none)")
    store.add_argument("--store-age", type=_seconds, default=3600.0, metavar="SECONDS",
                       help="longest time a response is kept (default: 3600)")
    store.add_argument("--store-bytes", type=_store_bytes, default=256 << 20, metavar="SIZE",
                       help="most bytes of responses kept, as JSON (default: 256MiB; the oldest goes first; a "
                            "larger response is not kept)")
    s.add_argument("--api-key", metavar="KEY",
                   help="answer 401 to every request but GET /health that lacks 'Authorization: Bearer KEY' (the "
                        "openai SDK's api_key); default: the XTML_API_KEY environment variable, which, unlike the "
                        "command line, other users of the machine cannot read; none: no key is asked for")
    s.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="uvicorn's log level (default: info)")


def port_number(s: str) -> int:
    # The socket layer takes a port modulo 65536: 70000 would listen on 4464.
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, 0 to 65535, not {s!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number, 0 to 65535, not {s!r}")
    return v


def _seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, not {s!r}")
    return v


def _size(s: str) -> int:
    number = s.strip().rstrip("bBiIkKmMgG")
    unit = s.strip()[len(number):].lower()
    if unit not in UNITS:
        raise argparse.ArgumentTypeError(f"expected a size (bytes, or a number with K, M, G, KiB, MiB, GiB, kB, MB "
                                         f"or GB), not {s!r}")
    try:
        v = float(number) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size (bytes, or a number with a unit), not {s!r}") from None
    if not 1 <= v < 1 << 62:
        raise argparse.ArgumentTypeError(f"expected a size of at least 1 byte, not {s!r}")
    return int(v)


def _store_bytes(s: str) -> int:
    return 0 if s.strip() == "0" else _size(s)


def _whole_number(least: int, what: str) -> Callable[[str], int]:
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = least - 1
        if v < least:
            raise argparse.ArgumentTypeError(f"expected {what}, not {s!r}")
        return v
    return parse


_entries = _whole_number(0, "a whole number, 0 or more")
_count = _whole_number(1, "a positive whole number")


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``xtml serve`` until interrupted; returns the exit status."""
    if not args.backend.startswith(("http://", "https://")):
        raise UsageError(f"--backend must be an http:// or https:// URL, not {args.backend!r}")
    require("xtml serve", "serve", *SERVE_MODULES)
    try:
        from ..serving.auth import API_KEY_ENV, api_key_from, check_api_key
        from ..serving.gateway import check_backend_url, create_app
        from ..serving.limits import Limits
    except ImportError as e:
        if (e.name or "").partition(".")[0] == "xtml":
            raise
        raise ServeError(extra_missing("xtml serve", "serve", e.name or "a module")) from None
    if args.grammar_format == "gbnf" and args.backend_kind != "llamacpp":
        raise UsageError(f"--grammar-format gbnf is llama.cpp's syntax: the {args.backend_kind} backend takes "
                         "llguidance grammars")
    check_backend_url(args.backend)  # before the tokenizer takes its time to load
    api_key = api_key_from(args.api_key)
    if api_key is not None:
        try:
            check_api_key(api_key)
        except ValueError as e:
            where = "--api-key" if args.api_key is not None else API_KEY_ENV
            raise UsageError(f"{where}: {e}") from None
    tpl = load(args.template)
    vocab = load_tokenizer(args.tokenizer, add_special_tokens=added_tokens(tpl) if args.add_markers else ())
    # Markers that do not fit the tokenizer are found now, not at the first request.
    tpl.bind(vocab)
    # tiktoken's BPE for the vocabulary's text (a second or two), made now
    # rather than in the middle of a request once a million characters in.
    vocab.fast_bpe()
    app = create_app(tpl, vocab, args.backend, kind=args.backend_kind, backend_model=args.backend_model,
                     timeout=args.backend_timeout, grammar=args.grammar,
                     grammar_format=args.grammar_format, max_body=args.max_body,
                     store_entries=args.store_entries, store_age=args.store_age, store_bytes=args.store_bytes,
                     api_key=api_key)
    limits = Limits(header_bytes=args.max_header_size, header_lines=args.max_header_lines,
                    header_timeout=args.header_timeout, body_idle=args.body_timeout,
                    connections=args.max_connections)
    return serve_app(app, args.host, args.port, limits, args.log_level,
                     lambda url: f"xtml serve: {url}v1 in front of {args.backend_kind} at {args.backend}"
                                 + (" (API key required)" if api_key is not None else ""))


def serve_app(app: Any, host: str, port: int, limits: Limits, log_level: str, banner: Callable[[str], str]) -> int:
    """Serve ``app`` with uvicorn under ``limits`` until interrupted, after
    printing ``banner`` of the address it listens on (``http://host:port/``)."""
    import uvicorn

    from ..serving.gateway import KEEP_ALIVE
    from ..serving.limits import protocol

    # Listening before uvicorn starts: an address in use or a host that is
    # not this machine's is one line, not uvicorn's log and exit status.
    socks = listen(host, port)
    bound, bound_port = socks[0].getsockname()[:2]
    shown = f"[{bound}]" if ":" in bound else bound
    print(banner(f"http://{shown}:{bound_port}/"), file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_keep_alive=KEEP_ALIVE,
                                           http=protocol(limits)))
    try:
        server.run(sockets=socks)
    finally:
        for sock in socks:
            sock.close()
    return 0


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (both of
    ``localhost``'s, say; all interfaces for ""), as uvicorn's own binding
    does; port 0 takes the first socket's port for the others."""
    where = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise ServeError(f"cannot listen on {where}: {getattr(e, 'strerror', None) or e}") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, addr in dict.fromkeys((f, k, p, a) for f, k, p, _, a in infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and len(infos) > 1:
                # IPv6 apart from IPv4, which has its own socket.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            sock.bind(addr)
            sock.listen(2048)
    except OSError as e:
        for sock in socks:
            sock.close()
        raise ServeError(f"cannot listen on {where}: {e.strerror or e}") from None
    return socks
