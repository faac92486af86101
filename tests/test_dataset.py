"""xtml render-dataset and lint-dataset, and the map function under Hugging
Face datasets."""

from __future__ import annotations

import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import xtml
from tests.helpers.docs import run_examples
from tests.helpers.tokenizers import deepseek_path, k3_vocab
from xtml.cli import main
from xtml.training import IGNORE_INDEX, MapFunction, dataset

pq = pytest.importorskip("pyarrow.parquet")

K3 = xtml.load("kimi-k3")
DEEPSEEK = ["--tokenizer", deepseek_path(), "--add-markers"]


def chat(i: int) -> dict[str, Any]:
    """A small varied request: reasoning on some, a tool round on some."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"question {i}: " + "why? " * (i % 7)}]
    if i % 3 == 0:
        msgs += [{"role": "assistant", "content": "", "reasoning_content": "look it up",
                  "tool_calls": [{"id": "c", "function": {"name": "search", "arguments": {"q": f"q{i}"}}}]},
                 {"role": "tool", "tool_call_id": "c", "content": f"result {i}"}]
    msgs.append({"role": "assistant", "content": "answer " * (1 + i % 5), "reasoning_content": "hm " * (i % 4)})
    if i % 4 == 1:
        msgs += [{"role": "user", "content": "and?"}, {"role": "assistant", "content": "done"}]
    return {"messages": msgs, "thinking_effort": ["low", "high", "max"][i % 3]}


BAD = {
    3: "{not json",
    8: '"just a string"',
    11: json.dumps([{"role": "wizard", "content": "x"}]),
    15: json.dumps({"messages": [{"role": "user", "content": "x"}], "thinking_effort": "medium"}),
}


def write_input(path: Path, n: int) -> dict[int, Any]:
    """``n`` lines (a few bad, one blank); returns the good requests by line."""
    good: dict[int, Any] = {}
    with open(path, "w", encoding="utf-8") as f:
        for line in range(1, n + 1):
            if line in BAD:
                f.write(BAD[line] + "\n")
            elif line == 6:
                f.write("   \n")
            else:
                req: Any = chat(line)
                if line % 5 == 0:
                    req = req["messages"]  # a bare list of messages is a row too
                good[line] = req
                f.write(json.dumps(req) + "\n")
    return good


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def training_request(req: Any) -> Any:
    if isinstance(req, list):
        return {"messages": req, "add_generation_prompt": False}
    return {**req, "add_generation_prompt": False}


def test_render_dataset_writes_every_good_row_and_reports_the_bad(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    good = write_input(src, 30)
    out = tmp_path / "out.parquet"
    errors = tmp_path / "errors.jsonl"
    code, text, err = run(["render-dataset", str(src), "-o", str(out), *DEEPSEEK, "--labels",
                           "--errors", str(errors)], capsys)
    assert code == 1 and err == ""  # some rows were skipped; the file is complete
    table = pq.read_table(out)
    assert table.column_names == ["line", "input_ids", "loss_mask", "labels", "length", "trained"]
    rows = table.to_pylist()
    assert [r["line"] for r in rows] == sorted(good)
    vocab = k3_vocab()
    for r in rows:
        ex = K3.encode_training(training_request(good[r["line"]]), vocab)
        assert r["input_ids"] == ex.ids and r["loss_mask"] == ex.mask and r["labels"] == ex.labels
        assert r["length"] == len(ex.ids) and r["trained"] == ex.trained > 0
        assert IGNORE_INDEX in r["labels"]
    assert "rows read      29\n" in text  # the blank line is not a row
    assert "rows written   25 to " in text and "rows skipped   4\n" in text
    tokens = sum(r["length"] for r in rows)
    assert f"tokens         {tokens:,}\n" in text
    skipped = [json.loads(x) for x in errors.read_text(encoding="utf-8").splitlines()]
    assert [s["line"] for s in skipped] == sorted(BAD)
    reasons = {s["line"]: s["error"] for s in skipped}
    assert reasons[3].startswith("invalid JSON: ")
    assert reasons[8] == "a row must be a request object or a list of messages, not a string"
    assert reasons[11] == "role 'wizard' is not one of system, user, assistant, tool (at messages[0].role)"
    assert reasons[15].startswith("thinking_effort must be one of low, high, max")
    for line, reason in reasons.items():
        assert f"line {line}: skipped: {reason}\n" in text


def test_output_is_byte_identical_whatever_the_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       tiny_tokenizer: str) -> None:
    # Small chunks: many row groups, and chunks finishing out of order in
    # the pool must still be written in input order.
    monkeypatch.setattr(dataset, "CHUNK_ROWS", 4)
    src = tmp_path / "in.jsonl"
    write_input(src, 45)
    outs = []
    for workers in ("1", "2", "3"):
        out = tmp_path / f"w{workers}.parquet"
        code, text, _ = run(["render-dataset", str(src), "-o", str(out), "--tokenizer", tiny_tokenizer,
                             "--add-markers", "--workers", workers, "--train", "last"], capsys)
        assert code == 1 and "rows skipped   4\n" in text
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]
    meta = pq.ParquetFile(tmp_path / "w2.parquet").metadata
    assert meta.num_row_groups > 5 and meta.num_rows == 45 - 1 - len(BAD)


def test_a_failed_write_is_reported_not_lost(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: str) -> None:
    # Writes happen in the sink's writer thread; its error must reach the
    # command as one line, and no partial file may be left as the output.
    monkeypatch.setattr(dataset, "CHUNK_ROWS", 4)
    src = tmp_path / "in.jsonl"
    write_input(src, 30)
    real = dataset.ParquetSink

    class Failing(real):  # type: ignore[misc, valid-type]
        def _write(self) -> None:
            calls = 0
            write = self.writer.write_table

            def failing(table: Any) -> None:
                nonlocal calls
                calls += 1
                if calls == 2:
                    raise OSError(28, "No space left on device")
                write(table)

            self.writer.write_table = failing
            super()._write()

    monkeypatch.setattr(dataset, "ParquetSink", Failing)
    out = tmp_path / "out.parquet"
    code = main(["render-dataset", str(src), "-o", str(out), "--tokenizer", tiny_tokenizer, "--add-markers"])
    _, err = capsys.readouterr()
    assert code == 1 and not out.exists() and not (tmp_path / "out.parquet.partial").exists()
    assert err.startswith("xtml: error: cannot write ") and "No space left on device" in err
    assert err.count("\n") == 1


def test_train_last_and_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    reqs = [chat(i) for i in (1, 5, 9)]
    data = "".join(json.dumps(r) + "\n" for r in reqs).encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    out = tmp_path / "o.parquet"
    code, text, _ = run(["render-dataset", "-", "-o", str(out), *DEEPSEEK, "--train", "last"], capsys)
    assert code == 0 and "rows skipped   0\n" in text
    rows = pq.read_table(out).to_pylist()
    assert "labels" not in rows[0]
    for r, req in zip(rows, reqs):
        assert r["loss_mask"] == K3.encode_training(training_request(req), k3_vocab(), train="last").mask


def test_tables_in_every_layout_render_like_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: str) -> None:
    # A Hugging Face dataset saved to disk, a Parquet file, Parquet shards
    # and an Arrow file: the same rows give the same samples as JSON lines,
    # numbered from 0, bad rows reported by row, whatever the workers.
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(dataset, "CHUNK_ROWS", 4)  # several chunks per file
    reqs = [chat(i) for i in range(1, 23)]
    table_rows: list[dict[str, Any]] = [
        {"messages": r["messages"], "thinking_effort": r["thinking_effort"], "source": f"s{i}"}
        for i, r in enumerate(reqs)]
    table_rows[5] = {"messages": None, "thinking_effort": "low", "source": "empty"}
    table_rows[9] = {**table_rows[9], "thinking_effort": "medium"}
    ds = datasets.Dataset.from_list(table_rows)
    ds.save_to_disk(str(tmp_path / "hf"))
    ds.to_parquet(str(tmp_path / "all.parquet"))
    (tmp_path / "shards").mkdir()
    ds.select(range(10)).to_parquet(str(tmp_path / "shards" / "train-00000-of-00002.parquet"))
    ds.select(range(10, len(ds))).to_parquet(str(tmp_path / "shards" / "train-00001-of-00002.parquet"))
    arrow = next((tmp_path / "hf").glob("*.arrow"))
    capsys.readouterr()  # datasets' own progress bars
    tok = ["--tokenizer", tiny_tokenizer, "--add-markers"]
    want = {i: K3.encode_training(training_request(r), xtml.load_tokenizer(
        tiny_tokenizer, add_special_tokens=K3.markers.all())) for i, r in enumerate(reqs) if i not in (5, 9)}
    outs = []
    for source, workers in ((tmp_path / "hf", "1"), (tmp_path / "all.parquet", "2"), (tmp_path / "shards", "1"),
                            (arrow, "1")):
        out = tmp_path / f"{source.name}-{workers}.parquet"
        errors = tmp_path / "errors.jsonl"
        code, text, err = run(["render-dataset", str(source), "-o", str(out), *tok, "--workers", workers,
                               "--errors", str(errors)], capsys)
        assert code == 1 and err == "" and "rows read      22\n" in text and "rows skipped   2\n" in text
        assert "row 5: skipped: a request needs 'messages'" in text
        assert "row 9: skipped: thinking_effort must be one of" in text
        assert [json.loads(x)["row"] for x in errors.read_text(encoding="utf-8").splitlines()] == [5, 9]
        table = pq.read_table(out)
        assert table.column_names[0] == "row"
        got = table.to_pylist()
        assert [r["row"] for r in got] == sorted(want)
        for r in got:
            assert r["input_ids"] == want[r["row"]].ids and r["loss_mask"] == want[r["row"]].mask
        outs.append(table)
    assert all(t.equals(outs[0]) for t in outs)


def test_table_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_tokenizer: str) -> None:
    datasets = pytest.importorskip("datasets")
    tok = ["--tokenizer", tiny_tokenizer, "--add-markers"]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"messages": "[]"}]),
                               "test": datasets.Dataset.from_list([{"messages": "[]"}])})
    dd.save_to_disk(str(tmp_path / "dd"))
    datasets.Dataset.from_list([{"text": "hello"}]).to_parquet(str(tmp_path / "text.parquet"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    capsys.readouterr()  # datasets' own progress bars
    for source, message in (("dd", "holds several splits (test, train): give one, e.g. "),
                            ("text.parquet", "the table has no 'messages' or 'request' column (columns: text)"),
                            ("empty", "no .parquet or .arrow files in "),
                            ("junk.parquet", "cannot read "),
                            ("missing.parquet", "no such file or directory")):
        code, out, err = run(["render-dataset", str(tmp_path / source), "-o", str(tmp_path / "o.parquet"), *tok],
                             capsys)
        assert code == 1 and out == "" and err.startswith("xtml: error: ") and message in err, (source, err)
        assert err.count("\n") == 1 and not (tmp_path / "o.parquet").exists()


def budget_template(tmp_path: Path) -> Path:
    """K3 with tiny think budgets."""
    text = (Path(xtml.__file__).parent / "dialects" / "kimi-k3.toml").read_text(encoding="utf-8")
    start = text.index("[training.budgets]")
    path = tmp_path / "k3-small.toml"
    path.write_text(text[:start] + "[training.budgets]\nlow = 3\nhigh = 50\n", encoding="utf-8")
    return path


def test_lint_dataset_reports_overruns_per_effort(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "a"},
                      {"role": "assistant", "reasoning_content": "one two three four five", "content": "x"},
                      {"role": "user", "content": "b"},
                      {"role": "assistant", "reasoning_content": "six seven eight nine ten", "content": "y"}],
         "thinking_effort": "low"},
        {"messages": [{"role": "user", "content": "a"},
                      {"role": "assistant", "reasoning_content": "ok", "content": "x"}],
         "thinking_effort": "low"},
        {"messages": [{"role": "user", "content": "a"},
                      {"role": "assistant", "reasoning_content": "word " * 60, "content": "x"}],
         "thinking_effort": "high"},
        {"messages": [{"role": "user", "content": "a"},
                      {"role": "assistant", "reasoning_content": "word " * 60, "content": "x"}],
         "thinking_effort": "max"},  # no budget for max in this template
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}], "thinking": False},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tpl = budget_template(tmp_path)
    code, text, err = run(["lint-dataset", str(src), "-t", str(tpl), *DEEPSEEK], capsys)
    assert code == 1 and err == ""
    vocab = k3_vocab()
    n = len(vocab.encode_texts(["one two three four five"])[0])
    m = len(vocab.encode_texts(["word " * 60])[0])
    assert "  low          1 / 2\n" in text and "  high         1 / 1\n" in text
    assert "  max          0 / 1\n" in text and "  off          0 / 1\n" in text
    assert f"line 1: message 1: think channel of {n} tokens is over the low budget of 3\n" in text
    assert "line 1: message 3: think channel of" in text
    assert f"line 3: message 1: think channel of {m} tokens is over the high budget of 50\n" in text
    assert "line 2:" not in text and "line 4:" not in text

    code, text, _ = run(["lint-dataset", str(src), "-t", str(tpl), *DEEPSEEK, "--format", "json"], capsys)
    report = json.loads(text)
    assert code == 1 and report["rows"] == 5 and report["skipped"] == []
    assert report["efforts"] == {"high": {"rows": 1, "over_budget": 1}, "low": {"rows": 2, "over_budget": 1},
                                 "max": {"rows": 1, "over_budget": 0}, "off": {"rows": 1, "over_budget": 0}}
    assert [(o["line"], o["message"]) for o in report["overruns"]] == [(1, 1), (1, 3), (3, 1)]

    # The built-in budgets are far larger: nothing to report, exit 0.
    code, text, _ = run(["lint-dataset", str(src), *DEEPSEEK], capsys)
    assert code == 0 and "over the" not in text

    # render-dataset checks the same when asked, and still writes every row.
    out = tmp_path / "o.parquet"
    code, text, _ = run(["render-dataset", str(src), "-o", str(out), "-t", str(tpl), *DEEPSEEK,
                         "--check-budgets"], capsys)
    assert code == 1 and pq.read_table(out).num_rows == 5
    assert f"line 3: message 1: think channel of {m} tokens is over the high budget of 50\n" in text


def test_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(chat(1)) + "\n", encoding="utf-8")
    code, _, err = run(["render-dataset", str(src), "-o", str(tmp_path / "o.parquet")], capsys)
    assert code == 2 and "the following arguments are required: --tokenizer" in err
    code, _, err = run(["lint-dataset", str(tmp_path / "missing.jsonl"), *DEEPSEEK], capsys)
    assert code == 1 and err.startswith("xtml: error: cannot read ") and err.count("\n") == 1
    code, _, err = run(["render-dataset", str(src), "-o", str(tmp_path / "no" / "o.parquet"), *DEEPSEEK], capsys)
    assert code == 1 and err.startswith("xtml: error: cannot write ") and err.count("\n") == 1
    code, _, err = run(["render-dataset", str(src), *DEEPSEEK], capsys)  # -o is required
    assert code == 2 and "-o/--output" in err
    code, _, err = run(["render-dataset", str(src), "-o", "x.parquet", *DEEPSEEK, "--workers", "0"], capsys)
    assert code == 2 and "expected a positive integer" in err
    code, _, err = run(["lint-dataset", str(src), "--tokenizer", deepseek_path()], capsys)
    assert code == 1 and "does not fit the template's markers" in err and err.count("\n") == 1
    assert not list(tmp_path.glob("*.partial"))


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and "render-dataset" in out and "lint-dataset" in out
    code, out, _ = run(["render-dataset", "--help"], capsys)
    assert code == 0 and "--workers" in out and "examples:" in out


# -- Hugging Face datasets ----------------------------------------------------------


def test_datasets_map_with_two_processes(tiny_tokenizer: str) -> None:
    datasets = pytest.importorskip("datasets")
    reqs = [chat(i) for i in range(12)]
    rows = [{"messages": json.dumps(r["messages"]), "thinking_effort": r["thinking_effort"], "id": i}
            for i, r in enumerate(reqs)]
    rows[4]["messages"] = json.dumps([{"role": "wizard", "content": "x"}])
    ds = datasets.Dataset.from_list(rows)
    fn = MapFunction("kimi-k3", tiny_tokenizer, add_markers=True, train="last")
    out = ds.map(fn, batched=True, batch_size=3, num_proc=2, remove_columns=["messages", "thinking_effort"])
    assert out.column_names == ["id", "input_ids", "loss_mask", "length", "error", "labels"]
    vocab = xtml.load_tokenizer(tiny_tokenizer, add_special_tokens=K3.markers.all())
    for i, row in enumerate(out):
        assert row["id"] == i
        if i == 4:
            assert row["input_ids"] == [] and row["length"] == 0
            assert row["error"] == "role 'wizard' is not one of system, user, assistant, tool (at messages[0].role)"
            continue
        ex = K3.encode_training(training_request(reqs[i]), vocab, train="last")
        assert (row["input_ids"], row["loss_mask"], row["labels"], row["error"]) == (ex.ids, ex.mask, ex.labels, "")
    # Message lists stored as Arrow structs (fields missing in a message come back as None) work too.
    structs = datasets.Dataset.from_list([{"messages": r["messages"]} for r in reqs[:3]])
    got = structs.map(fn, batched=True, remove_columns=["messages"])
    assert got["input_ids"] == [K3.encode_training(training_request(r["messages"]), vocab, train="last").ids
                                for r in reqs[:3]]


# -- docs/training.md ---------------------------------------------------------------

DOC = Path(__file__).parent.parent / "docs" / "training.md"


def test_training_doc_python_examples_run() -> None:
    pytest.importorskip("datasets")
    text, scope = run_examples(DOC, at_least=4)
    ex = scope["ex"]
    assert scope["tok"].decode([t for t, m in zip(ex.ids, ex.mask) if m]) in text
    for s in ex.spans:  # the spans the page prints are the real ones
        assert f"# {s.message} {s.role} {s.channel} {s.start} {s.end}" in text
    o = scope["overruns"](scope["k3"].encode_training(scope["long"], scope["tok"]), scope["k3"].dialect)
    assert [f"# {x.message} {x.effort} {x.tokens} {x.budget}" in text for x in o] == [True]
    assert scope["out"][2]["error"] in text


def test_training_doc_command_lines_parse() -> None:
    from xtml.cli import _parser
    from xtml.cli.dataset import COMMANDS

    lines = [ln for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
             for ln in block.splitlines() if ln.startswith("xtml ")]
    assert len(lines) >= 5
    for ln in lines:
        args = _parser().parse_args(shlex.split(ln)[1:])
        assert args.command in COMMANDS


def test_run_job_leaves_the_callers_collector_as_it_was(tiny_tokenizer: str) -> None:
    # Workers freeze what they load; the caller's process, forked from,
    # is frozen only while the pool lives.
    import gc

    job = dataset.Job("kimi-k3", tiny_tokenizer, add_markers=True)
    rows = b"".join(json.dumps(chat(i)).encode() + b"\n" for i in range(12))
    before = gc.get_freeze_count()
    for workers in (1, 2):
        report = dataset.run_job(job, io.BytesIO(rows), workers=workers)
        assert report.written == 12 and gc.get_freeze_count() == before


def test_compressed_jsonl_and_a_cut_one(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        tiny_tokenizer: str) -> None:
    import bz2
    import gzip
    import lzma

    src = tmp_path / "in.jsonl"
    write_input(src, 20)
    data = src.read_bytes()
    tok = ["--tokenizer", tiny_tokenizer, "--add-markers"]
    code, _, _ = run(["render-dataset", str(src), "-o", str(tmp_path / "plain.parquet"), *tok], capsys)
    want = (tmp_path / "plain.parquet").read_bytes()
    for suffix, pack in ((".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)):
        packed = tmp_path / f"in.jsonl{suffix}"
        packed.write_bytes(pack(data))
        out = tmp_path / f"out{suffix}.parquet"
        code2, text, _ = run(["render-dataset", str(packed), "-o", str(out), *tok], capsys)
        assert code2 == code == 1 and "rows skipped   4\n" in text and out.read_bytes() == want
        cut = tmp_path / f"cut.jsonl{suffix}"
        cut.write_bytes(pack(data)[: len(pack(data)) // 2])
        code3, text3, err = run(["render-dataset", str(cut), "-o", str(tmp_path / "cut.parquet"), *tok], capsys)
        assert code3 == 1 and text3 == "" and err.startswith(f"xtml: error: cannot read {cut}: ")
        assert err.count("\n") == 1 and not (tmp_path / "cut.parquet").exists()
