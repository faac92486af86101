"""Runs xtml's vLLM parsers inside vLLM itself.

Run by the vLLM venv's python (tests/run makes it), with the project's root
on ``PYTHONPATH`` and a folder holding xtml's distribution metadata (its
``vllm.general_plugins`` entry point, as installed) on ``sys.path``, so that
vLLM finds the plugin the way it finds an installed one. Reads one JSON job
on stdin, writes one JSON answer on stdout:

    job:    {"tokenizer": path of a tokenizer.json, "dist": folder of xtml's .dist-info,
             "stop": [the ids that stop generation],
             "cases": [{"prompt": ids, "completion": ids, "thinking": bool,
                        "groupings": [[size, ...], ...]}, ...]}
    job (optional): "builtin": true, to run the cases through vLLM's kimi_k3 parsers too ("builtin" in the
    answer: per case "whole"/"stream" messages, or "whole_error"/"stream_error");
                    "vllm_as": "other-version" or "other-signature", to load the plugin in a vLLM
                    made to look like one the whole-answer hook was not written for; "patched", to
                    load it in a vLLM of another version whose DelegatingParser.parse is the one
                    "patch" (a unified diff of vllm/parser/abstract_parser.py) makes;
                    "whole_only": true, to read the cases whole only ("streams" are then empty);
                    "reasoning_steps": [{"prompt": ids, "completion": ids}, ...], each fed one id a
                    step ("reasoning_steps" in the answer: per case the "reasoning" delta of each
                    step, and "decoded": how many ids xtml's vocabulary decoded over them all);
                    "grammar_cases": [{"request": ChatCompletionRequest fields, "stop": [id, ...],
                                       "answers": [ids after the reasoning, ...]}, ...]
    answer: {"vllm": version, "registered": {...}, "plugin_warnings": [warning, ...],
             "hands_ids": whether DelegatingParser.parse hands parsers the ids, "grammars": [{"structural_tag": bool,
             "results": [{"taken": n, "terminated": bool}, ...]}, ...],
             "results": [{"whole": message, "streams": [message, ...],
             "announced": [[index, ...], ...], "whole_ambiguous_at": token offset or None,
             "whole_warnings": n, "plain_whole": message, "plain_stream": message
             (a request without tools), "ended_at_prompt": bool, "ended_at_completion": bool,
             "keeps_special_tokens": bool}, ...]}

A message is {"reasoning", "content", "tool_calls": [[name, arguments], ...]}.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from importlib.metadata import version
from typing import Any


class _Warnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        WARNINGS.append(record.getMessage())


WARNINGS: list[str] = []


def main(job: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, job["dist"])
    logging.getLogger("xtml.vllm").addHandler(_Warnings(logging.WARNING))
    from transformers import PreTrainedTokenizerFast
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.parser.abstract_parser import DelegatingParser
    from vllm.plugins import load_general_plugins
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    _look_like(job.get("vllm_as"), DelegatingParser, job.get("patch"))
    # As each vLLM process does; twice, as several do in one.
    load_general_plugins()
    load_general_plugins()
    registered = {"tool": "xtml" in ToolParserManager.list_registered(),
                  "reasoning": "xtml" in ReasoningParserManager.list_registered()}
    plugin_warnings = list(WARNINGS)
    tok = PreTrainedTokenizerFast(tokenizer_file=job["tokenizer"])
    parser_cls = ParserManager.get_parser(tool_parser_name="xtml", reasoning_parser_name="xtml",
                                          enable_auto_tools=True, tokenizer=tok)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    results = []
    for case in job["cases"]:
        kwargs = {"thinking": case["thinking"]}
        request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m", tools=tools,
                                        chat_template_kwargs=kwargs)

        def parser(req: Any, kw: dict[str, Any] = kwargs, prompt: list[int] = case["prompt"]) -> Any:
            # As vLLM's server builds one per request (chat_completion/serving.py).
            p = parser_cls(tok, req.tools, chat_template_kwargs=kw, model_config=None)
            p.set_prompt_token_ids(prompt)
            p.adjust_request(req)
            return p

        ids = case["completion"]
        text = _text(tok, ids, job.get("stop", ()))
        p = parser(request)
        warned = len(WARNINGS)
        whole = _whole(p, text, ids, request)
        ambiguous_at, warnings = p.reasoning_parser.ambiguous_at, len(WARNINGS) - warned
        # A request without tools: tool_choice is "none" (vLLM's default).
        plain = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m",
                                      chat_template_kwargs=kwargs)
        plain_whole = _whole(parser(plain), text, ids, plain)
        streams, announced = [], []
        runs = [] if job.get("whole_only") else [*((g, request) for g in case["groupings"]), ([3], plain)]
        for sizes, req in runs:
            got, seen = _stream(parser(req), tok, ids, sizes, req, case["prompt"])
            streams.append(got)
            announced.append(seen)
        p = parser(request)
        results.append({"whole": whole, "whole_ambiguous_at": ambiguous_at, "whole_warnings": warnings,
                        "streams": streams[:-1], "announced": announced[:-1],
                        "plain_whole": plain_whole, "plain_stream": streams[-1] if streams else None,
                        "ended_at_prompt": p.is_reasoning_end(case["prompt"]),
                        "ended_at_completion": p.is_reasoning_end([*case["prompt"], *ids]),
                        "keeps_special_tokens": request.skip_special_tokens is False
                        and request.spaces_between_special_tokens is False})
    builtin = [_builtin(ParserManager, ChatCompletionRequest, tok, tools, case, job.get("stop", ()))
               for case in job["cases"]] \
        if job.get("builtin") else []
    steps = [_reasoning_steps(parser_cls, tok, case) for case in job.get("reasoning_steps", ())]
    return {"vllm": version("vllm"), "registered": registered, "plugin_warnings": plugin_warnings,
            "hands_ids": getattr(DelegatingParser.parse, "_xtml_hands_ids", False), "results": results,
            "builtin": builtin, "reasoning_steps": steps,
            "grammars": [_grammar(parser_cls, tok, g) for g in job.get("grammar_cases", ())]}


def _look_like(what: str | None, delegating: Any, patch: str | None) -> None:
    """Make this vLLM look like one the whole-answer hook was not written
    for: another version, or a DelegatingParser.parse of another signature;
    or another version with the patch applied to its DelegatingParser.parse."""
    if what == "patched":
        delegating.parse = _patched(patch or "").DelegatingParser.parse
        what = "other-version"
    if what == "other-version":
        import importlib.metadata

        real = importlib.metadata.version
        importlib.metadata.version = lambda name: "0.34.0" if name == "vllm" else real(name)  # type: ignore[assignment]
    elif what == "other-signature":
        parse = delegating.parse

        def changed(self: Any, model_output: str, request: Any, enable_auto_tools: bool = False,
                    model_output_token_ids: Any = (), **more: Any) -> Any:
            return parse(self, model_output, request, enable_auto_tools, model_output_token_ids)

        delegating.parse = changed
    elif what is not None:
        raise ValueError(what)


def _patched(patch: str) -> Any:
    """vllm/parser/abstract_parser.py with the patch's one hunk applied, as
    a module of its own."""
    import types

    import vllm.parser.abstract_parser as original

    body = patch[patch.index("\n@@"):].split("\n")[2:]
    old = [line[1:] for line in body if line[:1] in (" ", "-")]
    new = [line[1:] for line in body if line[:1] in (" ", "+")]
    with open(original.__file__, encoding="utf-8") as f:
        source = f.read()
    old_text, new_text = "\n".join(old) + "\n", "\n".join(new) + "\n"
    if source.count(old_text) != 1:
        raise ValueError("the patch does not apply to this vLLM")
    module = types.ModuleType("vllm.parser.abstract_parser")
    module.__file__ = original.__file__
    exec(compile(source.replace(old_text, new_text), original.__file__, "exec"), module.__dict__)
    return module


def _reasoning_steps(parser_cls: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    """A completion fed one id a step through vLLM's composed parser, as the
    server streams it: the reasoning delta of each step, and how many ids
    xtml's vocabulary decoded over the whole stream."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from xtml.vocab.vocabulary import Vocabulary

    decoded = 0
    decode = Vocabulary.decode

    def counted(self: Vocabulary, ids: Any) -> str:
        nonlocal decoded
        decoded += len(ids)
        return decode(self, ids)

    kwargs = {"thinking": True}
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m",
                                    chat_template_kwargs=kwargs)
    p = parser_cls(tok, None, chat_template_kwargs=kwargs, model_config=None)
    p.set_prompt_token_ids(case["prompt"])
    p.adjust_request(request)
    ids = case["completion"]
    reasoning = []
    Vocabulary.decode = counted  # type: ignore[method-assign]
    try:
        for k, t in enumerate(ids):
            d = p.parse_delta(tok.decode([t], skip_special_tokens=False), [t], request,
                              prompt_token_ids=case["prompt"], finished=k == len(ids) - 1)
            reasoning.append((d.reasoning or "") if d is not None else "")
    finally:
        Vocabulary.decode = decode  # type: ignore[method-assign]
    return {"reasoning": reasoning, "decoded": decoded}


