"""Shrunk failures found by fuzzing, each kept as a named test."""

from __future__ import annotations

import pytest

import xtml


def test_tool_result_keeps_its_own_name_after_normalize(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    # A result named differently from the call at its position was linked to
    # the call; rendering the link again renamed the result.
    req = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
           {"role": "tool", "name": "g", "content": "r"}]
    norm = k3.normalize(req)
    assert norm["messages"][1] == {"role": "tool", "name": "g", "content": "r"}
    assert k3.render(norm).text == k3.render(req).text
    assert k3.parse(k3.encode(req, vocab), vocab) == norm


def test_empty_tool_name_with_unmatched_id(k3: xtml.Template) -> None:
    req = [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {"name": "f"}}]},
           {"role": "tool", "name": "", "tool_call_id": "zzz", "content": "r"}]
    assert k3.render(k3.normalize(req)).text == k3.render(req).text


def test_text_completion_error_offset_is_inside_the_input(k3: xtml.Template) -> None:
    with pytest.raises(xtml.ParseError) as e:
        k3.parse("<|open|>", completion=True)
    assert 0 <= e.value.offset <= len("<|open|>")
    assert (e.value.line, e.value.column) == (1, 1)


@pytest.mark.parametrize("thinking", [True, False])
def test_empty_completion_is_truncated(k3: xtml.Template, vocab: xtml.Vocabulary, thinking: bool) -> None:
    got = k3.parse([], vocab, completion=True, lenient=True, thinking=thinking)
    assert [d["kind"] for d in got["diagnostics"]] == ["truncated"]
    with pytest.raises(xtml.ParseError):
        k3.parse([], vocab, completion=True, thinking=thinking)


@pytest.mark.parametrize("key", [None, 1, True])
def test_non_string_json_keys_are_refused(k3: xtml.Template, key: object) -> None:
    with pytest.raises(xtml.RequestError, match="keys must be strings"):
        k3.render({"messages": [], "tools": [{key: None}]})
    with pytest.raises(xtml.RequestError, match="keys must be strings"):
        k3.render([{"role": "user", "content": "x"}],
                  response_format={"type": "json_schema", "json_schema": {"schema": {key: 1}}})


def test_deeply_nested_arguments_are_an_error(k3: xtml.Template) -> None:
    deep: list[object] = []
    x = deep
    for _ in range(5000):
        y: list[object] = []
        x.append(y)
        x = y
    with pytest.raises(xtml.MessageError, match="nested too deeply"):
        k3.render([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": deep}}}]}])


def _custom(**changes: object) -> xtml.Template:
    import tomllib
    from importlib import resources

    from xtml.chat.template_file import from_dict

    base = tomllib.loads(resources.files("xtml.dialects").joinpath("kimi-k3.toml").read_text(encoding="utf-8"))
    for path, value in changes.items():
        *sections, key = path.split(".")
        table = base
        for sec in sections:
            table = table[sec]
        table[key] = value
    return xtml.Template(from_dict(base, "custom"))


def test_normal_form_images_render_in_any_template() -> None:
    t = _custom(**{"plugins.image.part_types": ["image_url"]})
    n = t.normalize([{"role": "user", "content": [{"type": "image_url"}]}])
    assert t.normalize(n) == n


def test_extra_roles_refuse_assistant_fields() -> None:
    t = _custom(**{"roles.accepted": ["system", "user", "assistant", "tool", "observer"]})
    assert t.normalize([{"role": "observer", "content": "x"}])["messages"] == [{"role": "observer", "content": "x"}]
    with pytest.raises(xtml.MessageError, match="cannot carry 'reasoning_content'"):
        t.render([{"role": "observer", "content": "x", "reasoning_content": "KEEP"}])


def test_lenient_stream_does_not_raise_on_deep_output(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    b = k3.bind(vocab)
    tag = [b.marker_ids["<|open|>"], *vocab.encode_texts(["think"])[0], b.marker_ids["<|sep|>"]]
    sp = k3.stream(vocab)
    events = sp.feed_many(tag * 63) + sp.close()
    assert events[-1].type == "message_end"
    assert any(e.type == "diagnostic" and (e.diagnostic or {}).get("kind") == "too-deep" for e in events)
