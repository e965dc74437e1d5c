"""The whole-space search against brute force over every grouping (not one grouping):
the plan equals the brute-force optimum, "optimal" is reported exactly when it is,
and the bound is a real lower bound when the work limit stops the search early."""
from __future__ import annotations

import pytest

from shardsched.core.types import Optimizer, Plan, Precision
from shardsched.plan.spec import parse_strategy_spec
from shardsched.solve.auto import auto_plan
from shardsched.solve.brute import brute_all
from shardsched.solve.candidates import candidate_problems, compositions
from shardsched.solve.search import OPTIMAL_TOL, Effort

from tests.solve.test_milp_vs_brute import CLUSTER, KW, OVERLAP, budgets, synth

NO_MILP = Effort(milp_units=0)
"""Greedy schedules and bounds only: the search stops short of a proof."""


def plan(prof, cluster, budget, effort=Effort()) -> Plan:
    return auto_plan(prof, cluster, spec=parse_strategy_spec("auto"), memory_budget_bytes=budget,
                     precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM, effort=effort)


def check_honest(p: Plan, optimum: float) -> bool:
    """The status against the brute-force optimum; returns whether the plan is optimal."""
    s = p.predicted.step_seconds
    assert s >= optimum * (1 - 1e-9)
    assert p.solver.bound <= optimum * (1 + 1e-9)  # a lower bound over the whole space
    assert p.solver.gap == pytest.approx((s - p.solver.bound) / s, abs=1e-12)
    is_optimal = s <= optimum * (1 + 1e-9)
    if p.solver.status == "optimal":
        assert is_optimal and p.solver.gap <= OPTIMAL_TOL
    else:
        assert "bound" in p.solver.status and "gap" in p.solver.status
        assert p.solver.gap > OPTIMAL_TOL  # not optimal, or not proven: never a silent "optimal"
    return is_optimal


CASES = [(seed, cluster) for seed in (0, 1, 5) for cluster in (OVERLAP, CLUSTER)]
OPTIMA: dict = {}


def optima(seed, cluster) -> list[tuple[int, float]]:
    """(budget, brute-force optimum over every grouping) per budget, cached across tests."""
    if (seed, id(cluster)) not in OPTIMA:
        problems = candidate_problems(synth(4, seed), cluster, **KW)
        assert len(problems) == len(list(compositions(4))) == 8  # brute force sees every grouping
        OPTIMA[seed, id(cluster)] = [(b, brute_all(problems, budget=b)[1].seconds) for b in budgets(problems)]
    return OPTIMA[seed, id(cluster)]


@pytest.mark.parametrize("seed,cluster", CASES, ids=[f"{s}-{'overlap' if c is OVERLAP else 'blocking'}"
                                                     for s, c in CASES])
def test_plan_is_the_optimum_over_every_grouping(seed, cluster):
    for budget, best in optima(seed, cluster):
        full = plan(synth(4, seed), cluster, budget)
        assert full.predicted.step_seconds == pytest.approx(best, rel=1e-9)
        assert full.solver.status == "optimal" and full.solver.search_space["groupings"] == 8
        assert check_honest(full, best)


def test_a_search_stopped_short_says_so():
    """Without the MILP (greedy schedules and O(n) bounds only) some plans miss the
    optimum or cannot prove it: each says so, with a bound below the optimum."""
    proven = []
    for seed, cluster in CASES:
        for budget, best in optima(seed, cluster):
            p = plan(synth(4, seed), cluster, budget, NO_MILP)
            proven.append(check_honest(p, best) and p.solver.status == "optimal")
    assert not all(proven)
