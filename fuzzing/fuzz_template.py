"""Coverage-guided fuzzing of template loading with atheris (optional).

    pip install atheris                      # or: pip install 'xtml[fuzz]'
    python fuzzing/fuzz_template.py -atheris_runs=200000 [corpus_dir]
    python fuzzing/fuzz_template.py --smoke  # a short run; without atheris, seeded random input

Input bytes are a template file: half the time as they are, half the time
spliced into a built-in template (so that the fuzzer starts from files that
load and mutates them section by section). Loading must end in a template or
an ``xtml.TemplateError``; a template that loads must render a small request
and read it back, ending only in a result or an ``xtml.XtmlError``. Anything
else (RecursionError, a stray exception, a crash) is what atheris reports,
with the input that caused it.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import xtml
from xtml.chat.template_file import builtin_files

BASES = [p.read_bytes() for p in dict.fromkeys(builtin_files().values())]
REQUEST = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|open|>"},
                        {"role": "assistant", "reasoning_content": "Think.", "content": "Hello.",
                         "tool_calls": [{"id": "c1", "type": "function",
                                         "function": {"name": "f", "arguments": {"a": 1}}}]},
                        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
_DIR = tempfile.mkdtemp(prefix="xtml-fuzz-template-")
atexit.register(shutil.rmtree, _DIR, True)
_count = 0


def template_bytes(data: bytes) -> bytes:
    """The file one input stands for."""
    if len(data) < 6 or data[0] % 2 == 0:
        return data[1:]
    base = BASES[data[1] % len(BASES)]
    at = int.from_bytes(data[2:5], "little") % (len(base) + 1)
    cut = data[5] % 64
    return base[:at] + data[6:] + base[at + cut:]


def one_input(data: bytes) -> None:
    global _count
    _count += 1
    # A new name each time: load() caches by path, modification time and size.
    path = Path(_DIR) / f"t{_count % 1000}-{_count}.toml"
    path.write_bytes(template_bytes(data))
    try:
        try:
            template = xtml.load(path)
        except xtml.TemplateError:
            return
        try:
            text = template.render(REQUEST, add_generation_prompt=False).text
            template.parse(text, lenient=True)
            template.parse(text)
        except xtml.XtmlError:
            pass
    finally:
        os.unlink(path)


def smoke(runs: int, seed: int = 0) -> None:
    """Seeded random inputs, for when atheris is not installed."""
    rng = random.Random(seed)
    pieces = [b"[", b"]", b"{", b"}", b"=", b'"', b"'", b"\n", b".", b",", b"#", b"a", b"1", b"[" * 40,
              b"x = " + b"[" * 2000, b"(a|aa)+", b"prompt = '^(a+)+$'\n", b"\xff", b"[plugins.image]\n"]
    for _ in range(runs):
        head = bytes(rng.randrange(256) for _ in range(6))
        one_input(head + b"".join(rng.choice(pieces) for _ in range(rng.randrange(12))))


def main() -> None:
    argv = [a for a in sys.argv if a != "--smoke"]
    try:
        import atheris
    except ImportError:
        if "--smoke" not in sys.argv:
            raise SystemExit("atheris is not installed (pip install atheris); --smoke runs without it") from None
        smoke(300)
        print("fuzz_template smoke run: 300 random inputs, no crash")
        return
    if "--smoke" in sys.argv:
        # Start from the built-in templates, whole and spliced, so that a
        # short run reaches past the TOML reader.
        seeds = tempfile.mkdtemp(prefix="xtml-fuzz-seeds-")
        for k, base in enumerate(BASES):
            Path(seeds, f"whole{k}").write_bytes(b"\x00" + base)
            Path(seeds, f"splice{k}").write_bytes(bytes([1, k, 0, 2, 0, 0]) + b"\n[x]\n")
        argv += ["-atheris_runs=1000", "-max_len=16384", "-len_control=0", "-seed=1", seeds]
    atheris.instrument_all()
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
