"""A chat template rendered by three real Jinja engines, for tests that check
that a template gives byte for byte the text xtml renders.

``render_all(engine, template, requests)`` renders each request, in one
batch, with one of :data:`ENGINES`:

* ``transformers``: Python's jinja2 as transformers' ``apply_chat_template``
  runs it (the test venv's transformers, a ``PreTrainedTokenizerFast`` over
  a one-token vocabulary);
* ``hfjs``: Hugging Face's JavaScript engine ``@huggingface/jinja``, as
  transformers.js calls it (tests/helpers/hfjinja_driver.mjs, one node
  process per batch; tests/run installs the package into the folder named by
  ``XTML_HFJINJA``);
* ``llamacpp``: llama.cpp's own engine, through ``llama-server --jinja
  --chat-template-file`` and its ``POST /apply-template`` (one server per
  batch, on a tiny model; tests/run builds the binary, ``XTML_LLAMA_SERVER``).

A request is ``{"messages": [...], "tools": [...] (optional),
"add_generation_prompt": bool, **kwargs}``, the kwargs extra template
variables. Every engine gets ``bos_token`` and ``eos_token`` as ``""``
unless the request names them. What each engine does to the inputs before
the template sees them is written down beside its code below: the engines do
not agree, and a template that is to render the same in all of them must
not depend on what they change.

:func:`need_engine` skips a test when an engine is not set up (and fails it
under ``CI=true``), as :func:`tests.helpers.need.need` does for tools.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.need import need

ENGINES = ("transformers", "hfjs", "llamacpp")

DRIVER = Path(__file__).with_name("hfjinja_driver.mjs")
HFJINJA_PACKAGE = Path("node_modules", "@huggingface", "jinja", "package.json")
HFJINJA_HOW = "tests/run (installs it once), or set XTML_HFJINJA to a folder holding node_modules/@huggingface/jinja"
LLAMA_HOW = "tests/run (builds it once), or set XTML_LLAMA_SERVER"

BATCH_TIMEOUT_S = 300.0
STARTUP_S = 60.0
STOP_S = 10.0
CTX = 512

# The variables every engine gets unless a request names them.
SPECIALS = {"bos_token": "", "eos_token": ""}


@dataclass(frozen=True)
class Rendered:
    text: str | None  # the rendered text, or None when the template raised
    error: str | None  # the engine's error message (raise_exception's where the engine passes it), else None


def render_all(engine: str, template: str, requests: list[dict[str, Any]], *,
               chat_parsing: bool = True) -> list[Rendered]:
    """Each request is ``{"messages": [...], "tools": [...] or absent,
    "add_generation_prompt": bool, **kwargs}``, the kwargs extra template
    variables (e.g. ``thinking=False``, ``tool_choice="required"``). Renders
    each with the named engine, in one batch (one node process / one
    llama-server for the whole list).

    ``chat_parsing=False`` starts llama-server with ``--skip-chat-parsing``:
    without it, llama.cpp builds an output parser from every template at
    start-up (a hand-written one for the formats it recognises by their
    markers, else one it derives by rendering probe conversations) and
    answers every request with a 400 when it cannot (common/chat.cpp)."""
    if engine == "transformers":
        return _transformers(template, requests)
    if engine == "hfjs":
        return _hfjs(template, requests)
    if engine == "llamacpp":
        return _llamacpp(template, requests, chat_parsing)
    raise ValueError(f"no engine {engine!r}; the engines: {', '.join(ENGINES)}")


def need_engine(engine: str) -> None:
    """Skip the calling test when ``engine`` is not set up (fail it under
    ``CI=true``, where tests/run has set every engine up)."""
    if engine == "transformers":
        if importlib.util.find_spec("transformers") is None:
            _missing("transformers is not installed in this interpreter; it is in the test extra: "
                     "pip install -e '.[test]' (tests/run does)")
    elif engine == "hfjs":
        _hfjinja()
    elif engine == "llamacpp":
        need("llama-server", LLAMA_HOW, env="XTML_LLAMA_SERVER")
    else:
        raise ValueError(f"no engine {engine!r}; the engines: {', '.join(ENGINES)}")


def _missing(message: str) -> None:
    # As tests.helpers.need.need: skip, or fail under CI=true.
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (with CI=true a missing tool is an error)", pytrace=False)
    pytest.skip(message)


def _split(request: dict[str, Any]) -> tuple[list[Any], list[Any] | None, bool, dict[str, Any]]:
    """(messages, tools or None, add_generation_prompt, the other variables
    with bos_token and eos_token "" unless the request names them)."""
    rest = dict(request)
    messages = rest.pop("messages")
    tools = rest.pop("tools", None)
    add = bool(rest.pop("add_generation_prompt", False))
    return messages, tools, add, {**SPECIALS, **rest}


# -- transformers -------------------------------------------------------------------------------
#
# What transformers (5.x) does before the template, read in its source:
#
# * tokenization_utils_base.py, apply_chat_template: the messages go through
#   _normalize_chat_messages (utils/chat_template_utils.py), which turns
#   message objects into dicts and drops each message's top-level keys whose
#   value is None ("Some APIs (e.g. OpenAI) return `content=None` or
#   `tool_calls=None` ..."); a None deeper in (in a tool call, in a tool) is
#   kept. The variables are `{**self.special_tokens_map, **kwargs}`: the
#   tokenizer's special tokens, then the caller's (this tokenizer has none;
#   bos_token and eos_token come from SPECIALS). A variable named as one of
#   apply_chat_template's own parameters (documents, continue_final_message,
#   tokenize, padding ...) is taken by it and never reaches the template.
# * chat_template_utils.py, render_jinja_template: tools given as dicts are
#   passed as they are (callables become schemas with get_json_schema);
#   `tools` and `documents` are None when not given, so both are always
#   defined; add_generation_prompt is always a bool. Everything goes through
#   _plain_template_data, which rebuilds it from plain JSON types (subclasses
#   of str/int/float stripped, key order kept, anything else a "<TypeName>"
#   string). _alias_reasoning_fields: a message whose reasoning is under
#   reasoning_content, thinking or reasoning (the first not None, in that
#   order) gets `reasoning_content` set to it, and `thinking` set to it unless
#   it has a `thinking` of its own (a new `thinking` key comes first in the
#   message's key order). Tool-call arguments are not touched: a JSON string
#   stays a string.
# * _cached_compile_jinja_template: ImmutableSandboxedEnvironment with
#   trim_blocks and lstrip_blocks and the loopcontrols extension; `tojson` is
#   json.dumps(ensure_ascii=False, sort_keys=False) (keys in their order, not
#   sorted as jinja2's own filter sorts them, and no HTML escaping);
#   `raise_exception(message)` raises jinja2.exceptions.TemplateError(message),
#   which apply_chat_template lets through: its str() is the message.

@cache
def _hf_tokenizer() -> Any:
    """A PreTrainedTokenizerFast over a one-token vocabulary: all
    apply_chat_template needs when it does not tokenize."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    assert not tok.special_tokens_map, tok.special_tokens_map  # no variables but the caller's
    return tok


