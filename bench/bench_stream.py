"""Streaming parse: per-token cost from 1k to 1M tokens, against re-parsing
the accumulated text on every token (what many serving engines do), and the
cost of the last token, which ends the message.

    .venv/bin/python bench/bench_stream.py [--quick]

Both are measured in the same run. The streaming parser is fed token by
token; its per-token cost is the median over blocks of 1,000 tokens, taken
at the start and at the end of each completion, so a cost that grew with the
stream would show. The naive baseline decodes the whole accumulated output
and runs a regular-expression tool parser over it at each token; its cost at
n tokens is measured directly at a few points (running it for every token of
a long completion would take hours, which is the point).

The last token (the end marker) reads the whole message; its cost is timed
on its own, for the completion above (a third of it tool calls: a thousand
calls at 100k tokens) and for a typical one (long reasoning, a response and
three calls), next to the median token of the same stream and to a batch
parse of the same ids (what the stream's last token used to cost). A
hostile stream of close tags that close nothing, at the deepest nesting
allowed, shows that their cost per token does not grow with their number.

First of all, xtml's stream is timed against openai-harmony's
``StreamableParser`` and against the bare loop (each token's bytes through an
incremental UTF-8 decoder) on one vocabulary, o200k, and one completion
(``versus_peers``; ``--peers-only`` runs just that; needs the ``bench``
extra).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench_core import vocab_and_template

import xtml

HERE = Path(__file__).parent




PARAGRAPH = (
    "Streaming parsers read model output as it is generated. Each token should cost the same, "
    "whether it is the tenth or the millionth; re-reading everything on every token does not. "
    "Ünïcödé, 中文, and emoji 🎉 cross token boundaries. "
)


def completion(k3: xtml.Template, vocab: xtml.Vocabulary, n: int, calls: int | None = None) -> list[int]:
    """About n ids: reasoning, a response and tool calls. With ``calls``
    None, a third each (many calls); else two thirds reasoning, a third
    response, and that many calls."""
    b = k3.bind(vocab)
    para = vocab.encode_texts([PARAGRAPH])[0]

    def call(k: int) -> list[int]:
        return b.encode_segments([xtml.Segment(
            f'<|open|>call tool="search" index="{k}"<|sep|><|open|>argument key="q" type="string"<|sep|>x'
            '<|close|>argument<|sep|><|close|>call<|sep|>', True)])

    share = 3 if calls is None else 1.5
    think = para * max(1, int(n / share) // len(para))
    response = para * max(1, n // (3 * len(para)))
    ids = list(think) + b.encode_segments([xtml.Segment("<|close|>think<|sep|><|open|>response<|sep|>", True)])
    ids += response + b.encode_segments([xtml.Segment("<|close|>response<|sep|><|open|>tools<|sep|>", True)])
    count = max(1, (n - len(ids)) // len(call(1))) if calls is None else calls
    for k in range(1, count + 1):
        ids += call(k)
    ids += b.encode_segments([xtml.Segment("<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>", True)])
    return ids


def last_token_ms(k3: xtml.Template, vocab: xtml.Vocabulary, ids: list[int], reps: int) -> float:
    """The cost of the last token (the end marker: the message is read)."""
    times = []
    for _ in range(reps):
        sp = k3.stream(vocab, thinking=True)
        sp.feed_many(ids[:-1])
        t0 = time.perf_counter()
        sp.feed(ids[-1])
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def batch_parse_ms(k3: xtml.Template, vocab: xtml.Vocabulary, ids: list[int], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        k3.parse(ids, vocab, completion=True, lenient=True, thinking=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def stray_closes_us(k3: xtml.Template, vocab: xtml.Vocabulary, n: int) -> float:
    """Per token, a stream of about n ids that nests as deep as allowed, then
    closes, again and again, an element that is not open."""
    b = k3.bind(vocab)
    opened = b.encode_segments([xtml.Segment("<|open|>x<|sep|>", True)]) * 60
    stray = b.encode_segments([xtml.Segment("<|close|>zz<|sep|>", True)])
    ids = opened + stray * max(1, (n - len(opened)) // len(stray))
    sp = k3.stream(vocab)
    t0 = time.perf_counter()
    sp.feed_many(ids)
    sp.close()
    return (time.perf_counter() - t0) / len(ids) * 1e6


def per_token_blocks(k3: xtml.Template, vocab: xtml.Vocabulary, ids: list[int], keep: bool) -> dict[str, float]:
    sp = k3.stream(vocab, thinking=True, keep=keep)
    feed = sp.feed
    blocks: list[float] = []
    clock = time.perf_counter
    for start in range(0, len(ids), 1000):
        block = ids[start : start + 1000]
        t0 = clock()
        for t in block:
            feed(t)
        blocks.append((clock() - t0) / len(block))
    sp.close()
    head = blocks[: max(1, len(blocks) // 10)]
    tail = blocks[-max(1, len(blocks) // 10):]
    return {"median_us": statistics.median(blocks) * 1e6, "first_us": statistics.median(head) * 1e6,
            "last_us": statistics.median(tail) * 1e6}


_CALL = re.compile(r'<\|open\|>call tool="([^"]*)" index="(\d+)"<\|sep\|>(.*?)<\|close\|>call<\|sep\|>', re.S)


def naive_step(vocab: xtml.Vocabulary, ids: list[int]) -> Any:
    """One step of the re-parse approach: decode everything, split reasoning
    and response, regex every tool call."""
    text = vocab.tokenizer.decode(ids, skip_special_tokens=False)
    reasoning, _, rest = text.partition("<|close|>think<|sep|>")
    return reasoning, [m.groups() for m in _CALL.finditer(rest)]


def naive_per_token_at(vocab: xtml.Vocabulary, ids: list[int], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        naive_step(vocab, ids)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def peak_memory(k3: xtml.Template, vocab: xtml.Vocabulary, ids: list[int], keep: bool) -> int:
    sp = k3.stream(vocab, thinking=True, keep=keep)
    tracemalloc.start()
    for t in ids:
        sp.feed(t)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


TARGET_VS_HARMONY = 1 / 1.5  # xtml's time per token over harmony's
TARGET_VS_BARE = 3.0  # xtml's time per token over the bare loop's


def versus_peers(k3: xtml.Template, rounds: int) -> dict[str, Any]:
    """xtml's stream, openai-harmony's ``StreamableParser`` and the bare
    loop, on one vocabulary (o200k, harmony's) and one completion: the same
    reasoning and response, each in its own format. Every round runs the
    three in a shuffled order, each over the whole completion in blocks of
    500 tokens; a figure is the median over blocks, a ratio the median over
    rounds of the per-round ratio of medians."""
    import codecs

    from bench_peers import O200K_PATTERN, o200k_dir

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(o200k_dir()))
    import openai_harmony as h

    from xtml.vocab.tiktoken import load_tiktoken

    vocab = load_tiktoken(Path(os.environ["TIKTOKEN_ENCODINGS_BASE"]) / "o200k_base.tiktoken", None,
                          O200K_PATTERN, k3.markers.all())
    henc = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    b = k3.bind(vocab)
    para = vocab.encode_texts([PARAGRAPH * 40])[0]
    reasoning, response = para * 2, para

    def seg(s: str) -> list[int]:
        return b.encode_segments([xtml.Segment(s, True)])

    def special(s: str) -> list[int]:
        return list(henc.encode(s, allowed_special="all"))

    x_ids = (reasoning + seg("<|close|>think<|sep|><|open|>response<|sep|>") + response
             + seg("<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"))
    h_ids = (special("<|channel|>analysis<|message|>") + reasoning
             + special("<|end|><|start|>assistant<|channel|>final<|message|>") + response + special("<|return|>"))
    table = vocab.byte_table()
    block = 500
    clock = time.perf_counter

    def xtml_blocks() -> list[float]:
        sp = k3.stream(vocab, thinking=True)
        feed = sp.feed
        out = []
        for s in range(0, len(x_ids), block):
            ids = x_ids[s : s + block]
            t0 = clock()
            for t in ids:
                feed(t)
            out.append((clock() - t0) / len(ids))
        sp.close()
        return out

    def harmony_blocks() -> list[float]:
        p = h.StreamableParser(henc, role=h.Role.ASSISTANT)
        process = p.process
        out = []
        for s in range(0, len(h_ids), block):
            ids = h_ids[s : s + block]
            t0 = clock()
            for t in ids:
                process(t)
                p.last_content_delta  # noqa: B018 - what a caller reads after each token
            out.append((clock() - t0) / len(ids))
        return out

    def bare_blocks() -> list[float]:
        # Look up each token's bytes and feed an incremental UTF-8 decoder.
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        out = []
        for s in range(0, len(x_ids), block):
            ids = x_ids[s : s + block]
            t0 = clock()
            for t in ids:
                decode(table[t])
            out.append((clock() - t0) / len(ids))
        return out

    runs = {"xtml": xtml_blocks, "harmony": harmony_blocks, "bare": bare_blocks}
    per: dict[str, list[float]] = {k: [] for k in runs}
    r = random.Random(0)
    names = list(runs)
    for _ in range(rounds):
        r.shuffle(names)
        for k in names:
            per[k].append(statistics.median(runs[k]()))
    us = {k: statistics.median(v) * 1e6 for k, v in per.items()}
    vs_h = statistics.median(a / b for a, b in zip(per["xtml"], per["harmony"]))
    vs_b = statistics.median(a / b for a, b in zip(per["xtml"], per["bare"]))
    return {"tokens_xtml": len(x_ids), "tokens_harmony": len(h_ids), "rounds": rounds, "us_per_token": us,
            "xtml_over_harmony": vs_h, "xtml_over_bare": vs_b, "ok_vs_harmony": vs_h <= TARGET_VS_HARMONY,
            "ok_vs_bare": vs_b <= TARGET_VS_BARE}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1k to 100k only")
    ap.add_argument("--peers-only", action="store_true", help="only xtml against harmony and the bare loop")
    ap.add_argument("--out", default=str(HERE / "results" / "stream.json"))
    args = ap.parse_args(argv)
    k3, vocab = vocab_and_template()
    peers = versus_peers(k3, 8 if args.quick else 30)
    print(f"on o200k, {peers['tokens_xtml']:,} tokens (harmony {peers['tokens_harmony']:,}), {peers['rounds']} rounds: "
          + ", ".join(f"{k} {v:.3f} µs/token" for k, v in peers["us_per_token"].items()))
    print(f"  xtml / harmony StreamableParser {peers['xtml_over_harmony']:.2f} (target ≤ {TARGET_VS_HARMONY:.2f}, "
          f"i.e. 1.5x faster) [{'ok' if peers['ok_vs_harmony'] else 'OVER'}]; xtml / bare loop "
          f"{peers['xtml_over_bare']:.2f} (target ≤ {TARGET_VS_BARE}) [{'ok' if peers['ok_vs_bare'] else 'OVER'}]")
    if args.peers_only:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"peers": peers}, indent=1))
        return 0
    vocab.byte_table()  # built once per vocabulary; not part of per-token cost
    sizes = [1_000, 10_000, 100_000] + ([] if args.quick else [1_000_000])
    rows: list[dict[str, Any]] = []
    for n in sizes:
        ids = completion(k3, vocab, n)
        stream = per_token_blocks(k3, vocab, ids, keep=False)
        kept = per_token_blocks(k3, vocab, ids, keep=True)
        naive = naive_per_token_at(vocab, ids, reps=3 if n >= 100_000 else 10)
        # The reasoning third of the completion: one element of ever longer text.
        mem_light = peak_memory(k3, vocab, ids[: len(ids) // 3], keep=False)
        rows.append({"tokens": len(ids), "stream_us_per_token": stream, "stream_keep_us_per_token": kept,
                     "naive_us_per_token_at_end": naive, "naive_over_stream": naive / stream["median_us"],
                     "peak_bytes_keep_false_reasoning": mem_light})
        print(f"{len(ids):>9} tokens  stream {stream['median_us']:.2f} µs/token "
              f"(first {stream['first_us']:.2f}, last {stream['last_us']:.2f}; keep=True {kept['median_us']:.2f})  "
              f"naive re-parse {naive:,.0f} µs/token ({naive / stream['median_us']:,.0f}x)  "
              f"peak memory in reasoning (keep=False) {mem_light / 1024:.0f} KiB")
    flat = rows[-1]["stream_us_per_token"]["median_us"] / rows[0]["stream_us_per_token"]["median_us"]
    print(f"per-token cost at {rows[-1]['tokens']:,} tokens / at {rows[0]['tokens']:,} tokens: {flat:.2f} "
          "(target ≤ 1.2); target median ≤ 3 µs/token")
    print("the last token (the end marker, which reads the message), next to the median token of the same "
          "stream and a batch parse of the same ids:")
    last_rows: list[dict[str, Any]] = []
    for shape, calls in (("typical", 3), ("many calls", None)):
        for n in sizes:
            ids = completion(k3, vocab, n, calls)
            reps = 3 if n >= 100_000 else 7
            median = per_token_blocks(k3, vocab, ids, keep=True)["median_us"]
            last = last_token_ms(k3, vocab, ids, reps)
            batch = batch_parse_ms(k3, vocab, ids, reps)
            ncalls = (ids.count(k3.bind(vocab).marker_ids[k3.markers.open]) - 2) // 2  # a call and its argument
            last_rows.append({"shape": shape, "tokens": len(ids), "calls": ncalls, "median_us": median,
                              "last_token_ms": last, "batch_parse_ms": batch})
            print(f"  {shape:>10} {len(ids):>9,} tokens {ncalls:>5} calls  median {median:.2f} µs/token  "
                  f"last token {last:.3f} ms (batch parse {batch:.2f} ms, {batch / last:.0f}x)")
    print("close tags of nothing open, at the deepest nesting allowed:")
    stray = {n: stray_closes_us(k3, vocab, n) for n in (24_000, 240_000)}
    print(f"  {stray[24_000]:.2f} µs/token at 24k tokens, {stray[240_000]:.2f} at 240k "
          f"(ratio {stray[240_000] / stray[24_000]:.2f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "flatness": flat, "last_token": last_rows,
                                          "stray_close_us_per_token": stray, "peers": peers}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
