"""The playground's views of a layout dialect (spec.md §12), which has no
markup tree: which turn each token of a render is in, the role each turn
names and the request's message it writes, the tokens of each marker
literal, and the example completion the page opens with."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from ..chat.layout_pattern import Builder, Tok
from ..template import Ambiguity, LayoutTemplate, Template
from ..vocab.tokens import TokenBinding

__all__ = ["example_completion", "frame_roles", "frames", "literal_spans"]


def _frame_starts(t: LayoutTemplate) -> frozenset[str]:
    """The tokens a turn of the format starts with: the first token of each
    frame's opening, of the system turn that declares tools and of the
    generation prompt."""
    d = t.layout
    patterns = [d.frame_open, d.prompt, *(f.open for f in d.role_frames.values())]
    if d.system_with_tools is not None:
        patterns.append(d.system_with_tools)
    return frozenset(p.items[0].token for p in patterns if p.items and isinstance(p.items[0], Tok))


def frames(t: LayoutTemplate, b: TokenBinding, ids: Sequence[int]) -> list[int]:
    """Which turn each id of a render is in, counted from 0: a turn starts
    at a token that starts a frame (a run of them starts one turn); ids
    before the first are turn 0."""
    starts = {b.token_ids[s] for s in _frame_starts(t) if s in b.token_ids}
    out: list[int] = []
    k = -1
    in_starts = False
    for i in ids:
        if i in starts:
            if not in_starts:
                k += 1
                in_starts = True
        else:
            if k < 0:
                k = 0
            in_starts = False
        out.append(k)
    return out


def _header_word(pieces: Sequence[tuple[str, bool]]) -> str:
    """The role a turn's header names: the text after its first tokens, up
    to a newline or the next token; the last of those tokens when no text
    follows (a role token with no role text)."""
    k = 0
    while k < len(pieces) and pieces[k][1]:
        k += 1
    text: list[str] = []
    for piece, token in pieces[k:]:
        if token:
            break
        text.append(piece)
        if "\n" in piece:
            break
    word = "".join(text).split("\n", 1)[0].strip()
    if word:
        return word
    return pieces[k - 1][0] if k else ""


def frame_roles(t: LayoutTemplate, tokens: Sequence[Mapping[str, Any]], messages: dict[int, dict[str, Any]],
                 request: Any) -> None:
    """The role each turn of a render names, and the request's message it
    writes (None: one the template writes itself, as a default system
    prompt or the tools' system turn, or the generation prompt). Turns and
    messages are matched in order by the role the turn's header names; a
    role whose frame groups a run of messages takes the run."""
    heads: dict[int, list[tuple[str, bool]]] = {}
    for tok in tokens:
        head = heads.setdefault(tok["message"], [])
        if len(head) < 16:
            head.append((tok["text"], tok["marker"]))
    for k, head in heads.items():
        messages[k]["role"] = _header_word(head)
    d = t.layout
    raw = request.get("messages") if isinstance(request, Mapping) else request
    roles = [m.get("role") if isinstance(m, Mapping) else None for m in raw] if isinstance(raw, list) else []
    expected: dict[str, str] = {}
    for role, layout in d.roles.items():
        frame = d.role_frames.get(role)
        pattern = frame.open if frame is not None else d.frame_open
        b = Builder()
        try:
            pattern.render({"role": layout.text}, {**d.options}, b)
        except KeyError:  # a condition only the render's walk sets
            expected[role] = layout.text
            continue
        expected[role] = _header_word([(s.text, s.special) for s in b.finish()])
    j = 0
    for k in sorted(messages):
        if j >= len(roles):
            break
        given = roles[j]
        if not isinstance(given, str) or messages[k]["role"] != expected.get(given):
            continue
        messages[k]["source"] = j
        frame = d.role_frames.get(given)
        j += 1
        while frame is not None and frame.group and j < len(roles) and roles[j] == given:
            j += 1


def literal_spans(text: str, found: Sequence[Ambiguity], raws: Sequence[bytes]) -> list[list[int]]:
    """The first and last token of each marker literal of ``found``, by the
    tokens' bytes added up once: the cost is the render's size plus a
    search per literal."""
    if not found:
        return []
    ends: list[int] = []
    n = 0
    for raw in raws:
        n += len(raw)
        ends.append(n)
    chars = sorted({p for a in found for p in (a.offset, a.offset + len(a.marker))})
    at_byte: dict[int, int] = {}
    pos = nbytes = 0
    for c in chars:
        nbytes += len(text[pos:c].encode("utf-8", "surrogatepass"))
        pos = c
        at_byte[c] = nbytes
    last = len(raws) - 1
    return [[min(bisect_right(ends, at_byte[a.offset]), last),
             min(bisect_left(ends, at_byte[a.offset + len(a.marker)]), last)] for a in found]


EXAMPLE_QUESTION = "Will it rain in Paris on day 2?"
EXAMPLE_ANSWER = {"role": "assistant", "reasoning_content": "Rain is forecast for day 2.",
                  "content": "Yes: rain is forecast for day 2."}


def example_completion(t: Template) -> str | None:
    """The text of an answer as a layout dialect's model would generate it
    after the generation prompt (the render of the answer past the prompt,
    up to its stop token); None for an XTML dialect, whose example
    completion is the playground's file."""
    if not isinstance(t, LayoutTemplate):
        return None
    user = [{"role": "user", "content": EXAMPLE_QUESTION}]
    prompt = t.render({"messages": user}).text
    whole = t.render({"messages": [*user, EXAMPLE_ANSWER], "add_generation_prompt": False}).text
    answer = whole[len(prompt):] if whole.startswith(prompt) else str(EXAMPLE_ANSWER["content"])
    stops = [(answer.find(s), s) for s in t.layout.stops if s in answer]
    if stops:
        at, stop = min(stops)
        return answer[: at + len(stop)]
    return answer + next(iter(t.layout.stops), "")
