"""The local search (`solve.local`) against brute force on small instances: what it returns
fits (by the simulator), is never slower than its start nor faster than the optimum, and,
from the least-memory schedule (every unit full_shard, checkpointed, no prefetch: the
farthest start there is), it reaches the brute-force optimum over strategies,
checkpointing and launch points."""
from __future__ import annotations

import pytest

from shardsched.core.types import Checkpoint

from shardsched.solve.baselines import score
from shardsched.solve.brute import brute
from shardsched.solve.candidates import candidate_problems
from shardsched.solve.greedy import Evaluator, least_memory
from shardsched.solve.local import polish

from tests.solve.test_levers_vs_brute import BLOCKING, FEW, MULTI, budgets as lever_budgets, problems as lever_problems
from tests.solve.test_selective_vs_brute import FEW as SAC_FEW, _budgets as sac_budgets, _problems as sac_problems
from tests.solve.test_milp_vs_brute import KW, OVERLAP, budgets, synth


def instances(family: str):
    """(problem, budget) pairs: 3-unit groupings, one node (three strategies, launches) or
    two nodes (node-aware strategies, checkpointing that saves memory)."""
    if family == "levers":
        return [(p, b) for seed in (0, 3) for p in lever_problems(seed, MULTI) if p.n == 3 for b in lever_budgets(p)]
    out = []
    for seed in range(4):
        for p in candidate_problems(synth(3, seed), OVERLAP, **KW):
            if p.n == 3:
                out += [(p, b) for b in budgets([p])]
    return out


@pytest.mark.parametrize("family", ["one-node", "levers"])
def test_polish_from_least_memory_reaches_the_brute_force_optimum(family):
    reached, cases = 0, 0
    for p, budget in instances(family):
        start = least_memory(p)
        if Evaluator(p).peak(start) > budget:
            continue
        opt = brute(p, budget=budget).seconds
        first = score("least", p, start)
        s = score("local", p, polish(p, start, budget=budget, ahead=p.n, evals=2000))
        assert s.peak <= budget  # the simulator's peak, not the evaluator's
        assert opt * (1 - 1e-9) <= s.seconds <= first.seconds
        cases += 1
        reached += s.seconds <= opt * (1 + 1e-9)
    assert cases >= 8
    assert reached >= 0.9 * cases, (reached, cases)


def test_polish_respects_its_work_limit():
    """No evaluations, no change; the same inputs give the same schedule."""
    p = lever_problems(0, MULTI)[-1]
    assert p.allowed == (FEW,) * p.n
    budget = lever_budgets(p)[1]
    start = least_memory(p)
    assert polish(p, start, budget=budget, ahead=p.n, evals=0) == start
    a = polish(p, start, budget=budget, ahead=p.n, evals=300)
    assert a == polish(p, start, budget=budget, ahead=p.n, evals=300) and a != start


def test_polish_reaches_selective_checkpointing_optima():
    """Layers whose selective form keeps some activations (tests/solve/test_selective_vs_brute.py):
    from the least-memory schedule (every unit fully checkpointed), the moves between none, full
    and selective reach the brute-force optimum over strategies, the three modes and launches,
    where that optimum checkpoints some unit selectively (without the selective move, none of
    these 16 optima was reached: 0.6-3.3% slower)."""
    reached, cases = 0, 0
    for seed, cluster in ((7, BLOCKING), (8, MULTI), (8, BLOCKING), (11, MULTI), (11, BLOCKING)):
        for p in sac_problems(seed, cluster, SAC_FEW):
            for budget in sac_budgets(p) if p.n == 3 else ():
                opt = brute(p, budget=budget)
                start = least_memory(p)
                if opt.choice is None or Checkpoint.SELECTIVE not in opt.choice.ckpt:
                    continue
                s = score("local", p, polish(p, start, budget=budget, ahead=p.n, evals=2000))
                assert s.peak <= budget
                assert opt.seconds * (1 - 1e-9) <= s.seconds <= score("least", p, start).seconds
                cases += 1
                reached += s.seconds <= opt.seconds * (1 + 1e-9)
    assert cases >= 12
    assert reached >= 0.9 * cases, (reached, cases)
