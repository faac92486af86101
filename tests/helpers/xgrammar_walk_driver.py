"""Random walks under xgrammar's own matcher, in the engines venv: each walk
is a completion xgrammar admits (the walk of tests/helpers/layout_walks.py:
tokens at random, ending ones preferred past a budget), for the main venv
to parse.

Run by the engines venv's python, as tests/helpers/xgrammar_driver.py is
(whose tokenizer info it loads by path: isolated mode imports nothing from
this folder). Reads one JSON job on stdin and writes one JSON answer:

    job:    {"tokenizer", "special_ids", "stop_ids", "grammars": as that driver's,
             "walks": [{"grammar": index, "seed": int}, ...],
             "enders": ids preferred past the budget (and one time in five),
             "numerals": ids preferred three times in ten otherwise,
             "budget": steps at random, "max_steps": steps at most}
    answer: {"xgrammar": version, "walks": [[id, ...], ...]}

A walk ends with a stop id xgrammar takes there (or where the matcher
terminates); a step where nothing is allowed, or a walk past max_steps,
fails the run.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import xgrammar as xgr  # type: ignore[import-not-found]

_spec = importlib.util.spec_from_file_location("xgrammar_driver", Path(__file__).with_name("xgrammar_driver.py"))
assert _spec is not None and _spec.loader is not None
_driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_driver)


def _walk(m: Any, rng: random.Random, size: int, job: dict[str, Any], stops: set[int]) -> list[int]:
    enders, numerals = set(job["enders"]) | stops, set(job["numerals"])
    mask = xgr.allocate_token_bitmask(1, size)
    ids: list[int] = []
    for step in range(job["max_steps"]):
        m.fill_next_token_bitmask(mask)
        words = mask[0].tolist()
        allowed = [i for i in range(size) if (words[i >> 5] >> (i & 31)) & 1]
        if not allowed:
            raise AssertionError(f"nothing allowed after {ids}")
        r = rng.random()
        if step >= job["budget"] or r < 0.2:
            allowed = [i for i in allowed if i in enders] or allowed
        elif r < 0.5:
            allowed = [i for i in allowed if i in numerals] or allowed
        t = rng.choice(allowed)
        if not m.accept_token(t):
            raise AssertionError(f"the matcher refused the token it allowed, {t}, after {ids}")
        ids.append(t)
        if t in stops or m.is_terminated():
            return ids
    raise AssertionError(f"a walk did not end within {job['max_steps']} steps: {ids[-60:]}")


def run(job: dict[str, Any]) -> dict[str, Any]:
    info = _driver.tokenizer_info(job["tokenizer"], job["special_ids"], job["stop_ids"], True)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    compiled = [compiler.compile_grammar(g["ebnf"]) if "ebnf" in g else compiler.compile_structural_tag(
        g["structural_tag"]) for g in job["grammars"]]
    stops = set(job["stop_ids"])
    walks = [_walk(xgr.GrammarMatcher(compiled[w["grammar"]]), random.Random(w["seed"]), info.vocab_size, job,
                   stops) for w in job["walks"]]
    return {"xgrammar": version("xgrammar"), "walks": walks}


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
