"""Plans monotone in the budget across separate runs, by construction (issue 27, part 2).

[Note: the budget ladder] One `auto_plan` run at budget b and another at b' > b need not agree:
the search is heuristic, and its work (starts, polish, MILP) depends on the budget, so the run at
b' can end slower (60 layers on 512 A100s: 33.512 GiB -> 2.5418 s, 33.548 GiB -> 2.6855 s).
`tradeoff` is monotone because it passes every schedule upward; a single run cannot, since it
cannot know the runs at smaller budgets. So `ladder_plan` fixes the budgets at which it searches:
the rungs r_0 < r_1 < ... depend on the model and cluster only (r_0: the least-memory figure over
every grouping, `least_memory_floor`; then x `RATIO` up to the device's memory), each rung's
search is seeded with every schedule the rungs below found (`solve.search` [Note: monotone]), and
the answer at b is the fastest schedule found at the rungs <= b (each fits r_k <= b). For b < b',
the rungs <= b' include those <= b, so the answer at b' is never slower: no tolerance, whether or
not either is "optimal". An answer between rungs searches no budget above the rung below it, so
it leaves up to RATIO - 1 of the budget unused, and a run costs one search per rung below b (on
the deep configurations of bench/bench_plan_speed.py: 1-11 CPU s each, times the
rungs; measured: 10-14 rungs and 26-36 CPU s on a 40-layer GPT over 128 H100s). That is why `auto_plan` (the `plan` command) does not use it: it is for callers that need
the guarantee (`shardsched.solve.ladder.ladder_plan`); the bound it reports is
`milp.lower_bound` at b over every grouping (valid at b; the rungs' bounds are not).
"""
from __future__ import annotations

import time

from shardsched.cost.device import Cluster
from shardsched.core.types import Optimizer, Plan, Precision
from shardsched.plan.spec import StrategySpec
from shardsched.profile.types import Profile
from shardsched.sim.memory import step_memory
from shardsched.solve import milp
from shardsched.solve.auto import auto_search, declared_space, plan_of
from shardsched.solve.greedy import least_memory
from shardsched.solve.search import Effort

RATIO = 2 ** 0.25
"""Each rung is this much above the one below (19%)."""


def least_memory_floor(problems) -> int:
    """The least peak of any grouping's least-memory schedule: nothing fits below it."""
    return min(max(m.total for m in step_memory(p.scenario(least_memory(p)))) for p in problems)


def rungs(floor: int, top: int) -> list[int]:
    out = [floor]
    while out[-1] * RATIO < top:
        out.append(int(out[-1] * RATIO))
    return out


def ladder_plan(profile: Profile, cluster: Cluster, *, spec: StrategySpec, precision: Precision,
                optimizer: Optimizer, memory_budget_bytes: int | None, effort: Effort = Effort()) -> Plan:
    """The fastest schedule the budget ladder found at rungs at or below the budget ([Note: the
    budget ladder]): monotone in the budget across separate runs."""
    t0 = time.perf_counter()
    budget = memory_budget_bytes if memory_budget_bytes is not None else cluster.device.memory_bytes
    _, problems, _ = declared_space(profile, cluster, spec=spec, precision=precision, optimizer=optimizer)
    floor = least_memory_floor(problems)
    if budget < floor:  # nothing fits: the planner's own message
        auto_search(profile, cluster, spec=spec, precision=precision, optimizer=optimizer, budget=budget,
                    effort=effort)
    ladder = [r for r in rungs(floor, max(budget, cluster.device.memory_bytes)) if r <= budget]
    seeds: tuple = ()
    for r in ladder:
        found, base, problems, pins = auto_search(profile, cluster, spec=spec, precision=precision,
                                                  optimizer=optimizer, budget=r, effort=effort, seeds=seeds)
        seeds = tuple(o.best for o in found.outcomes.values() if o.best) + (found.best,) + seeds
    best = min(seeds, key=lambda s: (s.seconds, s.peak))
    bound = min(min(milp.lower_bound(p, budget) for p in problems), best.seconds)
    found = found._replace(best=best, bound=bound, cut=False, notes=found.notes + (
        f"budget ladder: the fastest schedule of {len(ladder)} searches at fixed budgets from "
        f"{ladder[0] / 2**30:.2f} to {ladder[-1] / 2**30:.2f} GiB (x{RATIO:.3f} apart), each seeded with those "
        "below: more budget never gives a slower plan",))
    return plan_of(found, profile, base=base, problems=problems, pins=pins, effort=effort,
                   memory_budget_bytes=memory_budget_bytes, precision=precision, optimizer=optimizer, t0=t0)


__all__ = ["ladder_plan", "rungs", "RATIO"]
