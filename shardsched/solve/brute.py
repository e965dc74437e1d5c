"""Brute force over every strategy and launch point of a grouping (tests only).

Each candidate is replayed by the simulator itself (`sim.timeline.replay`,
`sim.memory.step_memory`), so it checks the MILP against the ground truth
rather than against a second model. Exponential: keep to <= 5 units.
"""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple

from shardsched.solve.candidates import Choice, Problem
from shardsched.sim.memory import step_memory
from shardsched.sim.timeline import replay


class BruteResult(NamedTuple):
    choice: Choice | None
    seconds: float
    peak: int
    evaluated: int


def _launch_options(p: Problem, strategies) -> list[list]:
    n = p.n
    fwd = [range(i + 1) for i in range(n)]
    bwd = [range(n, 2 * n - i) if s.gathers_for_backward else [None] for i, s in enumerate(strategies)]
    return fwd + bwd


def _ckpt_options(p: Problem):
    if not p.checkpointable:
        return [()]
    options = [p.checkpoint_modes(i) or (False,) for i in range(p.n)]  # never the root
    return [c if any(c) else () for c in itertools.product(*options)]


def brute(p: Problem, *, budget: int) -> BruteResult:
    """Fastest fitting (strategies, launches) of one grouping; ties keep the first."""
    best, count = BruteResult(None, math.inf, 0, 0), 0
    for strategies, ckpt in itertools.product(itertools.product(*p.allowed), _ckpt_options(p)):
        for launch in itertools.product(*_launch_options(p, strategies)):
            ch = Choice(tuple(strategies), tuple(launch[:p.n]), tuple(launch[p.n:]), ckpt)
            sc = p.scenario(ch)
            count += 1
            t = replay(sc).step_seconds
            if t >= best.seconds:
                continue
            top = max(m.total for m in step_memory(sc))
            if top <= budget:
                best = BruteResult(ch, t, top, 0)
    return best._replace(evaluated=count)


def brute_all(problems: list[Problem], *, budget: int) -> tuple[Problem | None, BruteResult]:
    """The best over several groupings."""
    best_p, best = None, BruteResult(None, math.inf, 0, 0)
    for p in problems:
        r = brute(p, budget=budget)
        if r.seconds < best.seconds:
            best_p, best = p, r
    return best_p, best
