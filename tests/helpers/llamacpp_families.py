"""llama.cpp's server as a parser of each family's answers: the answers
tests/helpers/vllm_families.py holds vLLM's parsers to (generated and
hostile, with what was meant), read back through llama-server's
``/v1/chat/completions`` running SmolLM2-135M with the family's official
chat template (``--jinja --chat-template-file``), as
tests/test_llamacpp_families.py and bench/bench_llamacpp_families.py read
them.

llama-server has no endpoint that parses a given text, and it refuses a
``grammar`` beside ``tools`` ("Cannot use custom grammar constraints with
tools."), so a completion cannot be forced by a grammar while its calls
are parsed. The answer's text is handed to the server as the assistant
message to continue (``continue_final_message``): llama.cpp then appends
it to the generation prompt it renders and parses that prompt plus what
the model adds (common/chat.cpp: the parse input is the generation prompt
followed by the generated text). ``logit_bias`` on the model's
end-of-generation ids with ``max_tokens`` 1 makes the model add nothing:
an answer whose only token was not an end-of-generation one ends with
``finish_reason: "length"`` and is refused here. Where the family opens its
reasoning itself (``<think>``, Gemma 4's ``<|channel>thought``, harmony's
analysis message), the text goes in as the reasoning to continue, because
llama.cpp writes the opening before it; which split of
the text makes llama.cpp's prompt equal to its own generation prompt
followed by exactly the answer's text is checked on ``/apply-template``,
and a case where none does says what llama.cpp put in between
(``inserted``: an empty reasoning block, for a family whose parser reads
reasoning, before an answer that does not open one). Where what it puts in
between opens a message of its own around the answer (gpt-oss: an empty
analysis message and a final channel's header before an answer that opens
no analysis message), the answer cannot be read as written: such a row is
``unforced``, and counted as refused. An empty answer is no message to
continue: the request then ends with the generation prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx

import xtml
from tests.helpers import vllm_families as vf
from tests.helpers.engines import closed_port, stop_process, wait_healthy
from tests.helpers.families import QWEN3_SHA256, llama_template
from tests.helpers.family_requests import REFERENCES
from tests.helpers.vllm import as_json

FAMILIES = ("qwen3", "llama-3.1", "deepseek-v3.1", "kimi-k2", "kimi-k2-thinking", "glm-4.6", "gemma-4", "gpt-oss")
# What bench/bench_llamacpp_families.py reads besides: K3 (the sdist's own
# Kimi-K3.jinja, written for llama.cpp) and Mistral Small 3.1 (its reference
# template kept apart: see HISTORY).
BENCHED = ("kimi-k3", *FAMILIES, "mistral-small-3.1")

# kimi-k2-thinking's and deepseek-v3.1's reference templates (REFERENCES,
# read from llama.cpp's history) are not in the sdist: its later copies
# stand in, since what matters here is which parser llama.cpp picks for a
# template, not how the template renders history.
TEMPLATES: dict[str, tuple[str, str]] = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", QWEN3_SHA256),
    "llama-3.1": (REFERENCES["llama-3.1"].source, REFERENCES["llama-3.1"].sha256),
    "kimi-k2": (REFERENCES["kimi-k2"].source, REFERENCES["kimi-k2"].sha256),
    "glm-4.6": (REFERENCES["glm-4.6"].source, REFERENCES["glm-4.6"].sha256),
    "deepseek-v3.1": ("deepseek-ai-DeepSeek-V3.1.jinja",
                      "d9f5f351b276cf9e81d009db08830db7d38e94927aecd09a7beb43e2aafee94e"),
    "kimi-k2-thinking": ("Kimi-K2-Thinking.jinja",
                         "2f6c593d50682612ccc3229f043ecd1bdeb5a32fdfe86ca2158203a61d885817"),
    "gemma-4": (REFERENCES["gemma-4"].source, REFERENCES["gemma-4"].sha256),
    "gpt-oss": (REFERENCES["gpt-oss"].source, REFERENCES["gpt-oss"].sha256),
    "kimi-k3": ("Kimi-K3.jinja", "4578103bf225f58d5b7ceb613ccc2ac8fe82b6707b7289211b3d4825e87806b3"),
    "mistral-small-3.1": (Path(REFERENCES["mistral-small-3.1"].source).name, REFERENCES["mistral-small-3.1"].sha256),
}
# Reference templates the sdist does not carry in any copy: read by file
# name from the folder XTML_REFERENCE_TEMPLATES names (default
# ~/.cache/xtml/references), where the files read from llama.cpp's history
# are kept (tests/data/families/make_expected.py says how); never committed.
HISTORY = ("mistral-small-3.1",)

# Where an answer opens its reasoning otherwise than the family's think
# pair says: harmony's analysis message, which the template writes before
# a continued reasoning (and, before continued content, an empty analysis
# message and a final channel's header of its own).
OPENS = {"gpt-oss": "<|channel|>analysis<|message|>"}
# A header llama.cpp writes before a continued answer that opens a message
# of the answer's own: the answer is then that message's body, not the
# answer as written (harmony: an answer that opens no analysis message).
HEADERS = {"gpt-oss": "<|channel|>final<|message|>"}

CTX = 4096
STARTUP_S = 120.0
QUESTION = [{"role": "user", "content": "Weather?"}]
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
# How llama.cpp's own log names the chat format and the parser it built
# for a template (tools/server, common/chat.cpp; the parser at debug
# verbosity, 5).
PICKED = ("chat format: ", "Using specialized template: ", "using differential autoparser")


@dataclass(frozen=True)
class Case:
    """One answer as llama.cpp is asked to read it."""

    kind: str
    """``generated`` or ``hostile``."""
    what: str
    text: str
    """The answer's text up to, not including, its stop token."""
    tools: list[dict[str, Any]]
    kwargs: dict[str, Any]
    want: dict[str, Any]
    """What was meant: reasoning, content, calls as ``[name, arguments]``."""
    ids: list[int]
    """The answer's ids (with its stop id), for xtml's own parse."""


