"""The command line, in process: main(argv) -> exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import xtml
from tests.helpers.cli import EXAMPLE, run
from tests.helpers.tokenizers import deepseek_path


def test_render_example(k3: xtml.Template) -> None:
    code, out, err = run(["render", str(EXAMPLE)])
    assert code == 0 and err == ""
    assert out == k3.render(json.loads(EXAMPLE.read_text())).text + "\n"


def test_render_segments_and_stdin() -> None:
    code, out, _ = run(["render", "-", "--format", "segments", "--thinking", "false"],
                       stdin='[{"role": "user", "content": "hi"}]')
    assert code == 0
    assert json.loads(out)[:2] == [["<|open|>", True], ["message", False]]


def test_ids_roundtrip_through_cli(tmp_path: Path) -> None:
    code, out, err = run(["render", str(EXAMPLE), "--tokenizer", deepseek_path(), "--add-markers",
                          "--format", "ids"])
    assert code == 0, err
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(out)
    code, out2, err = run(["parse", str(ids_file), "--tokenizer", deepseek_path(), "--add-markers"])
    assert code == 0, err
    parsed = json.loads(out2)
    assert parsed == xtml.load().normalize(json.loads(EXAMPLE.read_text()))


def test_tokens_format_is_for_programs_and_inspect_for_people() -> None:
    base = ["render", str(EXAMPLE), "--tokenizer", deepseek_path(), "--add-markers"]
    code, ids, _ = run([*base, "--format", "ids"])
    assert code == 0
    code, tokens, _ = run([*base, "--format", "tokens"])
    assert code == 0
    # One token per line: its id, a tab, its piece as a JSON string; nothing else.
    rows = [line.split("\t") for line in tokens.splitlines()]
    assert all(len(r) == 2 for r in rows)
    assert [int(r[0]) for r in rows] == json.loads(ids)
    assert json.loads(rows[0][1]) == "<|open|>" and json.loads(rows[1][1]) == "message"
    code, table, _ = run(["inspect", *base[1:]])
    assert code == 0 and table != tokens
    lines = table.splitlines()
    assert lines[0].startswith("── message 0 · system (tool-declare) · ")
    first = lines[1].split()
    assert first[0] == "0" and first[2] == "<|open|>"
    assert "\x1b[" not in table  # not a terminal: no colour
    shown = [ln.split() for ln in lines if ln[:7].strip().isdigit()]
    assert [int(r[1]) for r in shown] == json.loads(ids)
    assert lines[-1] == f"{len(shown)} tokens in {sum(ln.startswith('── message') for ln in lines)} messages"


def test_a_marker_literal_is_named_as_the_user_wrote_it() -> None:
    # The template adds its own messages first (tools, thinking effort): the
    # warning still names the request's messages by their index in it.
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "a <|end_of_msg|> b"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "thinking": True}
    code, _, err = run(["render", "-"], stdin=json.dumps(body))
    assert code == 0
    assert err.count("\n") == 1 and "the text of messages[1] holds" in err and "'<|end_of_msg|>'" in err
    code, _, err = run(["render", "-"], stdin=json.dumps(body["messages"][1:]))
    assert "the text of messages[0] holds" in err
    tools = {"messages": [{"role": "user", "content": "hi"}],
             "tools": [{"type": "function", "function": {"name": "f", "description": "<|close|>"}}]}
    code, _, err = run(["render", "-"], stdin=json.dumps(tools))
    assert "the template's own messages" in err and "messages[" not in err


def test_a_missing_extra_names_what_to_install() -> None:
    import subprocess

    code = ("import sys; sys.modules['starlette'] = None; from xtml.cli import main; "
            "sys.exit(main(['serve', '--backend', 'http://127.0.0.1:9', '--tokenizer', 'tok.json']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == ("xtml: error: xtml serve needs the serve extra (starlette is not installed): "
                           "pip install 'xtml[serve]' (from a clone: pip install -e '.[serve]')\n")


def test_parse_text_completion_lenient() -> None:
    code, out, _ = run(["parse", "-", "--from", "text", "--completion", "--lenient"],
                       stdin="thinking...<|close|>think<|sep|><|open|>response<|sep|>partial")
    assert code == 0
    got = json.loads(out)
    assert got["reasoning_content"] == "thinking..." and got["content"] == "partial"
    assert got["diagnostics"][0]["kind"] == "truncated"


@pytest.mark.parametrize(
    "argv, stdin, needle",
    [
        (["render", "-"], "{", "invalid JSON"),
        (["render", "-"], '[{"role": "critic", "content": "x"}]', "role 'critic'"),
        (["render", "/no/such/file.json"], "", "cannot read"),
        (["render", "-", "--template", "nope"], "[]", "no template named"),
        (["render", "-", "--tokenizer", "/no/such/tok", "--format", "ids"], "[]", "no tokenizer.json"),
        (["parse", "-", "--from", "text"], "<|open|>message<|sep|>", "(at line 1"),
        (["parse", "-", "--tokenizer", "x"], '["a"]', "JSON array of token ids"),
    ],
)
def test_invalid_input_exits_1_with_one_line(argv: list[str], stdin: str, needle: str) -> None:
    code, out, err = run(argv, stdin)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("xtml: error: ") and needle in err
    assert "Traceback" not in err


def test_a_command_that_needs_a_tokenizer_is_a_usage_error() -> None:
    code, out, err = run(["render", "-", "--format", "ids"], "[]")
    assert code == 2 and out == ""
    assert err == ("xtml: usage error: this needs --tokenizer PATH (a tokenizer.json, a tiktoken file, or a model "
                   "folder)\n")


@pytest.mark.parametrize("argv", [[], ["render", "--format", "bogus"], ["frobnicate"], ["parse", "--from", "x"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    code, _, err = run(argv)
    assert code == 2 and "usage:" in err


def test_help_exits_0() -> None:
    code, out, _ = run(["render", "--help"])
    assert code == 0 and "examples:" in out


def test_fuzz_text_form_runs() -> None:
    code, out, err = run(["fuzz", "--examples", "5", "--seed", "3"])
    assert code == 0, err
    assert "properties held" in out + err


def test_fuzz_with_tokenizer_runs() -> None:
    code, out, err = run(["fuzz", "--examples", "3", "--seed", "4", "--tokenizer", deepseek_path(), "--add-markers"])
    assert code == 0, err + out
    assert "stream = batch" in out + err


@pytest.mark.parametrize("argv", [["fuzz", "--examples", "0"], ["fuzz", "--examples", "x"]])
def test_fuzz_usage_errors(argv: list[str]) -> None:
    assert run(argv)[0] == 2


# -- what the system refuses, and options that do nothing alone -------------------------

def _subprocess(args: list[str], *, stdout: object = None, closed_stdin: bool = False) -> tuple[int, str]:
    import os
    import subprocess

    def close_stdin() -> None:
        os.close(0)

    r = subprocess.run([sys.executable, "-m", "xtml", *args], stdout=stdout if stdout is not None else
                       subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                       preexec_fn=close_stdin if closed_stdin else None)  # type: ignore[call-overload]
    return r.returncode, r.stderr


@pytest.mark.parametrize("argv", [["render"], ["parse"],
                                  ["lint-dataset", "-", "--tokenizer", deepseek_path(), "--add-markers"]])
def test_a_closed_standard_input_is_one_line(argv: list[str]) -> None:
    code, err = _subprocess(argv, closed_stdin=True)
    assert code == 1 and err == "xtml: error: cannot read standard input: it is closed\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["render", str(EXAMPLE)], ["templates"]])
def test_a_full_disk_on_standard_output_is_one_line(argv: list[str]) -> None:
    with open("/dev/full", "w") as full:
        code, err = _subprocess(argv, stdout=full)
    assert code == 1 and err == "xtml: error: cannot write the output: No space left on device\n"


@pytest.mark.parametrize("option", ["-o", "--errors"])
def test_a_dataset_command_never_writes_over_its_input(tmp_path: Path, option: str) -> None:
    data = tmp_path / "chats.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    command = ["render-dataset", str(data), "-o", str(tmp_path / "out.parquet")] if option == "--errors" else \
        ["render-dataset", str(data)]
    code, _, err = run([*command, option, str(data), "--tokenizer", deepseek_path(), "--add-markers"])
    assert code == 2 and f"{option} {data} is the input" in err
    assert data.read_text() == '{"messages": [{"role": "user", "content": "hi"}]}\n'


@pytest.mark.parametrize(("argv", "said"), [
    (["render", str(EXAMPLE), "-o", ""], "-o needs a file name"),
    (["new-template", "x", "-o", ""], "-o needs a file name"),
    (["parse", "-", "--thinking", "true"], "--thinking says how the prompt before a completion was rendered"),
    (["render", str(EXAMPLE), "--add-markers"], "--add-markers adds the template's markers to a tokenizer"),
    (["validate", "kimi-k3", "-n", "10000000"], "expected at most 1,000,000 examples"),
    (["fuzz", "-n", "10000000"], "expected at most 1,000,000 examples"),
    (["export", "grammar", str(EXAMPLE), "--max-calls", "5000"], "expected at most 4,096"),
    (["render-dataset", "x.jsonl", "-o", "x.parquet", "--tokenizer", "t.json", "--workers", "100000"],
     "expected at most"),
])
def test_options_that_cannot_do_what_they_say_are_usage_errors(argv: list[str], said: str) -> None:
    code, out, err = run(argv, stdin="x")
    assert code == 2 and said in err and out == ""


def test_token_ids_that_are_not_ids_are_located(tmp_path: Path) -> None:
    f = tmp_path / "ids.json"
    for text, said in (("[1, 2.0]", "element 1 is 2.0"), ('["1"]', 'element 0 is "1"'), ("[true]", "element 0 is true"),
                       ('{"ids": []}', "not dict")):
        f.write_text(text)
        code, _, err = run(["parse", str(f), "--tokenizer", deepseek_path(), "--add-markers"])
        sep = ": " if "element" in said else ", "
        assert code == 1 and err == f"xtml: error: expected a JSON array of token ids{sep}{said}\n"


@pytest.mark.parametrize(("text", "where"), [
    ('{"messages": [{"role": "user", "content": "a", "content": "b"}]}', " (at messages[0])"),
    ('{"messages": [], "messages": [{"role": "user", "content": "a"}]}', ""),
    ('[{"role": "user", "content": "a"}, {"role": "user", "content": {"x": 1, "x": 2}}]', " (at [1].content)"),
])
def test_a_key_twice_in_one_object_is_refused(tmp_path: Path, text: str, where: str) -> None:
    """JSON would keep the last value and drop the other silently."""
    f = tmp_path / "dup.json"
    f.write_text(text)
    key = "content" if "content\": \"b" in text else "messages" if text.count("messages") == 2 else "x"
    for argv in (["render", str(f)], ["export", "grammar", str(f)]):
        code, out, err = run(argv)
        assert code == 1 and out == ""
        assert err == f"xtml: error: {f}: invalid JSON: key '{key}' twice in one object{where}; JSON would keep only " \
                      "the last\n"


@pytest.mark.parametrize(("template", "said"), [
    (".", "is a folder: name a template file (.toml) or a built-in"),
    ("/dev/null", "is not a regular file (a device, a pipe or a socket)"),
])
def test_a_template_that_is_no_file_says_what_it_is(template: str, said: str) -> None:
    if not Path(template).exists():
        pytest.skip(f"no {template} here")
    for argv in (["render", str(EXAMPLE), "-t", template], ["fuzz", "-n", "1", "-t", template]):
        code, _, err = run(argv)
        assert code == 1 and err.startswith("xtml: error: ") and said in err and err.count("\n") == 1


def test_an_id_past_the_vocabulary_gets_no_completion_hint(tmp_path: Path) -> None:
    f = tmp_path / "ids.json"
    f.write_text("[1, 2, -1]")
    code, _, err = run(["parse", str(f), "--tokenizer", deepseek_path(), "--add-markers"])
    assert code == 1 and err == "xtml: error: -1 is not a token id of this tokenizer (at token 2)\n"
