"""Random walks under xgrammar's own matcher for Gemma 4's grammars, in the
engines venv: tests/helpers/xgrammar_walk_driver.py's walk, with the
preference tests/helpers/gemma_grammar.py's llguidance walk has past its
budget (a declared key where no token of the format nor a closer may
come), so that walks through objects whose required keys are yet to come
end.

Run by the engines venv's python (isolated mode: it loads its sibling
drivers by path). Reads one JSON job on stdin and writes one JSON answer:

    job:    {"tokenizer", "special_ids", "stop_ids", "grammars": as xgrammar_driver.py's,
             "walks": [{"grammar": index, "seed": int, "keys": [[id, ...], ...]}, ...],
             "special": ids preferred past the budget (and one time in five), first,
             "closers": ids that close an object or array, "closing": ids preferred
             after the special ones, "numerals": ids preferred three
             times in ten otherwise, "budget", "max_steps"}
    answer: {"xgrammar": version, "walks": [[id, ...], ...]}
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


def _fits(m: Any, ids: list[int]) -> bool:
    f = m.fork()
    return all(f.accept_token(i) for i in ids)


def _walk(m: Any, rng: random.Random, size: int, job: dict[str, Any], keys: list[list[int]],
          stops: set[int]) -> list[int]:
    special, closing, numerals = set(job["special"]) | stops, set(job["closing"]), set(job["numerals"])
    closers = set(job["closers"])
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
            if step >= job["budget"] and not any(i in special or i in closers for i in allowed):
                key = next((k for k in rng.sample(keys, len(keys)) if _fits(m, k)), None)
                if key is not None:
                    for i in key:
                        assert m.accept_token(i)
                    ids += key
                    continue
            allowed = [i for i in allowed if i in special] or [i for i in allowed if i in closing] or allowed
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
                   w["keys"], stops) for w in job["walks"]]
    return {"xgrammar": version("xgrammar"), "walks": walks}


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
