"""Runs xtml's xgrammar exports through xgrammar itself.

Run by the engines venv's python (tests/run sets it up, with torch and
xgrammar; xtml is not installed there, so this file imports nothing of it).
Reads one JSON job on stdin and writes one JSON answer on stdout:

    job:    {"tokenizer": path of a tokenizer.json,
             "special_ids": ids xgrammar is to treat as special tokens,
             "stop_ids": the ids that end a completion,
             "grammars": [{"ebnf": text} or {"structural_tag": JSON text}, ...],
             "cases": [{"grammar": index, "ids": [...], "tell_specials": true}, ...]}
    answer: {"xgrammar": version,
             "results": [{"taken": n, "terminated": bool, "refused": id or null}, ...]}

One process for a batch, since importing torch and building the tokenizer
info cost seconds while a case costs milliseconds.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Any

import xgrammar as xgr
from transformers import PreTrainedTokenizerFast

# A text no literal or character class of a grammar matches: byte 0xFF
# starts no UTF-8 character. Spelled as each vocabulary type spells it.
UNMATCHABLE = {xgr.VocabType.BYTE_LEVEL: "\u00ff", xgr.VocabType.BYTE_FALLBACK: "<0xFF>",
               xgr.VocabType.RAW: b"\xff"}


def tokenizer_info(path: str, special_ids: list[int], stop_ids: list[int], tell_specials: bool) -> xgr.TokenizerInfo:
    hf = PreTrainedTokenizerFast(tokenizer_file=path)
    # As vLLM and SGLang build it: every token, markers too, matched by its text.
    info = xgr.TokenizerInfo.from_huggingface(hf, stop_token_ids=stop_ids)
    if not tell_specials:
        return info
    # xgrammar 0.2 takes no list of special ids: it counts a token special
    # when its text is empty, and then refuses it even where the grammar
    # names it by Token(id). So the special ids keep a text, one that only
    # their Token(id) can match.
    encoded: list[str | bytes] = [""] * info.vocab_size
    for text, i in hf.get_vocab().items():
        encoded[i] = text
    for i in special_ids:
        if i not in stop_ids:
            encoded[i] = UNMATCHABLE[info.vocab_type]
    return xgr.TokenizerInfo(encoded, info.vocab_type, vocab_size=info.vocab_size, stop_token_ids=stop_ids,
                             add_prefix_space=info.add_prefix_space)


def run(job: dict[str, Any]) -> dict[str, Any]:
    infos: dict[bool, xgr.TokenizerInfo] = {}
    compilers: dict[bool, xgr.GrammarCompiler] = {}
    compiled: dict[tuple[bool, int], xgr.CompiledGrammar] = {}
    results = []
    for case in job["cases"]:
        tell = case.get("tell_specials", True)
        if tell not in infos:
            infos[tell] = tokenizer_info(job["tokenizer"], job["special_ids"], job["stop_ids"], tell)
            compilers[tell] = xgr.GrammarCompiler(infos[tell], max_threads=1)
        key = (tell, case["grammar"])
        if key not in compiled:
            g = job["grammars"][case["grammar"]]
            compiled[key] = (compilers[tell].compile_grammar(g["ebnf"]) if "ebnf" in g
                             else compilers[tell].compile_structural_tag(g["structural_tag"]))
        m = xgr.GrammarMatcher(compiled[key])
        taken, refused = 0, None
        for i in case["ids"]:
            if m.is_terminated() or not m.accept_token(i):
                refused = i
                break
            taken += 1
        results.append({"taken": taken, "terminated": m.is_terminated(), "refused": refused})
    return {"xgrammar": version("xgrammar"), "results": results}


if __name__ == "__main__":
    json.dump(run(json.load(sys.stdin)), sys.stdout)