def text_of(name: str, ids: list[int]) -> str:
    """The text of ``ids`` (each marker token its string), less a stop id
    at the end: the text a model wrote before its stop token."""
    from tokenizers import Tokenizer

    tok = _tokenizer(name)
    body = ids[:-1] if ids and ids[-1] in set(vf.stops(name)) else ids
    assert isinstance(tok, Tokenizer)
    return str(tok.decode(body, skip_special_tokens=False))


@cache
def _tokenizer(name: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(vf.tokenizer_json(name))


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


_FOUND: dict[str, dict[tuple[tuple[int, ...], tuple[int, ...]], list[dict[str, Any]]]] = {}


def _walk(name: str) -> Iterator[tuple[tuple[tuple[int, ...], tuple[int, ...]], list[dict[str, Any]]]]:
    """Each (prompt ids, answer ids) vf.generated considers, with the tools
    its request declared, in vf.generated's order."""
    t, v = vf.template(name), vf.vocab(name)
    end = set(vf.stops(name))
    for case in vf._requests(name):
        for k in range(1, len(case["request"]["messages"])):
            msgs = case["request"]["messages"][:k + 1]
            if msgs[-1]["role"] != "assistant":
                continue
            req = {**case["request"], "messages": msgs}
            try:
                whole = t.encode({**req, "add_generation_prompt": False}, v, **case["options"])
                prompt = t.encode({**req, "messages": msgs[:-1], "add_generation_prompt": True}, v,
                                  **case["options"])
            except xtml.XtmlError:
                continue
            ends = [k for k, i in enumerate(whole) if i in end]
            if whole[:len(prompt)] == prompt and ends:
                yield (tuple(prompt), tuple(whole[len(prompt):ends[-1] + 1])), list(case["request"].get("tools") or [])


def tools_for(name: str, case: vf.Case, want: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools the generated answer's request declared, and any its calls
    name that it did not (with no schema): the parser of a server that
    declares them all is the one asked to read the calls."""
    key = (tuple(case["prompt"]), tuple(case["completion"]))
    found = _FOUND.setdefault(name, {})
    if key not in found:
        for k, tools in _walk(name):
            found.setdefault(k, tools)
            if k == key:
                break
    declared = found.get(key, [])
    names = {t.get("function", {}).get("name") for t in declared}
    return [*declared, *(_tool(n) for n in dict.fromkeys(c[0] for c in want["tool_calls"]) if n not in names)]


def cases(name: str, generated: int | None = None, hostile: int | None = None) -> list[Case]:
    """The family's generated answers (what was meant: ``Template.parse``
    of their ids) and hostile ones (with what the model meant), as the
    vLLM column reads them; the first ``generated``/``hostile`` of each."""
    out = []
    for k, c in enumerate(vf.generated(name)[:generated]):
        want = vf.expected(name, c)
        out.append(Case("generated", f"generated answer {k + 1}", text_of(name, c["completion"]),
                        tools_for(name, c, want), dict(c["kwargs"]), want, list(c["completion"])))
    for what, c, want in vf.hostile(name)[:hostile]:
        out.append(Case("hostile", what, text_of(name, c["completion"]), WEATHER, dict(c["kwargs"]), want,
                        list(c["completion"])))
    return out


def _history_path(name: str) -> Path:
    folder = os.environ.get("XTML_REFERENCE_TEMPLATES") or os.path.expanduser("~/.cache/xtml/references")
    return Path(folder) / TEMPLATES[name][0]


def missing(name: str) -> str | None:
    """Why the family's template cannot be had here (None: it can)."""
    if name not in HISTORY or _history_path(name).is_file():
        return None
    ref = REFERENCES[name]
    return (f"no {_history_path(name)} (XTML_REFERENCE_TEMPLATES): ggml-org/llama.cpp's {ref.source} at commit "
            f"{ref.commit}, sha256 {ref.sha256}, is not in llama.cpp's sdist")


def template_text(name: str) -> str:
    """The family's template as llama-server is given it, checked by its
    sha256."""
    file, sha = TEMPLATES[name]
    if name not in HISTORY:
        return llama_template(file, sha)
    why = missing(name)
    if why is not None:
        raise FileNotFoundError(why)
    data = _history_path(name).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha:
        raise ValueError(f"{_history_path(name)} is not {file} of sha256 {sha}")
    return data.decode("utf-8")


def xtml_read(name: str, case: Case) -> tuple[dict[str, Any], bool]:
    """xtml's own lenient parse of the answer's ids, shaped as the losses
    are counted, and whether it reported a repair (the diagnostics the vLLM
    plugin logs as a warning)."""
    msg = vf.template(name).parse(case.ids, vf.vocab(name), completion=True, lenient=True, thinking=True)
    content = msg.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    got = {"reasoning": msg.get("reasoning_content") or "", "content": content or "",
           "tool_calls": [[c["function"]["name"], as_json(c["function"]["arguments"])]
                          for c in msg.get("tool_calls") or ()]}
    return got, bool(msg.get("diagnostics"))


class TemplateRefused(RuntimeError):
    """llama-server would not start with the template: its Jinja engine
    refused it (the message is what its log said)."""


class Server:
    """llama-server on the loopback address running SmolLM2 with one
    family's official chat template."""

    def __init__(self, binary: str, model: str, name: str, folder: Path) -> None:
        file = TEMPLATES[name][0]
        text = template_text(name)
        template = folder / file
        template.write_text(text, encoding="utf-8")
        self.name = name
        self.url = f"http://127.0.0.1:{closed_port()}"
        self.log_path = folder / f"llama-server-{name}.log"
        self._log = self.log_path.open("wb")
        # Debug verbosity: the log then names the parser llama.cpp built.
        self.proc = subprocess.Popen(
            [binary, "--model", model, "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1],
             "--ctx-size", str(CTX), "--parallel", "1", "--threads", "2", "--no-webui", "--jinja",
             "--chat-template-file", str(template), "-lv", "5"],
            stdout=self._log, stderr=subprocess.STDOUT)
        if not wait_healthy(self.url, self.proc, STARTUP_S):
            self.stop()
            log = self.log_path.read_text(encoding="utf-8", errors="replace")
            if "failed to initialize chat template" in log:
                # llama.cpp's own Jinja engine cannot load the template:
                # what it says, for the record.
                said = [line.split(" E ", 1)[1].strip() for line in log.splitlines() if " E " in line]
                raise TemplateRefused("; ".join(said)[:600])
            raise RuntimeError(f"llama-server did not start; its log:\n{log[-4000:]}")
        self.client = httpx.Client(base_url=self.url, timeout=300)
        props = self.client.get("/props").json()
        self.eog = self._eog_ids(props)

    def _eog_ids(self, props: dict[str, Any]) -> list[int]:
        """The model's end-of-generation ids, by their text."""
        out = []
        for text in {props.get("eos_token"), "<|im_end|>", "<|endoftext|>"} - {None}:
            r = self.client.post("/tokenize", json={"content": text, "parse_special": True}).json()
            if len(r["tokens"]) == 1:
                out.append(int(r["tokens"][0]))
        return sorted(set(out))

    def picked(self) -> str:
        """The chat format and the parser llama.cpp built for the template,
        as its log says (``peg-native; Kimi K2``, say)."""
        found = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            for mark in PICKED:
                if mark in line:
                    found.append(line.split(mark, 1)[1].strip() or mark.strip())
        return "; ".join(dict.fromkeys(found)) or "not logged"

    def _body(self, case: Case, last: dict[str, Any] | None, mode: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": [*QUESTION, *([last] if last else [])],
                                "chat_template_kwargs": case.kwargs}
        if case.tools:
            body["tools"] = case.tools
        if mode:
            body |= {"continue_final_message": mode, "add_generation_prompt": False}
        return body

    def _prompt(self, body: dict[str, Any]) -> str | None:
        r = self.client.post("/apply-template", json=body)
        return str(r.json()["prompt"]) if r.status_code == 200 else None

    def prefill(self, case: Case) -> tuple[dict[str, Any], str]:
        """The assistant message to continue, and what llama.cpp's prompt
        holds between its own generation prompt and the answer's text ("" when
        the parse reads exactly the answer after the generation prompt)."""
        plain = self._body(case, None, None)
        base = self._prompt(plain)
        if base is None:
            raise RuntimeError(f"llama-server refused the request of {case.what!r}")
        if not case.text:
            # Nothing to continue: the parse input is the generation prompt
            # alone, as after a model that stops at once.
            return plain, ""
        tries = [({"role": "assistant", "content": case.text}, "content", case.text)]
        own = OPENS.get(self.name) or (vf.BY_NAME[self.name].think or ("",))[0]
        for opened in dict.fromkeys((own, "<think>\n", "\n<think>", "<think>", "")):
            if case.text.startswith(opened):
                rest = case.text[len(opened):]
                # (GLM-4.6 writes a newline before the block, which
                # llama.cpp's render of a continued answer leaves out: the
                # answer is read from its block on.)
                shown = case.text[len(opened) - len(opened.lstrip("\n")):]
                tries.append(({"role": "assistant", "content": "", "reasoning_content": rest}, "reasoning_content",
                              shown))
        best: tuple[dict[str, Any], str] | None = None
        for msg, mode, text in tries:
            if mode == "reasoning_content" and not msg["reasoning_content"]:
                continue
            body = self._body(case, msg, mode)
            got = self._prompt(body)
            if got is None or not got.startswith(base) or not got.endswith(text):
                continue
            inserted = got[len(base):len(got) - len(text)]
            if inserted == "":
                return body, ""
            best = best or (body, inserted)
        if best is None:
            raise RuntimeError(f"no continuation of {case.what!r} ends llama.cpp's prompt with its text")
        return best

    def read(self, case: Case) -> dict[str, Any]:
        """llama.cpp's message for the answer: ``got`` (shaped as the losses
        are counted), ``inserted`` (see prefill), or ``error`` (the server's
        refusal: a report), or ``unforced`` (why the server cannot be made
        to read the answer as written: see HEADERS)."""
        body, inserted = self.prefill(case)
        body |= {"temperature": 0, "max_tokens": 1, "logit_bias": [[i, 100] for i in self.eog],
                 "cache_prompt": True}
        header = HEADERS.get(self.name)
        unforced = header is not None and inserted.endswith(header)
        r = self.client.post("/v1/chat/completions", json=body)
        if unforced:
            # What the server answers is kept for the record, never counted.
            return {"unforced": f"llama.cpp writes {inserted!r} before the continued answer, which it then reads "
                                f"as that message's body", "inserted": inserted,
                    "answered": r.json()["choices"][0]["message"] if r.status_code == 200 else r.text[:300]}
        if r.status_code != 200:
            return {"error": f"{r.status_code}: {r.text[:300]}", "inserted": inserted}
        answer = r.json()
        choice = answer["choices"][0]
        if choice["finish_reason"] == "length":
            raise RuntimeError(f"the model added a token after {case.what!r}: the forcing failed")
        msg = choice["message"]
        got = {"reasoning": msg.get("reasoning_content") or "", "content": msg.get("content") or "",
               "tool_calls": [[c["function"]["name"], as_json(c["function"]["arguments"])]
                              for c in msg.get("tool_calls") or ()]}
        return {"got": got, "inserted": inserted, "finish_reason": choice["finish_reason"],
                "completion_tokens": answer["usage"]["completion_tokens"]}

    def stop(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        stop_process(self.proc)
        self._log.close()


def started(binary: str, model: str, name: str, folder: Path) -> Iterator[Server]:
    """A family's server for the length of a block (a fixture body:
    ``yield from``)."""
    s = Server(binary, model, name, folder)
    try:
        yield s
    finally:
        s.stop()


def count(name: str, rows: list[tuple[Case, dict[str, Any]]]) -> dict[str, Any]:
    """Per kind (generated, hostile): llama.cpp's losses (every one silent:
    a 200 answer carries no report), the answers the server refused, and
    xtml's losses on the same answers, silent where it reported no repair.
    A row is ``Server.read``'s, or ``{"unforced": why}``."""
    out: dict[str, Any] = {"family": name, "answers": {}, "llamacpp": {}, "xtml": {}, "lost": [], "inserted": {},
                           "unforced": [c.what for c, row in rows if "unforced" in row]}
    for kind in ("generated", "hostile"):
        mine = [(c, row) for c, row in rows if c.kind == kind]
        out["answers"][kind] = len(mine)
        lost = refused = 0
        x_lost = x_silent = 0
        for c, row in mine:
            if "error" in row or "unforced" in row:
                # An answer the server cannot be made to read as written
                # has no reading of llama.cpp's to count: refused, as an
                # error answer is (named apart in ``unforced``).
                refused += 1
            else:
                n = vf.losses(row["got"], c.want)
                lost += n
                if n:
                    out["lost"].append(f"{kind}: {c.what}: {n}")
            got, reported = xtml_read(name, c)
            n = vf.losses(got, c.want)
            x_lost += n
            x_silent += 0 if reported else n
            if row.get("inserted") and "unforced" not in row:
                out["inserted"][c.what] = row["inserted"]
        out["llamacpp"][kind] = {"silent": lost, "refused": refused}
        out["xtml"][kind] = {"lost": x_lost, "silent": x_silent}
    return out


def dumps(rows: list[tuple[Case, dict[str, Any]]]) -> str:
    return json.dumps([{"what": c.what, "text": c.text, "want": c.want, **row} for c, row in rows],
                      ensure_ascii=False)
