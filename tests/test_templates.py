"""Templates as data: the shipped dialects, the documented format, xtml validate,
templates, new-template, inspect and the plugin door."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

import xtml
import xtml.plugins
from tests.helpers.cli import run
from tests.helpers.tokenizers import deepseek_path
from xtml.chat import template_file as dialect_mod
from xtml.chat.template_file import BUILTIN, builtin_files, from_dict
from xtml.testing.validate import validate

ROOT = Path(__file__).parent.parent
DOC = (ROOT / "docs" / "templates.md").read_text(encoding="utf-8")
K3_TEXT = builtin_files()["kimi-k3"].read_text(encoding="utf-8")
BASE_TEXT = builtin_files()["xtml-base"].read_text(encoding="utf-8")
LOCATED = re.compile(r"^[^:\n]+\.toml:\d+:\d+: [a-z_.\-\[\]0-9]+: .+", re.M)


def tokenizer_with(tmp: Path, markers: tuple[str, ...], *, lstrip: bool = False) -> str:
    """The DeepSeek vocabulary with ``markers`` as special tokens, saved."""
    tok = Tokenizer.from_file(deepseek_path())
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False, lstrip=lstrip) for m in markers])
    path = tmp / f"tok-{abs(hash((markers, lstrip)))}.json"
    tok.save(str(path))
    return str(path)


def doc_template() -> str:
    m = re.search(r"```toml template=acme\n(.*?)```", DOC, re.S)
    assert m is not None
    return m.group(1)


# -- shipped templates -------------------------------------------------------------

@pytest.mark.parametrize("name", ["kimi-k3", "xtml-base"])
def test_shipped_templates_validate_with_their_tokenizer(name: str, tmp_path: Path) -> None:
    markers = xtml.load(name).markers.all()
    tok = tokenizer_with(tmp_path, markers)
    code, out, err = run(["validate", name, "--tokenizer", tok, "--examples", "40"])
    assert code == 0, out + err
    assert out.strip().endswith("self-test)") and "valid" in out


def test_the_two_dialects_differ_in_everything_but_the_engine() -> None:
    k3, base = xtml.load("kimi-k3"), xtml.load("xtml-base")
    assert not set(k3.markers.all()) & set(base.markers.all())
    assert "Kimi" not in BASE_TEXT and "kimi" not in BASE_TEXT.lower()
    req = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
           "add_generation_prompt": True}
    text = base.render(req).text
    assert text.endswith('<|x_open|>msg role="assistant"<|x_sep|>')  # plain mode opens no channel
    assert base.parse(text) == base.normalize(req)


def test_templates_lists_builtins_with_files() -> None:
    code, out, _ = run(["templates"])
    assert code == 0
    for name, path in builtin_files().items():
        assert name in out
        assert path.is_file() and str(path) in out
    assert set(BUILTIN) >= {"kimi-k3", "xtml-base"}
    assert out.splitlines()[-1].startswith("installed plugins: audio, ")
    listed = set(out.splitlines()[-1][19:].split(", "))
    # Channels are the dialect's data, not plugins.
    assert {"image", "video"} <= listed and not {"think", "response", "tools"} & listed


# -- the documented format ---------------------------------------------------------

def test_documented_example_validates(tmp_path: Path) -> None:
    path = tmp_path / "acme.toml"
    path.write_text(doc_template(), encoding="utf-8")
    report = validate(path, examples=60)
    assert report.valid, [f.line_text() for f in report.findings]
    assert "self-test" in report.checks and report.self_test_examples >= 60


def test_documented_example_renders_what_the_doc_says_and_parses_back() -> None:
    t = xtml.Template(from_dict(tomllib.loads(doc_template()), "acme.toml"))
    m = re.search(r"```text render=acme request=(.*)\n(.*?)\n```", DOC)
    assert m is not None
    request = json.loads(m.group(1))
    assert t.render(request).text == m.group(2)
    rich = {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image"}]},
                         {"role": "assistant", "content": "ok", "reasoning_content": "hm",
                          "tool_calls": [{"function": {"name": "f", "arguments": {"a": [1]}}}]},
                         {"role": "tool", "content": "done"}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "thinking_effort": "quick"}
    text = t.render(rich).text
    # Channel order comes from the file: actions before reply.
    assert text.index("<|tag|>actions") < text.index("<|tag|>reply")
    assert t.parse(text) == t.normalize(rich)


def test_every_key_is_documented() -> None:
    keys: set[str] = set(dialect_mod.SECTIONS) | set(dialect_mod.NAME_KEYS) | set(dialect_mod.SYSTEM_KEYS)
    keys |= set(dialect_mod._MARKER_KEYS)
    keys |= {"name", "description", "accepted", "aliases", "order", "plain", "thinking", "default", "efforts",
             "default_effort", "off", "placeholder", "part_types", "prompt", "position", "body", "roles",
             "channels", "exclude", "end", "budgets"}
    reference = DOC[DOC.index("## Reference"):]
    missing = [k for k in sorted(keys) if not any(f in reference for f in (f"`{k}`", f"[{k}]", f"[{k}."))]
    assert not missing


# -- xtml validate on broken templates ---------------------------------------------

MUTATIONS: list[tuple[str, str, str, str]] = [
    # (id, old, new, expected key path in the message)
    ("duplicate marker", 'sep = "<|sep|>"', 'sep = "<|open|>"', "markers.sep"),
    ("overlapping marker", 'embed_end = ["<|media_end|>"]', 'embed_end = ["<|media_end|><|sep|>"]', "markers.sep"),
    ("empty marker", 'close = "<|close|>"', 'close = ""', "markers.close"),
    ("unknown key", "[thinking]\n", "[thinking]\neffort_levels = 3\n", "thinking.effort_levels"),
    ("unknown section", "[channels]\n", "[channel]\norder = []\n[channels]\n", "channel"),
    ("missing key", 'default_effort = "max"\n', "", "thinking.default_effort"),
    ("wrong type", "default = true", 'default = "yes"', "thinking.default"),
    ("bad tag name", 'think = "think"', 'think = "th ink"', "names.think"),
    ("bad attribute name", 'key = "key"', 'key = "1key"', "names.key"),
    ("unknown placeholder", "{effort}", "{level}", "system.thinking-effort.body"),
    ("missing plugin", "[plugins.image]", "[plugins.audio]\nrate = 16000\n\n[plugins.image]", "plugins.audio"),
    ("bad plugin setting", 'part_types = ["image", "image_url"]', "part_types = 3", "plugins.image.part_types"),
    ("unknown plugin setting", 'part_types = ["image", "image_url"]', 'size = 1\npart_types = ["image"]',
     "plugins.image"),
    ("bad channel order", 'order = ["think", "response", "tools"]', 'order = ["think", "think"]', "channels.order"),
    ("bad budget", "low = 4096", "low = -1", "training.budgets.low"),
]


@pytest.mark.parametrize("case", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutated_template_exits_1_with_a_located_message(case: tuple[str, str, str, str], tmp_path: Path) -> None:
    _, old, new, key = case
    assert old in K3_TEXT
    path = tmp_path / "mutant.toml"
    path.write_text(K3_TEXT.replace(old, new, 1), encoding="utf-8")
    code, out, _ = run(["validate", str(path), "--examples", "0"])
    assert code == 1
    lines = out.splitlines()
    assert LOCATED.match(lines[0]), lines[0]
    assert any(f": {key}: " in ln for ln in lines), out
    line_no = int(lines[0].split(":")[1])
    assert 1 <= line_no <= out.count("\n") + K3_TEXT.count("\n") + 10
    assert re.search(r"\d+ problems?", lines[-1])
    # Loading the same file fails with the first problem, located.
    with pytest.raises(xtml.TemplateError, match=re.escape(str(path))):
        xtml.load(path)


def test_syntax_error_is_located_at_its_line(tmp_path: Path) -> None:
    lines = K3_TEXT.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("[names]"))
    lines[at] = "[names"
    path = tmp_path / "syntax.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    code, out, _ = run(["validate", str(path)])
    assert code == 1
    assert out.startswith(f"{path}:{at + 1}:") and "invalid TOML" in out


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    text = K3_TEXT
    for _, old, new, _ in MUTATIONS[:4] + MUTATIONS[7:11]:
        text = text.replace(old, new, 1)
    path = tmp_path / "many.toml"
    path.write_text(text, encoding="utf-8")
    report = validate(path)
    keys = {f.key for f in report.findings}
    assert {"markers.sep", "markers.close", "thinking.effort_levels", "names.think", "names.key",
            "system.thinking-effort.body", "plugins.audio"} <= keys
    assert all(f.line is not None for f in report.findings)
    hints = {f.key: f.hint for f in report.findings}
    assert hints["thinking.effort_levels"].startswith(("did you mean", "allowed here"))
    assert hints["system.thinking-effort.body"] == "this body takes {effort}"


def test_json_format_has_the_same_findings(tmp_path: Path) -> None:
    path = tmp_path / "mutant.toml"
    path.write_text(K3_TEXT.replace('think = "think"', 'thnk = "think"'), encoding="utf-8")
    code, out, _ = run(["validate", str(path), "--format", "json"])
    assert code == 1
    data = json.loads(out)
    assert data["valid"] is False and data["template"] == str(path)
    assert {(f["key"], f["message"]) for f in data["findings"]} == {
        ("names.thnk", "unknown key 'thnk'"), ("names.think", "missing key 'think'")}
    assert all({"check", "file", "line", "column", "hint"} <= f.keys() for f in data["findings"])
    _, text_out, _ = run(["validate", str(path)])
    assert len(text_out.splitlines()) == len(data["findings"]) + 1


def test_tokenizer_without_the_markers_fails_per_marker(tmp_path: Path) -> None:
    code, out, _ = run(["validate", "kimi-k3", "--tokenizer", deepseek_path(), "--examples", "0"])
    assert code == 1
    assert re.search(r"kimi-k3\.toml:\d+:\d+: markers\.open: marker '<\|open\|>' is not a special token", out)
    assert "markers.sep" in out and "markers.end" in out
    # The optional placeholder may be spelled as text: not reported.
    assert "kimi_image_placeholder" not in out


def test_marker_that_does_not_split_cleanly_from_text(tmp_path: Path) -> None:
    tok = tokenizer_with(tmp_path, xtml.load().markers.all(), lstrip=True)
    report = validate("kimi-k3", tokenizer=tok, examples=0)
    assert not report.valid
    assert any("does not split cleanly" in f.message and f.key == "markers.open" for f in report.findings)


def test_validate_can_add_the_markers_first() -> None:
    code, out, _ = run(["validate", "kimi-k3", "--tokenizer", deepseek_path(), "--add-markers", "-n", "20"])
    assert code == 0, out
    assert "tokenizer, self-test" in out


def test_tokenizer_that_cannot_be_loaded(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json", encoding="utf-8")
    code, out, _ = run(["validate", "kimi-k3", "--tokenizer", str(bad)])
    assert code == 1 and str(bad) in out


def test_bodies_parse_cannot_tell_apart_are_found(tmp_path: Path) -> None:
    # Both tool-choice messages now read the same: "none" would parse back
    # as "required".
    text = K3_TEXT.replace("The system is invoked with `tool_choice=none`.\\nYou MUST NOT call any tools in the "
                           "next message.",
                           "The system is invoked with `tool_choice=required`.\\nYou MUST call tools in the next "
                           "message.")
    assert text != K3_TEXT
    path = tmp_path / "same.toml"
    path.write_text(text, encoding="utf-8")
    report = validate(path)
    assert {f.key for f in report.findings} == {"system.tool-choice-required.body", "system.tool-choice-none.body"}
    assert all(f.line is not None and "could not tell them apart" in f.message for f in report.findings)


class _Lossy:
    """A plugin whose parse loses data: only the self-test can tell."""

    name = "lossy-test"

    def configure(self, settings: Mapping[str, Any], where: str) -> Any:
        from xtml.plugins import ContentExtension

        class Ext(ContentExtension):
            name = "lossy-test"
            part_types = ("note",)
            elements = ("note",)

            def prepare(self, part: Mapping[str, Any]) -> str:
                return str(part.get("text", ""))

            def render(self, value: str, out: Any, ctx: Any) -> None:
                out.element("note", (), value)

            def normal(self, value: str, ctx: Any) -> dict[str, Any]:
                return {"type": "note", "text": value}

            def read_element(self, el: Any, ctx: Any) -> dict[str, Any]:
                text = "".join(getattr(c, "text", "") for c in el.children)
                return {"type": "note", "text": text[:3]}

            def strategy(self) -> Any:
                from hypothesis import strategies as st

                # Every note is longer than what reads back.
                return st.builds(lambda t: {"type": "note", "text": t}, st.text(min_size=4, max_size=8))

        return Ext()


@pytest.mark.parametrize("seed", [0, 2])
def test_self_test_catches_what_no_static_check_can(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "lossy.toml"
    path.write_text(K3_TEXT + "\n[plugins.lossy-test]\n", encoding="utf-8")
    with xtml.plugins.using(_Lossy()):
        # No tokenizer given: the self-test runs on ids of a byte-level vocabulary.
        report = validate(path, examples=200, seed=seed)
    # The file is valid in every other respect: the one finding is the
    # self-test's, and the request it shows holds a note.
    assert [f.check for f in report.findings] == ["self-test"]
    f = report.findings[0]
    assert "token ids of a byte-level vocabulary" in f.message and '"note"' in f.message
    assert f.hint == f"reproduce with xtml validate {path} --examples 200 --seed {seed}"
    # Once the plugin is taken back, the file names a plugin that is not there.
    report = validate(path, examples=0)
    assert [f.key for f in report.findings] == ["plugins.lossy-test"]


def test_unknown_template_name_exits_1() -> None:
    code, out, _ = run(["validate", "no-such-template"])
    assert code == 1 and "no template named" in out


# -- new-template --------------------------------------------------------------------

def test_new_template_writes_a_file_that_validates(tmp_path: Path) -> None:
    path = tmp_path / "acme.toml"
    code, out, err = run(["new-template", "acme", "-o", str(path)])
    assert code == 0, err
    text = path.read_text(encoding="utf-8")
    assert 'name = "acme"' in text and text.count("\n#") > 10
    code, out, _ = run(["validate", str(path), "--examples", "30"])
    assert code == 0, out
    assert xtml.load(path).name == "acme"
    code, _, err = run(["new-template", "acme", "-o", str(path)])
    assert code == 1 and "--force" in err
    assert run(["new-template", "acme", "-o", str(path), "--force"])[0] == 0
    code, _, err = run(["new-template", "not a name"])
    assert code == 1 and "not a valid template name" in err


# -- inspect ---------------------------------------------------------------------------

def test_inspect_counts_tokens_per_message_and_channel(tmp_path: Path, vocab: xtml.Vocabulary) -> None:
    req = {"messages": [{"role": "user", "content": "hi <|open|> there"},
                        {"role": "assistant", "content": "fine", "reasoning_content": "let me think"}],
           "add_generation_prompt": False}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req), encoding="utf-8")
    code, out, _ = run(["inspect", str(path), "--tokenizer", deepseek_path(), "--add-markers"])
    assert code == 0
    heads = [ln for ln in out.splitlines() if ln.startswith("── message")]
    assert [h.split(" · ")[1] for h in heads] == ["system (thinking-effort)", "user", "assistant"]
    from xtml.cli.inspect import tokens

    toks = tokens(xtml.load(), req, vocab)
    assert [t.id for t in toks] == xtml.load().encode(req, vocab)
    think = sum(1 for t in toks if t.message == 2 and t.path[1:2] == ("think",))
    assert f"think {think}" in heads[2]
    # The literal marker in user text is text, not a marker row.
    user_rows = [t for t in toks if t.message == 1 and t.marker]
    assert len(user_rows) == 5  # open, sep, close, sep, end
    code, coloured, _ = run(["inspect", str(path), "--tokenizer", deepseek_path(), "--add-markers",
                             "--colour", "always"])
    assert code == 0 and "\x1b[" in coloured and "\x1b[" not in out


# -- plugins -------------------------------------------------------------------------

class _Geo:
    name = "geo-test"

    def configure(self, settings: Mapping[str, Any], where: str) -> dict[str, Any]:
        zoom = settings.get("zoom")
        if type(zoom) is not int:
            raise xtml.TemplateError("zoom must be an integer", location=f"{where}.zoom")
        return {"zoom": zoom}


def test_plugins_come_through_one_door(tmp_path: Path) -> None:
    assert "image" in xtml.plugins.installed()  # the built-in, through the entry point
    assert "geo-test" not in xtml.plugins.installed()  # no other test's registration is left over
    geo = xtml.plugins.use(_Geo())
    path = tmp_path / "geo.toml"
    path.write_text(K3_TEXT + "\n[plugins.geo-test]\nzoom = 3\n", encoding="utf-8")
    assert xtml.load(path).dialect.plugins["geo-test"] == {"zoom": 3}
    path.write_text(K3_TEXT + '\n[plugins.geo-test]\nzoom = "far"\n', encoding="utf-8")
    report = validate(path, examples=0)
    assert [(f.key, f.message) for f in report.findings] == [("plugins.geo-test.zoom", "zoom must be an integer")]
    assert report.findings[0].line == K3_TEXT.count("\n") + 3
    # A second, different plugin of the same name is refused.
    with pytest.raises(xtml.TemplateError, match="already taken"):
        xtml.plugins.use(_Geo())
    assert xtml.plugins.use(geo) is geo


def test_a_plugin_given_to_use_can_be_taken_back(tmp_path: Path) -> None:
    path = tmp_path / "geo.toml"
    path.write_text(K3_TEXT + "\n[plugins.geo-test]\nzoom = 3\n", encoding="utf-8")
    geo = xtml.plugins.use(_Geo())
    loaded = xtml.load(path)
    with pytest.raises(xtml.TemplateError, match="was given to use\\(\\) by another plugin"):
        xtml.plugins.unuse(_Geo())
    xtml.plugins.unuse(geo)
    assert "geo-test" not in xtml.plugins.installed()
    assert loaded.dialect.plugins["geo-test"] == {"zoom": 3}  # what was loaded keeps it
    with pytest.raises(xtml.TemplateError, match="not given to use"):
        xtml.plugins.unuse(geo)
    with pytest.raises(xtml.TemplateError, match="not given to use"):
        xtml.plugins.unuse("image")  # installed, not registered here
    # The name is free again, for another object.
    other = xtml.plugins.use(_Geo())
    xtml.plugins.unuse("geo-test")
    assert "geo-test" not in xtml.plugins.installed() and other is not geo
    # For a block: taken back after it, on an error too; one registered
    # before the block stays.
    with pytest.raises(RuntimeError), xtml.plugins.using(geo) as got:
        assert got == (geo,) and xtml.plugins.installed()["geo-test"] is geo
        raise RuntimeError
    assert "geo-test" not in xtml.plugins.installed()
    xtml.plugins.use(geo)
    with xtml.plugins.using(geo):
        pass
    assert xtml.plugins.installed()["geo-test"] is geo


def test_templates_json() -> None:
    code, out, _ = run(["templates", "--format", "json"])
    assert code == 0
    rows = json.loads(out)
    assert [(r["name"], r["engine"]) for r in rows] == [("kimi-k3", "xtml"), ("xtml-base", "xtml"),
                                                        ("smollm2", "layout"), ("qwen3", "layout"),
                                                        ("llama-3.1", "layout"), ("deepseek-v3.1", "layout"),
                                                        ("kimi-k2", "layout"), ("kimi-k2-thinking", "layout"),
                                                        ("glm-4.6", "layout"), ("mistral-small-3.1", "layout"),
                                                        ("gemma-4", "layout"), ("gpt-oss", "layout")]
    assert rows[0]["aliases"] == ["k3"] and all(Path(r["path"]).is_file() for r in rows)


@pytest.mark.parametrize("command", ["render", "parse", "inspect", "validate", "templates", "new-template", "fuzz"])
def test_every_command_has_help_with_examples(command: str) -> None:
    code, out, _ = run([command, "--help"])
    assert code == 0 and "examples:" in out and f"xtml {command}" in out


@pytest.mark.parametrize("argv", [["validate"], ["new-template"], ["inspect", "--colour", "sometimes"],
                                  ["templates", "--format", "yaml"], ["validate", "k3", "-n", "-1"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    assert run(argv)[0] == 2
