"""The ``vllm.general_plugins`` entry point: registers the parsers named
``xtml`` with vLLM's parser managers.

vLLM calls every general plugin once in each of its processes (the API
server, the engine core, every worker), so :func:`register` is cheap and
safe to call again; the parsers' module, which imports vLLM, is registered
lazily and imported only when a parser is asked for. The template comes
from ``XTML_TEMPLATE`` (a built-in name or a template file; default
``kimi-k3``), read here so that a bad value stops vLLM at start-up with one
clear error rather than at the first request.

Whole answers: vLLM's server hands ``DelegatingParser.parse`` the generated
ids (``model_output_token_ids``), and vLLM 0.33 drops them there, handing
its reasoning and tool parsers the decoded text only. Within the vLLM range
of the ``vllm`` extra, and when ``parse`` still has the signature it was
written against, :func:`register` wraps it so that the ids reach the parsers
that take them (``set_model_output_token_ids``, the xtml ones), which then
read a whole answer on its ids as they read a stream. Anywhere else the
parsers read the text, and a warning says why.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from collections.abc import Callable, Sequence
from functools import cache, wraps
from importlib import metadata
from typing import Any

from ..errors import TemplateError
from ..template import LayoutTemplate, Template, load

__all__ = ["PARSE_SHAPE", "TEMPLATE_ENV", "VLLM_RANGE", "hook_problem", "register", "template"]

TEMPLATE_ENV = "XTML_TEMPLATE"
DEFAULT_TEMPLATE = "kimi-k3"

#: The vLLM versions the whole-answer hook was written for: the ``vllm``
#: extra's pin (``vllm>=0.33,<0.34``), as (major, minor) from and below.
VLLM_RANGE = ((0, 33), (0, 34))
#: ``DelegatingParser.parse``'s parameters, and their defaults, in that range.
PARSE_SHAPE = (("self", inspect.Parameter.empty), ("model_output", inspect.Parameter.empty),
               ("request", inspect.Parameter.empty), ("enable_auto_tools", False),
               ("model_output_token_ids", ()))
#: The method of a reasoning or tool parser that takes the generated ids.
TAKES_IDS = "set_model_output_token_ids"

log = logging.getLogger(__name__)

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
    # A layout template's answer opens its own reasoning block: its parsers
    # read it so (xtml.vllm.layout).
    layout = isinstance(template(), LayoutTemplate)
    module, kind = ("xtml.vllm.layout", "Layout") if layout else ("xtml.vllm.parsers", "")
    ToolParserManager.register_lazy_module("xtml", module, f"Xtml{kind}ToolParser")
    ReasoningParserManager.register_lazy_module("xtml", module, f"Xtml{kind}ReasoningParser")
    _hand_whole_answers_ids()
    _registered = True


def hook_problem(version: str, parse: Callable[..., Any]) -> str | None:
    """Why ``parse`` (vLLM's ``DelegatingParser.parse``, of vLLM ``version``)
    is not the one the whole-answer hook was written for, or None when it is."""
    m = re.match(r"(\d+)\.(\d+)", version)
    low, high = VLLM_RANGE
    if m is None or not low <= (int(m[1]), int(m[2])) < high:
        return (f"vLLM {version} is outside the range this hook was written for "
                f"(>={low[0]}.{low[1]},<{high[0]}.{high[1]}, the `vllm` extra's)")
    try:
        params = inspect.signature(parse).parameters.values()
    except (TypeError, ValueError):
        return "DelegatingParser.parse has no signature to check"
    shape = tuple((p.name, p.default) for p in params)
    if shape != PARSE_SHAPE:
        return (f"DelegatingParser.parse{inspect.signature(parse)} is not the signature this hook was written for "
                f"(self, model_output, request, enable_auto_tools=False, model_output_token_ids=())")
    return None


def _hand_whole_answers_ids() -> None:
    try:
        from vllm.parser.abstract_parser import DelegatingParser
    except ImportError as e:
        _text_path(f"vllm.parser.abstract_parser.DelegatingParser cannot be imported ({e})")
        return
    parse = DelegatingParser.parse
    if getattr(parse, "_xtml_hands_ids", False):
        return
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        version = "(unknown version)"
    why = hook_problem(version, parse)
    if why is not None:
        _text_path(why)
        return
    DelegatingParser.parse = _handing_ids(parse)


def _text_path(why: str) -> None:
    log.warning("xtml: whole answers are read from their decoded text, not their ids: %s. A marker the model "
                "spelled with ordinary tokens is then read as the marker (and reported); streamed answers are "
                "read on their ids.", why)


def _handing_ids(parse: Callable[..., Any]) -> Callable[..., Any]:
    """``DelegatingParser.parse``, handing the generated ids to the reasoning
    and tool parsers that take them before it reads the answer (what
    docs/vllm-delegating-parser-ids.patch does in vLLM itself)."""

    @wraps(parse)
    def parse_with_ids(self: Any, model_output: str, request: Any, enable_auto_tools: bool = False,
                       model_output_token_ids: Sequence[int] = ()) -> Any:
        takers = [getattr(p, TAKES_IDS) for p in (getattr(self, "_reasoning_parser", None),
                                                  getattr(self, "_tool_parser", None))
                  if callable(getattr(p, TAKES_IDS, None))]
        for take in takers:
            take(model_output_token_ids)
        try:
            return parse(self, model_output, request, enable_auto_tools, model_output_token_ids)
        finally:
            # The ids belong to this answer only.
            for take in takers:
                take(None)

    parse_with_ids._xtml_hands_ids = True  # type: ignore[attr-defined]
    return parse_with_ids
