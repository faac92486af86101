"""What the edges take from the facade and share with each other.

* ``Template.encode_request`` names a ``tool_choice`` that names a function
  (the options read it as ``auto``): the gateway decides on the grammar from
  it, reading no request field itself.
* The playground reads a request body with the gateway's own plumbing
  (``xtml.serving.asgi``): the same body is refused alike by both, with the
  same status and message.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.helpers.serve import K3
from tests.helpers.tokenizers import k3_vocab as vocab
from xtml.playground.app import create_app as playground_app
from xtml.serving.gateway import create_app as gateway_app

USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
NAMED = {"type": "function", "function": {"name": "search"}}


@pytest.mark.parametrize("request_, options, named", [
    ({"messages": [USER], "tools": [TOOL], "tool_choice": NAMED}, {}, NAMED),
    ({"messages": [USER], "tools": [TOOL], "chat_template_kwargs": {"tool_choice": NAMED}}, {}, NAMED),
    ({"messages": [USER], "tools": [TOOL], "extra_body": {"tool_choice": NAMED}}, {}, NAMED),
    ({"messages": [USER], "tools": [TOOL]}, {"tool_choice": NAMED}, NAMED),
    ({"messages": [USER], "tools": [TOOL], "tool_choice": NAMED}, {"tool_choice": "auto"}, None),
    ({"messages": [USER], "tools": [TOOL], "tool_choice": "auto"}, {}, None),
    ({"messages": [USER], "tools": [TOOL], "tool_choice": "required"}, {}, None),
    ({"messages": [USER]}, {}, None),
    ([USER], {}, None),
])
def test_encode_request_names_the_function_a_tool_choice_names(request_: Any, options: dict[str, Any],
                                                               named: Any) -> None:
    encoded = K3.encode_request(request_, vocab(), unknown_keys="ignore", **options)
    assert encoded.tool_named == named
    assert encoded.ids == K3.encode(request_, vocab(), unknown_keys="ignore", **options)


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[TestClient, TestClient]]:
    gateway = gateway_app(K3, vocab(), "http://127.0.0.1:9")
    playground = playground_app(vocab(), host="127.0.0.1")
    with TestClient(gateway, base_url="http://127.0.0.1") as g, \
            TestClient(playground, base_url="http://127.0.0.1") as p:
        yield g, p


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("raw, headers, status", [
    (b"\xff{}", JSON, 400),
    (b"{", JSON, 400),
    (b"[1, 2]", JSON, 400),
    (b"[" * 100_000, JSON, 400),
    (b'{"messages": []}', {"content-type": "application/json; charset=latin-1"}, 415),
    (b'{"messages": []}', {"content-type": "text/plain"}, 415),
], ids=["not-utf8", "not-json", "array", "too-deep", "charset", "text"])
def test_the_playground_and_the_gateway_refuse_a_body_alike(clients: tuple[TestClient, TestClient], raw: bytes,
                                                            headers: dict[str, str], status: int) -> None:
    g, p = clients
    by_gateway = g.post("/v1/chat/completions", content=raw, headers=headers)
    by_playground = p.post("/api/render", content=raw, headers=headers)
    assert by_gateway.status_code == by_playground.status_code == status
    assert by_gateway.json()["error"]["message"] == by_playground.json()["error"]["message"]