def _builtin(manager: Any, request_cls: Any, tok: Any, tools: list[Any], case: dict[str, Any],
             stop: Any) -> dict[str, Any]:
    """The same answer through vLLM's own K3 parsers (``kimi_k3``), whole and
    one id a delta, for the record: errors are results too."""
    cls = manager.get_parser(tool_parser_name="kimi_k3", reasoning_parser_name="kimi_k3", enable_auto_tools=True,
                             tokenizer=tok)
    kwargs = {"thinking": case["thinking"]}
    request = request_cls(messages=[{"role": "user", "content": "x"}], model="m", tools=tools,
                          chat_template_kwargs=kwargs)
    ids = case["completion"]

    def parser() -> Any:
        p = cls(tok, request.tools, chat_template_kwargs=kwargs, model_config=None)
        p.set_prompt_token_ids(case["prompt"])
        p.adjust_request(request)
        return p

    out: dict[str, Any] = {}
    try:
        out["whole"] = _whole(parser(), _text(tok, ids, stop), ids, request)
    except Exception as e:
        out["whole_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        got, _ = _stream(parser(), tok, ids, [1], request, case["prompt"])
        out["stream"] = got
    except Exception as e:
        out["stream_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def _grammar(parser_cls: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    """What the parser hands vLLM's structured outputs for a request, and
    what xgrammar (vLLM's backend) makes of the answers after the reasoning."""
    import xgrammar as xgr
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m", **case["request"])
    p = parser_cls(tok, request.tools, chat_template_kwargs=case["request"].get("chat_template_kwargs"),
                   model_config=None)
    p.adjust_request(request)
    so = request.structured_outputs
    tag = so.structural_tag if so is not None else None
    if tag is None:
        return {"structural_tag": False, "results": []}
    info = xgr.TokenizerInfo.from_huggingface(tok, stop_token_ids=case["stop"])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_structural_tag(tag)
    results = []
    for ids in case["answers"]:
        m = xgr.GrammarMatcher(compiled)
        taken = 0
        for i in ids:
            if m.is_terminated() or not m.accept_token(i):
                break
            taken += 1
        results.append({"taken": taken, "terminated": m.is_terminated()})
    return {"structural_tag": True, "results": results}


def _stream(p: Any, tok: Any, ids: list[int], sizes: list[int], request: Any,
            prompt: list[int], stop: Any = ()) -> tuple[dict[str, Any], list[int]]:
    """The deltas of ``ids`` fed ``sizes`` at a time (cycling), joined, and
    the indexes of the calls as they were announced. A last id in ``stop``
    adds no text to its delta, as vLLM's detokenizer leaves a stop token's
    text out."""
    got: dict[str, Any] = {"reasoning": "", "content": "", "tool_calls": {}}
    seen: list[int] = []
    pos = 0
    for size in itertools.cycle(sizes):
        if pos >= len(ids):
            break
        delta = ids[pos:pos + size]
        pos += len(delta)
        shown = delta[:-1] if pos >= len(ids) and delta[-1] in stop else delta
        d = p.parse_delta(tok.decode(shown, skip_special_tokens=False), delta, request, prompt_token_ids=prompt,
                          finished=pos >= len(ids))
        if d is None:
            continue
        got["reasoning"] += d.reasoning or ""
        got["content"] += d.content or ""
        for tc in d.tool_calls or ():
            entry = got["tool_calls"].setdefault(tc.index, ["", ""])
            if tc.function is not None:
                entry[0] += tc.function.name or ""
                entry[1] += tc.function.arguments or ""
                if tc.function.name:
                    seen.append(tc.index)
    got["tool_calls"] = [got["tool_calls"][k] for k in sorted(got["tool_calls"])]
    return got, seen


def _text(tok: Any, ids: list[int], stop: Any) -> str:
    """The answer's text as vLLM's server hands it to a whole answer's
    parser: special tokens kept, the stop token's own text left out."""
    if ids and ids[-1] in stop:
        ids = ids[:-1]
    return str(tok.decode(ids, skip_special_tokens=False))


def _whole(p: Any, text: str, ids: list[int], request: Any) -> dict[str, Any]:
    """A whole answer, as vLLM's chat server reads it
    (chat_completion/serving.py): ``parse``, then ``count_reasoning_tokens``
    on the generated ids."""
    reasoning, content, calls = p.parse(text, request, enable_auto_tools=True, model_output_token_ids=ids)
    p.count_reasoning_tokens(ids)
    return {"reasoning": reasoning, "content": content, "tool_calls": [[c.name, c.arguments] for c in calls or ()]}


if __name__ == "__main__":
    json.dump(main(json.load(sys.stdin)), sys.stdout)
