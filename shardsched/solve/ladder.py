"""Plans monotone in the budget across separate runs, by construction (issue 27, part 2).

[Note: the budget ladder] One search at budget b and another at b' > b need not agree: the search
is heuristic, and its work (starts, polish, MILP) depends on the budget, so the run at b' can end
slower (60 layers on 512 A100s: 33.512 GiB -> 2.5418 s, 33.548 GiB -> 2.6855 s). `tradeoff` is
monotone because it passes every schedule upward; a single run cannot know the runs at smaller
budgets, so `ladder_plan` fixes where it searches. The rungs r_0 < r_1 < ... depend on the model
and cluster only (r_0: the least-memory figure over every grouping, `least_memory_floor`; then
x `RATIO`), rung k's search depends on k and the rungs below only (the same effort at every rung,
`rung_effort`; seeded with every schedule the rungs below found, `solve.search` [Note: monotone]),
and the answer at b is the fastest of (a) the schedules found at rungs <= b (each fits r_k <= b)
and (b) the plans `--strategy` can name that fit b (`solve.named`: a fixed set, so its fitting
part only grows with b; taken as scored, not polished, since a polish at b depends on b).
For b < b', the rungs <= b' include those <= b, searched identically, and the named plans fitting
b fit b': the answer at b' is never slower, with no tolerance and whether or not either is proven.

Rejected: answering b from the rungs below plus a search at b seeded from them. Two budgets between
the same rungs then get two searches from the same seeds, and the larger can end slower.

Cost: a rung searches every grouping's starts and polishes the lead, MILPs on small groupings only (`rung_effort`;
per-grouping constants built once, `candidates.once`), so a run costs about (rungs below b) x
(starts + an eighth of a polish), plus the named pass at b; an answer between rungs leaves up to
RATIO - 1 of the budget unsearched (`python bench/bench_plan_speed.py --deep --random 16 --seed 27
--monotone` prints both against the 10x search).
"""
from __future__ import annotations

import time

from shardsched.cost.device import Cluster
from shardsched.core.types import Optimizer, Plan, Precision
from shardsched.plan.spec import StrategySpec
from shardsched.profile.types import Profile
from shardsched.sim.memory import step_memory
from shardsched.solve import milp
from shardsched.solve.auto import InfeasibleBudget, auto_search, declared_space, infeasible_message, plan_of
from shardsched.solve.greedy import least_memory
from shardsched.solve.named import one_override_plans
from shardsched.solve.effort import Effort
from shardsched.solve.search import Search, search

RATIO = 2 ** (1 / 5)
"""Each rung is this much above the one below (15%)."""


def least_memory_floor(problems) -> int:
    """The least peak of any grouping's least-memory schedule: nothing fits below it."""
    return min(max(m.total for m in step_memory(p.scenario(least_memory(p)))) for p in problems)


def rungs(floor: int, top: int) -> list[int]:
    """The fixed budgets at or below `top`: floor x RATIO^k (independent of `top` but for where it stops)."""
    out = [floor]
    while int(out[-1] * RATIO) <= top:
        out.append(int(out[-1] * RATIO))
    return out


def rung_effort(effort: Effort) -> Effort:
    """A rung's search: starts (`Effort.least_starts` off: a grouping seeded from below skips the
    least-memory starts), the lead's polish at an eighth of the local work, MILPs on groupings of up
    to `light_units` units only (small and exact: without them seed 27's r11, 4 units, ended 9.6%
    behind its 10x search, 0.4% with them, in less time), no contenders and no LP bounds (the
    ladder's bound is `milp.lower_bound` at the budget)."""
    small = effort.light_units
    return effort._replace(milp_units=small, lead_units=small, narrow_units=0, bound_units=0, contenders=1,
                           least_starts=False, local_work=effort.local_work // 8)


def climb(problems, base, floor: int, budget: int, effort: Effort) -> tuple[Search, tuple, int]:
    """The rungs' searches from `floor` up to `budget`, each seeded with every schedule found below
    it: the last search, every schedule found, and how many rungs."""
    ladder = rungs(floor, budget)
    seeds, found, each = (), None, rung_effort(effort)
    for r in ladder:
        at = search(problems, budget=r, base=base, seeds=seeds, effort=each)
        if at is not None:  # None: nothing the rung's search starts from fits (the answer comes from above)
            found = at
            seeds = tuple(o.best for o in at.outcomes.values() if o.best) + (at.best,) + seeds
    return found, seeds, len(ladder)


def ladder_plan(profile: Profile, cluster: Cluster, *, spec: StrategySpec, precision: Precision,
                optimizer: Optimizer, memory_budget_bytes: int | None, effort: Effort = Effort()) -> Plan:
    """The fastest of the budget ladder's schedules at rungs at or below the budget and the
    fitting plans `--strategy` names ([Note: the budget ladder]): monotone in the budget."""
    t0 = time.perf_counter()
    budget = memory_budget_bytes if memory_budget_bytes is not None else cluster.device.memory_bytes
    base, problems, pins = declared_space(profile, cluster, spec=spec, precision=precision, optimizer=optimizer)
    kw = dict(pins=pins, precision=precision, optimizer=optimizer)
    floor = least_memory_floor(problems)
    if budget < floor:
        raise InfeasibleBudget(infeasible_message(profile, cluster, budget=budget, problems=problems, **kw))
    found, seeds, count = climb(problems, base, floor, budget, effort)
    if found is None:  # no rung's search found a schedule: the one search at the budget says why
        found = auto_search(profile, cluster, spec=spec, precision=precision, optimizer=optimizer, budget=budget,
                            effort=effort)[0]
        seeds = (found.best,)
    best = min(seeds + tuple(s for s in base if s.peak <= budget), key=lambda s: (s.seconds, s.peak))
    named, plans = one_override_plans(profile, cluster, budget=budget, best=best.seconds,
                                      word_peaks={s.name: s.peak for s in base}, **kw)
    notes = (f"budget ladder: the fastest schedule of {count} searches at fixed budgets x{RATIO:.3f} apart from "
             f"the least-memory figure up to this budget, each seeded with those below, and of the plans "
             "--strategy names: more budget never gives a slower plan",)
    if named is not None:
        best, notes = named, notes + (f"--strategy '{named.name}' ({named.seconds:.6g} s)",)
    bound = min(min(milp.lower_bound(p, budget) for p in problems), best.seconds)
    found = found._replace(best=best, bound=bound, cut=False, named=plans, notes=found.notes + notes)
    return plan_of(found, profile, base=base, problems=problems, pins=pins, effort=effort,
                   memory_budget_bytes=memory_budget_bytes, precision=precision, optimizer=optimizer, t0=t0)


__all__ = ["ladder_plan", "rungs", "RATIO", "rung_effort"]
