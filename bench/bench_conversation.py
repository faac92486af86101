"""Conversation benchmark: one more turn on a long chat, against a full encode.

Run:  .venv/bin/python bench/bench_conversation.py [--quick] [--out PATH]

A server or an agent that renders every turn from scratch pays for the whole
history each time; ``Template.conversation`` keeps the ids and renders only
what is new. Each round takes a chat of the workload of bench_core.py
(agentic: tool calls with typed arguments, tool results, reasoning on about
half of the assistant turns, four tools, ``thinking_effort``), a
conversation already holding its first N messages (made outside the timed
region), and times, on the same request, in a shuffled order:

* ``encode``: ``k3.encode`` of the whole request — the baseline;
* ``append + prompt_ids``: ``conv.append(next message)`` then
  ``conv.prompt_ids()``;
* ``turn``: the model's answer as completion ids through
  ``conv.append_completion`` (its parse included), the next message, then
  ``conv.prompt_ids()``;
* ``set thinking_effort`` and ``set thinking off``: changing a conversation
  option, then ``conv.prompt_ids()`` (what renders differently is tokenized
  again).

Every figure is the median over rounds of the per-round ratio (encode time /
method time: how many times faster). Every round checks that the ids are
those of ``encode``; a mismatch exits with status 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xtml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_core import make_chat, vocab_and_template  # noqa: E402  (the shared workload)

DEFAULT_OUT = HERE / "results" / "conversation.json"
TARGET = 10.0  # append + prompt_ids at least 10x faster than encode, at 100 messages


class Round:
    """One round's request: a history of N messages, then what comes next."""

    def __init__(self, k3: xtml.Template, vocab: xtml.Vocabulary, req: dict[str, Any], n: int) -> None:
        msgs = req["messages"]
        self.opts = {k: v for k, v in req.items() if k != "messages"}
        # The next message after N messages; and, for a turn, the first
        # assistant message from N on (the model's answer) and the one after it.
        self.history = msgs[:n]
        self.next = msgs[n]
        a = next(i for i in range(n, len(msgs) - 1) if msgs[i]["role"] == "assistant")
        self.turn_history = msgs[:a]
        self.answer = msgs[a]
        self.after = msgs[a + 1]
        self.k3, self.vocab = k3, vocab
        self.base = k3.conversation(vocab, self.history, **self.opts)
        self.base.prompt_ids()
        self.turn_base = k3.conversation(vocab, self.turn_history, **self.opts)
        prompt = self.turn_base.prompt_ids()
        whole = k3.encode({**req, "messages": [*self.turn_history, self.answer]}, vocab, add_generation_prompt=False)
        assert whole[: len(prompt)] == prompt
        self.answer_ids = whole[len(prompt) :]
        # The requests each method's result must equal (and what encode times).
        self.want_next = k3.encode({**req, "messages": [*self.history, self.next]}, vocab)
        parsed = k3.parse(self.answer_ids, vocab, completion=True, thinking=True)
        for k, c in enumerate(parsed.get("tool_calls") or (), start=1):
            c["id"] = f"call_{a}_{k}"
        self.turn_request = {**req, "messages": [*self.turn_history, parsed, self.after]}
        self.want_turn = k3.encode(self.turn_request, vocab)
        self.want_effort = k3.encode({**req, "messages": self.history, "thinking_effort": "low"}, vocab)
        self.want_off = k3.encode({**req, "messages": self.history, "thinking": False}, vocab)
        self.encode_request = {**req, "messages": [*self.history, self.next]}


Method = Callable[[Round, Any], Any]


def m_encode(r: Round, _: Any) -> Any:
    return r.k3.encode(r.encode_request, r.vocab)


def m_append(r: Round, conv: Any) -> Any:
    conv.append(r.next)
    return conv.prompt_ids()


def m_turn(r: Round, conv: Any) -> Any:
    conv.append_completion(r.answer_ids)
    conv.append(r.after)
    return conv.prompt_ids()


def m_effort(r: Round, conv: Any) -> Any:
    conv.set_options(thinking_effort="low")
    return conv.prompt_ids()


def m_off(r: Round, conv: Any) -> Any:
    conv.set_options(thinking=False)
    return conv.prompt_ids()


