"""Runs vLLM's own chat-completions server code over scripted K3 answers,
with xtml's parsers (``--tool-call-parser xtml --reasoning-parser xtml``).

Run by the vLLM venv's python (tests/run makes it), with the project's root
on ``PYTHONPATH``, ``VLLM_PLUGINS=xtml`` and a folder holding xtml's
distribution metadata (its ``vllm.general_plugins`` entry point) on
``sys.path``, as tests/helpers/vllm_driver.py is run.

What is vLLM's: the ``ModelConfig`` and ``VllmConfig`` of a model folder
(a ``config.json`` and the tokenizer folder ``xtml export hf`` writes: no
weights), the renderer it makes of them (the exported Jinja chat template
renders the prompt), ``OpenAIServingModels``, ``OnlineRenderer``,
``OpenAIServingChat`` (``create_chat_completion``, whole and streamed), and
the front end of its engine: the ``InputProcessor`` that turns the rendered
prompt and sampling parameters into an engine request, and the
``OutputProcessor`` that detokenizes each step's ids and makes the
``RequestOutput`` the server reads. What is scripted is the engine core
alone (the model and its scheduler): it generates the answer's ids, one a
step, and stops as vLLM's scheduler stops (``check_stop``): at the end of
sequence id, at a stop id, at ``max_tokens``.

    job:    {"model": folder, "dist": folder of xtml's .dist-info,
             "cases": [{"request": ChatCompletionRequest fields, "answer": ids}, ...]}
    answer: {"vllm": version, "hands_ids": whether DelegatingParser.parse hands parsers the ids,
             "results": [{"prompt": ids the engine got, "whole": ChatCompletionResponse as JSON,
             "sse": [each string the streamed response yields, ...], "whole_warnings": n,
             "steps": ids generated}, ...]}
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncGenerator
from importlib.metadata import version
from typing import Any


class _Warnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        WARNINGS.append(record.getMessage())


WARNINGS: list[str] = []


class ScriptedEngine:
    """An ``EngineClient`` whose engine core is a script: vLLM's own input
    and output processing around ids chosen in advance."""

    errored = False
    dead_error = RuntimeError("the scripted engine does not die")

    def __init__(self, vllm_config: Any, renderer: Any) -> None:
        from vllm.v1.engine.input_processor import InputProcessor
        from vllm.v1.engine.output_processor import OutputProcessor

        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer
        self.input_processor = InputProcessor(vllm_config, renderer)
        self.output_processor = OutputProcessor(renderer.tokenizer, log_stats=False)
        self.answer: list[int] = []
        self.prompts: list[list[int]] = []
        self.generated: list[list[int]] = []

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        pass

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, *,
                       reasoning_ended: bool | None = None, reasoning_parser_kwargs: dict[str, Any] | None = None,
                       **_: Any) -> AsyncGenerator[Any, None]:
        # As AsyncLLM.add_request and AsyncLLM.generate do.
        from vllm.renderers.inputs.preprocess import extract_prompt_components
        from vllm.v1.engine import EngineCoreOutput, FinishReason
        from vllm.v1.engine.output_processor import RequestOutputCollector

        request = self.input_processor.process_inputs(request_id, prompt, sampling_params,
                                                      supported_tasks=("generate",))
        prompt_text, _, _ = extract_prompt_components(self.model_config, prompt)
        request.reasoning_ended = reasoning_ended
        request.reasoning_parser_kwargs = reasoning_parser_kwargs
        self.input_processor.assign_request_id(request)
        queue = RequestOutputCollector(request.sampling_params.output_kind, request.request_id)
        self.output_processor.add_request(request, prompt_text, None, 0, queue)
        self.prompts.append(list(request.prompt_token_ids or ()))
        params = request.sampling_params
        generated: list[int] = []
        self.generated.append(generated)
        for token in self.answer:
            generated.append(token)
            finish, stop_reason = None, None
            if token == params.eos_token_id:
                finish = FinishReason.STOP
            elif token in (params.stop_token_ids or ()):
                finish, stop_reason = FinishReason.STOP, token
            elif len(generated) >= params.max_tokens:
                finish = FinishReason.LENGTH
            self.output_processor.process_outputs([EngineCoreOutput(
                request_id=request.request_id, new_token_ids=[token], finish_reason=finish,
                stop_reason=stop_reason)])
            out = queue.get_nowait()
            if out is not None:
                yield out
            if finish is not None:
                return
        raise AssertionError("the script ran out before the engine stopped")


def main(job: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, job["dist"])
    logging.getLogger("xtml.vllm").addHandler(_Warnings(logging.WARNING))
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.models.serving import BaseModelPath, OpenAIServingModels
    from vllm.plugins import load_general_plugins
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.renderers.registry import renderer_from_config

    # As vLLM's server does at start-up.
    load_general_plugins()
    model_config = ModelConfig(model=job["model"], tokenizer=job["model"], dtype="float32", max_model_len=8192)
    # The CPU named: this vLLM wheel infers no device without a GPU.
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    renderer = renderer_from_config(vllm_config)
    engine = ScriptedEngine(vllm_config, renderer)
    models = OpenAIServingModels(engine, [BaseModelPath(name="kimi-k3", model_path=job["model"])])
    parsers = {"tool_parser": "xtml", "reasoning_parser": "xtml", "enable_auto_tools": True}
    online = OnlineRenderer(model_config, renderer, request_logger=None, chat_template=None,
                            chat_template_content_format="auto", **parsers)
    serving = OpenAIServingChat(engine, models, "assistant", online_renderer=online, request_logger=None,
                                chat_template=None, chat_template_content_format="auto", **parsers)

    async def run(case: dict[str, Any]) -> dict[str, Any]:
        engine.answer = case["answer"]
        out: dict[str, Any] = {}
        warned = len(WARNINGS)
        whole = await serving.create_chat_completion(ChatCompletionRequest(**case["request"]))
        out["whole"] = json.loads(whole.model_dump_json())
        out["whole_warnings"] = len(WARNINGS) - warned
        out["prompt"], out["steps"] = engine.prompts[-1], engine.generated[-1]
        stream = await serving.create_chat_completion(ChatCompletionRequest(**case["request"], stream=True))
        if hasattr(stream, "model_dump_json"):  # an error before the stream started
            out["sse"] = [f"data: {stream.model_dump_json()}\n\n"]
        else:
            out["sse"] = [s async for s in stream]
        return out

    async def run_all() -> list[dict[str, Any]]:
        return [await run(case) for case in job["cases"]]

    from vllm.parser.abstract_parser import DelegatingParser

    return {"vllm": version("vllm"), "hands_ids": getattr(DelegatingParser.parse, "_xtml_hands_ids", False),
            "results": asyncio.run(run_all())}


if __name__ == "__main__":
    json.dump(main(json.load(sys.stdin)), sys.stdout)
