"""The families table: one row per built-in dialect (``kimi-k3`` and every
built-in layout dialect), with the silent losses of xtml, vLLM 0.33's own
parsers and llama.cpp's server on the same generated and hostile answers,
the cost per streamed id at about 1k and 100k ids of xtml's vLLM parsers
and vLLM's, xtml's own stream alone, and the render against transformers'
Jinja, all in one table.

    .venv/bin/python bench/bench_table.py            # runs the benches, then the table (about 25 min)
    .venv/bin/python bench/bench_table.py --quick    # each bench's quick run
    .venv/bin/python bench/bench_table.py --reuse    # the table of the result files already there

It measures nothing the other benches measure: it runs them, each as a
subprocess writing its JSON to the results folder (``--results``, default
``bench/results``), and reads those files:

* ``bench_families.py`` → ``families.json``: per layout dialect, render →
  ids against transformers' ``apply_chat_template(tokenize=True)`` with the
  official template, and ``Template.stream`` per id at 1k and 100k ids;
* ``bench_vllm_families.py`` → ``vllm_families.json``: per family, the
  silent losses of xtml's vLLM parsers and vLLM's own on its generated and
  hostile answers (whole / one id a delta), and the cost per id of both
  stacks inside vLLM (``--quick``: ``--losses --quick``, 1k ids only);
* ``bench_llamacpp_families.py`` → ``llamacpp_families.json``: the silent
  losses of llama.cpp's server on the same answers, and the answers it
  refuses;
* ``bench_vllm.py --sizes 1000,100000`` → ``vllm.json``: K3's cost per id
  in vLLM, xtml's parsers against vLLM's ``kimi_k3`` (``--quick``: 1k ids).

The measurements of its own are K3's: its ``Template.stream`` per id at
about 1k and 100k ids (an answer of reasoning, content and a call, fed one
id at a time, as bench_families.py feeds the families'), and its render
against transformers, which no bench above makes on the families' footing (``bench_peers.py`` makes it
on another vocabulary, beside peers it needs the ``bench`` extra for): the
same rounds as ``bench_families.py`` (its ``rounds`` and ``ratio``), on
``bench_core.make_chat`` conversations of 20 messages, over SmolLM2's
vocabulary with K3's markers as special tokens, with
``bench/k3_chat_template.jinja`` as the template (it writes K3's markup but
not xtml's bytes: the tools' JSON spacing, the argument types it can tell
apart and the tool results' names differ, so the texts are recorded as not
equal). Both written to ``k3_render.json``.

K3's silent losses are counted as the families' are, against vLLM's
``kimi_k3`` and llama.cpp's "Kimi K3" (with the sdist's ``Kimi-K3.jinja``).
The reference templates llama.cpp's sdist does not carry as the dialects
mirror them (Mistral Small 3.1's, DeepSeek V3.1's and Kimi K2 Thinking's,
read from llama.cpp's history: tests/data/families/make_expected.py says
how) are looked for in ``XTML_REFERENCE_TEMPLATES`` (default
``~/.cache/xtml/references``) by bench_families.py (the render against
transformers) and bench_llamacpp_families.py (Mistral Small 3.1's server);
without them those cells say so. SmolLM2 writes no tool calls and no
reasoning, so no engine parser is paired with it: its engine cells are "—".

Needs what the benches need: ``XTML_SMOLLM2_GGUF``, ``XTML_LLAMA_TEMPLATES``
and ``XTML_LLAMA_SERVER`` (looked for in tests/run's cache,
``~/.cache/xtml``, when unset) and vLLM's venv (``XTML_VLLM_PYTHON``). A
bench that fails is reported and its cells say "not measured"; the table
is still written. Writes ``--out`` (default ``bench/results/table.json``)
and the markdown table beside it (``table.md``). On 2 shared vCPUs the
default run took 24 minutes with other jobs running (load average 3 to 5):
``bench_vllm_families.py`` 14, ``bench_llamacpp_families.py`` 6,
``bench_vllm.py`` 2, ``bench_families.py`` 1.5, K3's render 5 seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_RESULTS = HERE / "results"
K3 = "kimi-k3"
SIZES = ("1000", "100000")
K3_RENDER = "k3_render.json"


@dataclass(frozen=True)
class Bench:
    key: str
    script: str
    file: str
    full: tuple[str, ...]
    quick: tuple[str, ...]


BENCHES = (
    Bench("families", "bench_families.py", "families.json", (), ("--quick",)),
    # --quick alone skips the loss count, which the table needs.
    Bench("vllm_families", "bench_vllm_families.py", "vllm_families.json", (), ("--losses", "--quick")),
    Bench("llamacpp_families", "bench_llamacpp_families.py", "llamacpp_families.json", (), ("--quick",)),
    Bench("vllm_k3", "bench_vllm.py", "vllm.json", ("--sizes", "1000,100000"), ("--quick", "--sizes", "1000")),
)

NOTES = {
    "no-parser": "SmolLM2 writes no tool calls and no reasoning: no engine parser is paired with it, and "
                 "the loss count reads no SmolLM2 answers.",
    "k3-jinja": "K3's row: bench/k3_chat_template.jinja, which writes K3's markup but not xtml's bytes "
                "(tools' JSON spacing, argument types, tool results' names), measured by this script in "
                "bench_families.py's rounds.",
    "cut": "vLLM's run stopped at bench_vllm_families.py's --cap (seconds): the figure is over the ids it "
           "reached, a floor for the whole run.",
    "once": "vLLM's run took longer than bench_vllm.py's --cap (seconds): one run, not repeated.",
}


# -- running the benches ----------------------------------------------------------------------


def cached(env: str, pattern: str) -> None:
    """Sets ``env`` to the first file tests/run's cache holds, when unset."""
    if not os.environ.get(env):
        hits = sorted(glob.glob(os.path.expanduser(pattern)))
        if hits:
            os.environ[env] = hits[0]


