"""``xtml serve``: the time the gateway adds, per request and per streamed
token, at 1, 16 and 64 concurrent streams.

    .venv/bin/python bench/bench_serve.py [--quick]

A stand-in vLLM (tests/helpers/engines.py, in its own process) answers scripted
ids as fast as it can, one id per event; ``xtml serve`` (the command line,
in its own process) sits in front of it. The same client (httpx, in this
process) times four paths in the same run, in alternating rounds:

* **direct** — client → engine ``POST /v1/completions`` with exactly the body
  the gateway sends (the prompt ids the gateway renders);
* **relay/httpx** — client → a bare relay (uvicorn, httpx; its own process)
  → engine: what a Python gateway on that stack pays for the extra hop, with
  no rendering and no parsing;
* **relay/xtml** — the same relay reaching the engine with xtml serve's own
  client (xtml.serving.client): the hop on the gateway's stack, its floor;
* **gateway** — client → ``xtml serve`` ``POST /v1/chat/completions`` →
  engine, rendering, parsing and shaping included.

Per request: p50 and p99 of the latency of a short answer, one request at a
time; the time added is the median, over blocks of 10 requests per path, of
the gateway's block median minus the direct one (and minus the relays').
Per streamed token: a long answer streamed by 1, 16 and 64 clients at once;
per round, (mean stream duration through the gateway - the same direct) /
tokens per stream, and the median over rounds. With N streams sharing the
machine each stream's tokens wait on the others', so the time added per
token of one stream is about N times what the gateway costs per token; the
figure per token of throughput (divided by N) is printed beside it. The
gateway's own CPU time per token (from /proc, over the gateway rounds) is
what it costs whatever the concurrency. xtml's own work per request is also
timed in this process, back to back and after 1 ms idle. Targets: ≤ 1 ms added per request at
p50, ≤ 20 µs per streamed token.

uvicorn serves with httptools and uvloop when they are installed (the serve
extra installs them), else with h11 and asyncio; the run says which.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import xtml  # noqa: E402
from tests.helpers.engines import closed_port  # noqa: E402
from tests.helpers.tokenizers import deepseek_path  # noqa: E402
from xtml.serving.engines import VLLM, Generation  # noqa: E402

REQUEST: dict[str, Any] = {
    "messages": [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "What is the capital of France? Then look up its population."}],
    "tools": [{"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}],
}
SHORT = ("The user wants the capital.<|close|>think<|sep|><|open|>response<|sep|>Paris.<|close|>response<|sep|>"
         "<|close|>message<|sep|><|end_of_msg|>")
PARAGRAPH = ("Paris is the capital and largest city of France, on the Seine, with an estimated population of "
             "just over two million residents in the city proper and many more in its metropolitan area. ")


def long_answer(words: int) -> str:
    reasoning = (PARAGRAPH * (words // 60 + 1))[: words * 3]
    response = (PARAGRAPH * (words // 30 + 1))[: words * 6]
    return (f"{reasoning}<|close|>think<|sep|><|open|>response<|sep|>{response}<|close|>response<|sep|>"
            '<|open|>tools<|sep|><|open|>call tool="search" index="1"<|sep|>'
            '<|open|>argument key="q" type="string"<|sep|>population of Paris "2024"<|close|>argument<|sep|>'
            "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>")


def in_process_us_per_token(k3: xtml.Template, vocab: xtml.Vocabulary, ids: list[int]) -> float:
    """xtml's own work per streamed token, in this process (best of 5): the
    stream parser, the chunk shapes and the event text, as the gateway runs
    them per engine event of one id."""
    from xtml.serving.gateway import SSE
    from xtml.serving.openai import ChunkStream

    best = float("inf")
    for _ in range(6):
        t = time.perf_counter()
        for _ in range(5):
            parser = k3.stream(vocab, thinking=True)
            chunks = ChunkStream(model="kimi-k3", template=k3)
            sse = SSE(chunks)
            for i in ids:
                "".join(sse(c) for c in chunks.feed(parser.feed(i))).encode()
            "".join(sse(c) for c in chunks.feed(parser.close())).encode()
        best = min(best, (time.perf_counter() - t) / 5 / len(ids))
    return best * 1e6


def in_process_request_us(k3: xtml.Template, vocab: xtml.Vocabulary, answer: list[int]) -> dict[str, float]:
    """xtml's own work per request, in this process: the gateway's check and
    render of the benchmark's request to ids, then the parse of the short
    answer and its OpenAI object as JSON. Medians, run back to back and run
    each after 1 ms of sleep, as a server answering one request at a time
    does; the tokenizer's call alone in the same two conditions shows what
    idle costs on this machine (its caches are others' meanwhile)."""
    from xtml.serving.engines import dumps
    from xtml.serving.gateway import Gateway
    from xtml.serving.openai import chat_completion

    gw = Gateway(k3, vocab, "http://127.0.0.1:9")
    body = json.dumps({**REQUEST, "seed": 0}).encode()

    def request() -> None:
        job = gw.job(json.loads(body))
        parsed = k3.parse(answer, vocab, completion=True, lenient=True, thinking=job.thinking,
                          max_chars=len(answer))
        dumps(chat_completion(parsed, model="m", prompt_tokens=len(job.gen.prompt), completion_tokens=len(answer)))

    text = [REQUEST["messages"][-1]["content"]]
    tok = vocab.tokenizer

    def tokenizer() -> None:
        tok.encode_batch_fast(text, add_special_tokens=False)

    out: dict[str, float] = {}
    for name, f in (("xtml", request), ("tokenizer", tokenizer)):
        for idle in (0.0, 0.001):
            ts = []
            for _ in range(300):
                if idle:
                    time.sleep(idle)
                t = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t)
            out[f"{name}_{'idle' if idle else 'busy'}"] = statistics.median(ts[20:]) * 1e6
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(args: list[str], log: Path) -> subprocess.Popen[str]:
    with open(log, "w") as f:
        path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
        return subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
                                stdout=subprocess.PIPE, stderr=f, text=True)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def timed_post(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> float:
    t = time.perf_counter()
    r = await http.post(url, json=body)
    await r.aread()
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t


async def timed_stream(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> float:
    t = time.perf_counter()
    async with http.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code}")
        tail = b""
        async for chunk in r.aiter_raw():
            tail = (tail + chunk)[-32:]
    if b"[DONE]" not in tail:
        raise RuntimeError(f"{url}: the stream did not end with [DONE]")
    return time.perf_counter() - t


PATHS = ("direct", "relay_httpx", "relay_xtml", "gateway")
NAMES = {"direct": "direct (client → engine)", "relay_httpx": "relay, uvicorn + httpx",
         "relay_xtml": "relay, uvicorn + xtml's client", "gateway": "xtml serve"}


async def run(quick: bool) -> dict[str, Any]:
    k3 = xtml.load("kimi-k3")
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=k3.markers.all())
    short = k3.completion_ids(SHORT, vocab)
    long = k3.completion_ids(long_answer(150 if quick else 400), vocab)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "answers.json").write_text(json.dumps([short, long]))
    engine = start([sys.executable, "-m", "tests.helpers.engines", "--kind", "vllm",
                    "--answers", str(tmp / "answers.json")], tmp / "engine.log")
    procs = [engine]
    try:
        assert engine.stdout is not None
        backend = f"http://127.0.0.1:{int(engine.stdout.readline().split()[1])}"
        port = closed_port()
        gateway = start([sys.executable, "-m", "xtml", "serve", "--backend", backend, "--tokenizer",
                         deepseek_path(), "--add-markers", "--port", str(port), "--log-level", "warning"],
                        tmp / "gateway.log")
        procs.append(gateway)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if gateway.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("xtml serve did not start: " + (tmp / "gateway.log").read_text()[-2000:])
            time.sleep(0.1)

        prompt = k3.encode(REQUEST, vocab)
        stop = k3.bind(vocab).stop_ids
        engine_api = VLLM(backend)
        await engine_api.learn()  # the engine's context length, for the body's max_tokens
        await engine_api.aclose()

        def direct_body(seed: int, stream: bool) -> dict[str, Any]:
            # Exactly what the gateway sends the engine.
            return engine_api.body(Generation(prompt, {"seed": seed}, stop, vocab.size), stream)

        (tmp / "body.json").write_text(json.dumps(direct_body(0, False)))
        relays = {}
        pids = {"direct": engine.pid, "gateway": gateway.pid}
        for client in ("httpx", "xtml"):
            relay = start([sys.executable, "-m", "tests.helpers.engines", "--relay", backend,
                           "--body", str(tmp / "body.json"), "--client", client], tmp / f"relay-{client}.log")
            procs.append(relay)
            assert relay.stdout is not None
            relays[client] = f"http://127.0.0.1:{int(relay.stdout.readline().split()[1])}/v1/chat/completions"
            pids[f"relay_{client}"] = relay.pid

        chat = url + "/v1/chat/completions"
        completions = backend + "/v1/completions"
        paths = {
            "direct": lambda seed, stream: (completions, direct_body(seed, stream)),
            "relay_httpx": lambda seed, stream: (relays["httpx"], {"seed": seed, "stream": stream}),
            "relay_xtml": lambda seed, stream: (relays["xtml"], {"seed": seed, "stream": stream}),
            "gateway": lambda seed, stream: (chat, {**REQUEST, "seed": seed, "stream": stream}),
        }
        results: dict[str, Any] = {"tokens_short": len(short), "tokens_long": len(long), "prompt": len(prompt),
                                   "xtml_us_per_token": in_process_us_per_token(k3, vocab, long),
                                   "xtml_us_per_request": in_process_request_us(k3, vocab, short),
                                   "server": server_stack()}
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256, keepalive_expiry=30)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            # -- per request: alternating blocks of 10, each path ---------------------------
            n = 60 if quick else 400
            lat: dict[str, list[float]] = {p: [] for p in paths}
            blocks: dict[str, list[float]] = {p: [] for p in paths}
            for p in paths:
                for _ in range(20):
                    await timed_post(http, *paths[p](0, False))
            cpu: dict[str, float] = {p: 0.0 for p in paths}
            for block in range(n // 10):
                order = list(paths) if block % 2 else list(reversed(paths))
                for p in order:
                    c0 = cpu_seconds(pids[p])
                    got = [await timed_post(http, *paths[p](0, False)) for _ in range(10)]
                    cpu[p] += cpu_seconds(pids[p]) - c0
                    lat[p] += got
                    blocks[p].append(statistics.median(got))
            req: dict[str, Any] = {p: {"p50_ms": percentile(xs, 0.5) * 1e3, "p99_ms": percentile(xs, 0.99) * 1e3}
                                   for p, xs in lat.items()}
            req["n"] = n
            # The CPU of the process each path reaches first (the engine for
            # direct), per request: what the hop and the gateway's work cost
            # whatever the machine's wake-up latency.
            req["cpu_ms"] = {p: c / n * 1e3 for p, c in cpu.items()}
            for base in ("direct", "relay_httpx", "relay_xtml"):
                req[f"added_over_{base}_ms"] = statistics.median(
                    g - d for g, d in zip(blocks["gateway"], blocks[base], strict=True)) * 1e3
                req[f"added_over_{base}_p99_ms"] = (req["gateway"]["p99_ms"] - req[base]["p99_ms"])
            req["relay_xtml_over_direct_ms"] = statistics.median(
                r - d for r, d in zip(blocks["relay_xtml"], blocks["direct"], strict=True)) * 1e3
            results["request"] = req

            # -- per streamed token -----------------------------------------------------
            results["stream"] = []
            rounds = 3 if quick else 5
            for concurrency in (1, 16, 64):
                per_client = 2 if quick else (6 if concurrency == 1 else 2)
                rounds_mean: dict[str, list[float]] = {p: [] for p in paths}
                gw_cpu = 0.0
                gw_streams = 0
                for r in range(rounds + 1):
                    order = list(paths) if r % 2 else list(reversed(paths))
                    for p in order:
                        async def client(p: str = p, k: int = per_client) -> list[float]:
                            return [await timed_stream(http, *paths[p](1, True)) for _ in range(k)]

                        c0 = cpu_seconds(gateway.pid)
                        got = [t for ts in await asyncio.gather(*(client() for _ in range(concurrency))) for t in ts]
                        if r == 0:
                            continue  # warm-up round
                        rounds_mean[p].append(statistics.fmean(got))
                        if p == "gateway":
                            gw_cpu += cpu_seconds(gateway.pid) - c0
                            gw_streams += len(got)
                tokens = len(long)
                us = {p: statistics.median(ts) / tokens * 1e6 for p, ts in rounds_mean.items()}
                added = {base: statistics.median(g - d for g, d in zip(rounds_mean["gateway"], rounds_mean[base],
                                                                        strict=True)) / tokens * 1e6
                         for base in ("direct", "relay_httpx", "relay_xtml")}
                results["stream"].append({"concurrency": concurrency, "streams": gw_streams, "tokens": tokens,
                                          "us_per_token": us, "added_us": added,
                                          "gateway_cpu_us_per_token": gw_cpu / (gw_streams * tokens) * 1e6})
        return results
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def server_stack() -> str:
    import importlib.util

    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"uvicorn with {http} on {loop}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and shorter streams")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args()
    res = asyncio.run(run(args.quick))
    req = res["request"]
    print(f"{res['server']}; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"prompt {res['prompt']} ids; short answer {res['tokens_short']} ids; long answer {res['tokens_long']} ids")
    print()
    print(f"per request ({req['n']} each, one at a time)          p50 ms    p99 ms")
    for p in PATHS:
        print(f"  {NAMES[p]:<40}{req[p]['p50_ms']:8.2f}  {req[p]['p99_ms']:8.2f}")
    ok = "ok" if req["added_over_direct_ms"] <= 1.0 else "OVER TARGET"
    print(f"  {'added by xtml serve (vs direct)':<40}{req['added_over_direct_ms']:8.2f}  "
          f"{req['added_over_direct_p99_ms']:8.2f}   (target p50 ≤ 1 ms: {ok})")
    print(f"  {'  over the httpx relay':<40}{req['added_over_relay_httpx_ms']:8.2f}  "
          f"{req['added_over_relay_httpx_p99_ms']:8.2f}")
    print(f"  {'  over the xtml-client relay':<40}{req['added_over_relay_xtml_ms']:8.2f}  "
          f"{req['added_over_relay_xtml_p99_ms']:8.2f}")
    print(f"  {'the hop alone (xtml relay vs direct)':<40}{req['relay_xtml_over_direct_ms']:8.2f}")
    print("  CPU per request, ms, of the process reached: "
          + ", ".join(f"{p} {c:.2f}" for p, c in req["cpu_ms"].items()))
    w = res["xtml_us_per_request"]
    print(f"  xtml's own work per request, in process (render, parse, shape): {w['xtml_busy']:.0f} µs back to back, "
          f"{w['xtml_idle']:.0f} µs after 1 ms idle;\n    the tokenizer's call alone: {w['tokenizer_busy']:.0f} µs "
          f"back to back, {w['tokenizer_idle']:.0f} µs after 1 ms idle")
    print()
    print("per streamed token, µs  direct  relay/httpx  relay/xtml  gateway │ added: per stream  ÷ streams"
          "  over relay/xtml │ gateway CPU")
    for st in res["stream"]:
        u, a, c = st["us_per_token"], st["added_us"], st["concurrency"]
        ok = "ok" if a["direct"] / c <= 20 else "OVER TARGET (20)"
        label = f"{c:>2} stream{'s' if c > 1 else ' '} ({st['streams']:>3})"
        print(f"  {label}  {u['direct']:7.1f}  {u['relay_httpx']:11.1f}"
              f"  {u['relay_xtml']:10.1f}  {u['gateway']:7.1f} │ {a['direct']:17.1f}  {a['direct'] / c:9.1f}"
              f"  {a['relay_xtml']:15.1f} │ {st['gateway_cpu_us_per_token']:11.1f}  {ok}")
    print(f"\nxtml's own work per streamed token, in process (parse, shape, event text): "
          f"{res['xtml_us_per_token']:.1f} µs")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
