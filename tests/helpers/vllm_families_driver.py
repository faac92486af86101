"""Runs parsers inside vLLM itself over completions of several layout
templates in one process (vLLM's import is slow): for each, xtml's parsers
with ``XTML_TEMPLATE`` set to it, and vLLM's own for the same family.

Run as tests/helpers/vllm_layout_driver.py is. Reads one JSON job on stdin,
writes one JSON answer:

    job:    {"dist": folder of xtml's .dist-info,
             "families": [{"template": name, "source": what XTML_TEMPLATE names (optional: the name),
                           "tokenizer": path of a tokenizer.json,
                           "stop": [the ids that stop generation],
                           "pairs": [[tool parser name, reasoning parser name or null], ...],
                           "harmony": vLLM's own pair is composed as for a harmony model (optional),
                           "cases": as tests/helpers/vllm_layout_driver.py reads them, each with
                                    "tools" (optional: the request's, else get_weather's)}, ...]}
    answer: {"vllm": version, "registered": {"tool": [...], "reasoning": [...]},
             "families": {name: {"classes": {pair: [tool class, reasoning class]},
                                 "templates": {pair: the template xtml's parsers read},
                                 "results": {pair: [row, ...]}}}}

A row is what tests/helpers/vllm_layout_driver.py writes for a case, its
streams' last delta without the stop token's text, as vLLM's server (its
detokenizer) leaves it out.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib.metadata import version
from typing import Any

from tests.helpers.vllm_layout_driver import _case, _Reports


def main(job: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, job["dist"])
    from transformers import PreTrainedTokenizerFast
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.plugins import load_general_plugins
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    os.environ["XTML_TEMPLATE"] = job["families"][0].get("source", job["families"][0]["template"])
    load_general_plugins()
    from xtml.vllm import plugin

    for name in ("xtml", "vllm"):
        logging.getLogger(name).addHandler(_Reports(logging.WARNING))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    out: dict[str, Any] = {"vllm": version("vllm"), "families": {},
                           "registered": {"tool": sorted(ToolParserManager.list_registered()),
                                          "reasoning": sorted(ReasoningParserManager.list_registered())}}
    for fam in job["families"]:
        # The plugin reads XTML_TEMPLATE once a process; each family here
        # is read as a process started with it would read it.
        os.environ["XTML_TEMPLATE"] = fam.get("source", fam["template"])
        plugin.template.cache_clear()
        tok = PreTrainedTokenizerFast(tokenizer_file=fam["tokenizer"])
        got: dict[str, Any] = {"classes": {}, "templates": {}, "results": {}}
        for tool_name, reasoning_name in fam["pairs"]:
            key = f"{tool_name}+{reasoning_name}"
            # vLLM's server composes HarmonyParser for a gpt-oss model
            # whatever parsers are named; xtml's plugin is named as for any.
            harmony = bool(fam.get("harmony")) and tool_name != "xtml"
            cls = ParserManager.get_parser(tool_parser_name=tool_name, reasoning_parser_name=reasoning_name,
                                           enable_auto_tools=True, tokenizer=tok, is_harmony=harmony)
            got["results"][key] = [_case(cls, tok, ChatCompletionRequest, case.get("tools", tools), case,
                                         fam["stop"], stop_text=False) for case in fam["cases"]]
            try:
                probe = cls(tok, None, chat_template_kwargs={}, model_config=None)
                got["classes"][key] = [type(getattr(probe, "_tool_parser", None)).__name__,
                                       type(getattr(probe, "_reasoning_parser", None)).__name__]
            except Exception as e:  # a parser that cannot be made is a result too
                got["classes"][key] = [f"{type(e).__name__}: {e}"[:200]]
            got["templates"][key] = plugin.template().name
        out["families"][fam["template"]] = got
    return out


if __name__ == "__main__":
    json.dump(main(json.load(sys.stdin)), sys.stdout)