def run_bench(b: Bench, results: Path, quick: bool) -> dict[str, Any]:
    """Runs one bench writing its JSON into ``results``: its command, exit
    status, time and the end of its error output."""
    cmd = [sys.executable, str(HERE / b.script), *(b.quick if quick else b.full), "--out", str(results / b.file)]
    print(f"\n== {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    seconds = round(time.perf_counter() - t0, 1)
    if run.stderr:
        sys.stderr.write(run.stderr[-4000:])
    print(f"== {b.script}: exit {run.returncode}, {seconds} s", flush=True)
    return {"command": cmd[1:], "returncode": run.returncode, "seconds": seconds,
            "stderr_tail": run.stderr[-1500:] if run.returncode else ""}


def k3_answer(t: Any, vocab: Any, n: int, paragraph: str) -> list[int]:
    """About ``n`` ids of a K3 answer after its generation prompt, as
    bench_families.py makes the families' (reasoning, content and a call),
    up to and with the end marker."""
    import xtml

    user = [{"role": "user", "content": "Go on."}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    reps, ids = 1, []
    while len(ids) < n:
        answer = {"role": "assistant", "reasoning_content": paragraph * reps, "content": paragraph * reps,
                  "tool_calls": [{"type": "function", "function": {
                      "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}]}
        req = {"messages": user, "tools": tools}
        prompt = t.render(req).text
        whole = t.render({**req, "messages": [*user, answer], "add_generation_prompt": False}).text
        if not whole.startswith(prompt):
            raise xtml.XtmlError("K3's answer does not extend its prompt")
        ids = t.completion_ids(whole[len(prompt):], vocab)
        reps = max(reps + 1, reps * n // max(len(ids), 1))
    return list(ids)


def k3_render(gguf: str, quick: bool) -> dict[str, Any]:
    """K3's render → ids against transformers with bench/k3_chat_template.jinja,
    in bench_families.py's rounds, shaped as one of its rows."""
    sys.path.insert(0, str(HERE))
    from bench_core import make_chat
    from bench_families import PARAGRAPH, per_token_us, ratio, rounds
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    import xtml

    t = xtml.load(K3)
    vocab = xtml.load_tokenizer(gguf, add_special_tokens=list(t.markers.all()))
    tok = Tokenizer.from_str(vocab.tokenizer.to_str())
    tok.encode_special_tokens = False
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()))  # type: ignore[no-untyped-call]
    jinja = (HERE / "k3_chat_template.jinja").read_text(encoding="utf-8")
    seeds = list(range(20250101, 20250101 + (3 if quick else 8)))
    reqs = [make_chat(20, s) for s in seeds]

    def objects(req: dict[str, Any]) -> list[dict[str, Any]]:
        # The template iterates the arguments' items: objects, not JSON text.
        return [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
            c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in req["messages"]]

    hf_msgs = [objects(r) for r in reqs]

    def hf_call(k: int, tokenize: bool) -> Any:
        return hf.apply_chat_template(hf_msgs[k], tools=reqs[k]["tools"], chat_template=jinja, tokenize=tokenize,
                                      add_generation_prompt=True, thinking_effort=reqs[k]["thinking_effort"])

    texts = [t.render(r).text for r in reqs]
    # As bench_families.py does: tiktoken's BPE made first, as a server makes it.
    fast = bool(vocab.fast_bpe())
    ids = [t.encode(r, vocab) for r in reqs]
    hf_texts = [hf_call(k, False) for k in range(len(reqs))]
    floor_ids = [e.ids for e in (tok.encode_batch_fast([x], add_special_tokens=False)[0] for x in texts)]
    checks = {"tiktoken's BPE in use": fast, "xtml ids == floor ids of its text": ids == floor_ids,
              "transformers text == xtml text": hf_texts == texts}
    methods: dict[str, Callable[[int], Any]] = {
        "floor": lambda k: tok.encode_batch_fast([texts[k]], add_special_tokens=False),
        "xtml": lambda k: t.encode(reqs[k], vocab),
        "transformers": lambda k: hf_call(k, True),
    }
    for k in range(len(reqs)):
        for f in methods.values():
            f(k)
    times = rounds(methods, 6 if quick else 30, len(reqs))
    stream = {}
    for n in (1_000, 100_000):
        answer = k3_answer(t, vocab, n, PARAGRAPH)
        reps = 3 if n >= 100_000 else 9
        got = [per_token_us(SimpleNamespace(t=t, vocab=vocab), answer) for _ in range(reps)]  # type: ignore[arg-type]
        stream[str(n)] = {"ids": len(answer), "per_token_us": statistics.median(g[0] for g in got),
                          "stop_token_us": statistics.median(g[1] for g in got)}
    return {"dialect": K3, "reference": "bench/k3_chat_template.jinja", "checks": checks, "stream": stream,
            "ids_per_prompt": statistics.median(map(len, ids)),
            "text_length_vs_xtml": statistics.median(len(a) / len(b) for a, b in zip(hf_texts, texts)),
            "render_floor_us": statistics.median(times["floor"]) * 1e6,
            "render_xtml_us": statistics.median(times["xtml"]) * 1e6,
            "render_transformers_us": statistics.median(times["transformers"]) * 1e6,
            "render_vs_floor": ratio(times, "xtml", "floor"),
            "transformers_vs_xtml": ratio(times, "transformers", "xtml")}


# -- reading the results ----------------------------------------------------------------------


def load(results: Path) -> dict[str, Any]:
    """Each bench's JSON in ``results`` (None where there is none or it does
    not read as JSON), and K3's render."""
    out: dict[str, Any] = {}
    for key, name in [*((b.key, b.file) for b in BENCHES), ("k3_render", K3_RENDER)]:
        path = results / name
        try:
            out[key] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            out[key] = None
    return out


def us(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


class Table:
    """The rows, their cells as text, and the notes the cells point to."""

    def __init__(self) -> None:
        self.notes: dict[str, str] = {}

    def note(self, key: str, text: str | None = None) -> str:
        """The mark of note ``key`` (its text ``NOTES[key]`` unless given)."""
        if key not in self.notes:
            self.notes[key] = NOTES[key] if text is None else text
        return f"[{list(self.notes).index(key) + 1}]"


NOT_MEASURED = "not measured"


def losses_cells(tb: Table, name: str, res: dict[str, Any]) -> dict[str, str]:
    vf = (res["vllm_families"] or {}).get("losses")
    fam = next((e for e in (vf or {}).get("families", ()) if e["family"] == name), None)
    llamacpp = res["llamacpp_families"] or {}
    lc = next((e for e in llamacpp.get("families", ()) if e["family"] == name), None)
    if fam is None and lc is None and name == "smollm2":
        n = tb.note("no-parser")
        return {"answers": "—", "xtml": NOT_MEASURED + n, "vllm": "—" + n, "llamacpp": "—" + n}
    cells = {"answers": "—", "xtml": NOT_MEASURED, "vllm": NOT_MEASURED, "llamacpp": NOT_MEASURED}

    if fam is not None:
        cells["answers"] = f"{fam['answers']['generated']}+{fam['answers']['hostile']}"
        for side in ("xtml", "vllm"):
            s = fam[side]
            cell = (f"{s['generated']['silent whole'] + s['hostile']['silent whole']}/"
                    f"{s['generated']['silent streamed'] + s['hostile']['silent streamed']}")
            raised = s["generated"]["raised"] + s["hostile"]["raised"]
            cells[side] = cell + (f" ({raised} raised)" if raised else "")
        parsers = fam["vllm_parsers"].removesuffix("+None")
        cells["vllm"] += f" (`{parsers}`)"
    if lc is not None:
        g, h = lc["llamacpp"]["generated"], lc["llamacpp"]["hostile"]
        refused = g.get("refused", 0) + h.get("refused", 0)
        cells["llamacpp"] = f"{g['silent']}+{h['silent']}" + (f" ({refused} refused)" if refused else "")
        answers = f"{lc['answers']['generated']}+{lc['answers']['hostile']}"
        if fam is None:
            cells["answers"] = answers
        elif answers != cells["answers"]:  # a quick run reads fewer
            cells["llamacpp"] += f" of {answers}"
        x = lc["xtml"]
        parsed = f"{x['generated']['silent'] + x['hostile']['silent']}"
        cells["xtml"] = (cells["xtml"] if fam else NOT_MEASURED) + f" · {parsed}"
    elif name in llamacpp.get("template_refused", {}):
        said = llamacpp["template_refused"][name]
        cells["llamacpp"] = "refuses the template" + tb.note(
            f"refused {name}", f"{name}: llama-server does not start with the reference template; its log: {said}")
    elif name in llamacpp.get("not_measured", {}):
        cells["llamacpp"] += tb.note(f"unmeasured {name}", f"{name}: {llamacpp['not_measured'][name]}.")
    return cells


def stream_cells(tb: Table, name: str, res: dict[str, Any]) -> dict[str, str]:
    """µs per id at each size, xtml / vLLM, inside vLLM."""
    cells = dict.fromkeys(SIZES, NOT_MEASURED)
    if name == K3:
        for e in (res["vllm_k3"] or {}).get("sizes", ()):
            if str(e["target"]) in cells:
                star = tb.note("once") if e["kimi_k3"].get("once") else ""
                cells[str(e["target"])] = f"{us(e['xtml']['median_us'])} / {us(e['kimi_k3']['median_us'])}{star}"
        return cells
    entries = [e for e in (res["vllm_families"] or {}).get("sizes", ()) if e["template"] == name]
    if not entries and name == "smollm2":
        n = tb.note("no-parser")
        return dict.fromkeys(SIZES, "—" + n)
    workloads = list(dict.fromkeys(e["workload"] for e in entries))

    def side(e: dict[str, Any], p: str) -> str:
        s = e[p]
        if "median_us" not in s:
            return "raised"
        return us(s["median_us"]) + (tb.note("cut") if s.get("cut_at") else "")

    for size in SIZES:
        parts = []
        for w in workloads:
            e = next((e for e in entries if e["workload"] == w and str(e["target"]) == size), None)
            if e is None:
                continue
            # The workload's own words past the family's name (mistral's
            # workloads say "mistral-3.1 text").
            label = w.split(" ", 1)[1] if " " in w else ""
            parts.append((f"{label}: " if label else "") + f"{side(e, 'xtml')} / {side(e, 'vllm')}")
        if parts:
            cells[size] = "; ".join(parts)
    return cells


def own_stream_cell(tb: Table, name: str, row: dict[str, Any] | None) -> str:
    if row is None or "stream" not in row:
        return NOT_MEASURED
    return " / ".join(us(row["stream"][n]["per_token_us"]) if n in row["stream"] else "—" for n in SIZES)


def render_cell(tb: Table, name: str, row: dict[str, Any] | None) -> str:
    if row is None:
        return NOT_MEASURED
    mark = tb.note("k3-jinja") if name == K3 else ""
    if "transformers_vs_xtml" not in row:
        why = tb.note(f"no-template {name}", f"{name}: no transformers figure, the official template is not "
                      f"here ({row['reference']}).")
        return f"{row['render_xtml_us'] / 1e3:.2f} / —{why}"
    differ = "" if name == K3 or row["checks"].get("transformers text == xtml text", True) else ", texts differ"
    return (f"{row['render_xtml_us'] / 1e3:.2f} / {row['render_transformers_us'] / 1e3:.2f} "
            f"({row['transformers_vs_xtml']:.2f}x{differ}){mark}")


COLUMNS = (
    ("dialect", "dialect"),
    ("answers", "answers (generated+hostile)"),
    ("losses_xtml", "silent losses xtml (vLLM whole/streamed · Template.parse)"),
    ("losses_vllm", "silent losses vLLM 0.33 (whole/streamed)"),
    ("losses_llamacpp", "silent losses llama.cpp (generated+hostile)"),
    ("stream_1k", "µs/id in vLLM at 1k, xtml / vLLM"),
    ("stream_100k", "µs/id in vLLM at 100k, xtml / vLLM"),
    ("own_stream", "Template.stream µs/id, 1k / 100k"),
    ("render", "render ms, xtml / transformers (transformers ÷ xtml)"),
)


def build(res: dict[str, Any], layout: list[str]) -> dict[str, Any]:
    """The table of the results ``load`` read: a row per dialect, K3 first,
    then ``layout`` in its order."""
    tb = Table()
    fam_rows = {r["dialect"]: r for r in (res["families"] or {}).get("rows", ())}
    rows = []
    for name in [K3, *layout]:
        lo = losses_cells(tb, name, res)
        st = stream_cells(tb, name, res)
        own = fam_rows.get(name)
        render_row = res["k3_render"] if name == K3 else own
        rows.append({"dialect": name, "answers": lo["answers"], "losses_xtml": lo["xtml"],
                     "losses_vllm": lo["vllm"], "losses_llamacpp": lo["llamacpp"],
                     "stream_1k": st["1000"], "stream_100k": st["100000"],
                     "own_stream": own_stream_cell(tb, name, render_row), "render": render_cell(tb, name, render_row)})
    sources = {k: (v or {}).get("env") for k, v in res.items() if k != "k3_render"}
    return {"columns": dict(COLUMNS), "rows": rows, "notes": list(tb.notes.values()), "sources": sources}


def markdown(table: dict[str, Any]) -> str:
    keys = [k for k, _ in COLUMNS]
    lines = ["| " + " | ".join(table["columns"][k] for k in keys) + " |",
             "|---|" + "--:|" * (len(keys) - 1)]
    lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in table["rows"]]
    lines.append("")
    lines += [f"[{k}] {n}" for k, n in enumerate(table["notes"], start=1)]
    return "\n".join(lines) + "\n"


# -- the run ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="each bench's quick run")
    ap.add_argument("--reuse", action="store_true", help="run nothing: the table of the result files there")
    ap.add_argument("--results", default=str(DEFAULT_RESULTS), help=f"the benches' JSON (default {DEFAULT_RESULTS})")
    ap.add_argument("--out", help="the table's JSON (default RESULTS/table.json; the markdown beside it, .md)")
    args = ap.parse_args(argv)
    results = Path(args.results).resolve()
    out = Path(args.out) if args.out else results / "table.json"
    runs: dict[str, Any] = {}
    t0 = time.perf_counter()
    if not args.reuse:
        cached("XTML_SMOLLM2_GGUF", "~/.cache/xtml/models/*/*.gguf")
        cached("XTML_LLAMA_TEMPLATES", "~/.cache/xtml/llama-cpp-templates/*")
        cached("XTML_LLAMA_SERVER", "~/.cache/xtml/llama-server/*/llama-server")
        results.mkdir(parents=True, exist_ok=True)
        for b in BENCHES:
            runs[b.script] = run_bench(b, results, args.quick)
        print("\n== K3's render against transformers (bench/k3_chat_template.jinja)", flush=True)
        k3t0 = time.perf_counter()
        try:
            row = k3_render(os.environ.get("XTML_SMOLLM2_GGUF", ""), args.quick)
            (results / K3_RENDER).write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
            runs["k3 render"] = {"returncode": 0, "seconds": round(time.perf_counter() - k3t0, 1)}
        except Exception as e:  # reported; the table says not measured
            print(f"K3's render: {type(e).__name__}: {e}", file=sys.stderr)
            runs["k3 render"] = {"returncode": 1, "error": f"{type(e).__name__}: {e}"[:500]}
    import xtml.chat.template_file as tf

    table = build(load(results), list(tf.LAYOUT_BUILTIN))
    table["run"] = {"quick": args.quick, "reuse": args.reuse, "seconds": round(time.perf_counter() - t0, 1),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "load_average_end": os.getloadavg(),
                    "benches": runs}
    md = markdown(table)
    print()
    print(md)
    failed = [k for k, v in runs.items() if v["returncode"]]
    if failed:
        print(f"failed (their cells say not measured): {', '.join(failed)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(md, encoding="utf-8")
    print(f"wrote {out} and {out.with_suffix('.md')} ({table['run']['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
