"""llama.cpp's server running a tiny llama model with random weights
(tests/helpers/gguf.py) over a small byte-level BPE with the K3 markers as
control tokens, the end marker as its end-of-generation token; and the
gateway in front of it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai

import xtml
from tests.helpers.engines import closed_port, running, stop_process, wait_healthy
from tests.helpers.gguf import write_tiny_llama
from tests.helpers.need import need
from tests.helpers.serve import REQUEST
from tests.helpers.tokenizers import tiny_tokenizer_json
from xtml.serving.gateway import create_app

K3 = xtml.load("kimi-k3")
CTX = 8192
STARTUP_S = 60.0


class Engine:
    """llama-server on the loopback address, with the tiny model."""

    def __init__(self, folder: Path, chain: bytes = b"") -> None:
        server = need("llama-server", "tests/run (builds it once), or set XTML_LLAMA_SERVER",
                      env="XTML_LLAMA_SERVER")
        self.vocab = xtml.load_tokenizer(tiny_tokenizer_json(str(folder)), add_special_tokens=K3.markers.all())
        tokenizer = folder / "k3-tokenizer.json"
        self.vocab.tokenizer.save(str(tokenizer))
        marks = K3.bind(self.vocab).marker_ids
        self.end = marks[K3.markers.end]
        model = folder / "tiny.gguf"
        # chain: the model generates these bytes, one byte token each, over
        # and over after the generation prompt.
        byte_id = {b: i for i, b in enumerate(self.vocab.byte_table()) if len(b) == 1}
        self.chain = [byte_id[bytes([c])] for c in chain]
        write_tiny_llama(model, tokenizer, eog=self.end, control=list(marks.values()), ctx=CTX, chain=self.chain,
                         after=K3.encode(REQUEST, self.vocab)[-1])
        port = closed_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = folder / "llama-server.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [server, "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
             "--ctx-size", str(CTX), "--parallel", "1", "--threads", "1", "--no-webui", "--no-warmup"],
            stdout=self.log, stderr=subprocess.STDOUT)
        if not wait_healthy(self.url, self.proc, STARTUP_S):
            self.stop()
            raise RuntimeError(f"llama-server did not start; its log: {folder / 'llama-server.log'}")

    def complete(self, prompt: list[int], **fields: Any) -> dict[str, Any]:
        """The engine called directly, as its documentation says."""
        r = httpx.post(self.url + "/completion", json={"prompt": prompt, "return_tokens": True, **fields},
                       timeout=30)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()



def gateway(engine: Engine, **options: Any) -> Iterator[openai.OpenAI]:
    """An OpenAI client of the gateway in front of ``engine``; ``options``
    are the gateway's."""
    with running(create_app(K3, engine.vocab, engine.url, kind="llamacpp", timeout=30, **options)) as gw:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=60)
        yield c
        c.close()


def started(tmp_path_factory: Any, name: str) -> Iterator[Engine]:
    """A module's llama-server (a fixture body: ``yield from``)."""
    e = Engine(tmp_path_factory.mktemp(name))
    yield e
    e.stop()


REAL_STARTUP_S = 120.0


def real_model_server(tmp_path_factory: Any, model: str, name: str) -> Iterator[str]:
    """llama-server on the loopback address running a real model file with
    its own chat template (``--jinja``), for a module (a fixture body:
    ``yield from``); it must outlive every request the module sends."""
    binary = need("llama-server", "tests/run (builds it once), or set XTML_LLAMA_SERVER", env="XTML_LLAMA_SERVER")
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp(name) / "llama-server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [binary, "--model", model, "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "2048",
             "--parallel", "1", "--threads", "2", "--no-webui", "--jinja"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            if not wait_healthy(url, proc, REAL_STARTUP_S):
                raise RuntimeError(f"llama-server did not start; its log:\n{log_path.read_text()[-4000:]}")
            yield url
            # A crash in a decode kills the process: it must have survived
            # every request of the module.
            assert proc.poll() is None, f"llama-server died; its log:\n{log_path.read_text()[-4000:]}"
        finally:
            stop_process(proc)
