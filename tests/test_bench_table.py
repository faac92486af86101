"""bench/bench_table.py reads the benches' result files into the families
table: each cell from the right file and field, "not measured" where a
file or a row is missing, "—" where no engine parser is paired with the
format, never a number it was not given. On small result files under
tests/data/bench_table (one a bench); nothing is timed or run."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from xtml.chat.template_file import LAYOUT_BUILTIN

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "bench_table"


def bench_table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_table", ROOT / "bench" / "bench_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_table"] = mod
    spec.loader.exec_module(mod)
    return mod


bt = bench_table()


def rows(folder: Path) -> tuple[dict[str, dict[str, str]], list[str]]:
    table = bt.build(bt.load(folder), list(LAYOUT_BUILTIN))
    return {r["dialect"]: r for r in table["rows"]}, table["notes"]


def note(notes: list[str], cell: str) -> str:
    """The text of the note a cell points to."""
    m = re.search(r"\[(\d+)\]$", cell)
    assert m, cell
    return notes[int(m.group(1)) - 1]


def test_a_row_per_built_in_dialect_k3_first() -> None:
    table = bt.build(bt.load(DATA), list(LAYOUT_BUILTIN))
    assert [r["dialect"] for r in table["rows"]] == ["kimi-k3", *LAYOUT_BUILTIN]
    assert "smollm2" in LAYOUT_BUILTIN and "glm-4.6" in LAYOUT_BUILTIN


def test_a_family_row_reads_every_bench() -> None:
    by, _ = rows(DATA)
    q = by["qwen3"]
    assert q["answers"] == "24+12"
    assert q["losses_xtml"] == "0/0 · 0"
    assert q["losses_vllm"] == "17/33 (`hermes+qwen3`)"
    assert q["losses_llamacpp"] == "1+3 (5 refused)"
    assert q["stream_1k"] == "4.79 / 10.9"
    assert q["stream_100k"] == "4.14 / 114"
    assert q["own_stream"] == "0.87 / 1.01"
    assert q["render"] == "3.70 / 7.45 (1.78x)"


def test_raised_refused_and_a_quick_run_of_fewer_answers() -> None:
    by, _ = rows(DATA)
    ll = by["llama-3.1"]
    assert ll["losses_xtml"] == "0/0 (1 raised) · 0"
    assert ll["losses_vllm"] == "13/25 (2 raised) (`llama3_json`)"
    # llama.cpp's run read 3+3 of the family's 24+10 answers.
    assert ll["losses_llamacpp"] == "2+0 (3 refused) of 3+3"


def test_two_workloads_of_a_family_and_a_cut_run() -> None:
    by, notes = rows(DATA)
    ll = by["llama-3.1"]
    assert ll["stream_1k"] == "text: 4.92 / 4.78; call: 2.65 / 322"
    assert ll["stream_100k"].startswith("text: 5.64 / 84.8; call: 2.06 / 6,205[")
    assert "--cap" in note(notes, ll["stream_100k"])
    # A stack that raised is said so; a size not run is not measured.
    assert by["kimi-k2"]["stream_1k"] == "4.57 / raised"
    assert by["kimi-k2"]["stream_100k"] == "not measured"


def test_a_family_only_llamacpp_read() -> None:
    by, _ = rows(DATA)
    k2 = by["kimi-k2"]
    assert k2["answers"] == "24+10"
    assert k2["losses_llamacpp"] == "24+1 (5 refused)"
    assert k2["losses_vllm"] == "not measured"
    assert k2["losses_xtml"] == "not measured · 0"


def test_no_official_template_and_texts_that_differ() -> None:
    by, notes = rows(DATA)
    assert by["deepseek-v3.1"]["render"].startswith("3.51 / —[")
    assert note(notes, by["deepseek-v3.1"]["render"]).startswith(
        "deepseek-v3.1: no transformers figure, the official template is not here (deepseek-ai-")
    assert by["glm-4.6"]["render"] == "3.76 / 5.61 (1.64x, texts differ)"


def test_k3_row() -> None:
    by, notes = rows(DATA)
    k3 = by["kimi-k3"]
    assert k3["answers"] == "24+12"
    assert k3["losses_xtml"] == "0/0 · 0"
    assert k3["losses_vllm"] == "9/10 (`kimi_k3+kimi_k3`)"
    assert k3["losses_llamacpp"] == "0+3 (9 refused)"
    assert k3["stream_1k"] == "4.23 / 15.8"
    assert k3["stream_100k"].startswith("3.47 / 537[")  # kimi_k3 ran once
    assert "one run" in note(notes, k3["stream_100k"])
    assert k3["own_stream"] == "1.99 / 0.69"
    assert k3["render"].startswith("4.51 / 9.10 (2.02x)[")
    assert "k3_chat_template.jinja" in note(notes, k3["render"])


def test_a_template_llamacpp_refuses_and_one_not_here() -> None:
    by, notes = rows(DATA)
    cell = by["mistral-small-3.1"]["losses_llamacpp"]
    assert cell.startswith("refuses the template[")
    assert "unknown escape character" in note(notes, cell)
    cell = by["gemma-4"]["losses_llamacpp"]
    assert cell.startswith("not measured[") and note(notes, cell) == "gemma-4: no such file here."


def test_smollm2_engine_cells_are_dashes() -> None:
    by, notes = rows(DATA)
    s = by["smollm2"]
    for key in ("losses_vllm", "losses_llamacpp", "stream_1k", "stream_100k"):
        assert s[key].startswith("—[")
        assert "no tool calls" in note(notes, s[key])
    assert s["own_stream"] == "not measured"  # no smollm2 row in the fixture


def test_no_result_files_no_figures(tmp_path: Path) -> None:
    by, _ = rows(tmp_path)
    for name, row in by.items():
        for key, cell in row.items():
            if key == "dialect":
                continue
            assert not re.search(r"\d+(\.\d+)? / \d|\d+\+\d", cell), (name, key, cell)
            assert cell.startswith(("not measured", "—")), (name, key, cell)


def test_a_result_file_that_is_not_json_is_not_measured(tmp_path: Path) -> None:
    for f in DATA.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "families.json").write_text('{"rows": [', encoding="utf-8")
    by, _ = rows(tmp_path)
    assert by["qwen3"]["render"] == "not measured"
    assert by["qwen3"]["own_stream"] == "not measured"
    assert by["qwen3"]["losses_vllm"] == "17/33 (`hermes+qwen3`)"


def test_markdown_lines_and_notes() -> None:
    table = bt.build(bt.load(DATA), list(LAYOUT_BUILTIN))
    md = bt.markdown(table).splitlines()
    head, rule, *body = md
    n = len(bt.COLUMNS)
    assert head.count(" | ") == n - 1 and rule.count("|") == n + 1
    lines = body[: len(table["rows"])]
    assert all(line.count(" | ") == n - 1 for line in lines)
    assert [line.split(" | ")[0].removeprefix("| ") for line in lines] == ["kimi-k3", *LAYOUT_BUILTIN]
    used = {int(k) for line in lines for k in re.findall(r"\[(\d+)\]", line)}
    assert used == set(range(1, len(table["notes"]) + 1))
    assert body[len(table["rows"]) + 1:] == [f"[{k}] {t}" for k, t in enumerate(table["notes"], start=1)]


def test_reuse_runs_nothing_and_writes_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("--reuse ran a bench")

    monkeypatch.setattr(subprocess, "run", refuse)
    out = tmp_path / "t" / "table.json"
    assert bt.main(["--reuse", "--results", str(DATA), "--out", str(out)]) == 0
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got["run"]["benches"] == {} and got["run"]["reuse"] is True
    assert [r["dialect"] for r in got["rows"]] == ["kimi-k3", *LAYOUT_BUILTIN]
    assert out.with_suffix(".md").read_text(encoding="utf-8") == bt.markdown(
        {k: v for k, v in got.items() if k != "run"})
    assert got["sources"]["vllm_families"]["vllm"] == "0.33.0"


def test_each_bench_gets_its_quick_flags_and_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake(cmd: list[str], **k: Any) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 3, "", "no engine here")

    monkeypatch.setattr(subprocess, "run", fake)
    monkeypatch.setattr(bt, "k3_render", lambda gguf, quick: (_ for _ in ()).throw(RuntimeError("no gguf")))
    out = tmp_path / "table.json"
    assert bt.main(["--quick", "--results", str(tmp_path), "--out", str(out)]) == 0
    flags = {Path(c[1]).name: c[2:] for c in seen}
    assert flags == {
        "bench_families.py": ["--quick", "--out", str(tmp_path / "families.json")],
        "bench_vllm_families.py": ["--losses", "--quick", "--out", str(tmp_path / "vllm_families.json")],
        "bench_llamacpp_families.py": ["--quick", "--out", str(tmp_path / "llamacpp_families.json")],
        "bench_vllm.py": ["--quick", "--sizes", "1000", "--out", str(tmp_path / "vllm.json")],
    }
    got = json.loads(out.read_text(encoding="utf-8"))
    assert {k: v["returncode"] for k, v in got["run"]["benches"].items()} == {
        "bench_families.py": 3, "bench_vllm_families.py": 3, "bench_llamacpp_families.py": 3, "bench_vllm.py": 3,
        "k3 render": 1}
    assert got["run"]["benches"]["bench_vllm.py"]["stderr_tail"] == "no engine here"
    assert got["rows"][1]["render"] == "not measured"
