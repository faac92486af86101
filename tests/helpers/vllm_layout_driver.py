"""Runs parsers inside vLLM itself over completions of a layout template
(``XTML_TEMPLATE`` names it): xtml's, and vLLM's own for the same family.

Run as tests/helpers/vllm_driver.py is (the vLLM venv's python, the
project's root on ``PYTHONPATH``, xtml's distribution metadata on
``sys.path``). Reads one JSON job on stdin, writes one JSON answer:

    job:    {"tokenizer": path of a tokenizer.json, "dist": folder of xtml's .dist-info,
             "stop": [the ids that stop generation],
             "pairs": [[tool parser name, reasoning parser name or null], ...],
             "cases": [{"prompt": ids, "completion": ids, "kwargs": chat_template_kwargs,
                        "groupings": [[size, ...], ...]}, ...],
             "grammar_cases": as tests/helpers/vllm_driver.py reads them, for the xtml parsers}
    answer: {"vllm": version, "registered": {"tool": [name, ...], "reasoning": [name, ...]},
             "classes": {pair: [tool parser class, reasoning parser class]},
             "results": {pair ("tool+reasoning"): [{"whole": message, "whole_reports": n,
                         "streams": [message, ...], "stream_reports": [n, ...],
                         "plain_whole": message, "plain_stream": message,
                         "reasoning_tokens": n, "ended_at_prompt": bool, "error": text,
                         "text_whole": message read from the text alone (where the plugin hooks parse)}, ...]},
             "grammars": as tests/helpers/vllm_driver.py writes them}

A message is {"reasoning", "content", "tool_calls": [[name, arguments], ...]}; a
report is a log record at warning level or above from xtml or vLLM while
the parser read the answer (a parser's way of saying it lost something).
"""

from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import version
from typing import Any

from tests.helpers.vllm_driver import _grammar, _stream, _text, _whole


class _Reports(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        REPORTS.append(f"{record.name}: {record.getMessage()}")


REPORTS: list[str] = []


def main(job: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, job["dist"])
    from transformers import PreTrainedTokenizerFast
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.plugins import load_general_plugins
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    load_general_plugins()
    for name in ("xtml", "vllm"):
        logging.getLogger(name).addHandler(_Reports(logging.WARNING))
    tok = PreTrainedTokenizerFast(tokenizer_file=job["tokenizer"])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    out: dict[str, Any] = {"vllm": version("vllm"), "results": {}, "classes": {},
                           "registered": {"tool": sorted(ToolParserManager.list_registered()),
                                          "reasoning": sorted(ReasoningParserManager.list_registered())}}
    for tool_name, reasoning_name in job["pairs"]:
        key = f"{tool_name}+{reasoning_name}"
        cls = ParserManager.get_parser(tool_parser_name=tool_name, reasoning_parser_name=reasoning_name,
                                       enable_auto_tools=True, tokenizer=tok)
        rows = []
        for case in job["cases"]:
            rows.append(_case(cls, tok, ChatCompletionRequest, tools, case, job["stop"]))
        probe = cls(tok, None, chat_template_kwargs={}, model_config=None)
        out["classes"][key] = [type(getattr(probe, "_tool_parser", None)).__name__,
                               type(getattr(probe, "_reasoning_parser", None)).__name__]
        out["results"][key] = rows
        if key == "xtml+xtml":
            out["grammars"] = [_grammar(cls, tok, g) for g in job.get("grammar_cases", ())]
    return out


def _case(cls: Any, tok: Any, request_cls: Any, tools: list[Any], case: dict[str, Any],
          stop: list[int], stop_text: bool = True) -> dict[str, Any]:
    """One case through a parser pair; without ``stop_text`` a stream's
    last delta leaves the stop token's text out, as vLLM's server does."""
    kwargs = case["kwargs"]
    quiet = () if stop_text else stop
    prompt, ids = case["prompt"], case["completion"]

    def request(with_tools: bool) -> Any:
        return request_cls(messages=[{"role": "user", "content": "x"}], model="m",
                           tools=tools if with_tools else None, chat_template_kwargs=kwargs)

    def parser(req: Any) -> Any:
        # As vLLM's server builds one per request (chat_completion/serving.py).
        p = cls(tok, req.tools, chat_template_kwargs=kwargs, model_config=None)
        p.set_prompt_token_ids(prompt)
        p.adjust_request(req)
        return p

    row: dict[str, Any] = {}
    try:
        text = _text(tok, ids, stop)
        req = request(True)
        p = parser(req)
        row["ended_at_prompt"] = p.is_reasoning_end(prompt)
        before = len(REPORTS)
        row["whole"] = _whole(p, text, ids, req)
        row["whole_reports"] = len(REPORTS) - before
        row["reasoning_tokens"] = p.count_reasoning_tokens(ids)
        # As a vLLM without the plugin's hook reads it: DelegatingParser.parse
        # as vLLM wrote it, which hands the parsers the text only.
        parse = getattr(type(p).parse, "__wrapped__", None)
        if parse is not None:
            reasoning, content, calls = parse(parser(req), text, req, True, ids)
            row["text_whole"] = {"reasoning": reasoning, "content": content,
                                 "tool_calls": [[c.name, c.arguments] for c in calls or ()]}
        plain = request(False)
        row["plain_whole"] = _whole(parser(plain), text, ids, plain)
        row["streams"], row["stream_reports"] = [], []
        for sizes in case["groupings"]:
            before = len(REPORTS)
            got, _ = _stream(parser(req), tok, ids, sizes, req, prompt, quiet)
            row["streams"].append(got)
            row["stream_reports"].append(len(REPORTS) - before)
        row["plain_stream"], _ = _stream(parser(plain), tok, ids, [3], plain, prompt, quiet)
    except Exception as e:  # a parser that raises is a result too
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    return row


if __name__ == "__main__":
    json.dump(main(json.load(sys.stdin)), sys.stdout)
