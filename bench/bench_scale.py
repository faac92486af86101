"""Cost against input size, 1 KB to 100 MB, path by path: linear or not.

    python bench/bench_scale.py [--quick] [--paths NAME,...] [--max-mb N]
    python bench/bench_scale.py --fourfold 32 --paths gateway-body

Each path below runs at 1 KB, 10 KB, 100 KB, 1 MB, 10 MB and 100 MB of input
(``--quick`` stops at 10 MB; ``--max-mb`` anywhere), each size in a fresh
subprocess, so that one size's memory cannot hide another's. A size prints
the time per MB (median of several runs at small sizes) and the peak memory
the operation added, as a multiple of the input: the process's resident
high-water mark is reset (``/proc/self/clear_refs``) after the input is
built, and read after the first run. Doubling the input should at most
double the time: the last column, time per MB at the largest size over time
per MB at 1 MB, is near 1 for a linear path.

MB means a million bytes of the input's UTF-8 text (for token ids: of the
text they decode to; for templates: of the file). Paths:

* ``encode``: a conversation of many messages (reasoning, responses, tool
  calls) rendered to token ids, ``k3.encode``.
* ``encode-one-message``: one user message of that size to ids (the
  tokenizer's own memory shows here).
* ``render``: the same conversation to text and segments, ``k3.render``.
* ``normalize-parts``: one image part and many text parts, ``k3.normalize``.
* ``parse-ids`` / ``parse-text``: the conversation's ids / text parsed back,
  strict.
* ``parse-ids-stray`` / ``parse-text-stray``: one message body split by a
  stray separator marker every 50 characters, parsed leniently.
* ``parse-text-bad-header``: strict text with one malformed tag header of
  that size (the error path; its message quotes at most 60 characters).
* ``image-prompt``: an ``image_prompts`` prompt of that size matched by the
  K3 prompt pattern while rendering.
* ``template-keys``: a template file with that many bytes of unknown keys,
  checked (``xtml.chat.template_file.check_text``, as ``xtml validate``); past the
  1 MiB template limit the file is refused at once.
* ``gateway-body``: a request body collected by ``xtml serve``
  (``Gateway._body``) from 64 KiB pieces, as uvicorn hands them over.
* ``stream-deltas``: one engine read of that many bytes of answer text, one
  text event a token (about 4 bytes), and half as many argument deltas, fed
  to ``ChunkStream.feed`` at once, as the gateway feeds an engine's read.

``--fourfold MB`` runs each path at MB and at four times MB in the same run
and prints the time of the larger over the smaller: about 4 for a linear
path, 16 for a quadratic one.

The request and parse size limit (``max_chars``) is lifted for the run.
Results go to ``bench/results/scale.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SIZES_KB = [1, 10, 100, 1_000, 10_000, 100_000]
PATHS = ["encode", "encode-one-message", "render", "normalize-parts", "parse-ids", "parse-text", "parse-ids-stray",
         "parse-text-stray", "parse-text-bad-header", "image-prompt", "template-keys", "gateway-body",
         "stream-deltas"]
NEEDS_TOKENIZER = {"encode", "encode-one-message", "parse-ids", "parse-ids-stray"}


def _status() -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(k + r":\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _unit(paragraph: str, n: int) -> list[dict[str, Any]]:
    """Turn ``n`` of a conversation, about 1.5 kB of text: a user turn, an
    assistant turn with reasoning, a response and two tool calls, and their
    results. Every turn's texts differ, so that no cache or deduplication
    of equal texts makes a long conversation cheaper than it is."""
    body = f"({n}) {paragraph}"
    calls = [{"id": f"c{i}", "type": "function",
              "function": {"name": "search", "arguments": {"q": f"query {n}.{i}", "limit": i}}}
             for i in range(2)]
    return [
        {"role": "user", "content": body},
        {"role": "assistant", "reasoning_content": body, "content": body, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": f"c{i}", "content": f"result {n}.{i}"} for i in range(2)),
    ]


def build(path: str, size: int) -> tuple[Callable[[], Any], int]:
    """The operation of ``path`` on about ``size`` bytes of input, and the
    input's exact size in bytes."""
    from bench_stream import PARAGRAPH, vocab_and_template

    import xtml

    if path in NEEDS_TOKENIZER:
        k3, vocab = vocab_and_template()
        vocab.byte_table()
    else:
        k3, vocab = xtml.load("kimi-k3"), None
    k3 = k3.replace(max_chars=None)

    options = {"add_generation_prompt": False, "reasoning_effort": "high"}

    def conversation() -> dict[str, Any]:
        one = len(k3.render(_unit(PARAGRAPH, 0), **options).text.encode())
        msgs = [m for n in range(max(1, round(size / one))) for m in _unit(PARAGRAPH, n)]
        return {"messages": msgs, **options}

    if path in ("encode", "render", "parse-ids", "parse-text"):
        req = conversation()
        text = k3.render(req).text
        if path == "encode":
            return (lambda: k3.encode(req, vocab)), len(text.encode())
        if path == "render":
            return (lambda: k3.render(req)), len(text.encode())
        if path == "parse-text":
            return (lambda: k3.parse(text)), len(text.encode())
        # Encoding 100 MB takes minutes and gigabytes: the ids are the
        # options' messages once, then each turn encoded alone (which gives
        # the ids encoding the whole would).
        ids = k3.encode({"messages": [], **options}, vocab)
        head = len(ids)
        turns = len(req["messages"]) // len(_unit(PARAGRAPH, 0))
        for n in range(turns):
            ids += k3.encode({"messages": _unit(PARAGRAPH, n), **options}, vocab)[head:]
        return (lambda: k3.parse(ids, vocab)), len(text.encode())
    if path == "encode-one-message":
        text = (PARAGRAPH * (size // len(PARAGRAPH.encode()) + 1))
        req = {"messages": [{"role": "user", "content": text}], "add_generation_prompt": False}
        return (lambda: k3.encode(req, vocab)), len(text.encode())
    if path == "normalize-parts":
        piece = PARAGRAPH[:50]
        parts = [{"type": "image"}] + [{"type": "text", "text": piece}] * max(1, size // len(piece.encode()))
        req = {"messages": [{"role": "user", "content": parts}]}
        return (lambda: k3.normalize(req)), len(piece.encode()) * (len(parts) - 1)
    if path in ("parse-text-stray", "parse-ids-stray"):
        piece = "x" * 42 + " words "
        k = max(1, size // (len(piece) + 7))
        text = ('<|open|>message role="user"<|sep|>' + (piece + "<|sep|>") * k
                + "<|close|>message<|sep|><|end_of_msg|>")
        if path == "parse-text-stray":
            return (lambda: k3.parse(text, lenient=True)), len(text.encode())
        b = k3.bind(vocab)
        head = b.encode_segments([xtml.Segment('<|open|>message role="user"<|sep|>', True)])
        sep = b.marker_ids["<|sep|>"]
        chunk = vocab.encode_texts([piece])[0] + [sep]
        tail = b.encode_segments([xtml.Segment("<|close|>message<|sep|><|end_of_msg|>", True)])
        ids = head + chunk * k + tail
        return (lambda: k3.parse(ids, vocab, lenient=True)), len(text.encode())
    if path == "parse-text-bad-header":
        text = ('<|open|>message role="' + "a&amp;" * max(1, size // 6) + "<|sep|>hi<|close|>message<|sep|>"
                "<|end_of_msg|>")

        def bad_header() -> Any:
            try:
                return k3.parse(text)
            except xtml.ParseError as e:
                assert len(str(e)) < 200, "the error quotes too much"
                return e

        return bad_header, len(text.encode())
    if path == "image-prompt":
        prompt = ("<|media_begin|>image 28x28<|media_content|>" + "<|media_pad|>" * max(1, size // 13)
                  + "<|media_end|>")
        req = {"messages": [{"role": "user", "content": [{"type": "image"}]}], "image_prompts": [prompt]}
        return (lambda: k3.render(req)), len(prompt.encode())
    if path == "template-keys":
        from xtml.chat.template_file import builtin_files, check_text

        base = builtin_files()["kimi-k3"].read_text()
        line = "unknown_key_{} = 1\n"
        n = max(1, (size - len(base)) // len(line.format(1000)))
        text = base.replace("[template]\n", "[template]\n" + "".join(line.format(i) for i in range(n)), 1)
        return (lambda: check_text(text, "bench.toml")), len(text.encode())
    if path == "gateway-body":
        import asyncio

        from xtml.serving.asgi import read_body

        block = b"x" * (64 << 10)
        n = max(1, size // len(block))

        async def collect() -> bytes | None:
            left = n

            async def receive() -> dict[str, Any]:
                nonlocal left
                left -= 1
                return {"type": "http.request", "body": block, "more_body": left > 0}

            body = await read_body({"headers": []}, receive, n * len(block))
            assert isinstance(body, bytes), "the body was refused"
            return body

        return (lambda: asyncio.run(collect())), n * len(block)
    if path == "stream-deltas":
        from xtml.codec.stream import StreamEvent
        from xtml.serving.openai import ChunkStream

        n = max(1, size // 6)
        events = [StreamEvent("text", k, "response", "abcd") for k in range(n)]
        events.append(StreamEvent("tool_call_start", n, index=1, name="f"))
        events.append(StreamEvent("argument_start", n, index=1, key="a", value_type="string"))
        events += [StreamEvent("argument_delta", n + k, index=1, key="a", text="xy") for k in range(n // 2)]

        def feed() -> Any:
            return ChunkStream(model="m").feed(events)

        return feed, 4 * n + 2 * (n // 2)
    raise SystemExit(f"unknown path {path!r}")


def one(path: str, size: int) -> dict[str, Any]:
    """Run in a subprocess: time and peak memory of one path at one size."""
    fn, nbytes = build(path, size)
    reps = max(1, min(30, 300_000 // max(1, size)))
    # One-time costs (building the grammar's parser) are not per-MB costs.
    import xtml

    xtml.load("kimi-k3").parse('<|open|>message role="user"<|sep|>x<|close|>message<|sep|><|end_of_msg|>')
    # What building the input freed goes back to the system, so that the
    # operation's own memory shows as growth, not as reuse of it.
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    before = _status()["VmRSS"]
    _reset_peak()
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    peak = _status()["VmHWM"] - before
    del out
    times = [first]
    for _ in range(reps - 1):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return {"path": path, "bytes": nbytes, "seconds": seconds, "s_per_mb": seconds / (nbytes / 1e6),
            "peak_bytes": peak, "peak_multiple": peak / nbytes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="stop at 10 MB")
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated paths (default: all)")
    ap.add_argument("--max-mb", type=float, default=None, help="largest size, in MB")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed for one size")
    ap.add_argument("--fourfold", type=float, default=None, metavar="MB",
                    help="only MB and four times MB, and the ratio of their times")
    ap.add_argument("--one", nargs=2, metavar=("PATH", "BYTES"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "scale.json"))
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]))))
        return 0
    top = args.max_mb * 1e6 if args.max_mb else (10e6 if args.quick else 100e6)
    sizes = [kb * 1000 for kb in SIZES_KB if kb * 1000 <= top]
    if args.fourfold:
        sizes = [int(args.fourfold * 1e6), int(4 * args.fourfold * 1e6)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    results: dict[str, list[dict[str, Any]]] = {}
    failed = False
    for path in args.paths.split(","):
        rows: list[dict[str, Any]] = []
        print(f"{path}:")
        for size in sizes:
            try:
                run = subprocess.run([sys.executable, __file__, "--one", path, str(size)], capture_output=True,
                                     text=True, env=env, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"  {size / 1e6:>9.3f} MB  more than {args.timeout:.0f} s: stopped")
                failed = True
                break
            if run.returncode != 0:
                print(f"  {size / 1e6:>9.3f} MB  failed:\n{run.stderr[-2000:]}")
                failed = True
                break
            row = json.loads(run.stdout.strip().splitlines()[-1])
            rows.append(row)
            at_1mb = next((r["s_per_mb"] for r in rows if r["bytes"] >= 0.5e6), None)
            slope = f"  x{row['s_per_mb'] / at_1mb:.2f} of 1 MB" if at_1mb else ""
            print(f"  {row['bytes'] / 1e6:>9.3f} MB  {row['seconds']:9.4f} s  {row['s_per_mb']:8.3f} s/MB  "
                  f"peak +{row['peak_bytes'] / 1e6:9.1f} MB ({row['peak_multiple']:5.1f}x input){slope}",
                  flush=True)
        if args.fourfold and len(rows) == 2:
            print(f"  4x the input: x{rows[1]['seconds'] / rows[0]['seconds']:.2f} the time (linear: 4, "
                  f"quadratic: 16)")
        results[path] = rows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
