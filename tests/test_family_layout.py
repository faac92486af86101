"""Layout dialect files (``[template] engine = "layout"``): what the reader
accepts, and where it says a file is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

import xtml
from xtml.chat.layout_file import check_any_text
from xtml.chat.template_file import builtin_files, load_dialect

SMOLLM2 = builtin_files(layout=True)["smollm2"].read_text(encoding="utf-8")


def _problems(text: str) -> list[tuple[str, str, int | None]]:
    d, problems = check_any_text(text, "t.toml")
    assert d is None
    return [(p.key, p.message, p.line) for p in problems]


def test_the_builtin_reads() -> None:
    d, problems = check_any_text(SMOLLM2, "smollm2.toml")
    assert not problems and d is not None
    assert d.name == "smollm2"


@pytest.mark.parametrize(("old", "new", "key", "words"), [
    ('open = "<|im_start|>{role}\\n"', 'open = "<|im_start|>{rol}\\n"', "frame.open", "unknown slot {rol}"),
    ('open = "<|im_start|>{role}\\n"', 'open = "<|im_start|>\\n"', "frame.open", "must hold {role}"),
    ('"<|endoftext|>" = "end"', '"<|eot|>" = "end"', "stop.<|eot|>", "not one of [tokens]"),
    ('"<|im_end|>" = "end"', '"<|im_end|>" = "done"', "stop.<|im_end|>", "meaning of a stop token"),
    ('[calls]\nrender = "drop"', '[calls]\nrender = "json"', "calls.render", "'drop', 'refuse'"),
    ('[calls]\nrender = "drop"', '[calls]', "calls", "render is required"),
    ('body = "<|im_start|>assistant\\n"', 'body = "<|im_start|>assistant\\n{?thinking}x"', "prompt.body",
     "unknown condition"),
    ('parts = "refuse"', 'parts = "refuse"\nextra = 1', "content.extra", "unknown key"),
    ('accepted = ["system", "user", "assistant", "tool", "developer"]', 'accepted = ["user", "assistant"]',
     "roles.accepted", "must include 'system'"),
])
def test_each_problem_is_located(old: str, new: str, key: str, words: str) -> None:
    assert old in SMOLLM2
    found = _problems(SMOLLM2.replace(old, new, 1))
    hits = [(k, m, line) for k, m, line in found if k == key and words in m]
    assert hits, found
    assert hits[0][2] is not None  # a line of the file


def test_an_unknown_engine_is_located() -> None:
    found = _problems(SMOLLM2.replace('engine = "layout"', 'engine = "jinja"', 1))
    assert [k for k, m, line in found if k == "template.engine" and "engine must be" in m and line]


def test_a_layout_file_by_path_and_its_options(tmp_path: Path) -> None:
    text = SMOLLM2.replace('[prompt]\nbody = "<|im_start|>assistant\\n"',
                           '[options]\nbrief = { type = "bool", default = false }\n\n'
                           '[prompt]\nbody = "<|im_start|>assistant\\n{?brief}In short: {/}"')
    path = tmp_path / "chatml.toml"
    path.write_text(text, encoding="utf-8")
    t = xtml.load(str(path))
    assert t.render([{"role": "user", "content": "hi"}]).text.endswith("<|im_start|>assistant\n")
    out = t.render([{"role": "user", "content": "hi"}], chat_template_kwargs={"brief": True}).text
    assert out.endswith("<|im_start|>assistant\nIn short: ")
    assert t.parse(out) == t.normalize([{"role": "user", "content": "hi"}], chat_template_kwargs={"brief": True})


def test_the_xtml_loader_says_what_a_layout_file_is() -> None:
    with pytest.raises(xtml.TemplateError) as e:
        load_dialect("smollm2")
    assert "layout dialect" in e.value.msg and e.value.location


def test_a_layout_template_is_read_only_and_replaces_its_limit() -> None:
    t = xtml.load("smollm2")
    with pytest.raises(AttributeError):
        t.max_chars = 5
    small = t.replace(max_chars=10)
    with pytest.raises(xtml.RequestError):
        small.render([{"role": "user", "content": "x" * 20}])
    with pytest.raises(xtml.ParseError):
        small.parse("x" * 20)
    assert t.render([{"role": "user", "content": "x" * 20}]).text
