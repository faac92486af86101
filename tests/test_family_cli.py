"""The command line with a layout dialect (``-t smollm2``, ``-t qwen3``):
each command works, or refuses in one line what layout dialects do not have
yet; never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import xtml
from tests.helpers.cli import EXAMPLE, run
from tests.helpers.families import smollm2_gguf
from xtml.chat.template_file import builtin_files
from xtml.template import LayoutTemplate

# A tokenizer without the ChatML tokens: --add-markers must add them.
BASE_TOKENIZER = str(Path(__file__).parent.parent / "examples" / "tokenizer.json")
REQUEST = json.loads(EXAMPLE.read_text(encoding="utf-8"))


def _layout(name: str) -> LayoutTemplate:
    tpl = xtml.load(name)
    assert isinstance(tpl, LayoutTemplate)
    return tpl


def _one_line_error(code: int, out: str, err: str) -> str:
    assert code == 1, (code, out, err)
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xtml: error: "), err
    return lines[0]


def test_templates_lists_the_layout_builtins_with_their_files() -> None:
    code, out, _ = run(["templates"])
    assert code == 0
    layout = builtin_files(layout=True)
    assert set(layout) == {"smollm2", "qwen3", "llama-3.1", "kimi-k2", "kimi-k2-thinking", "deepseek-v3.1", "glm-4.6",
                          "mistral-small-3.1", "gemma-4", "gpt-oss"}
    for name, path in layout.items():
        assert f"{name} (layout dialect)\n" in out
        assert path.is_file() and f"  {path}\n" in out
    code, out, _ = run(["templates", "--format", "json"])
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["smollm2"]["engine"] == "layout" and rows["kimi-k3"]["engine"] == "xtml"
    assert rows["qwen3"]["path"] == str(layout["qwen3"])


def test_render_text_and_segments_say_what_the_format_drops() -> None:
    tpl = xtml.load("smollm2")
    rendered = tpl.render(REQUEST)
    assert rendered.dropped  # the example's tools, calls and reasoning
    code, out, err = run(["render", "-t", "smollm2", str(EXAMPLE)])
    assert code == 0 and out == rendered.text + "\n"
    assert err.count("\n") == 1 and err.startswith("xtml: warning: the format does not write tools, ")
    assert "messages[2].tool_calls" in err
    code, out, _ = run(["render", "-t", "smollm2", "--format", "segments", str(EXAMPLE)])
    assert code == 0
    assert json.loads(out) == [[s.text, s.special] for s in rendered.segments]
    code, _, err = run(["render", "-t", "smollm2", "-"], stdin='[{"role": "user", "content": "hi"}]')
    assert code == 0 and err == ""


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_add_markers_adds_the_declared_tokens(name: str) -> None:
    tpl = _layout(name)
    base = ["render", "-t", name, str(EXAMPLE), "--tokenizer", BASE_TOKENIZER, "--format", "ids"]
    line = _one_line_error(*run(base))
    assert "does not fit the format's tokens" in line and "'<|im_start|>' is not a special token" in line
    code, out, err = run([*base, "--add-markers"])
    assert code == 0, err
    ids = json.loads(out)
    vocab = xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=tpl.layout.tokens)
    assert ids == tpl.encode(REQUEST, vocab)
    assert ids[0] == vocab.special_id("<|im_start|>")
    # Read back with the same tokenizer: the request's normal form.
    code, out, err = run(["parse", "-t", name, "--tokenizer", BASE_TOKENIZER, "--add-markers"], stdin=json.dumps(ids))
    assert code == 0, err
    assert json.loads(out) == tpl.normalize(REQUEST)


def test_render_and_parse_ids_with_the_gguf(tmp_path: Path) -> None:
    gguf = smollm2_gguf()
    tpl = xtml.load("smollm2")
    code, out, err = run(["render", "-t", "smollm2", str(EXAMPLE), "--tokenizer", gguf, "--format", "ids"])
    assert code == 0, err
    ids = json.loads(out)
    assert ids == tpl.encode(REQUEST, gguf)
    code, out, _ = run(["render", "-t", "smollm2", str(EXAMPLE), "--tokenizer", gguf, "--format", "tokens"])
    assert code == 0 and [int(r.split("\t")[0]) for r in out.splitlines()] == ids
    f = tmp_path / "ids.json"
    f.write_text(json.dumps(ids))
    code, out, err = run(["parse", "-t", "smollm2", str(f), "--tokenizer", gguf])
    assert code == 0, err
    assert json.loads(out) == tpl.normalize(REQUEST)
    code, out, err = run(["parse", "-t", "smollm2", "--tokenizer", gguf, "--completion", "--openai", "--stream"],
                         stdin=json.dumps(xtml.load("smollm2").completion_ids("Hi there<|im_end|>", gguf)))
    assert code == 0, err
    chunks = [json.loads(x) for x in out.splitlines()]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hi there"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_parse_text_prompts_and_completions() -> None:
    tpl = xtml.load("smollm2")
    # As `xtml render` writes it: the text and a newline, which parse takes off.
    text = tpl.render(REQUEST).text + "\n"
    code, out, err = run(["parse", "--from", "text", "-t", "smollm2"], stdin=text)
    assert code == 0, err
    assert json.loads(out) == tpl.normalize(REQUEST)
    code, out, _ = run(["parse", "--from", "text", "-t", "smollm2", "--completion"], stdin="Hi there<|im_end|>")
    assert code == 0 and json.loads(out) == {"role": "assistant", "content": "Hi there"}
    # A completion read as a whole prompt: the error says what to add, in one line.
    line = _one_line_error(*run(["parse", "--from", "text", "-t", "smollm2"], stdin="Hi there<|im_end|>"))
    assert line.endswith("add --completion")
    code, out, _ = run(["parse", "--from", "text", "-t", "smollm2", "--completion", "--lenient"], stdin="Hi th")
    assert code == 0 and json.loads(out)["diagnostics"][0]["kind"] == "truncated"


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_inspect_shows_each_message_with_its_role_and_the_encoded_ids(name: str) -> None:
    tpl = _layout(name)
    vocab = xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=tpl.layout.tokens)
    code, out, err = run(["inspect", "-t", name, str(EXAMPLE), "--tokenizer", BASE_TOKENIZER, "--add-markers"])
    assert code == 0, err
    lines = out.splitlines()
    heads = [ln for ln in lines if ln.startswith("── message ")]
    roles = [re.match(r"── message \d+ · (\S+) · ", h).group(1) for h in heads]  # type: ignore[union-attr]
    assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "assistant"
    assert "?" not in roles
    shown = [ln.split() for ln in lines if ln[:7].strip().isdigit()]
    assert [int(r[1]) for r in shown] == tpl.encode(REQUEST, vocab)
    assert shown[0][2] == "<|im_start|>"
    assert lines[-1] == f"{len(shown)} tokens in {len(heads)} messages"


def test_validate_checks_a_layout_file(tmp_path: Path) -> None:
    path = builtin_files(layout=True)["smollm2"]
    code, out, _ = run(["validate", str(path)])
    assert code == 0, out
    assert out.strip() == (f"{path}: valid (checked: toml, keys, tokens, patterns; not yet for layout dialects: "
                           "self-test)")
    code, out, _ = run(["validate", "qwen3", "--format", "json", "-n", "0"])
    assert code == 0 and json.loads(out)["valid"] and "not_yet" not in json.loads(out)
    # Problems of the file's structure, each at its line and column.
    text = path.read_text(encoding="utf-8")
    bad = tmp_path / "bad.toml"
    broken = text.replace("{role}", "{rol}", 1).replace('[stop]\n', '[stop]\n"<|nope|>" = "end"\n', 1)
    assert broken.count("{rol}") == 1 and "<|nope|>" in broken
    bad.write_text(broken, encoding="utf-8")
    code, out, _ = run(["validate", str(bad)])
    assert code == 1
    lines = out.splitlines()
    where = {ln.split(": ")[1]: ln.split(": ")[0] for ln in lines[:-1]}
    at_open = broken.splitlines().index(next(x for x in broken.splitlines() if "{rol}" in x)) + 1
    assert where["frame.open"] == f"{bad}:{at_open}:1"
    assert re.fullmatch(rf"{re.escape(str(bad))}:\d+:\d+", where["stop.<|nope|>"])
    assert lines[-1].startswith(f"{bad}: 2 problems (checked: toml, keys, tokens, patterns)")
    # With a tokenizer: every declared token must fit it.
    code, out, _ = run(["validate", "smollm2", "--tokenizer", BASE_TOKENIZER, "-n", "0"])
    assert code == 1
    first = out.splitlines()[0]
    assert re.match(r"smollm2\.toml:\d+:1: tokens: tokenizer .* does not fit the format's tokens", first)
    assert first.endswith("-- for a base model's tokenizer, add the tokens as special tokens: xtml validate "
                          "--add-markers")
    code, out, _ = run(["validate", "smollm2", "--tokenizer", BASE_TOKENIZER, "--add-markers", "-n", "0"])
    assert code == 0, out


@pytest.mark.parametrize("argv", [
    ["fuzz", "-t", "smollm2", "-n", "1"],
])
def test_what_layout_dialects_do_not_have_yet_is_refused_in_one_line(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    line = _one_line_error(*run(argv))
    what = " ".join(argv[:2]) if argv[0] == "export" else argv[0]
    assert line.startswith(f"xtml: error: xtml {what}")
    assert "is not yet available for layout dialects ('smollm2' is one) (at smollm2.toml)" in line
    assert not (tmp_path / "hf").exists() and not (tmp_path / "out.parquet").exists()


def test_the_grammar_export_and_serve_refuse_in_one_line() -> None:
    request = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    # Llama 3.1 reads any JSON object of a call's keys as a call: a JSON
    # answer of any object cannot be held.
    json_object = json.dumps({"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_object"}})
    line = _one_line_error(*run(["export", "grammar", "-", "-t", "llama-3.1"], stdin=json_object))
    assert "reads a JSON object of the keys 'name' and 'parameters' as a tool call" in line
    assert "(at option 'response_format')" in line
    for name in ("smollm2", "llama-3.1", "deepseek-v3.1"):
        code, out, _ = run(["export", "grammar", "-", "-t", name], stdin=request)
        head = f"%llguidance {{}}\n// xtml completion grammar (llguidance): template {name}"
        assert code == 0 and out.startswith(head)
    # The tokenizer is checked against the dialect's tokens before anything listens.
    line = _one_line_error(*run(["serve", "-t", "smollm2", "--tokenizer", BASE_TOKENIZER, "--backend",
                                 "http://127.0.0.1:9", "--backend-kind", "llamacpp"]))
    assert "does not fit the format's tokens" in line


def test_new_template_takes_no_template() -> None:
    code, out, err = run(["new-template", "x", "-t", "smollm2"])
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "xtml: error: unrecognized arguments: -t smollm2"
