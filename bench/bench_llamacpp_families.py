"""llama.cpp's server as a parser of each family's answers, beside xtml:
the silent losses of each on the generated and hostile answers the vLLM
column is counted on (bench/bench_vllm_families.py, --losses).

    .venv/bin/python bench/bench_llamacpp_families.py                 # every answer of the eight families
    .venv/bin/python bench/bench_llamacpp_families.py --quick         # 3 generated + 3 hostile a family
    .venv/bin/python bench/bench_llamacpp_families.py --only kimi-k2,qwen3

Needs llama-server and the SmolLM2-135M-Instruct GGUF (tests/run sets both
up; ``XTML_LLAMA_SERVER`` and ``XTML_SMOLLM2_GGUF`` name others) and the chat
templates of llama.cpp's sdist (``XTML_LLAMA_TEMPLATES``). One server a
family, on the loopback address, runs with ``--jinja --chat-template-file``
and the family's official template: ``Qwen-Qwen3-0.6B.jinja``,
``meta-llama-Llama-3.1-8B-Instruct.jinja``, ``moonshotai-Kimi-K2.jinja``,
``GLM-4.6.jinja``, ``google-gemma-4-31B-it.jinja``,
``openai-gpt-oss-120b.jinja``, and, for DeepSeek V3.1 and Kimi K2 Thinking,
whose reference templates are not in the sdist, its later copies
``deepseek-ai-DeepSeek-V3.1.jinja`` and ``Kimi-K2-Thinking.jinja`` (what
matters here is which parser llama.cpp builds for the template; the log
names it). K3's row reads its answers with the sdist's ``Kimi-K3.jinja``
(llama.cpp's own, written for it). Mistral Small 3.1's reference template is
not in the sdist in any copy, and llama.cpp picks its parser by the
template's source, so no other text stands in for it: it is read by its
file name from the folder ``XTML_REFERENCE_TEMPLATES`` names (default
``~/.cache/xtml/references``), ``mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja``
of ggml-org/llama.cpp at commit 9190da2 (checked by its sha256;
tests/data/families/make_expected.py says how to take it out of a clone),
and without it the row says why it is not measured. A template
llama-server will not start with (its Jinja engine refuses it) is recorded
with what its log said (``template_refused``).

The answers are tests/helpers/vllm_families.py's: per family up to 24
generated ones (the last assistant turn of seeded requests as the dialect
renders it; what was meant is ``Template.parse`` of their ids) and 10-16
hostile ones (marker text in arguments, content and reasoning, cuts inside
a call or the reasoning, text around calls, an unknown tool, malformed
JSON, each with what the model meant). Each is sent to
``/v1/chat/completions`` as tests/helpers/llamacpp_families.py sends it: a
one-question conversation with the tools the answer's request declared
(``get_weather`` for the hostile ones) and its template options, and the
answer's text (up to its stop token) as the assistant message to continue,
the model held to adding nothing (``logit_bias`` on its end-of-generation
ids, ``max_tokens`` 1). llama.cpp refuses a ``grammar`` beside ``tools``,
so the completion cannot be forced by one; its parse input is its
generation prompt followed by the generated text, and the continued message
makes it the generation prompt followed by the answer's text, which
``/apply-template`` checks per answer. For Kimi K2, llama.cpp writes
``<think></think>`` before a continued message (its parser reads K2 and K2
Thinking alike), which its reasoning rule reads as empty reasoning, and for
Gemma 4 ``<|channel>thought\n<channel|>`` before an answer that opens no
thought block; the table says where text was put in between. For gpt-oss
it writes an empty analysis message and then a final channel's header
(``<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>``)
before any answer that opens no analysis message (a call, or final text,
right after ``<|start|>assistant``): the answer is then read as the final
message's body, not as written, so such an answer is counted as refused
(named under "not read as written").

A loss is counted as for the vLLM column (``losses``: a call missing or
changed, an argument included, or the reasoning or content changed,
compared stripped). A 200 answer of llama.cpp carries nothing that says it
dropped or repaired something, so every loss in one is silent; an error
answer is a report (counted apart, ``refused``, as is an answer the server
cannot be made to read as written). xtml's column is its own
lenient parse of the same answer's ids (``Template.parse(completion=True,
lenient=True)``), silent where it gives no diagnostic (the vLLM plugin logs
each diagnostic as a warning).

Only whole answers are read: llama.cpp's parse of a stream cannot be timed
apart from its decoding, so there is no cost per token here (the vLLM
bench has xtml's).

Results go to ``bench/results/llamacpp_families.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

DEFAULT_OUT = HERE / "results" / "llamacpp_families.json"
QUICK = (3, 3)


def found(env: str, pattern: str) -> str:
    """The file ``env`` names, else the first one tests/run's cache holds."""
    if os.environ.get(env):
        return os.environ[env]
    hits = sorted(glob.glob(os.path.expanduser(pattern)))
    if not hits:
        raise SystemExit(f"bench_llamacpp_families: set {env} (tests/run sets it up under ~/.cache/xtml)")
    return hits[0]


