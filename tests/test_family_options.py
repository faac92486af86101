"""A layout dialect's own options (the official template's keyword names)
at the top level of a request body, as transformers' ``apply_chat_template``
passes every extra keyword to the template: read there too, typed, below
``chat_template_kwargs`` and keyword options in precedence; a name no table
and no dialect holds is still refused. Through ``xtml serve`` too: the
openai SDK's ``extra_body`` and a plain JSON body against the gateway, with
a stand-in engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import xtml
from tests.helpers.engines import StandIn, running
from xtml.chat.request import OPTION_NAMES
from xtml.chat.template_file import LAYOUT_BUILTIN, builtin_files
from xtml.errors import OptionError, RequestError
from xtml.serving.gateway import create_app
from xtml.template import LayoutTemplate

ROOT = Path(__file__).parent.parent
BASE_TOKENIZER = str(ROOT / "examples" / "tokenizer.json")
MESSAGES = [{"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
BASE = {"messages": MESSAGES, "tools": TOOLS}
"""A request every option shows in (Llama 3.1's ``tools_in_user_message``
only moves tools; a format that writes no tools drops them)."""
OWN = "think_first"
"""The option of a dialect made for these tests: qwen3's ``enable_thinking``
under a name the shared table of request fields does not hold, as the
official templates' own keywords (``date_string``, ``tools_in_user_message``)
are not in it."""


@pytest.fixture(scope="module")
def own_dialect(tmp_path_factory: pytest.TempPathFactory) -> LayoutTemplate:
    text = builtin_files(layout=True)["qwen3"].read_text(encoding="utf-8")
    assert text.count("enable_thinking") == 2  # the option and the prompt's condition
    path = tmp_path_factory.mktemp("dialect") / "mine.toml"
    path.write_text(text.replace("enable_thinking", OWN).replace('name = "qwen3"', 'name = "mine"', 1),
                    encoding="utf-8")
    t = xtml.load(str(path))
    assert isinstance(t, LayoutTemplate) and OWN not in OPTION_NAMES
    return t


def _cases(own_dialect: LayoutTemplate) -> list[tuple[LayoutTemplate, str, bool]]:
    """(template, option, its default) of every boolean option of the
    built-in layout dialects (the shared ``enable_thinking`` of qwen3, and
    each dialect's own names as they come) and of the test's dialect."""
    out: list[tuple[LayoutTemplate, str, bool]] = []
    for name in LAYOUT_BUILTIN:
        t = xtml.load(name)
        assert isinstance(t, LayoutTemplate)
        out += [(t, k, v) for k, v in t.layout.options.items() if isinstance(v, bool)]
    out.append((own_dialect, OWN, True))
    return out


def _vocab(t: LayoutTemplate) -> xtml.Vocabulary:
    return xtml.load_tokenizer(BASE_TOKENIZER, add_special_tokens=t.layout.tokens)


def test_at_the_top_level_as_in_chat_template_kwargs_and_as_a_keyword(own_dialect: LayoutTemplate) -> None:
    for t, name, default in _cases(own_dialect):
        flipped = not default
        want = t.render(BASE, **{name: flipped}).text
        assert want != t.render(BASE).text, (t.name, name)  # the option shows in the prompt
        assert t.render({**BASE, name: flipped}).text == want
        assert t.render({**BASE, "extra_body": {name: flipped}}).text == want
        assert t.render({**BASE, "chat_template_kwargs": {name: flipped}}).text == want
        # Precedence as for every option: keyword, then chat_template_kwargs,
        # then extra_body, then the top level.
        assert t.render({**BASE, name: default, "chat_template_kwargs": {name: flipped}}).text == want
        assert t.render({**BASE, name: default, "extra_body": {name: flipped}}).text == want
        assert t.render({**BASE, name: default}, **{name: flipped}).text == want
        assert t.render({**BASE, name: flipped,
                         "chat_template_kwargs": {name: default}}).text == t.render(BASE).text
        # The ids and the normal form read it alike.
        vocab = _vocab(t)
        assert t.encode({**BASE, name: flipped}, vocab) == t.encode(BASE, vocab, **{name: flipped})
        assert t.normalize({**BASE, name: flipped}) == t.normalize(BASE, **{name: flipped})


def test_typed_and_unknown_names_still_refused(own_dialect: LayoutTemplate) -> None:
    for t, name, _ in _cases(own_dialect):
        with pytest.raises(OptionError) as e:
            t.render({"messages": MESSAGES, name: "no"})
        assert e.value.option == name and "true or false" in str(e.value)
        with pytest.raises(RequestError) as r:
            t.render({"messages": MESSAGES, name + "s": False})
        assert r.value.location == name + "s"
    # A name is the dialect's own: another dialect's request refuses it.
    with pytest.raises(RequestError) as r:
        xtml.load("smollm2").render({"messages": MESSAGES, OWN: False})
    assert r.value.location == OWN and "unknown request key" in str(r.value)


# -- through the gateway ------------------------------------------------------------------------


class Gateway:
    """A stand-in llama.cpp engine that answers ``Hello.`` and the gateway
    with ``t`` in front of it."""

    def __init__(self, t: LayoutTemplate) -> None:
        self.t = t
        self.vocab = _vocab(t)
        b = t.bind(self.vocab)
        self.engine = StandIn("llamacpp", eog=b.stop_ids, vocab_size=self.vocab.size, token_bytes=b.text_table())
        self.engine.answer = [*self.vocab.ids_of(["Hello."])[0], b.stop_ids[0]]
        self._backend = running(self.engine)
        backend = self._backend.__enter__()
        self._gateway = running(create_app(t, self.vocab, backend.url, kind="llamacpp"))
        self.url = self._gateway.__enter__().url
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=30)

    def close(self) -> None:
        self.client.close()
        self._gateway.__exit__(None, None, None)
        self._backend.__exit__(None, None, None)

    def prompt(self) -> list[int]:
        return list(self.engine.requests[-1]["prompt"])


@pytest.fixture(scope="module")
def gateways(own_dialect: LayoutTemplate) -> Iterator[dict[str, Gateway]]:
    made = {t.name: Gateway(t) for t in {t.name: t for t, _, _ in _cases(own_dialect)}.values()}
    try:
        yield made
    finally:
        for g in made.values():
            g.close()


def test_the_gateway_reads_them_from_the_sdks_extra_body_and_a_plain_body(
        own_dialect: LayoutTemplate, gateways: dict[str, Gateway]) -> None:
    for t, name, default in _cases(own_dialect):
        g = gateways[t.name]
        flipped = not default
        want = t.encode(BASE, g.vocab, **{name: flipped})
        assert want != t.encode(BASE, g.vocab)
        answer = g.client.chat.completions.create(model=t.name, messages=MESSAGES, tools=TOOLS,  # type: ignore[arg-type]
                                                  max_tokens=8, extra_body={name: flipped})
        assert answer.choices[0].message.content == "Hello."
        assert g.prompt() == want
        assert answer.usage is not None and answer.usage.prompt_tokens == len(want)
        # Streamed, and as a plain JSON body: the same prompt.
        chunks: list[Any] = list(g.client.chat.completions.create(model=t.name, messages=MESSAGES, tools=TOOLS,  # type: ignore[arg-type]
                                                       max_tokens=8, stream=True, extra_body={name: flipped}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello."
        assert g.prompt() == want
        r = httpx.post(g.url + "/v1/chat/completions", json={**BASE, "max_tokens": 8, name: flipped},
                       timeout=30)
        assert r.status_code == 200, r.text
        assert g.prompt() == want
        # chat_template_kwargs win over the top level, as in the library.
        r = httpx.post(g.url + "/v1/chat/completions", timeout=30, json={
            **BASE, "max_tokens": 8, name: default, "chat_template_kwargs": {name: flipped}})
        assert r.status_code == 200 and g.prompt() == want


def test_the_gateway_refuses_a_badly_typed_one_by_name(own_dialect: LayoutTemplate,
                                                       gateways: dict[str, Gateway]) -> None:
    for t, name, _ in _cases(own_dialect):
        g = gateways[t.name]
        asked = len(g.engine.requests)
        with pytest.raises(openai.BadRequestError) as e:
            g.client.chat.completions.create(model=t.name, messages=MESSAGES,  # type: ignore[arg-type]
                                             max_tokens=8, extra_body={name: "no"})
        body: Any = e.value.body
        assert name in json.dumps(body) and "true or false" in json.dumps(body)
        assert len(g.engine.requests) == asked  # nothing reached the engine