def _transformers(template: str, requests: list[dict[str, Any]]) -> list[Rendered]:
    need_engine("transformers")
    import jinja2

    tok = _hf_tokenizer()
    out = []
    for request in requests:
        messages, tools, add, kwargs = _split(request)
        try:
            text = tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                           add_generation_prompt=add, **kwargs)
        except jinja2.TemplateError as e:  # raise_exception's, and the template's own errors
            out.append(Rendered(None, str(e)))
        except Exception as e:  # an error of Python's in the template (1 + "a"), or a refusal of transformers'
            out.append(Rendered(None, f"{type(e).__name__}: {e}"))
        else:
            out.append(Rendered(text, None))
    return out


# -- @huggingface/jinja -------------------------------------------------------------------------
#
# The driver (hfjinja_driver.mjs) says how the variables are passed and what
# JSON.parse does to the values (verified there): integers beyond 2**53 lose
# precision, a float with no fraction is an integer (1.0 renders "1", -0.0
# "0"), keys that look like array indices come first; null renders "",
# booleans "true"/"false", objects and lists as JSON.
# raise_exception is built in and throws Error(message): the message comes
# back as it is. tools is null when the request has none (as transformers.js
# passes it), documents null.

def _hfjinja() -> tuple[str, str]:
    """(node, the folder holding node_modules/@huggingface/jinja)."""
    node = need("node", "Node.js 18 or later on PATH")
    home = os.environ.get("XTML_HFJINJA", "")
    if not home:
        _missing(f"XTML_HFJINJA is not set; to set it up: {HFJINJA_HOW}")
    elif not (Path(home) / HFJINJA_PACKAGE).is_file():
        _missing(f"XTML_HFJINJA={home} holds no {HFJINJA_PACKAGE}; to set it up: {HFJINJA_HOW}")
    return node, home


