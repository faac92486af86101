"""Answers in the shape of the deprecated ``functions`` API
(:class:`FunctionCalls`)."""

from __future__ import annotations

from typing import Any

__all__ = ["FunctionCalls"]


class FunctionCalls:
    """Answers to a request that declared its tools as the deprecated
    ``functions``, in that API's shape: the call is the message's
    ``function_call`` (``{"name", "arguments"}``, no id), and a finish reason
    of ``tool_calls`` is ``function_call``. That shape holds one call: a
    further one is left out, with a diagnostic ``dropped-call`` naming it.
    One object per response; :meth:`completion` shapes a whole answer,
    :meth:`chunk` each chunk of a stream, in order."""

    __slots__ = ("dropped",)

    def __init__(self) -> None:
        self.dropped: dict[int, str] = {}

    def _diag(self, index: int, name: str) -> dict[str, Any]:
        return {"kind": "dropped-call", "offset": 0, "index": index, "name": name,
                "message": f"tool call {index} ({name!r}) is left out: the deprecated functions API answers with "
                           "one function_call"}

    def completion(self, completion: dict[str, Any]) -> dict[str, Any]:
        for choice in completion["choices"]:
            self.choice(choice)
        return completion

    def choice(self, choice: dict[str, Any]) -> None:
        """One choice of a whole answer, rewritten in place."""
        m = choice["message"]
        calls = m.pop("tool_calls", None)
        if calls:
            m["function_call"] = dict(calls[0]["function"])
            choice.setdefault("xtml_diagnostics", []).extend(
                self._diag(k, c["function"]["name"]) for k, c in enumerate(calls) if k)
        if choice["finish_reason"] == "tool_calls":
            choice["finish_reason"] = "function_call"

    def chunk(self, chunk: dict[str, Any]) -> dict[str, Any]:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            calls = delta.pop("tool_calls", None)
            for tc in calls or ():
                fn = tc.get("function") or {}
                if tc.get("index", 0) == 0:
                    piece = {k: fn[k] for k in ("name", "arguments") if k in fn and (k == "name" or fn[k])}
                    if "name" in piece or "arguments" in piece:
                        delta["function_call"] = piece
                elif "name" in fn:
                    self.dropped[tc["index"]] = fn["name"]
            if choice["finish_reason"] is not None:
                if choice["finish_reason"] == "tool_calls":
                    choice["finish_reason"] = "function_call"
                choice.setdefault("xtml_diagnostics", []).extend(
                    self._diag(k, name) for k, name in sorted(self.dropped.items()))
        return chunk
