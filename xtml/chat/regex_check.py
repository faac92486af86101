"""Regular expressions from templates, checked to run in linear time.

A template's ``[plugins.image] prompt`` is a Python regular expression that
runs on request input (the ``image_prompts`` option) and on parsed model
output. Python's ``re`` backtracks: a pattern such as ``^(a|aa)+$`` takes time
exponential in the input's length, ``^.*x.*y$`` quadratic. Loading a template
refuses such patterns, by a conservative static check on the pattern's
automaton (a pattern it accepts runs in linear time; it may refuse a few that
would too):

* no backreferences (``\\1``, ``(?P=name)``, ``(?(1)…)``), whose matching is
  not a regular-language problem at all;
* no lookaround holding an unbounded repeat (each test could scan to the end);
* no *exponential ambiguity*: no state the automaton can leave and return to
  along two different paths reading the same text (nested quantifiers such as
  ``(a+)+``, or a repeated alternation whose branches overlap, ``(a|aa)+``);
* no *polynomial ambiguity*: no two loops, one after the other, that can read
  the same text and are joined by a path that can read it too (``.*x.*``,
  ``\\d+\\d+``).

The automaton is the Thompson construction of the parse ``re`` itself makes;
character sets are exact for literals, ranges and the ``\\d \\w \\s`` classes,
and widened under ``IGNORECASE``. An end anchor (``$``, ``\\Z``) ends the
automaton (at most a newline can follow it); other anchors and atomic groups
are treated as if absent, which can only add paths, so the check stays on the
safe side.
"""

from __future__ import annotations

import bisect
import importlib
import re
from collections.abc import Iterable
from functools import cache
from typing import Any

__all__ = ["MAX_STATES", "RegexRisk", "check_pattern"]

_sre: Any = importlib.import_module("re._parser")
_MAXREPEAT: int = _sre.MAXREPEAT
_MAX_CHAR = 0x10FFFF

# Patterns whose automaton has more character states than this are refused
# as too large to check (the check's cost grows with the square of it); an
# image prompt pattern has a few dozen.
MAX_STATES = 600

Ranges = tuple[tuple[int, int], ...]


class RegexRisk(Exception):
    """Why a pattern may not run in linear time."""


# -- character sets as sorted, disjoint, inclusive ranges ---------------------------


