"""Errors that say whose fault, told to whom.

* the family: a caller's bad input is a :class:`~xtml.CallerError` (and a
  ``ValueError``), an engine's failure a :class:`~xtml.errors.PeerError`
  (no ``ValueError``), both an :class:`~xtml.XtmlError`;
* a fault of the gateway itself reaches the client as an id only (whole
  answer, stream, stream of n choices, Responses), the log has the
  traceback under the same id;
* a request nested past :data:`~xtml.errors.MAX_DEPTH` is refused with one
  wording, naming where, whether it comes as JSON text too deep to read, as
  a body the gateway reads, as a Responses request or to the library.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import xtml
from tests.helpers.serve import K3, REQUEST, Rig, answer_of
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml.errors import MAX_DEPTH, CallerError, PeerError, XtmlError
from xtml.serving import answers as answers_module
from xtml.serving import gateway as gateway_module
from xtml.serving.engines import BackendError
from xtml.serving.openai import ChunkStream

SECRET = "s3cr3t-/etc/xtml/key"
TOO_DEEP = f"nested too deeply: more than {MAX_DEPTH} levels of arrays and objects"


# -- the family ----------------------------------------------------------------------------------

def _subclasses() -> set[type[XtmlError]]:
    for m in pkgutil.walk_packages(xtml.__path__, "xtml."):
        if m.name.startswith(("xtml.vllm", "xtml.playground", "xtml.__main__")):
            continue  # need extras (vLLM, the page's assets) to import, or run the command line
        importlib.import_module(m.name)
    seen: set[type[XtmlError]] = set()
    todo: list[type[XtmlError]] = [XtmlError]
    while todo:
        c = todo.pop()
        for s in c.__subclasses__():
            if s not in seen:
                seen.add(s)
                todo.append(s)
    return seen


def test_every_error_is_the_callers_or_a_peers() -> None:
    assert issubclass(BackendError, PeerError) and issubclass(BackendError, XtmlError)
    assert not issubclass(BackendError, ValueError) and not issubclass(PeerError, ValueError)
    assert not issubclass(XtmlError, ValueError)
    classes = _subclasses()
    assert {xtml.RequestError, xtml.ParseError, xtml.MarkupError, xtml.TemplateError, xtml.TokenizerError,
            BackendError} <= classes
    for c in classes - {CallerError, PeerError}:
        # Bad input stays a ValueError, as before the family had branches.
        assert issubclass(c, CallerError) != issubclass(c, PeerError), c
        assert issubclass(c, ValueError) == issubclass(c, CallerError), c
    assert {c for c in classes if issubclass(c, PeerError)} == {PeerError, BackendError}


def test_the_errors_module_documents_both_branches() -> None:
    doc = inspect.getdoc(importlib.import_module("xtml.errors")) or ""
    assert "CallerError" in doc and "PeerError" in doc and "MAX_DEPTH" in doc


# -- a fault of the gateway: an id, not its text ---------------------------------------------------

@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    r = Rig("vllm")
    r.engine.answer = answer_of({"role": "assistant", "content": "Hello there, this is a longer answer."})
    yield r
    r.close()


def _broken_feed(monkeypatch: pytest.MonkeyPatch) -> None:
    """ChunkStream.feed fails on the first events of the model's answer (its
    first call, with none, goes through: the stream has started)."""
    feed = ChunkStream.feed

    def failing(self: ChunkStream, events: Any) -> Any:
        if events:
            raise RuntimeError(f"cannot open {SECRET}")
        return feed(self, events)

    monkeypatch.setattr(ChunkStream, "feed", failing)


def _broken_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*a: Any, **k: Any) -> Any:
        raise RuntimeError(f"cannot open {SECRET}")

    monkeypatch.setattr(answers_module, "chat_completion", failing)


def _said(text: str, caplog: pytest.LogCaptureFixture) -> None:
    """``text`` (what the client got) holds an id and nothing of the
    exception; the log has its traceback under that id."""
    assert SECRET not in text and "RuntimeError" not in text, text
    m = re.search(r"internal error, id ([0-9a-f]{12}): the server's log has the details", text)
    assert m is not None, text
    logged = [r for r in caplog.records if r.name == "xtml.serve" and m.group(1) in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert logged[0].exc_info is not None and SECRET in str(logged[0].exc_info[1])


def _post(rig: Rig, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(rig.url + path, content=json.dumps(body).encode(), headers={"content-type": "application/json"},
                      timeout=30)


@pytest.mark.parametrize(("path", "extra", "broken"), [
    ("/v1/chat/completions", {}, _broken_whole),
    ("/v1/chat/completions", {"stream": True}, _broken_feed),
    ("/v1/chat/completions", {"stream": True, "n": 2}, _broken_feed),
    ("/v1/responses", {}, _broken_whole),
    ("/v1/responses", {"stream": True}, _broken_feed),
], ids=["whole", "stream", "stream-n", "responses", "responses-stream"])
def test_a_fault_of_the_gateway_is_told_as_an_id(rig: Rig, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture, path: str, extra: dict[str, Any],
                                                 broken: Any) -> None:
    broken(monkeypatch)
    body: dict[str, Any] = dict(REQUEST)
    if path == "/v1/responses":
        body = {"input": REQUEST["messages"][1]["content"], "instructions": REQUEST["messages"][0]["content"]}
    with caplog.at_level(logging.ERROR, logger="xtml.serve"):
        r = _post(rig, path, {**body, **extra})
    if extra.get("stream"):
        assert r.status_code == 200
        # The stream ends as a stream that failed does: whole, then done.
        assert r.text.endswith("data: [DONE]\n\n" if path == "/v1/chat/completions" else "\n\n"), r.text
        if path == "/v1/responses":
            assert "event: response.failed" in r.text
    else:
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "server_error"
    _said(r.text, caplog)


def test_an_unhandled_fault_of_another_path_is_told_as_an_id(rig: Rig, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    def failing(self: Any) -> Any:
        raise RuntimeError(f"cannot open {SECRET}")

    monkeypatch.setattr(gateway_module.Gateway, "_card", failing)
    with caplog.at_level(logging.ERROR, logger="xtml.serve"):
        r = httpx.get(rig.url + "/v1/models", timeout=30)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    _said(r.text, caplog)


# -- nesting: one limit, one wording, one place ---------------------------------------------------

def _nest(depth: int, leaf: Any = "x") -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _schema(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        inner = {"type": "object", "properties": {"a": inner}}
    return inner


def _tools(schema: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                         "properties": {"x": schema}}}}]


# request(1) messages(2) message(3) tool_calls(4) call(5) function(6) arguments(7): the arguments' values
# start at 8.
AT_THE_LIMIT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
    {"function": {"name": "f", "arguments": {"a": _nest(MAX_DEPTH - 7)}}}]}, {"role": "user", "content": "and?"}]}


@pytest.mark.parametrize(("request_", "where"), [
    ({"messages": [{"role": "user", "content": _nest(MAX_DEPTH - 2)}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": _nest(5000)}]}, "messages[0].content"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": {"a": _nest(300)}}}]}], "messages[1].tool_calls"),
    ({**REQUEST, "tools": _tools(_schema(40))}, "tools"),
    ({**REQUEST, "response_format": {"type": "json_schema", "json_schema": {"schema": _nest(2000, {})}}},
     "response_format"),
    ({**REQUEST, "chat_template_kwargs": {"k": _nest(100)}}, "chat_template_kwargs"),
])
def test_the_library_refuses_a_request_nested_past_the_limit(request_: Any, where: str) -> None:
    calls = [lambda: K3.encode(request_, vocab()), lambda: K3.render(request_), lambda: K3.normalize(request_),
             lambda: K3.completion_grammar(request_, tool_choice="required")]
    if where.startswith(("messages", "tools")):
        messages = request_ if isinstance(request_, list) else request_["messages"]
        tools = {"tools": request_["tools"]} if where == "tools" else {}
        calls.append(lambda: K3.conversation(vocab(), messages, **tools))
    for call in calls:
        with pytest.raises(xtml.RequestError) as e:
            call()
        assert e.value.msg == TOO_DEEP and e.value.location == where, e.value


def test_a_request_at_the_limit_is_served_by_every_step() -> None:
    past = json.loads(json.dumps(AT_THE_LIMIT))
    past["messages"][1]["tool_calls"][0]["function"]["arguments"]["a"] = _nest(MAX_DEPTH - 6)
    with pytest.raises(xtml.MessageError, match=re.escape(TOO_DEEP)):
        K3.encode(past, vocab())
    K3.encode(AT_THE_LIMIT, vocab())
    K3.normalize(AT_THE_LIMIT)
    K3.conversation(vocab(), AT_THE_LIMIT["messages"])
    # Schemas: 28 nested objects is 64 levels in a request; every grammar
    # writer (each recursing per level) writes it.
    deep = {"messages": [{"role": "user", "content": "hi"}], "tools": _tools(_schema(28)), "tool_choice": "required"}
    for fmt in ("llguidance", "gbnf", "xgrammar", "xgrammar-tag"):
        assert K3.completion_grammar(deep, vocab(), format=fmt)
    with pytest.raises(xtml.RequestError, match=re.escape(TOO_DEEP)):
        K3.render({**deep, "tools": _tools(_schema(29))})


def test_a_value_that_contains_itself_is_nested_past_the_limit() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(xtml.MessageError, match=re.escape(TOO_DEEP)) as e:
        K3.render({"messages": [{"role": "user", "content": loop}]})
    assert e.value.location == "messages[0].content"


@pytest.mark.parametrize("field", ["messages", "tools", "response_format", "stop", "logit_bias", "tool_choice",
                                   "stream_options", "metadata", "chat_template_kwargs", "functions", "unknown"])
@pytest.mark.parametrize("depth", [MAX_DEPTH, 900, 100_000])
def test_the_gateway_refuses_a_deep_value_in_any_field_with_the_one_wording(rig: Rig, field: str,
                                                                           depth: int) -> None:
    body = {**REQUEST, field: _nest(depth)}
    r = httpx.post(rig.url + "/v1/chat/completions", content=json.dumps(body).encode() if depth < 500 else
                   json.dumps(REQUEST)[:-1].encode() + f', "{field}": '.encode() + b"[" * depth + b"]" * depth + b"}",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    where = "messages[0]" if field == "messages" else field
    assert error["param"] == where
    if depth < 100_000 and field in ("stop", "logit_bias", "stream_options"):
        # Read by the gateway's own checks first, which want no array there.
        assert "must" in error["message"], error
    else:
        assert error["message"] == f"{TOO_DEEP} (at {where})"


@pytest.mark.parametrize("depth", [MAX_DEPTH, 100_000])
def test_a_deep_message_is_named_as_the_message(rig: Rig, depth: int) -> None:
    head = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": '
    r = httpx.post(rig.url + "/v1/chat/completions", content=head + b"[" * depth + b"]" * depth + b"}]}",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == f"{TOO_DEEP} (at messages[1].content)"
    assert r.json()["error"]["param"] == "messages[1].content"


@pytest.mark.parametrize("depth", [MAX_DEPTH, 900, 100_000])
@pytest.mark.parametrize(("field", "value", "where"), [
    ("tools", lambda d: [{"type": "function", "name": "f", "parameters": _nest(d, {})}], "tools"),
    ("text", lambda d: {"format": {"type": "json_schema", "schema": {"type": "array", "default": _nest(d)}}},
     "text"),
    ("input", lambda d: [{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                          "arguments": "{}"},
                         {"type": "function_call_output", "call_id": "c", "output": _nest(d, "x")}], "input"),
])
def test_a_deep_responses_request_is_refused_naming_its_own_field(rig: Rig, field: str, value: Any, where: str,
                                                                  depth: int) -> None:
    text = json.dumps({"input": "hi", field: value(3)})
    # The deep value as JSON text, as a client sends it (json.dumps stops at Python's recursion limit).
    text = text.replace("[[[", "[" * depth, 1).replace("]]]", "]" * depth, 1)
    r = httpx.post(rig.url + "/v1/responses", content=text.encode(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] is not None and error["param"].startswith(where), error
    if depth == 100_000 or field != "input":
        # (An output nested that deep within the limit is refused by the
        # translation first: its parts must be objects.)
        assert error["message"].startswith(TOO_DEEP), error


def test_a_request_at_the_limit_is_served(rig: Rig) -> None:
    r = _post(rig, "/v1/chat/completions", {**AT_THE_LIMIT, "max_tokens": 5})
    assert r.status_code == 200, r.text


def test_an_engine_that_cannot_be_reached_is_told_without_its_address(caplog: pytest.LogCaptureFixture) -> None:
    """The engine's address and the HTTP client's own words (hosts, ports,
    paths of the network behind the gateway) stay in the log, under the id
    the client is given."""
    from tests.helpers.engines import closed_port, running
    from xtml.serving.gateway import create_app

    port = closed_port()
    caplog.set_level(logging.WARNING, logger="xtml.serve")
    with running(create_app(K3, vocab(), f"http://127.0.0.1:{port}", timeout=5)) as gw:
        for stream in (False, True):
            r = httpx.post(gw.url + "/v1/chat/completions", json={**REQUEST, "stream": stream}, timeout=30)
            text = r.text
            assert str(port) not in text and "127.0.0.1" not in text and "Connect" not in text, text
            assert "cannot reach the backend" in text, text
            ref = re.search(r"error id ([0-9a-f]{12})", text)
            assert ref is not None, text
            logged = [rec.getMessage() for rec in caplog.records if ref.group(1) in rec.getMessage()]
            assert logged and str(port) in logged[0], caplog.text
