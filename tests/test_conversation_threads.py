"""A conversation shared by threads: its calls serialize, so it ends equal to
``encode`` of its request whatever the interleaving; and a failed call
changes nothing, so a thread's bad message cannot leave it half-changed for
the others."""

from __future__ import annotations

import copy
import sys
import threading
from typing import Any

import pytest

import xtml

THREADS = 8
ROUNDS = 12
TIMEOUT = 60.0
EFFORTS = ("low", "high", "max")


def _worker(conv: xtml.Conversation, n: int, start: threading.Barrier, errors: list[BaseException]) -> None:
    try:
        start.wait()
        for r in range(ROUNDS):
            conv.append({"role": "user", "content": f"thread {n}, round {r}: what is {n} + {r}?"})
            conv.prompt_ids()
            conv.append({"role": "assistant", "content": f"{n + r}", "reasoning_content": f"add {n} and {r}"})
            # Every message renders again on a new effort: the longest
            # stretch between reading the state and changing it.
            conv.set_options(thinking_effort=EFFORTS[(n + r) % len(EFFORTS)])
            conv.prompt_ids(tool_choice="none")
            assert conv.ids
    except BaseException as e:  # the main thread reports it
        errors.append(e)


def test_a_conversation_shared_by_threads_stays_equal_to_encode(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    add = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    conv = k3.conversation(vocab, [{"role": "system", "content": "Add."}], tools=[add], thinking_effort="low")
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)
    threads = [threading.Thread(target=_worker, args=(conv, n, start, errors), daemon=True) for n in range(THREADS)]
    # Switching threads every few bytecodes makes a call interleave with
    # another's inside it, where an unguarded conversation breaks.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "the threads did not finish in time"
    assert errors == []
    assert len(conv) == 1 + 2 * THREADS * ROUNDS
    assert conv.prompt_ids() == k3.encode(conv.request(), vocab)
    assert conv.ids == k3.encode(conv.request(), vocab, add_generation_prompt=False)
    # Each thread's messages are whole and in its own order.
    for n in range(THREADS):
        mine = [m["content"] for m in conv.messages if m["content"].startswith(f"thread {n},")]
        assert mine == [f"thread {n}, round {r}: what is {n} + {r}?" for r in range(ROUNDS)]


def test_a_copy_has_its_own_lock(k3: xtml.Template, vocab: xtml.Vocabulary) -> None:
    conv = k3.conversation(vocab, [{"role": "user", "content": "hi"}])
    fork = conv.copy()
    fork.append({"role": "assistant", "content": "hello"})
    # Holding one conversation's lock does not block the other's calls.
    with conv._lock:
        done = threading.Event()

        def use_fork() -> None:
            fork.prompt_ids()
            done.set()

        t = threading.Thread(target=use_fork, daemon=True)
        t.start()
        assert done.wait(10), "the copy waited on the original's lock"
        t.join()
    assert fork.prompt_ids() == k3.encode(fork.request(), vocab)
    assert len(conv) == 1 and conv.prompt_ids() == k3.encode(conv.request(), vocab)


def _state(conv: xtml.Conversation) -> tuple[Any, ...]:
    return copy.deepcopy(conv.messages), conv.ids, conv.options, conv.prompt_ids(), len(conv), conv.request()


@pytest.mark.parametrize("bad", [
    {"role": "user", "content": 5},
    {"role": "nobody", "content": "x"},
    {"role": "tool", "tool_call_id": "nowhere", "content": "x"},
])
def test_a_failed_append_changes_nothing(k3: xtml.Template, vocab: xtml.Vocabulary, bad: dict[str, Any]) -> None:
    conv = k3.conversation(vocab, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                           thinking_effort="low")
    before = _state(conv)
    with pytest.raises(xtml.MessageError) as e:
        conv.append(bad)
    assert e.value.index == 2
    assert _state(conv) == before
    # Nothing is left held either: the next call goes through.
    conv.append({"role": "user", "content": "c"})
    assert conv.prompt_ids() == k3.encode(conv.request(), vocab)
