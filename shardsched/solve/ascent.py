"""The ascent: a chain of ever faster schedules of one grouping, each bought with the least memory.

[Note: the ascent] The budget ladder (`solve.ladder`) searches at a few fixed budgets only, and a
budget between two rungs must still get what its extra memory buys. The ascent walks from a rung's
schedule toward the next rung, one move at a time (a move of `solve.local`: one unit's strategy,
checkpointing or one AllGather's launch), taking first the moves that cost no memory (the fastest
first) and then the move of the most seconds saved per byte added: a greedy walk along the
time-memory front (the fractional knapsack's rule, Dantzig 1957). Every schedule it passes is a
point of the chain; a budget b takes the fastest point that fits it. The walk reads the next
rung's budget (`top`) and never b: the chain below b is the same for every b above it, which is
what keeps the ladder monotone. It is lazy (Minoux 1978): the moves are surveyed once, kept in a
heap by their gain per byte, and a move popped is scored again against the current schedule and
taken only while it still leads; a new survey (at most `SURVEYS`) starts when the heap is empty.
Work is counted in evaluations, as the local search's is ([Note: determinism] in `solve.search`).
"""
from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

from shardsched.solve.candidates import Choice, Problem
from shardsched.solve.effort import ahead_for
from shardsched.solve.local import Local, neighbours


SURVEYS = 2
"""Surveys of every move per chain: a third added 1-3 CPU s on 50-90-unit groupings of
`bench_plan_speed.py --deep --random 16 --seed 27` and changed no plan by more than 0.07%."""


class Point(NamedTuple):
    """One schedule of the chain: its seconds and peak as greedy's `Evaluator` scores them."""

    seconds: float
    peak: int
    choice: Choice


def _onto(p: Problem, moved: Choice, cur: Choice, base: Choice) -> Choice:
    """`moved` (a move from `base`) made on `cur`: every unit it changed takes all of its fields
    from `moved` (a strategy and its backward launch go together), the others `cur`'s."""
    full = [c._replace(ckpt=c.ckpt or (False,) * p.n) for c in (moved, cur, base)]
    changed = [any(f[i] != b[i] for f, b in zip(full[0], full[2])) for i in range(p.n)]
    fields = [tuple(m[i] if changed[i] else c[i] for i in range(p.n)) for m, c in zip(full[0], full[1])]
    return Choice(*fields[:3], fields[3] if any(fields[3]) else ())


def _faster_moves(s: Local, top: int) -> list[tuple[float, int, Choice]]:
    """(seconds saved, bytes added, schedule) of every single move that is faster and fits `top`:
    the seconds first, the peak only of the faster ones (the replay costs a quarter of the peak)."""
    out = []
    for i in range(s.p.n):
        for cand in neighbours(s.p, s.ch, i, ahead=s.ahead):
            r = s._score(cand, need_fit=True, faster=True)
            if r is None and s.left <= 0:
                return out
            if r is not None:
                out.append((r[0] - s.t, r[1] - s.peak, cand))
    return out


def _priority(dt: float, dpeak: int) -> tuple[int, float]:
    """Free moves (no more memory) first, fastest first; then the most seconds saved per byte."""
    return (0, dt) if dpeak <= 0 else (1, dt / dpeak)


def ascend(p: Problem, ch: Choice, *, top: int, evals: int, stop: int | None = None) -> list[Point]:
    """The chain from `ch` (which fits `top`) over moves that fit `top`, within `evals`
    evaluations; `stop`: end at the first point above it (the chain up to there is the same)."""
    s = Local(p, ch, budget=top, ahead=ahead_for(p.n), evals=evals)
    points, order = [Point(s.t, s.peak, s.ch)], itertools.count()
    for _ in range(SURVEYS):
        if s.left <= 0 or (stop is not None and s.peak > stop):
            break
        base = s.ch
        heap = [(_priority(dt, dpeak), next(order), moved) for dt, dpeak, moved in _faster_moves(s, top)]
        heapq.heapify(heap)
        took = False
        while heap and s.left > 0 and (stop is None or s.peak <= stop):
            _, _, moved = heapq.heappop(heap)
            cand = moved if s.ch == base else _onto(p, moved, s.ch, base)
            r = s._score(cand, need_fit=True, faster=True)
            if r is None:
                continue
            now = _priority(r[0] - s.t, r[1] - s.peak)
            if heap and now > heap[0][0]:  # no longer the best: back in the heap, as it now is
                heapq.heappush(heap, (now, next(order), moved))
                continue
            s.ch, s.t, s.peak = cand, *r
            points.append(Point(s.t, s.peak, s.ch))
            took = True
        if not took:
            break
    return points


__all__ = ["ascend", "Point"]