def _norm(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _complement(r: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    pos = 0
    for lo, hi in r:
        if lo > pos:
            out.append((pos, lo - 1))
        pos = hi + 1
    if pos <= _MAX_CHAR:
        out.append((pos, _MAX_CHAR))
    return tuple(out)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


@cache
def _all_chars() -> str:
    # Surrogates too: a str may hold them, and ``re`` classifies them.
    return "".join(map(chr, range(_MAX_CHAR + 1)))


@cache
def _class(name: str, ascii_only: bool) -> Ranges:
    """The code points ``re`` puts in a class (``\\d``, ``\\w``, ``\\s``),
    found by ``re`` itself, so the two cannot disagree."""
    pat = re.compile({"DIGIT": r"\d+", "WORD": r"\w+", "SPACE": r"\s+", "LINEBREAK": r"\n+"}[name],
                     re.ASCII if ascii_only else 0)
    return tuple((m.start(), m.end() - 1) for m in pat.finditer(_all_chars()))


@cache
def _case_groups() -> tuple[tuple[int, ...], dict[int, int], list[Ranges]]:
    """Cased code points (sorted), each one's group, and the groups: chars
    that one ``IGNORECASE`` match may confuse (a wide approximation)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    # No code point past U+1FFFF has a case variant.
    for cp in range(0x20000):
        ch = chr(cp)
        variants = {ch.lower(), ch.upper(), ch.casefold(), ch.title()}
        for v in variants:
            if len(v) == 1 and v != ch:
                a, b = find(cp), find(ord(v))
                if a != b:
                    parent[a] = b
                parent.setdefault(cp, cp)
                parent.setdefault(ord(v), ord(v))
    members: dict[int, list[int]] = {}
    for cp in parent:
        members.setdefault(find(cp), []).append(cp)
    groups = [_norm((c, c) for c in m) for m in members.values()]
    group_of: dict[int, int] = {}
    for k, m in enumerate(members.values()):
        for c in m:
            group_of[c] = k
    return tuple(sorted(group_of)), group_of, groups


def _fold(r: Ranges) -> Ranges:
    cased, group_of, groups = _case_groups()
    extra: list[tuple[int, int]] = []
    for lo, hi in r:
        for c in cased[bisect.bisect_left(cased, lo) : bisect.bisect_right(cased, hi)]:
            extra.extend(groups[group_of[c]])
    return _norm([*r, *extra]) if extra else r


def _charset(op: str, av: Any, flags: int) -> Ranges:
    ascii_only = bool(flags & re.ASCII)
    if op == "LITERAL":
        r: Ranges = ((av, av),)
    elif op == "NOT_LITERAL":
        r = _complement(_fold(((av, av),)) if flags & re.IGNORECASE else ((av, av),))
        return r
    elif op == "ANY":
        return ((0, _MAX_CHAR),) if flags & re.DOTALL else _complement(((10, 10),))
    else:  # IN
        negate = False
        parts: list[tuple[int, int]] = []
        for iop, iav in av:
            name = str(iop)
            if name == "NEGATE":
                negate = True
            elif name == "LITERAL":
                parts.append((iav, iav))
            elif name == "RANGE":
                parts.append((iav[0], iav[1]))
            elif name == "CATEGORY":
                cat = str(iav).removeprefix("CATEGORY_")
                neg = cat.startswith("NOT_")
                base = _class(cat.removeprefix("NOT_").removeprefix("UNI_").removeprefix("LOC_"), ascii_only)
                parts.extend(_complement(base) if neg else base)
            else:
                raise RegexRisk(f"an unknown character class item ({name})")
        r = _norm(parts)
        if flags & re.IGNORECASE:
            r = _fold(r)
        return _complement(r) if negate else r
    return _fold(r) if flags & re.IGNORECASE else r


# -- the automaton -------------------------------------------------------------------


class _Nfa:
    """Thompson automaton: a state reads one character (``sets[i]`` not
    None) or none (a split); ``nxt`` holds its successors."""

    def __init__(self) -> None:
        self.sets: list[Ranges | None] = []
        self.nxt: list[list[int]] = []

    def state(self, cs: Ranges | None, nxt: list[int]) -> int:
        if len(self.sets) >= 4 * MAX_STATES:
            raise RegexRisk(f"it is too large to check (more than {4 * MAX_STATES} states once counted repeats "
                            "are expanded)")
        self.sets.append(cs)
        self.nxt.append(nxt)
        return len(self.sets) - 1

    def seq(self, items: Any, flags: int, after: int) -> int:
        entry = after
        for op, av in reversed(list(items)):
            entry = self.item(str(op), av, flags, entry)
        return entry

    def item(self, op: str, av: Any, flags: int, after: int) -> int:
        if op in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
            return self.state(_charset(op, av, flags), [after])
        if op == "AT":
            where = str(av)
            if where == "AT_END_STRING" or (where == "AT_END" and not flags & re.MULTILINE):
                # Nothing can be read past the end, but the one newline "$"
                # may stand before: what the pattern says after it cannot
                # loop.
                return self.state(None, [self.state(((10, 10),), [])] if where == "AT_END" else [])
            return after
        if op == "SUBPATTERN":
            _, add, remove, body = av
            return self.seq(body, (flags | add) & ~remove, after)
        if op == "ATOMIC_GROUP":
            return self.seq(av, flags, after)
        if op == "BRANCH":
            return self.state(None, [self.seq(alt, flags, after) for alt in av[1]])
        if op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, body = av
            if hi == _MAXREPEAT:
                loop = self.state(None, [])
                self.nxt[loop] = [self.seq(body, flags, loop), after]
                cur = loop
            else:
                cur = after
                for _ in range(hi - lo):
                    cur = self.state(None, [self.seq(body, flags, cur), after])
            for _ in range(lo):
                cur = self.seq(body, flags, cur)
            return cur
        if op in ("GROUPREF", "GROUPREF_EXISTS"):
            raise RegexRisk("it uses a backreference")
        if op in ("ASSERT", "ASSERT_NOT"):
            _, body = av
            if _unbounded(body):
                raise RegexRisk("a lookahead or lookbehind holds an unbounded repeat")
            return after
        raise RegexRisk(f"it uses {op}, which this check does not know")


def _unbounded(items: Any) -> bool:
    for op, av in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if av[1] == _MAXREPEAT or _unbounded(av[2]):
                return True
        elif name == "SUBPATTERN":
            if _unbounded(av[3]):
                return True
        elif name == "BRANCH":
            if any(_unbounded(alt) for alt in av[1]):
                return True
        elif name in ("ATOMIC_GROUP",):
            if _unbounded(av):
                return True
        elif name in ("ASSERT", "ASSERT_NOT"):
            if _unbounded(av[1]):
                return True
    return False


def _sccs(nodes: list[Any], succ: dict[Any, list[Any]]) -> dict[Any, int]:
    """Strongly connected components (iterative Tarjan): node → component."""
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    comp: dict[Any, int] = {}
    stack: list[Any] = []
    on: set[Any] = set()
    count = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, k = work[-1]
            out = succ.get(v, ())
            if k < len(out):
                work[-1] = (v, k + 1)
                w = out[k]
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp[w] = count
                    if w == v:
                        break
                count += 1
    return comp


def _epsilon_free(nfa: _Nfa, start: int) -> tuple[list[int], dict[int, list[tuple[int, int]]]]:
    """Character states reachable from ``start``, and for each source (-1 for
    the start, else a character state) the character states one character
    further, with how many distinct split paths lead there (1, or 2 for
    several)."""

    def reach(frm: int) -> list[tuple[int, int]]:
        # Count split paths from ``frm`` to each character state, capped at
        # 2; a split cycle means endless paths.
        seen: list[int] = []
        succ: dict[int, list[int]] = {}
        todo = [frm]
        visited = {frm}
        while todo:
            v = todo.pop()
            seen.append(v)
            if nfa.sets[v] is not None and v != frm:
                continue
            succ[v] = list(nfa.nxt[v])
            for w in succ[v]:
                if w not in visited:
                    visited.add(w)
                    todo.append(w)
        comp = _sccs(seen, succ)
        members: dict[int, list[int]] = {}
        for v in seen:
            members.setdefault(comp[v], []).append(v)
        cyclic = {comp[v] for v in seen if any(comp[w] == comp[v] for w in succ.get(v, ()))}
        # Paths into each component, in topological order (Tarjan numbers
        # components in reverse topological order); a cyclic one passes on
        # endless paths.
        into = {comp[frm]: 1}
        out: list[tuple[int, int]] = []
        for c in sorted(members, reverse=True):
            p = into.get(c, 0)
            if not p:
                continue
            if c in cyclic:
                p = 2
            for v in members[c]:
                if v not in succ:
                    out.append((v, p))
                    continue
                for w in succ[v]:
                    if comp[w] != c:
                        into[comp[w]] = min(2, into.get(comp[w], 0) + p)
        return out

    edges: dict[int, list[tuple[int, int]]] = {}
    states: list[int] = []
    todo = [-1]
    done: set[int] = set()
    while todo:
        s = todo.pop()
        if s in done:
            continue
        done.add(s)
        out: list[tuple[int, int]] = []
        for after in ([start] if s == -1 else nfa.nxt[s]):
            if nfa.sets[after] is not None:
                out.append((after, 1))
            else:
                out.extend(reach(after))
        merged: dict[int, int] = {}
        for t, m in out:
            merged[t] = min(2, merged.get(t, 0) + m)
        edges[s] = list(merged.items())
        for t in merged:
            if t not in done:
                states.append(t)
                todo.append(t)
    return states, edges


def _on_cycle(c: int, chars: Ranges, comp: dict[int, int], edges: dict[int, list[tuple[int, int]]],
              sets: list[Ranges | None]) -> set[int]:
    """States of component ``c`` on a cycle that reads only ``chars``."""
    succ: dict[int, list[int]] = {}
    nodes = [s for s in edges if s != -1 and comp[s] == c]
    for s in nodes:
        succ[s] = [t for t, _ in edges[s] if comp[t] == c and _intersect(sets[t] or (), chars)]
    sub = _sccs(nodes, succ)
    return {s for s in nodes if any(sub[t] == sub[s] for t in succ[s])}


def _ambiguity(nfa: _Nfa, start: int) -> str | None:
    states, edges = _epsilon_free(nfa, start)
    sets = nfa.sets
    succ = {s: [t for t, _ in out] for s, out in edges.items()}
    comp = _sccs([-1, *states], succ)
    # Two split paths to one state, on a cycle: exponential.
    for s, out in edges.items():
        for t, m in out:
            if m >= 2 and comp[t] == comp[s]:
                return "a repeat can read the same text in two ways (a nested or overlapping quantifier)"
    # Two different paths from a state back to itself reading one text: the
    # pair automaton's component of (q, q) holds a pair (a, b) with a != b.
    pairs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    todo = [(s, s) for s in states]
    while todo:
        p = todo.pop()
        if p in pairs:
            continue
        a, b = p
        nxt: list[tuple[int, int]] = []
        for ta, _ in edges.get(a, ()):
            sa = sets[ta]
            assert sa is not None
            for tb, _ in edges.get(b, ()):
                sb = sets[tb]
                assert sb is not None
                if _intersect(sa, sb):
                    nxt.append((ta, tb))
        pairs[p] = nxt
        todo.extend(q for q in nxt if q not in pairs)
        if len(pairs) > 50 * MAX_STATES * 4:
            return "it is too ambiguous to check"
    pcomp = _sccs(list(pairs), pairs)
    diagonal = {pcomp[(s, s)] for s in states if (s, s) in pcomp}
    for (a, b), c in pcomp.items():
        if a != b and c in diagonal:
            return "a repeat can read the same text in two ways (a nested or overlapping quantifier)"
    # Two loops in a row that can read one text, joined by a path that can
    # read it: polynomial.
    loops: dict[int, Ranges] = {}
    for s, out in edges.items():
        for t, _ in out:
            if s != -1 and comp[s] == comp[t]:
                cs = sets[t]
                assert cs is not None
                loops[comp[s]] = _norm([*loops.get(comp[s], ()), *cs])
    for ca, la in loops.items():
        for cb, lb in loops.items():
            common = _intersect(la, lb) if ca != cb else ()
            if not common:
                continue
            starts = _on_cycle(ca, common, comp, edges, sets)
            ends = _on_cycle(cb, common, comp, edges, sets)
            if not starts or not ends:
                continue
            # A path from one to the other along which ``common`` can be read?
            seen = set(starts)
            todo2 = list(starts)
            while todo2:
                s = todo2.pop()
                for t, _ in edges.get(s, ()):
                    ts = sets[t]
                    assert ts is not None
                    if t not in seen and _intersect(ts, common):
                        if t in ends:
                            return ("two repeats in a row can read the same text (as in .*x.*), which takes "
                                    "time quadratic or worse")
                        seen.add(t)
                        todo2.append(t)
    return None


def check_pattern(pattern: str, flags: int = 0) -> None:
    """Raise :class:`RegexRisk` saying why ``pattern`` may take more than
    linear time on some input; return if it cannot. ``re.error`` if it is not
    a regular expression."""
    parsed = _sre.parse(pattern, flags)
    flags = parsed.state.flags
    nfa = _Nfa()
    accept = nfa.state(None, [])
    start = nfa.seq(parsed, flags, accept)
    why = _ambiguity(nfa, start)
    if why is not None:
        raise RegexRisk(why)

