"""Rules of s9 that must not change answers where they only save work, and the size rule of
the narrowed lead MILP: remembered evaluations in the local search (`solve.local`, [Note:
evaluations remembered]) give the same schedules and the same work count as evaluating every
schedule afresh, on the instances of tests/solve/test_local_vs_brute.py; `Effort.narrow` gives
the windows its docstring states."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from shardsched.solve import local
from shardsched.solve.greedy import Evaluator, least_memory
from shardsched.solve.search import Effort

from tests.solve.test_local_vs_brute import instances


class Forgetful(local.Local):
    """The local search without its memory: every schedule evaluated afresh."""

    def _entry(self, ch):
        return [self.ev.seconds(ch), None]

    def _peak(self, ch):
        return self.ev.peak(ch)


def _run(cls, p, ch, *, budget, evals):
    s = cls(p, ch, budget=budget, ahead=p.n, evals=evals)
    local._descend(s)
    while s.left > 0 and local._kick(s):
        pass
    return s.ch, s.t, s.left


@pytest.mark.parametrize("family", ["one-node", "levers"])
def test_remembered_evaluations_change_no_answer(family):
    compared = remembered = 0
    for p, budget in instances(family):
        start = least_memory(p)
        if Evaluator(p).peak(start) > budget:
            continue
        for evals in (7, 60, 2000):  # cut mid-descent, mid-kick, and run out
            mem = local.Local(p, start, budget=budget, ahead=p.n, evals=evals)
            assert _run(local.Local, p, start, budget=budget, evals=evals) == \
                _run(Forgetful, p, start, budget=budget, evals=evals)
            local._descend(mem)
            remembered += len(mem.known) < evals - mem.left  # some evaluation was a repeat
            compared += 1
    assert compared >= 16 and remembered >= 1


@pytest.mark.parametrize("n,scale,steps", [
    (20, 1, 0), (21, 1, 6), (42, 1, 3), (64, 1, 2), (65, 1, 2), (74, 1, 2), (80, 1, 2), (81, 1, 0),
    (97, 1, 0), (74, 10, 0), (200, 10, 0), (201, 10, 2), (800, 10, 2), (801, 10, 0)])
def test_narrowed_lead_windows(n, scale, steps):
    """lead_launches // (2n) steps, at least 2, for leads above lead_units up to narrow_units
    (both times the scale); 0 (full window, or no lead MILP) elsewhere."""

    assert Effort(scale=scale).narrow(SimpleNamespace(n=n)) == steps  # it reads the size only
