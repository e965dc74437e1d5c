"""The whole-space search against brute force over every grouping (not one grouping):
the plan equals the brute-force optimum, "optimal" is reported exactly when it is,
and the bound is a real lower bound when the work limit stops the search early."""
from __future__ import annotations

import pytest

from shardsched.core.types import Optimizer, Plan, Precision
from shardsched.plan.spec import parse_strategy_spec
from shardsched.solve.auto import auto_plan, auto_search
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


@pytest.mark.parametrize("seed", [0, 2])
def test_grouping_bound_is_below_its_brute_force_optimum(seed):
    """`milp.lower_bound` (compute with the least recomputation that fits, or the channel)
    never exceeds the best fitting schedule, on instances where checkpointing buys memory."""
    from shardsched.solve import milp
    from shardsched.solve.brute import brute
    from tests.solve.test_levers_vs_brute import MULTI, budgets as lever_budgets, problems

    for p in problems(seed, MULTI):
        for budget in lever_budgets(p):
            best, lb = brute(p, budget=budget).seconds, milp.lower_bound(p, budget)
            assert lb <= best * (1 + 1e-12)


@pytest.mark.parametrize("seed", [0, 2])
def test_relaxation_is_below_its_brute_force_optimum(seed):
    """`milp.relaxation_bound` (the MILP's LP relaxation) never exceeds the best fitting
    schedule, with the unslowed step capped at that schedule's step or not; it is +inf only
    where nothing fits, and it is above `milp.lower_bound` somewhere (else it would buy nothing)."""
    from shardsched.solve import milp
    from shardsched.solve.brute import brute
    from tests.solve.test_levers_vs_brute import MULTI, budgets as lever_budgets, problems

    tighter = 0
    for p in problems(seed, MULTI):
        for budget in lever_budgets(p):
            found = brute(p, budget=budget)
            free = milp.relaxation_bound(p, budget=budget)
            assert found.choice is None or free < float("inf")
            if found.choice is None:
                continue
            capped = milp.relaxation_bound(p, budget=budget, t_ub=found.seconds)
            assert free <= found.seconds * (1 + 1e-9) and capped <= found.seconds * (1 + 1e-9)
            tighter += free > milp.lower_bound(p, budget) * (1 + 1e-9)
    assert tighter >= 1


def test_bound_counts_the_recomputation_a_budget_forces():
    """Llama-2-70B on 512 A100s at 40 GiB: ~13 GiB of activations per two-layer unit, so
    almost every unit must be checkpointed; the bound charges that recomputation (~3.75 s,
    a quarter of the compute) and meets the all-checkpointed plan to within 10%."""
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.models.spec import PRESETS
    from shardsched.profile.analytic import analytic_profile
    from shardsched.solve import milp

    prof = analytic_profile(PRESETS["llama-70b"], micro_batch=1, seq=4096, device=DEVICES["a100"])
    cl = Cluster(world=512, gpus_per_node=8, device=DEVICES["a100"])
    p = candidate_problems(prof, cl, **KW)[0]._replace(checkpointable=True)
    free, tight = milp.lower_bound(p), milp.lower_bound(p, 40 << 30)
    c = milp.costs_of(p)
    # compute-bound: the collectives all run beside compute, slowing it by the SM share they hold
    comm = sum(min(c.agf[i][k] + c.agb[i][k] + c.red[i][k] for k in p.allowed[i]) for i in range(p.n))
    assert comm < sum(c.fwd) + sum(c.bwd)
    assert free == pytest.approx(sum(c.fwd) + sum(c.bwd) + DEVICES["a100"].comm_sm_share * comm +
                                 sum(min(s[k] for k in a) for s, a in zip(c.shard, p.allowed)) * c.opt_per_param)
    assert 0.2 * sum(c.fwd) < tight - free < sum(c.fwd)


NARROW = Effort(milp_units=0, lead_units=1, lead_launches=16)
"""Only the lead grouping gets a MILP, over launch windows of 16 // (2n) steps (2 on 4 units,
4 on 2): `Effort.lead_launches`, the rule the 21-80-unit lead groupings meet at scale 1."""


def test_a_narrowed_milp_bounds_nothing_the_relaxations_do():
    """The lead grouping's MILP over narrowed launch windows finds schedules (never slower than
    without it); its own dual bound covers the narrowed space only and is dropped. LP relaxations
    over the whole window (`Effort.bound_units`) bound the groupings no full-window MILP bounded:
    the plan stays honest with them or without them, the schedule is the same, and the bound is
    never looser. They run last, least bound first, only while that can raise the plan's bound
    ([Note: bounds last]): the plan's bound is the one relaxing every such grouping would give."""
    from shardsched.solve import milp, search

    tighter = 0
    kw = dict(spec=parse_strategy_spec("auto"), precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
    for seed, cluster in CASES:
        for budget, best in optima(seed, cluster):
            p, q = plan(synth(4, seed), cluster, budget, NARROW), plan(synth(4, seed), cluster, budget, NO_MILP)
            r = plan(synth(4, seed), cluster, budget, NARROW._replace(bound_units=0))
            check_honest(p, best)
            check_honest(r, best)
            assert p.predicted.step_seconds <= q.predicted.step_seconds * (1 + 1e-12)
            assert p.predicted.step_seconds == r.predicted.step_seconds
            assert p.solver.bound >= r.solver.bound * (1 - 1e-12)
            # every grouping relaxed, eagerly, from the search that relaxed none
            a, _, problems, _ = auto_search(synth(4, seed), cluster, budget=budget,
                                            effort=NARROW._replace(bound_units=0), **kw)
            eager = []
            for g in problems:
                o = a.outcomes[search.key(g)]
                relaxed = milp.relaxation_bound(g, budget=budget, ahead=search.ahead_for(g.n), t_ub=a.best.seconds)
                b = max(o.bound, relaxed) if o.relax else o.bound
                eager.append(min(b, o.best.seconds) if o.best else b)
                tighter += o.relax and b > milp.lower_bound(g, budget) * (1 + 1e-9)
            assert p.solver.bound == pytest.approx(min(min(eager), a.best.seconds), rel=1e-12, abs=0)
    assert tighter >= 3  # the relaxation over `milp.lower_bound` on some grouping