# name → (function, the conversation it starts from (copied, untimed), expected ids)
METHODS: dict[str, tuple[Method, Callable[[Round], Any], Callable[[Round], list[int]]]] = {
    "encode (baseline)": (m_encode, lambda r: None, lambda r: r.want_next),
    "append + prompt_ids": (m_append, lambda r: r.base.copy(), lambda r: r.want_next),
    "turn: append_completion + append + prompt_ids": (m_turn, lambda r: r.turn_base.copy(),
                                                      lambda r: r.want_turn),
    "set thinking_effort + prompt_ids": (m_effort, lambda r: r.base.copy(), lambda r: r.want_effort),
    "set thinking off + prompt_ids": (m_off, lambda r: r.base.copy(), lambda r: r.want_off),
}
BASELINE = "encode (baseline)"


def run_case(k3: xtml.Template, vocab: xtml.Vocabulary, n: int, seeds: list[int], rounds: int,
             budget: float) -> dict[str, Any]:
    pool = [Round(k3, vocab, make_chat(n + 12, seed), n) for seed in seeds]
    for rd in pool:  # warm every path once, and check it
        for name, (f, start, want) in METHODS.items():
            assert f(rd, start(rd)) == want(rd), name
    names = list(METHODS)
    times: dict[str, list[int]] = {k: [] for k in names}
    ok = True
    rng = random.Random(n)
    clock = time.perf_counter_ns
    deadline = time.perf_counter() + budget
    done = 0
    while done < rounds and (done < 5 or time.perf_counter() < deadline):
        rd = pool[done % len(pool)]
        rng.shuffle(names)
        for name in names:
            f, start, want = METHODS[name]
            conv = start(rd)
            gc.collect()
            t0 = clock()
            got = f(rd, conv)
            times[name].append(clock() - t0)
            ok = ok and got == want(rd)
        done += 1
    base = times[BASELINE]
    rows = {}
    for name in METHODS:
        t = times[name]
        speedups = [b / x for b, x in zip(base, t)]
        rows[name] = {
            "median_us": round(statistics.median(t) / 1000, 1),
            "speedup": round(statistics.median(speedups), 1),
            "p10": round(_q(speedups, 0.1), 1),
            "p90": round(_q(speedups, 0.9), 1),
        }
    ids = statistics.median(len(rd.want_next) for rd in pool)
    return {"messages": n, "rounds": done, "ids": ids, "rows": rows, "checks_ok": ok}


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a few rounds (a smoke run)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON results file (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)

    import tokenizers

    k3, vocab = vocab_and_template()

    # (messages, seeds, rounds, time budget in s)
    plan = [(20, 8, 200, 20.0), (100, 8, 120, 30.0), (1000, 3, 30, 60.0)]
    if args.quick:
        plan = [(n, min(s, 3), 6, 2.0) for n, s, _, _ in plan]
    t0 = time.perf_counter()
    cases = []
    for n, n_seeds, rounds, budget in plan:
        c = run_case(k3, vocab, n, [20260100 + n + i for i in range(n_seeds)], rounds, budget)
        cases.append(c)
        print(f"=== {n} messages (~{c['ids']:,.0f} ids), {c['rounds']} rounds: speed-up over a full encode "
              "(median of per-round ratios)")
        for name, row in c["rows"].items():
            print(f"  {name:48} {row['median_us']:>10,.1f} µs   x{row['speedup']:<7} "
                  f"(p10 {row['p10']}, p90 {row['p90']})")
    elapsed = time.perf_counter() - t0
    at100 = next(c for c in cases if c["messages"] == 100)["rows"]["append + prompt_ids"]["speedup"]
    print(f"=== target: append + prompt_ids at 100 messages ≥ {TARGET}x faster than encode: "
          f"{at100}x [{'ok' if at100 >= TARGET else 'UNDER'}]")
    result = {
        "benchmark": "conversation",
        "mode": "quick" if args.quick else "full",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(elapsed, 1),
        "env": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "tokenizers": tokenizers.__version__,
            "xtml": xtml.__version__,
        },
        "target": {"append_at_100": TARGET, "met": at100 >= TARGET},
        "cases": cases,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out} ({elapsed:.0f} s)")
    if not all(c["checks_ok"] for c in cases):
        print("ids differ from encode", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
