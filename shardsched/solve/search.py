"""The whole-space search behind `--strategy auto`: deterministic, bounded, monotone.

The declared search space (recorded in the plan as `solver.search_space`): the candidate
groupings (`solve.candidates`, plus the groupings of the uniform baselines), and for each
of them every strategy the cluster offers (less pins), checkpointing per unit, and every
AllGather launch point within `milp.windows` of its use. Per grouping, in a fixed order:
  1. starts: its greedy schedule, the least-memory schedule with one-ahead prefetch, the
     least-memory schedule hoisted as far as fits then upgraded (`hoisted_least`), a
     fitting uniform baseline of that grouping, and any `seeds` (schedules found at a
     smaller budget: they fit this one too); the best, with checkpointing switched off
     wherever it still fits (`_polished`); for the lead grouping (the best start, or the
     fastest contender after half a polish, of most units among those tied within
     `Effort.tie`: [Note: contenders for the lead]), then the local
     search (`solve.local`, within `Effort.local_work`);
  2. a lower bound no schedule of it beats (`milp.lower_bound`, O(n log n)); a grouping whose
     bound is not below the incumbent is closed without a MILP;
  3. the MILP, warm-started from the best start, within a node limit (`Effort`): it never
     returns worse than its start, and HiGHS's dual bound raises the grouping's bound; the
     lead grouping's MILP answer is polished again (`solve.local`), and so is the best plan
     at the end when another grouping gave it. A lead grouping above `Effort.lead_units` (20),
     up to `Effort.narrow_units` (80), gets its MILP over narrowed launch windows
     (`Effort.narrow`): a schedule, no bound. Other groupings get a MILP up to
     `Effort.milp_units` (16); MILPs above `Effort.light_units` (8) run light (no strong
     branching, restart or presolve);
  4. last, the LP relaxation over the whole window bounds the groupings of up to
     `Effort.bound_units` (40) that no full-window MILP bounded, least bound first and only
     while that can raise the plan's bound ([Note: bounds last]).
The plan's bound is the least bound over every grouping; "optimal" means the plan meets it.

[Note: determinism] Nothing here reads the clock to decide: the groupings, their order,
which get a MILP (size rule) and HiGHS's work (node limit, one thread, fixed seed) depend
on the inputs only. `time_limit` is a safety cut-off: when it strikes, the status and a
note say so, and that answer (only that one) may depend on the machine.

[Note: monotone] A schedule that fits budget b fits b' > b. Passing the schedules found at
b as `seeds` at b' (the `tradeoff` sweep does, budgets ascending) makes every grouping's
start at b' at least as good as its result at b, and the MILP never returns worse than its
start: step time is non-increasing along the sweep. Separate runs are monotone wherever
both are "optimal" (the optimum over a fixed space cannot rise with the budget).
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

from shardsched.solve import milp
from shardsched.solve.baselines import Scored, score
from shardsched.solve.candidates import Choice, Problem, _allowed, once
from shardsched.solve.effort import CONTEND_UNITS, FULL_WINDOW_UNITS, Effort, ahead_for
from shardsched.solve.greedy import Evaluator, greedy, hoist_uniform, least_memory, recompute_less, upgrade
from shardsched.solve.local import polish, within
from shardsched.sim.scenario import default_launch
from shardsched.plan.units import ROOT, root_strategy

OPTIMAL_TOL = 1e-6
"""Relative distance from the bound at which a plan is called optimal (HiGHS closes
its gap to 1e-9; the simulator re-prices the schedule in floating point)."""


class Outcome(NamedTuple):
    """One grouping's result: its best fitting schedule (None: none found) and a lower
    bound on every fitting schedule of it (+inf: proven none fits)."""

    best: Scored | None
    bound: float
    milp: milp.MilpResult | None = None
    relax: bool = False
    """Whether its LP relaxation may still raise `bound`: no full-window MILP bounded it
    ([Note: bounds last])."""


class Search(NamedTuple):
    best: Scored
    bound: float
    outcomes: dict
    """Grouping key -> Outcome."""
    notes: tuple[str, ...]
    cut: bool
    """Whether `time_limit` cut the search short."""
    named: int = 0
    """Plans `--strategy` can name that were scored against the result (`solve.named`)."""

    @property
    def gap(self) -> float:
        return max(0.0, (self.best.seconds - self.bound) / self.best.seconds) if self.best.seconds > 0 else 0.0

    @property
    def optimal(self) -> bool:
        return not self.cut and self.gap <= OPTIMAL_TOL

    def status(self) -> str:
        """"optimal" only with a proof over the whole space; otherwise the bound and gap."""
        if self.optimal:
            return "optimal"
        why = "time limit reached" if self.cut else "work limit reached"
        return f"{why}: bound {self.bound:.6g} s, gap {self.gap:.3%} over the whole search space"


def key(p: Problem) -> tuple:
    return tuple(c.layers for c in p.costs)


def with_baseline_groupings(problems: list[Problem], base: list[Scored], pins: dict) -> list[Problem]:
    """The uniform baselines' groupings join the space (every strategy, checkpointing), so
    the bound covers every plan the planner may return."""
    out, seen = [], set()
    for p in problems:  # distinct groupings, first kept
        if key(p) not in seen:
            seen.add(key(p))
            out.append(p)
    for s in base:
        if key(s.problem) in seen:
            continue
        seen.add(key(s.problem))
        allowed = []
        for c in s.problem.costs:
            a = _allowed([pins.get(name) for name in c.layers], s.problem.cluster)
            allowed.append(tuple(dict.fromkeys(map(root_strategy, a))) if c.layers == (ROOT,) else a)
        out.append(s.problem._replace(allowed=tuple(allowed), checkpointable=True))
    return out


def _start(p: Problem, *, budget: int, extra: list[Scored], greedy_ok: bool, least_ok: bool = True) -> Scored | None:
    """The fastest fitting schedule known for this grouping before its MILP (`least_ok`: with the
    starts from the least-memory schedule, `Effort.least_starts`)."""
    pool = [s for s in extra if s.peak <= budget]
    if greedy_ok:
        ch = greedy(p, budget=budget, ahead=ahead_for(p.n))
        if ch is not None:
            pool.append(score("greedy", p, ch))
        least = once(p, _least_scored)
        if least_ok and least.peak > budget:  # at the least-memory figure itself, no prefetch fits
            least = once(p, _least_unprefetched)
        if least_ok and least.peak <= budget:
            pool.append(_polished(p, least, budget=budget))
            pool.append(score("greedy", p, hoisted_least(p, budget=budget)))
    pool = [s for s in pool if s.peak <= budget]
    best = min(pool, key=lambda s: (s.seconds, s.peak), default=None)
    return _polished(p, best, budget=budget) if best is not None and any(best.choice.ckpt) else best


def _least_scored(p: Problem) -> Scored:
    return score("greedy", p, prefetched_least(p))  # budget-independent: `once` per grouping


def _least_unprefetched(p: Problem) -> Scored:
    """The least-memory schedule as `auto.least_memory_peak` scores it (no prefetch): a budget
    of exactly that figure, which the advice "use --memory-budget X" quotes, has a plan."""
    return score("greedy", p, least_memory(p))


def prefetched_least(p: Problem) -> Choice:
    """The least-memory strategies and checkpointing with FSDP2's one-ahead prefetch: where
    the greedy's upgrades take the memory its hoisting needed (big groupings: uniform
    hoisting), this start then spends what is left on recomputing less (`_polished`)."""
    ch = least_memory(p)
    fwd, bwd = default_launch(ch.strategies, ahead=1)
    return ch._replace(fwd=fwd, bwd=bwd)


def hoisted_least(p: Problem, *, budget: int) -> Choice:
    """The least-memory schedule with every AllGather as far ahead as fits, then the greedy's
    upgrades and less recomputation with what is left: the greedy's order (upgrades first)
    spends the memory deep prefetch needs (a 40-layer GPT on 1024 H100s at 7.4 GiB: 1.18 s;
    this start 1.14 s, 0.97 s after the local search, against 1.17 s from the greedy's)."""
    ev = Evaluator(p)
    ch = hoist_uniform(ev, least_memory(p), budget=budget, ahead=ahead_for(p.n))
    return recompute_less(ev, upgrade(ev, ch, budget=budget), budget=budget)


def _polished(p: Problem, s: Scored, *, budget: int) -> Scored:
    """The start with checkpointing switched off where it still fits (`greedy.recompute_less`):
    a uniform `+ckpt` baseline often beats the greedy schedule (its prefetch fits where the
    greedy spent memory on strategies first) yet checkpoints more than the budget needs
    (Llama-2-70B, 512 A100s, 40 GiB: every unit, at a 25 GiB peak)."""
    ev = Evaluator(p)
    ch = recompute_less(ev, s.choice, budget=budget)
    if ch == s.choice:
        return s
    better = score(s.name, p, ch)
    return better if better.peak <= budget and better.seconds <= s.seconds else s


def _milp(p: Problem, start: Scored | None, *, budget: int, effort: Effort, left: float,
          notes: list, narrow: int = 0) -> tuple[Scored | None, milp.MilpResult]:
    """The MILP warm-started from `start`; over launch windows of `narrow` steps when > 0 (its
    bound then covers that smaller space only and is dropped: `Effort.lead_launches`).

    [Note: no restart] HiGHS restarts a MILP whose root reduced-cost fixing fixed many columns:
    a second presolve and a second root node. The narrowed lead MILP is a large move of the local
    search (its answer is polished, its bound dropped) and the lead's root-only bound MILP wanted
    the first root's bound only, so neither restarted (`milp.solve(restart=False)`; the bound is now the LP
    relaxation's, [Note: bounds last]). Measured (`bench_plan_speed.py
    --random 8 --seed 0`, r4, 42 units: narrowed MILP 6.2 -> 2.9 CPU s, and its polished answer
    0.9254 -> 0.9212 s; root bounds of the 24-layer GPT, seed 0's r1 and seed 1's r3: 2.2 -> 1.3,
    2.8 -> 2.1, 4.3 -> 3.3 CPU s, the same bounds to 1e-14). Nor is the narrowed MILP presolved:
    on the eight narrowed leads of the bench measured (21-79 units) its polished answer was the
    same or faster (seed 1's r7: 9.8886 -> 9.8603 s, its 10x search's) and its time lower on all
    but one (seed 1's r3 5.3 -> 2.9 CPU s, seed 2's r5 4.5 -> 2.8; the 24-layer GPT 3.7 -> 4.7);
    since s10 every MILP above `Effort.light_units` runs so (full window or narrowed: the leads
    of 9-20 units, 4.8-8.1 -> 2.1-3.8 CPU s). MILPs of up to `light_units` units, and every
    grouping's of up to 200 units in the 10x search (`TENFOLD`), keep HiGHS's defaults."""
    ahead, light = narrow or ahead_for(p.n), bool(narrow) or effort.light(p)
    r = milp.solve(p, budget=budget, ahead=ahead, start=within(p, start.choice, ahead) if start else None,
                   start_seconds=start.seconds if start else None, nodes=effort.node_limit(), time_limit=left,
                   reliable=effort.reliable(p), restart=not light, presolve=not light)
    if narrow:
        r = r._replace(bound=0.0)
    if r.choice is None:
        return None, r
    s = score("highs", p, r.choice)
    if s.peak > budget:  # a bug in the MILP's memory rows: never trust it over the simulator
        notes.append(f"MILP schedule rejected: simulated peak {s.peak} > budget {budget}")
        return None, r
    return s, r


def local_polish(p: Problem, s: Scored | None, *, budget: int, effort: Effort) -> Scored | None:
    """`s` after the local search (`solve.local`), re-simulated; `s` when it finds nothing faster."""
    if s is None or effort.local_evals(p) <= 0:
        return s
    ch = polish(p, s.choice, budget=budget, ahead=ahead_for(p.n), evals=effort.local_evals(p))
    if ch == s.choice:
        return s
    better = score(s.name, p, ch)
    return better if better.peak <= budget and better.seconds < s.seconds else s


def solve_grouping(p: Problem, start: Scored | None, *, budget: int, effort: Effort, incumbent: float,
                   deadline: float, notes: list, lead: bool = False, polished: int = 0) -> Outcome:
    """Steps 2-3 of the module docstring for one grouping. The lead grouping (best start)
    is polished before its MILP (HiGHS's root heuristics search around the start: on the
    24-layer GPT of bench/bench_plan_speed.py, 0.2477 s from a polished start, 0.2755 s
    from the greedy's) and after; `polished`: the local work its start has had already
    (`_contend`), taken from that first polish.

    [Note: polish the move] The lead's MILP is a large move of the local search: its answer is
    polished whenever it differs from the start, slower or not. A narrowed MILP's answer can be
    slower than the start (its launches are cut to the narrowed windows) and still lie in a
    better basin: `bench_plan_speed.py --random 8 --seed 9`'s r6 (32 units) had its MILP answer at
    5.6021 s against a polished start of 5.5915, and kept the start (10x search: 5.4335, ratio
    1.0291); polished, that answer reaches 5.4365 s (1.0006), for one more polish (1.2 CPU s)."""
    lb = milp.lower_bound(p, budget)
    if start is not None and start.seconds <= lb * (1 + OPTIMAL_TOL):
        return Outcome(start, start.seconds)  # the start meets the bound: optimal, nothing to solve
    if lead:
        effort = effort.lead_effort(p)
        first = effort._replace(local_work=max(0, effort.local_work - polished))
        start = local_polish(p, start, budget=budget, effort=first)
    if lb >= incumbent or not effort.runs_milp(p, lead=lead) or (start is None and p.n > FULL_WINDOW_UNITS):
        return Outcome(start, lb, relax=lb < incumbent)  # closed by the bound, or left to the bound (size rule)
    left = deadline - time.perf_counter()
    if left <= 0:
        return Outcome(start, lb)
    found, r = _milp(p, start, budget=budget, effort=effort, left=left, notes=notes,
                     narrow=effort.narrow(p) if lead else 0)
    if lead and found is not None and (start is None or found.choice != start.choice):  # [Note: polish the move]
        found = local_polish(p, found, budget=budget, effort=effort)
    best = min((s for s in (start, found) if s is not None), key=lambda s: (s.seconds, s.name != "highs"),
               default=None)
    bound = max(lb, r.bound)
    return Outcome(best, min(bound, best.seconds) if best else bound, r, relax=lead and effort.narrow(p) > 0)


def _bounds_last(outcomes: dict, problems: dict, *, budget: int, best: float, effort: Effort,
                 deadline: float) -> None:
    """Raise the plan's bound with LP relaxations over each grouping's whole declared space
    (every launch point; `milp.relaxation_bound`, capped at `best`), least bound first.

    [Note: bounds last] The plan's bound is the least over every grouping. A grouping bounded
    only by `milp.lower_bound` (no MILP: a grouping other than the lead above `Effort.milp_units`,
    or one closed by the size rule) or by a narrowed MILP (its bound dropped) can be raised by
    its LP relaxation over the whole window, while it has at most `Effort.bound_units` units. Only
    the grouping holding the least bound can raise the plan's, so that one is relaxed, and again
    while the least bound belongs to one not relaxed yet; the loop stops at the first that is
    relaxed already, too large, or at `best` (the plan's step). It runs after every grouping is
    visited, so no relaxation is solved that another bound makes moot (`bench_plan_speed.py
    --random 8 --seed 1`, r3: a lead bound of 3.4013 s under another grouping's 3.3735).
    Deterministic: the rule reads bounds and sizes only."""
    while time.perf_counter() < deadline:
        k = min(outcomes, key=lambda k: outcomes[k].bound)  # ties: the first visited
        o, p = outcomes[k], problems[k]
        if not o.relax or o.bound >= best or p.n > effort.bound_units * effort.scale:
            return
        raised = max(o.bound, milp.relaxation_bound(p, budget=budget, ahead=ahead_for(p.n), t_ub=best))
        outcomes[k] = o._replace(bound=min(raised, o.best.seconds) if o.best else raised, relax=False)


def _partitioned(p: Problem) -> bool:
    names = {layer.name for layer in p.profile.layers}
    return any(name not in names for c in p.costs for name in c.layers)


def _order(problems: list[Problem], starts: dict) -> list[int]:
    """Best start first; ties (and groupings with none, last) by position."""
    return sorted(range(len(problems)), key=lambda i: (starts[key(problems[i])] is None,
                                                       getattr(starts[key(problems[i])], "seconds", 0.0), i))


def _contend(problems: list[Problem], starts: dict, *, budget: int, effort: Effort) -> tuple[list[int], int]:
    """The visiting order, and the local work the lead's start has had.

    [Note: contenders for the lead] Only the lead grouping gets the local search and the MILP
    before the end, so which grouping leads decides the plan, and starts 1% apart do not say
    which search ends faster. Groupings whose start is within `Effort.contend` of the best
    (up to `Effort.contenders`, when none has more than `CONTEND_UNITS` units) are each polished with
    half the local work first, in the order of their starts; the fastest then leads, and its
    first polish in `solve_grouping` gets the other half, so the lead's work is unchanged and
    each other contender costs half a polish. Where the polished starts are within `Effort.tie`
    of the fastest, the one of most units leads instead: the polish often cannot move such
    starts at all, and the lead's MILP, a large move, has more to change on finer units
    (`bench_plan_speed.py --random 8 --seed 1`, r2: starts of 15, 28 and 55 units within 0.01%,
    none moved by the polish; led, the 28-unit one ends at 7.8116 s, the 55-unit one at 7.7320,
    the 10x search 7.7147 at 55 units). Deterministic: the rule reads the starts only."""
    order = _order(problems, starts)
    best = starts[key(problems[order[0]])]
    if best is None:
        return order, 0
    near = [i for i in order if starts[key(problems[i])] is not None
            and starts[key(problems[i])].seconds <= best.seconds * (1 + effort.contend)][:effort.contenders]
    if len(near) < 2 or any(problems[i].n > CONTEND_UNITS for i in near):
        return order, 0
    half = effort._replace(local_work=effort.local_work // 2)
    for i in near:
        p = problems[i]
        starts[key(p)] = local_polish(p, starts[key(p)], budget=budget, effort=half)
    order = _order(problems, starts)
    top = starts[key(problems[order[0]])].seconds * (1 + effort.tie)
    lead = max((i for i in order if i in near and starts[key(problems[i])].seconds <= top),
               key=lambda i: (problems[i].n, -order.index(i)))
    return [lead] + [i for i in order if i != lead], half.local_work


def search(problems: list[Problem], *, budget: int, base: list[Scored], seeds: tuple[Scored, ...] = (),
           effort: Effort = Effort(), time_limit: float = math.inf) -> Search | None:
    """The fastest fitting schedule over `problems` and its whole-space bound; None when
    nothing fits. Groupings are visited best start first (ties: their order in `problems`).

    Partitioned groupings (layers split into children) buy memory, not speed: for models
    of more than 2 * FULL_WINDOW_UNITS units they get no greedy schedule (seconds of
    replays each) unless nothing else fits; they stay in the space, bounded by
    `milp.lower_bound`."""
    deadline, notes = time.perf_counter() + time_limit, []
    extra: dict[tuple, list[Scored]] = {}
    for s in (*base, *seeds):
        extra.setdefault(key(s.problem), []).append(s)
    starts = {}
    for p in sorted(problems, key=_partitioned):  # unpartitioned first: they decide "something fits"
        skip = _partitioned(p) and p.n > 2 * FULL_WINDOW_UNITS and any(starts.values())
        seeded = any(s.peak <= budget and key(s.problem) == key(p) for s in seeds)
        starts[key(p)] = _start(p, budget=budget, extra=extra.get(key(p), []), greedy_ok=not skip,
                                least_ok=effort.least_starts or not seeded)
    order, polished = _contend(problems, starts, budget=budget, effort=effort)
    outcomes, incumbent = {}, min((s.seconds for s in starts.values() if s), default=math.inf)
    for i in order:
        p = problems[i]
        o = solve_grouping(p, starts[key(p)], budget=budget, effort=effort, incumbent=incumbent,
                           deadline=deadline, notes=notes, lead=i == order[0], polished=polished)
        outcomes[key(p)] = o
        incumbent = min(incumbent, o.best.seconds if o.best else math.inf)
    pool = [o.best for o in outcomes.values() if o.best] + [s for s in (*base, *seeds) if s.peak <= budget]
    if not pool:
        return None
    # Ties go to the MILP's schedule, then to the smaller peak.
    best = min(pool, key=lambda s: (s.seconds, s.name != "highs", s.peak))
    if key(best.problem) != key(problems[order[0]]):  # the lead grouping's best was polished already
        better = local_polish(best.problem, best, budget=budget, effort=effort)
        if better is not best and key(best.problem) in outcomes:
            o = outcomes[key(best.problem)]
            outcomes[key(best.problem)] = o._replace(best=better, bound=min(o.bound, better.seconds))
        best = better
    _bounds_last(outcomes, {key(p): p for p in problems}, budget=budget, best=best.seconds, effort=effort,
                 deadline=deadline)
    bound = min(min(o.bound for o in outcomes.values()), best.seconds)
    cut = time.perf_counter() > deadline or any(o.milp and "time" in o.milp.status for o in outcomes.values())
    if cut:
        notes.append("stopped by the time limit: this answer may depend on the machine's speed and load")
    return Search(best, bound, outcomes, tuple(notes), cut)
