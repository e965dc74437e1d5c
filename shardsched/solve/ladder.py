"""Plans monotone in the budget across separate runs, by construction (issue 27, part 2).

[Note: the budget ladder] One search at budget b and another at b' > b need not agree: the search
is heuristic, and its work (starts, polish, MILP) depends on the budget, so the run at b' can end
slower (60 layers on 512 A100s: 33.512 GiB -> 2.5418 s, 33.548 GiB -> 2.6855 s). `tradeoff` is
monotone because it passes every schedule upward; a single run cannot know the runs at smaller
budgets, so `ladder_plan` answers b from work that does not depend on b:
  1. rungs r_0 < r_1 < ... fixed by the model and cluster (r_0: the least-memory figure over every
     grouping, `least_memory_floor`; then x `RATIO`); rung k's search depends on k and the rungs
     below only (`rung_effort`, the same at every rung; seeded with what was found below, and
     `solve.search` never returns worse than a seed that fits: [Note: monotone]);
  2. from each grouping's schedule at rung k within `NEAR` of the rung's best, the ascent toward
     r_(k+1) ([Note: the ascent] in `solve/ascent.py`): a chain of schedules that reads r_(k+1),
     never b; b takes the chain up to its first point above b, and the chain's fastest point
     seeds rung k+1;
  3. the plans `--strategy` names (`solve.named`: a fixed set, taken as scored);
  4. the exact optimum at b of every grouping of up to `Effort.light_units` units (HiGHS run to
     completion: the optimum of a fixed space only falls as b grows), solved only where its bound
     (`milp.lower_bound`) is below the best of 1-3, which leaves the minimum unchanged.
The answer at b is the fastest of 1-4 that fits b. For b < b': the rungs <= b' include those <= b,
searched identically; the chains b' reads include the points b reads; the named plans that fit b
fit b'; and each exact optimum at b' is no slower than at b: the answer at b' is never slower,
with no tolerance and whether or not either is proven.

Rejected: answering b from the rungs below plus a search at b seeded from them. Two budgets between
the same rungs then get two searches from the same seeds, and the larger can end slower. Rungs
x1.149 apart with no chain (the ladder before): a budget up to 15% above its rung searched nothing
there, and 13-20 rungs from the least-memory figure cost 5-24 CPU s (`bench_plan_speed.py --deep
--random 16 --seed 27`, session 27: 6 of 16 within 1% of the 10x search, the worst 11.7% behind).

Cost: about (rungs below b: log2 of b over the least-memory figure, 1-4 on the bench) x (a light
search + one or two chains of up to `Effort.local_work` unit-evaluations), the named pass at b, and
the exact MILPs the bounds leave (0.01-0.3 CPU s each on the bench).
"""
from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

from shardsched.cost.device import Cluster
from shardsched.core.types import Optimizer, Plan, Precision
from shardsched.plan.spec import StrategySpec
from shardsched.profile.types import Profile
from shardsched.sim.memory import step_memory
from shardsched.solve import milp
from shardsched.solve.auto import InfeasibleBudget, auto_search, declared_space, infeasible_message, plan_of
from shardsched.solve.greedy import least_memory
from shardsched.solve.named import one_override_plans
from shardsched.solve.ascent import Point, ascend
from shardsched.solve.baselines import Scored, score
from shardsched.solve.candidates import Problem
from shardsched.solve.effort import Effort, ahead_for
from shardsched.solve.search import Search, key, search

RATIO = 2.0
"""Each rung is this much above the one below; the ascent fills the budgets between."""
NEAR = 0.02
"""Groupings whose schedule at a rung is within this fraction of the rung's best are ascended."""
EXACT_NODES = 10 ** 9
"""HiGHS's node limit for the exact optima of small groupings: never reached (a few hundred at most
on 8 units), so each is solved to completion."""


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


class Climb(NamedTuple):
    """What the rungs up to a budget found: the last rung's search (None: none found a schedule),
    every schedule the searches found, the chains' points (`solve.ascent.Point`, with their
    grouping), and how many rungs."""

    found: Search | None
    seeds: tuple[Scored, ...]
    points: tuple[tuple[Point, Problem], ...]
    rungs: int


def climb(problems, base, floor: int, budget: int, effort: Effort) -> Climb:
    """The rungs' searches from `floor` up to `budget`, each seeded with every schedule found
    below it, and from each the ascent toward the next rung ([Note: the budget ladder], 1-2)."""
    ladder = rungs(floor, budget)
    seeds, found, points, each = (), None, [], rung_effort(effort)
    for k, r in enumerate(ladder):
        at = search(problems, budget=r, base=base, seeds=seeds, effort=each)
        if at is None:  # nothing the rung's search starts from fits (the answer comes from above)
            continue
        found, bests = at, {}
        for s in (at.best, *(o.best for o in at.outcomes.values() if o.best)):
            bests.setdefault(key(s.problem), s)
        last = k == len(ladder) - 1  # its chain ends at the budget's first point above it
        ascended = []
        for s in bests.values():
            if s.seconds <= at.best.seconds * (1 + NEAR):
                chain = ascend(s.problem, s.choice, top=int(r * RATIO), evals=effort.local_evals(s.problem),
                               stop=budget if last else None)
                points += [(pt, s.problem) for pt in chain]
                lead = min(chain, key=lambda pt: (pt.seconds, pt.peak))
                ascended.append(s if lead.choice == s.choice else score("greedy", s.problem, lead.choice))
        seeds = (*ascended, *bests.values(), *seeds)
    return Climb(found, seeds, tuple(points), len(ladder))