def _hfjs(template: str, requests: list[dict[str, Any]]) -> list[Rendered]:
    node, home = _hfjinja()
    job = json.dumps({"template": template, "requests": requests}, allow_nan=False)
    run = subprocess.run([node, str(DRIVER)], input=job, capture_output=True, text=True, encoding="utf-8",
                         env={**os.environ, "XTML_HFJINJA": home}, timeout=BATCH_TIMEOUT_S, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"the hfjs driver failed ({run.returncode}): {run.stderr[-4000:]}")
    answer = json.loads(run.stdout)
    if len(answer) != len(requests):
        raise RuntimeError(f"the hfjs driver answered {len(answer)} of {len(requests)} requests")
    return [Rendered(a["text"], None) if "text" in a else Rendered(None, a["error"]) for a in answer]


# -- llama.cpp ----------------------------------------------------------------------------------
#
# llama-server (build 11434) with --jinja and the template as
# --chat-template-file; POST /apply-template takes a chat-completions body and
# answers {"prompt": text} (tools/server/server-context.cpp,
# post_apply_template: "same with handle_chat_completions, but without
# inference part"). A request is sent as {"messages", "tools" (when given),
# "add_generation_prompt", "chat_template_kwargs": the other variables}.
#
# What it does before the template, in its source (verified with this
# binary where marked *):
#
# * tools/server/server-common.cpp, oaicompat_chat_params_parse:
#   "All non-assistant messages must contain 'content'" and "Assistant
#   message must contain either 'content' or 'tool_calls'!" (400 *); content
#   is a string, null or a list of parts of type text or media_marker. A
#   final assistant message is a prefill (the server's default,
#   --prefill-assistant): continue_final_message, add_generation_prompt
#   false, and "Cannot have 2 or more assistant messages at the end of the
#   list." (400 *). The prompt is then the template over the messages before
#   it with no generation prompt, then the generation prompt (the difference
#   between the renders with and without add_generation_prompt), then that
#   message's content (*: with the self-test's template, "[user]hi" +
#   "[gen]x" + "pre").
#   chat_template_kwargs: each value is dumped to JSON and parsed again;
#   "enable_thinking" must be a boolean ("invalid type for
#   \"enable_thinking\" (expected boolean, got string)", 400 *). Roles are not
#   checked (an unknown role renders *).
# * common/chat.cpp, common_chat_msgs_parse_oaicompat and
#   common_chat_msg::to_json_oaicompat: each message is rebuilt from a struct,
#   with only role, content, reasoning_content (left out when empty), name,
#   tool_call_id and tool_calls, in that order; other keys are dropped *;
#   null or missing content becomes "" *; a tool call is rebuilt as {type,
#   function: {name, arguments}, id} *, and arguments given as an object are
#   dumped to a JSON string (compact *), which stays a string unless the next
#   point parses it again.
# * common/chat.cpp, common_chat_templates_apply_jinja (the "workaround"s):
#   role developer becomes system unless the template holds "<|channel|>" *;
#   when the template does not show a system message's content (its caps,
#   common/jinja/caps.cpp, from trial renders), a first system message is
#   merged into the next ("system\nuser" *) or dropped; when it renders tool
#   calls, a message with tool calls and no content gets content ""; when it
#   reads arguments as an object (caps: a trial call whose arguments are
#   {"arg": "value"} has its "arg" read; `arguments | tojson` does *,
#   `arguments.x` does not *), string arguments are parsed as JSON *
#   ("Failed to parse tool call arguments as JSON" otherwise).
#   A template holding "You have access to the following functions in
#   JSONSchema format" gets every content trimmed.
# * common/chat.cpp, common_chat_tools_parse_oaicompat and
#   common_chat_tools_to_json_oaicompat: each tool is rebuilt as {type:
#   "function", function: {name, description ("" when absent), parameters
#   ({} when absent)}} *, other keys dropped *; no tools or an empty list
#   leaves `tools` undefined (not none) *.
# * common/chat.cpp, common_chat_template_direct_apply_impl: the variables
#   are messages, bos_token and eos_token (the model's tokens; SPECIALS
#   overrides them through chat_template_kwargs), enable_thinking (always:
#   the server's default is true when the template "supports thinking", else
#   false *), tools (when not empty), datetime and date_string, the
#   chat_template_kwargs, and add_generation_prompt only when true (undefined
#   otherwise *). A string reasoning_effort also sets reasoning_strength *; a
#   boolean preserve_reasoning sets preserve_thinking, clear_thinking,
#   truncate_history_thinking and drop_thinking.
# * Each request renders the template three times (the prompt, then with and
#   without add_generation_prompt for the generation prompt,
#   chat-auto-parser-generator.cpp): an error in any of them fails it.
# * At start-up (common/arg.cpp, common_chat_verify_template) the template is
#   rendered with one user message "test"; if that raises, the server exits
#   with "error: the supplied chat template is not supported" * and every
#   request of the batch is Rendered(None, the error lines of its log).
# * The autoparser (chat-diff-analyzer.cpp, run on every request to build
#   the parser of the answer) can fail on a template, and then every request
#   does: "Unable to generate parser for this template. Automatic parser
#   generation failed: [json.exception.parse_error.101] ..." * (seen with a
#   template that wrote `{{ m | tojson }}` and then each call's arguments
#   followed by ";").
# * Values: a float is written with 6 significant digits, by tojson and by
#   `{{ x }}` alike (0.1234567891 as 0.123457 *); tojson writes 1.0 as 1,
#   `{{ x }}` as 1.0, and 1e300 as 1e+300 and as all its 301 digits and
#   ".0" *; `{{ x }}` of an object writes nothing, of a list its items run together,
#   of none nothing *; booleans render True and False *. tojson on an
#   undefined value is an error ("Unknown (built-in) filter 'tojson' for type
#   Undefined" *). Arguments given as an object and rendered as a string are
#   compact JSON with the floats kept (`{"x":1.0}` *).
#
# raise_exception (common/jinja/value.cpp) throws "Jinja Exception: " +
# message; the autoparser's try (common_chat_templates_apply_jinja) wraps it
# as std::invalid_argument("Unable to generate parser for this template.
# Automatic parser generation failed: " ...), and the server's ex_wrapper
# (tools/server/server.cpp) answers 400 {"error": {"code": 400, "message":
# ..., "type": "invalid_request_error"}} *; the message ends with
# "Error: Jinja Exception: boom".

