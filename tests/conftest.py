"""Shared fixtures and hypothesis profiles.

Profiles: ``ci`` (default; sized for CI) and ``fuzz`` (long runs):
``HYPOTHESIS_PROFILE=fuzz pytest``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import xtml
from tests.helpers.tokenizers import k3_vocab, tiny_tokenizer_json

settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile(
    "fuzz", max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def k3() -> xtml.Template:
    return xtml.load("kimi-k3")


@pytest.fixture(scope="session")
def vocab() -> xtml.Vocabulary:
    return k3_vocab()


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_tokenizer_json(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module", params=("vllm", "sglang", "llamacpp"))
def rig(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A stand-in engine of each kind and a gateway in front of it
    (:class:`tests.helpers.serve.Rig`), shared by a module's tests."""
    from tests.helpers.serve import Rig

    r = Rig(request.param)
    yield r
    r.close()


@pytest.fixture(autouse=True)
def _fresh(request: pytest.FixtureRequest) -> None:
    # A rig is shared by a module: each test starts with the engine's
    # records and behaviours cleared.
    if "rig" in request.fixturenames:
        request.getfixturevalue("rig").engine.reset()


@pytest.fixture(autouse=True)
def _plugin_registry() -> Iterator[None]:
    # Plugins given to xtml.plugins.use() are process-wide: each test starts
    # with the registry as the one before it found it, so that no test's
    # outcome depends on which ran first.
    import xtml.plugins

    registry = xtml.plugins._explicit
    saved = dict(registry)
    yield
    registry.clear()
    registry.update(saved)
