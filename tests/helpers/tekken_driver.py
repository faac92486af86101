"""mistral-common's Tekken vocabulary, as a tokenizer.json and as the
reference ids of texts: run by a python that has mistral-common and
transformers (vLLM's venv, ``XTML_VLLM_PYTHON``), with no network.

Reads one JSON job on stdin, writes one JSON answer:

    job:    {"vocabulary": file name under mistral_common/data (a Tekken .json),
             "out": folder to write tokenizer.json to,
             "specials": [the format's special token strings],
             "texts": [text, ...]}
    answer: {"mistral_common": version, "vocabulary": path, "config": its config,
             "special_ids": {string: id as mistral-common's Tekkenizer has it},
             "ids": [[id, ...] per text]}

The tokenizer.json is transformers' conversion of the Tekken file (its
``MistralConverter``: the special slots first, the byte-level BPE ranks
after them). A text's reference ids are mistral-common's alone: the text
cut at each of ``specials``, each of them its Tekkenizer id, each piece
between ``Tekkenizer.encode`` (no BOS or EOS): a special token as a
special, the rest as text, as the format writes it.
"""

from __future__ import annotations

import json
import re
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any


def main(job: dict[str, Any]) -> dict[str, Any]:
    import mistral_common  # type: ignore[import-not-found]
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # type: ignore[import-not-found]
    from transformers.integrations.mistral.tokenizer import MistralConverter

    path = Path(mistral_common.__file__).parent / "data" / job["vocabulary"]
    tek = Tekkenizer.from_file(path)
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    MistralConverter(vocab_file=str(path)).converted().save(str(out / "tokenizer.json"))
    specials = {s: tek.get_special_token(s) for s in job["specials"]}
    # Longest first, so a token that holds another is cut whole.
    cut = re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
    ids = []
    for text in job["texts"]:
        row: list[int] = []
        for piece in cut.split(text):
            if piece in specials:
                row.append(specials[piece])
            elif piece:
                row.extend(tek.encode(piece, bos=False, eos=False))
        ids.append(row)
    config = json.loads(path.read_text(encoding="utf-8"))["config"]
    return {"mistral_common": version("mistral_common"), "vocabulary": str(path), "config": config,
            "special_ids": specials, "ids": ids}


if __name__ == "__main__":
    json.dump(main(json.load(sys.stdin)), sys.stdout)
