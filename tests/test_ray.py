"""The batched map function under Ray Data, in local mode (skipped when
ray is not installed: it is the optional extra ``ray``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import xtml
from xtml.training import MapFunction

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

# Starting Ray takes most of a minute, so this is a load test; Ray warns
# about its own deprecated settings when it starts.
pytestmark = [pytest.mark.load, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

K3 = xtml.load("kimi-k3")

ROWS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "hello", "reasoning_content": "greet back"}],
     "thinking_effort": "low"},
    {"messages": [{"role": "user", "content": "weather?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "a", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}]},
                  {"role": "tool", "tool_call_id": "a", "content": "rain"},
                  {"role": "assistant", "content": "Rain."}]},
    {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"role": "user", "content": "no thinking"}, {"role": "assistant", "content": "fine"}],
     "thinking": False},
]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.usefixtures("local_ray")
@pytest.mark.parametrize("batch_format", ["default", "numpy", "pandas", "pyarrow"])
def test_map_batches_in_every_batch_format(batch_format: str, tiny_tokenizer: str, tmp_path: Path) -> None:
    fn = MapFunction("kimi-k3", tiny_tokenizer, add_markers=True)
    vocab = xtml.load_tokenizer(tiny_tokenizer, add_special_tokens=K3.markers.all())
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    for ds in (ray.data.from_items(ROWS), ray.data.read_json(str(src))):
        got = ds.map_batches(fn, batch_format=batch_format, batch_size=2).take_all()
        assert len(got) == len(ROWS)
        for row, want in zip(got, ROWS):
            if want["messages"][0]["role"] == "wizard":
                assert list(row["input_ids"]) == [] and row["length"] == 0
                assert row["error"] == "role 'wizard' is not one of system, user, assistant, tool (at messages[0].role)"
                continue
            ex = K3.encode_training({**want, "add_generation_prompt": False}, vocab)
            assert list(row["input_ids"]) == ex.ids and list(row["loss_mask"]) == ex.mask
            assert list(row["labels"]) == ex.labels and row["length"] == len(ex.ids) and row["error"] == ""