def run_family(name: str, binary: str, model: str, folder: Path, limit: tuple[int | None, int | None]
               ) -> dict[str, Any]:
    from tests.helpers import llamacpp_families as lf

    t0 = time.perf_counter()
    cases = lf.cases(name, *limit)
    rows = []
    for server in lf.started(binary, model, name, folder):
        for c in cases:
            try:
                rows.append((c, server.read(c)))
            except RuntimeError as err:
                rows.append((c, {"unforced": str(err)}))
        picked = server.picked()
    entry = lf.count(name, rows)
    entry |= {"llamacpp_format": picked, "seconds": round(time.perf_counter() - t0, 1),
              "template": lf.TEMPLATES[name][0],
              "answers_read": json.loads(lf.dumps(rows))}
    return entry


def cell(e: dict[str, Any], side: str) -> str:
    g, h = e[side]["generated"], e[side]["hostile"]
    text = f"{g['silent']}+{h['silent']}"
    refused = g.get("refused", 0) + h.get("refused", 0)
    return text + (f" ({refused} refused)" if refused else "")


def table(entries: list[dict[str, Any]]) -> str:
    head = (f"{'family':<17} {'llama.cpp format; parser':<42} {'answers':>7} | "
            f"{'silent llama.cpp':>18} {'silent xtml':>11}")
    lines = [head, "-" * len(head)]
    for e in entries:
        answers = f"{e['answers']['generated']}+{e['answers']['hostile']}"
        lines.append(f"{e['family']:<17} {e['llamacpp_format']:<42} {answers:>7} | "
                     f"{cell(e, 'llamacpp'):>18} {cell(e, 'xtml'):>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tests.helpers import llamacpp_families as lf

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"the first {QUICK[0]} generated and {QUICK[1]} hostile answers of each family")
    ap.add_argument("--only", help=f"these families (comma-separated: {', '.join(lf.BENCHED)})")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON results (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else list(lf.BENCHED)
    if not set(only) <= set(lf.BENCHED):
        ap.error(f"--only: families are {', '.join(lf.BENCHED)}")
    binary = found("XTML_LLAMA_SERVER", "~/.cache/xtml/llama-server/*/llama-server")
    model = found("XTML_SMOLLM2_GGUF", "~/.cache/xtml/models/*/*.gguf")
    os.environ.setdefault("XTML_LLAMA_TEMPLATES", found("XTML_LLAMA_TEMPLATES", "~/.cache/xtml/llama-cpp-templates/*"))
    limit: tuple[int | None, int | None] = QUICK if args.quick else (None, None)

    load_start = os.getloadavg()
    t0 = time.perf_counter()
    entries = []
    skipped: dict[str, str] = {}
    refused: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="xtml-bench-llamacpp-families-") as tmp:
        for name in only:
            why = lf.missing(name)
            if why is not None:
                print(f"{name}: not measured: {why}", flush=True)
                skipped[name] = why
                continue
            print(f"reading {name}'s answers through llama-server ...", flush=True)
            try:
                e = run_family(name, binary, model, Path(tmp), limit)
            except lf.TemplateRefused as err:
                print(f"  llama-server refuses {lf.TEMPLATES[name][0]}: {err}", flush=True)
                refused[name] = str(err)
                continue
            print(f"  {e['seconds']} s; llama.cpp: {e['llamacpp_format']}", flush=True)
            entries.append(e)
    elapsed = time.perf_counter() - t0

    print("\nsilent losses (generated+hostile answers; a loss is a call, an argument or text lost or changed; "
          "llama.cpp's error answers are reports, counted as refused):\n")
    print(table(entries))
    print()
    for e in entries:
        gen = sum(line.startswith("generated:") for line in e["lost"])
        named = [line.removeprefix("hostile: ") for line in e["lost"] if line.startswith("hostile:")]
        print(f"llama.cpp {e['family']:<17}: lost {gen} of {e['answers']['generated']} generated answers; "
              f"hostile: {'; '.join(named) or 'none'}")
        if e["unforced"]:
            print(f"    not read as written (counted as refused): {'; '.join(e['unforced'])}")
        between = set(e["inserted"].values())
        if between:
            print(f"    {len(e['inserted'])} answers read with {', '.join(map(repr, sorted(between)))} "
                  "written by llama.cpp between its generation prompt and the answer")
    env = {"llama_server": binary, "model": Path(model).name, "python": platform.python_version(),
           "cpus": os.cpu_count(), "load_average_start": load_start, "load_average_end": os.getloadavg(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "seconds": round(elapsed, 1),
           "limit": {"generated": limit[0], "hostile": limit[1]}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env, "families": entries, "not_measured": skipped,
                              "template_refused": refused}, indent=1, ensure_ascii=False), encoding="utf-8")
    print(f"\nwrote {out} ({elapsed:.0f} s; load average {load_start[0]:.2f} → {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
