"""Batch render and parse cost per token, 1k to 1M tokens: linear or not.

    python bench/bench_scale.py [--quick]

A conversation whose assistant turn grows (reasoning, response and tool
calls) is rendered to ids and parsed back at each size; the per-token cost at
the largest size over the per-token cost at the smallest shows whether cost
grows linearly (ratio near 1) or worse. Decoding the same ids with the
tokenizer is measured alongside as the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_stream import PARAGRAPH, vocab_and_template

HERE = Path(__file__).parent


def request(n_tokens: int) -> dict[str, Any]:
    # About 40 tokens per paragraph and per call.
    k = max(1, n_tokens // 120)
    calls = [{"id": f"c{i}", "type": "function",
              "function": {"name": "search", "arguments": {"q": f"query {i}", "limit": i % 7}}} for i in range(k)]
    return {"messages": [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "reasoning_content": PARAGRAPH * k, "content": PARAGRAPH * k, "tool_calls": calls},
    ], "add_generation_prompt": False}


def best(f: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1k to 100k only")
    ap.add_argument("--out", default=str(HERE / "results" / "scale.json"))
    args = ap.parse_args(argv)
    k3, vocab = vocab_and_template()
    vocab.byte_table()
    rows: list[dict[str, Any]] = []
    for n in [1_000, 10_000, 100_000] + ([] if args.quick else [1_000_000]):
        req = request(n)
        ids = k3.encode(req, vocab)
        reps = 20 if n <= 10_000 else 3
        render = best(lambda req=req: k3.encode(req, vocab), reps)
        parse = best(lambda ids=ids: k3.parse(ids, vocab), reps)
        decode = best(lambda ids=ids: vocab.tokenizer.decode(ids, skip_special_tokens=False), reps)
        msg = req["messages"][1]
        texts = [msg["reasoning_content"], msg["content"], *(
            str(v) for c in msg["tool_calls"] for v in c["function"]["arguments"].values())]
        floor = best(lambda texts=texts: vocab.tokenizer.encode_batch_fast(texts, add_special_tokens=False), reps)
        row = {"tokens": len(ids), "render_us_per_token": render / len(ids) * 1e6,
               "floor_us_per_token": floor / len(ids) * 1e6,
               "parse_us_per_token": parse / len(ids) * 1e6, "decode_us_per_token": decode / len(ids) * 1e6}
        rows.append(row)
        print(f"{len(ids):>9} tokens  render {row['render_us_per_token']:.3f} µs/token "
              f"(encode_batch of its texts {row['floor_us_per_token']:.3f}, render/that {render / floor:.2f})  "
              f"parse {row['parse_us_per_token']:.3f} µs/token  decode {row['decode_us_per_token']:.3f} µs/token  "
              f"parse/decode {parse / decode:.2f}")
    for key in ("render_us_per_token", "floor_us_per_token", "parse_us_per_token", "decode_us_per_token"):
        print(f"{key}: largest / smallest = {rows[-1][key] / rows[0][key]:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