_model_dir: tempfile.TemporaryDirectory[str] | None = None


def _tiny_model() -> Path:
    """A tiny llama GGUF (random weights; llama-server needs a model even to
    apply a template), written once per process."""
    global _model_dir
    if _model_dir is None:
        from tests.helpers.gguf import write_tiny_llama
        from tests.helpers.tokenizers import tiny_tokenizer_json

        folder = tempfile.TemporaryDirectory(prefix="xtml-jinja-")
        tokenizer = tiny_tokenizer_json(folder.name)
        write_tiny_llama(Path(folder.name, "tiny.gguf"), tokenizer, eog=0, ctx=CTX)  # id 0: <unk>
        _model_dir = folder
    return Path(_model_dir.name, "tiny.gguf")


def _refused(log: str) -> str | None:
    """llama-server's refusal of the template at start-up, from its log: its
    error lines (with the lines that continue them), or None when the log
    holds no refusal."""
    if "the supplied chat template is not supported" not in log:
        return None
    errors = re.findall(r"^[\d.]+ E (.*(?:\n(?![\d.]+ [A-Z] |error: ).*)*)", log, re.MULTILINE)
    return "\n".join(e.strip() for e in errors) or "the supplied chat template is not supported"


def _llamacpp(template: str, requests: list[dict[str, Any]], chat_parsing: bool = True) -> list[Rendered]:
    from tests.helpers.engines import closed_port

    server = need("llama-server", LLAMA_HOW, env="XTML_LLAMA_SERVER")
    model = _tiny_model()
    with tempfile.TemporaryDirectory(prefix="xtml-jinja-") as tmp:
        template_file = Path(tmp, "template.jinja")
        template_file.write_text(template, encoding="utf-8")
        log_path = Path(tmp, "llama-server.log")
        port = closed_port()
        url = f"http://127.0.0.1:{port}"
        with log_path.open("wb") as log:
            # --no-prefill-assistant: by default llama-server renders a final
            # assistant message as a prefill (the messages before it, the
            # generation prompt, then its content: server-common.cpp); with it,
            # the template gets the whole conversation, as the other engines
            # give it (docs/exports.md says what the default does).
            proc = subprocess.Popen(
                [server, "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(CTX),
                 "--parallel", "1", "--threads", "1", "--no-webui", "--no-warmup", "--jinja",
                 "--no-prefill-assistant", "--chat-template-file", str(template_file),
                 *(() if chat_parsing else ("--skip-chat-parsing",))],
                stdout=log, stderr=subprocess.STDOUT)
            try:
                with httpx.Client(base_url=url, timeout=30) as client:
                    if not _started(proc, client):
                        text = log_path.read_text(encoding="utf-8", errors="replace")
                        refusal = _refused(text) if proc.poll() is not None else None
                        if refusal is None:
                            raise RuntimeError(f"llama-server did not start; its log:\n{text[-4000:]}")
                        return [Rendered(None, refusal) for _ in requests]
                    return [_apply(client, request) for request in requests]
            finally:
                _stop(proc)


def _started(proc: subprocess.Popen[bytes], client: httpx.Client) -> bool:
    """Whether the server answers /health within STARTUP_S (False: it exited
    or did not answer)."""
    deadline = time.monotonic() + STARTUP_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if client.get("/health", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_S)


def _apply(client: httpx.Client, request: dict[str, Any]) -> Rendered:
    messages, tools, add, kwargs = _split(request)
    body: dict[str, Any] = {"messages": messages, "add_generation_prompt": add, "chat_template_kwargs": kwargs}
    if tools is not None:
        body["tools"] = tools
    r = client.post("/apply-template", content=json.dumps(body, allow_nan=False),
                    headers={"Content-Type": "application/json"})
    try:
        answer = r.json()
    except ValueError:
        raise RuntimeError(f"llama-server answered {r.status_code} with no JSON: {r.text[:2000]}") from None
    if r.status_code == 200:
        return Rendered(answer["prompt"], None)
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict) or "message" not in error:
        raise RuntimeError(f"llama-server answered {r.status_code}: {r.text[:2000]}")
    return Rendered(None, error["message"])
