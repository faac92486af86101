"""The ``vllm.general_plugins`` entry point: registers the parsers named
``xtml`` with vLLM's parser managers.

vLLM calls every general plugin once in each of its processes (the API
server, the engine core, every worker), so :func:`register` is cheap and
safe to call again; the parsers' module, which imports vLLM, is registered
lazily and imported only when a parser is asked for. The template comes
from ``XTML_TEMPLATE`` (a built-in name or a template file; default
``kimi-k3``), read here so that a bad value stops vLLM at start-up with one
clear error rather than at the first request.
"""

from __future__ import annotations

import os
from functools import cache

from ..errors import TemplateError
from ..template import Template, load

__all__ = ["TEMPLATE_ENV", "register", "template"]

TEMPLATE_ENV = "XTML_TEMPLATE"
DEFAULT_TEMPLATE = "kimi-k3"

_registered = False


@cache
def template() -> Template:
    """The template ``XTML_TEMPLATE`` names (read once per process)."""
    name = os.environ.get(TEMPLATE_ENV) or DEFAULT_TEMPLATE
    try:
        return load(name)
    except TemplateError as e:
        raise TemplateError(f"{TEMPLATE_ENV}={name!r}: {e.msg}", location=e.location) from None


def register() -> None:
    """Register the ``xtml`` tool parser and reasoning parser with vLLM
    (nothing when vLLM is not installed; once per process)."""
    global _registered
    if _registered:
        return
    try:
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        return
    template()
    ToolParserManager.register_lazy_module("xtml", "xtml.vllm.parsers", "XtmlToolParser")
    ReasoningParserManager.register_lazy_module("xtml", "xtml.vllm.parsers", "XtmlReasoningParser")
    _registered = True
