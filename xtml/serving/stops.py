"""OpenAI's ``stop`` sequences, cut out of the text a gateway on ids
returns (:class:`StopSequences`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .chunks import chunk
from .shape import Shaped

__all__ = ["StopSequences"]


class StopSequences:
    """OpenAI's ``stop``: the text a model returns ends before the first stop
    sequence it writes, which is left out with all that follows.

    An engine asked for stop sequences matches them on its own text and
    stops, but the ids it returns still hold the tokens that spelled the
    sequence (and may run past its end): a gateway on ids cuts the text
    here. :meth:`message` cuts a whole answer's message; :meth:`chunks`
    filters a stream's chunks, holding back the end of a text field while it
    could be the start of a stop sequence (what it holds goes out once it
    cannot, or when the field or the message ends). Text is matched within
    ``reasoning_content`` and within ``content``; a sequence inside a tool
    call's arguments leaves the call cut off, and the cut withholds it."""

    __slots__ = ("_hold", "_pending", "found", "stops")

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self._hold = max(map(len, self.stops), default=1) - 1
        self._pending: dict[str, str] = {}
        self.found: str | None = None
        """The stop sequence the model wrote, once it has."""

    def _first(self, text: str) -> tuple[int, str | None]:
        """Where the stop sequence that the text completes first starts, and
        which one it is: an engine checks as it generates, so of two that
        overlap the one that ends first stops it."""
        at, end, found = -1, -1, None
        for s in self.stops:
            i = text.find(s)
            if i >= 0 and (found is None or i + len(s) < end or (i + len(s) == end and i < at)):
                at, end, found = i, i + len(s), s
        return at, found

    def _held(self, text: str) -> int:
        """How much of the end of ``text`` could start a stop sequence."""
        for k in range(min(self._hold, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def text(self, field: str, text: str) -> str:
        """What of a field's new ``text`` can go out now."""
        if self.found is not None:
            return ""
        held = self._pending.pop(field, None)
        buf = held + text if held else text
        at, found = self._first(buf)
        if found is not None:
            self.found = found
            self._pending.clear()
            return buf[:at]
        k = self._held(buf)
        if k:
            self._pending[field] = buf[-k:]
            return buf[:-k]
        return buf

    def diagnostic(self, offset: int) -> dict[str, Any]:
        return {"kind": "stop-sequence", "offset": offset,
                "message": f"the model wrote the stop sequence {self.found!r}: it and the text after it are left "
                           "out"}

    def message(self, shaped: Shaped, offset: int) -> Shaped:
        """A whole answer's message, cut at the first stop sequence: what
        follows it (the content after reasoning, the calls after content)
        is left out."""
        m = dict(shaped.message)
        for field in ("reasoning_content", "content"):
            v = m.get(field)
            at, found = self._first(v) if isinstance(v, str) else (-1, None)
            if found is not None:
                self.found = found
                m[field] = v[:at]  # type: ignore[index]
                break
        if self.found is None:
            return shaped
        if field == "reasoning_content":
            m["content"] = ""
        m["content"] = m["content"] or ""  # no calls now: text, even when empty
        if not m.get("reasoning_content"):
            m.pop("reasoning_content", None)
        m.pop("tool_calls", None)
        reason = "stop" if shaped.finish_reason == "tool_calls" else shaped.finish_reason
        return Shaped(m, reason, [*shaped.diagnostics, self.diagnostic(offset)])

    def _flush(self, like: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
        """What every field holds back goes out, in chunks like ``like``:
        it can no longer start a stop sequence."""
        for field, held in self._pending.items():
            out.append(_text_chunk(like, field, held))
        self._pending.clear()

    def chunks(self, chunks: list[dict[str, Any]], offset: int = 0) -> list[dict[str, Any]]:
        """A stream's chunks (as :class:`ChunkStream` gives them), with the
        text that could start a stop sequence held back and the text from
        one on left out."""
        out: list[dict[str, Any]] = []
        for c in chunks:
            choices = c.get("choices")
            if not choices:
                out.append(c)  # the usage chunk
                continue
            choice = choices[0]
            delta = choice["delta"]
            for field in ("reasoning_content", "content"):
                v = delta.get(field)
                if not v:
                    continue
                # The other field has ended: what it held was no stop sequence.
                other = "content" if field == "reasoning_content" else "reasoning_content"
                held = self._pending.pop(other, None)
                if held:
                    out.append(_text_chunk(c, other, held))
                delta[field] = self.text(field, v)
            if "tool_calls" in delta:
                if self.found is not None:
                    del delta["tool_calls"]  # a call after the stop sequence is no part of the answer
                else:
                    self._flush(c, out)  # a call ends the text before it
            if choice["finish_reason"] is not None:
                self._flush(c, out)
                if self.found is not None:
                    if choice["finish_reason"] == "tool_calls":
                        choice["finish_reason"] = "stop"
                    diags = choice.get("xtml_diagnostics")
                    if isinstance(diags, list):
                        diags.append(self.diagnostic(offset))
            elif delta.keys() <= {"content", "reasoning_content"} and not any(delta.values()):
                continue  # all its text is held back
            out.append(c)
        return out


def _text_chunk(like: Mapping[str, Any], field: str, text: str) -> dict[str, Any]:
    return chunk(like, {field: text})