def fastest(c: Climb, base: list[Scored], budget: int) -> Scored | None:
    """The fastest schedule the climb found and the uniform plans that fits `budget`, as the
    simulator scores it (the chains' points are greedy's `Evaluator`'s, which it matches)."""
    fits = [(pt.seconds, pt.peak, i) for i, (pt, _) in enumerate(c.points) if pt.peak <= budget]
    known = [s for s in (*c.seeds, *base) if s.peak <= budget]
    best = min(known, key=lambda s: (s.seconds, s.peak), default=None)
    for seconds, _, i in sorted(fits):
        if best is not None and seconds >= best.seconds:
            break
        pt, p = c.points[i]
        s = score("greedy", p, pt.choice)
        if s.peak <= budget:
            return s if best is None or s.seconds < best.seconds else best
    return best


def exact(problems, best: Scored, budget: int, effort: Effort) -> tuple[Scored, dict]:
    """`best`, or the exact optimum at `budget` of a grouping of up to `Effort.light_units` units
    where one is faster ([Note: the budget ladder], 4), and the bound proven per grouping (its
    `milp.lower_bound`, its optimum where solved). Least bound first; a grouping whose bound is not
    below the best so far cannot change the minimum."""
    bounds = {key(p): milp.lower_bound(p, budget) for p in problems}
    small = sorted({key(p): (bounds[key(p)], i) for i, p in enumerate(problems)
                    if p.n <= effort.light_units * effort.scale}.values())
    for lb, i in small:
        if lb >= best.seconds:
            break
        p = problems[i]
        start = best if key(best.problem) == key(p) else None
        r = milp.solve(p, budget=budget, ahead=ahead_for(p.n), nodes=EXACT_NODES,
                       start=start.choice if start else None, start_seconds=start.seconds if start else None)
        bounds[key(p)] = max(lb, r.bound)
        if r.choice is not None:
            s = score("highs", p, r.choice)
            if s.peak <= budget and s.seconds < best.seconds:
                best = s
    return best, bounds


def ladder_plan(profile: Profile, cluster: Cluster, *, spec: StrategySpec, precision: Precision,
                optimizer: Optimizer, memory_budget_bytes: int | None, effort: Effort = Effort()) -> Plan:
    """The fastest of the budget ladder's schedules, the fitting plans `--strategy` names and the
    exact optima of small groupings ([Note: the budget ladder]): monotone in the budget."""
    t0 = time.perf_counter()
    budget = memory_budget_bytes if memory_budget_bytes is not None else cluster.device.memory_bytes
    base, problems, pins = declared_space(profile, cluster, spec=spec, precision=precision, optimizer=optimizer)
    kw = dict(pins=pins, precision=precision, optimizer=optimizer)
    floor = least_memory_floor(problems)
    if budget < floor:
        raise InfeasibleBudget(infeasible_message(profile, cluster, budget=budget, problems=problems, **kw))
    c = climb(problems, base, floor, budget, effort)
    best = fastest(c, base, budget)
    if c.found is None or best is None:  # no rung's search found a schedule: one search at the budget says why
        found = auto_search(profile, cluster, spec=spec, precision=precision, optimizer=optimizer, budget=budget,
                            effort=effort)[0]
        best, c = found.best, c._replace(found=found)
    named, plans = one_override_plans(profile, cluster, budget=budget, best=best.seconds,
                                      word_peaks={s.name: s.peak for s in base}, **kw)
    notes = (f"budget ladder: the fastest of {c.rungs} searches at fixed budgets x{RATIO:g} apart from the "
             "least-memory figure up to this budget, each seeded with those below and ascended toward the "
             "next, of the plans --strategy names, and of the exact optima of small groupings: more budget "
             "never gives a slower plan",)
    if named is not None:
        best, notes = named, notes + (f"--strategy '{named.name}' ({named.seconds:.6g} s)",)
    best, bounds = exact(problems, best, budget, effort)
    if named is not None and key(named.problem) not in bounds:  # its grouping's other schedules: unsearched
        bounds[key(named.problem)] = milp.lower_bound(named.problem, budget)
    bound = min(min(bounds.values()), best.seconds)  # no LP relaxations: they cost 1-5 CPU s on 30-40 units
    found = c.found._replace(best=best, bound=bound, cut=False, named=plans, notes=c.found.notes + notes)
    plan = plan_of(found, profile, base=base, problems=problems, pins=pins, effort=effort,
                   memory_budget_bytes=memory_budget_bytes, precision=precision, optimizer=optimizer, t0=t0)
    ladder = {"rungs": c.rungs, "ratio": RATIO, "from_bytes": floor, "ascended_within": NEAR,
              "ascent_points": len(c.points), "exact_up_to_units": int(effort.light_units * effort.scale)}
    space = {**plan.solver.search_space, "ladder": ladder}
    return dataclasses.replace(plan, solver=dataclasses.replace(plan.solver, search_space=space))


__all__ = ["ladder_plan", "rungs", "RATIO", "NEAR", "rung_effort", "climb", "Climb", "exact"]
