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
from shardsched.solve.greedy import Evaluator, greedy, hoist_uniform, least_memory, recompute_less, upgrade
from shardsched.solve.local import polish, within
from shardsched.sim.scenario import default_launch
from shardsched.plan.units import ROOT, root_strategy

FULL_WINDOW_UNITS = 40
"""Up to this many units every launch point is allowed (exact); above, the
window is capped so the MILP keeps ~2,000 launch binaries (`milp.windows`)."""
CONTEND_UNITS = 2 * FULL_WINDOW_UNITS
"""No contenders for the lead when one of them has more units ([Note: contenders for the lead]):
GPT-3's 97-unit groupings have their 10 s in starts and polishes already."""
OPTIMAL_TOL = 1e-6
"""Relative distance from the bound at which a plan is called optimal (HiGHS closes
its gap to 1e-9; the simulator re-prices the schedule in floating point)."""


class Effort(NamedTuple):
    """The deterministic work limit. 10x effort = 10x the nodes and MILPs on groupings
    of up to 10x the units (the "10x longer search" of bench/bench_plan_speed.py)."""

    scale: float = 1.0
    nodes: int = 100
    """Branch-and-bound nodes per grouping at scale 1."""
    milp_units: int = 16
    """Groupings other than the lead of more units get no MILP (their bound: the LP relaxation,
    [Note: bounds last]); above `light_units` theirs is light. It was 20 with HiGHS's defaults: a
    full-window MILP of 18-20 units took 5-8 CPU s whatever its node limit (HiGHS's root: cut
    rounds and sub-MIPs), and two or three such groupings took 11-22 CPU s of one plan
    (`bench_plan_speed.py --random 8`, seeds 7 and 8, r0). Light, up to 16 units, they cost a few
    CPU s where they run (seed 10's r0: two 15-unit groupings, 2.2 -> 5.6 CPU s, and a plan of
    0.5194 s against 0.5248 without them and 0.5207 for its 10x search); at 20, seeds 7's and 8's
    r0 reach their 10x plans but one takes 10.4 CPU s. Seeds 0-9's 80 plans are the same at 8 and
    16. Small groupings' MILPs also prove small instances optimal (tests/solve/test_search_vs_brute)."""

    def node_limit(self) -> int:
        return max(1, round(self.nodes * self.scale))

    lead_units: int = 20
    """The grouping with the best start (visited first) gets its MILP over every launch point
    up to this size, and over narrowed launch windows above it (`narrow`). It was 40: the
    full-window root node of 23-34 units took 7-15 CPU s of the 10 s target, and at 100 nodes
    its answer came from the root's heuristics, near the start; narrowed, the same leads take
    0.4-4 s and their polished answers were as fast or faster (s7: 25 units on 1024 H100s,
    2.6202 -> 2.5920 s, the 10x search's)."""

    def runs_milp(self, p: Problem, *, lead: bool = False) -> bool:
        return p.n <= (self.lead_units if lead else self.milp_units) * self.scale or (lead and self.narrow(p) > 0)

    lead_launches: int = 256
    """Above `lead_units`, the lead grouping's MILP keeps every strategy and checkpointing
    choice but only launch points within about lead_launches / (2n) steps of their use: HiGHS's
    root node is what costs, and it grows with the binaries (a 40-layer GPT's 42 units on 1024
    H100s at 7.4 GiB: 28 s at 23 steps, 7.5 s at 3). That MILP's answer is then polished over the
    whole window; its dual bound covers only the narrowed space, so it bounds nothing. It
    works as a large move of the local search: strategies of many units change at once."""

    narrow_units: int = 80
    """Lead groupings of up to this many units (at scale 1) get the narrowed MILP, over windows
    of at least 2 steps (it was the 64 units at which `lead_launches // (2n)` is still 2). On
    65-80 units its root takes 2-5 CPU s, and it is the only large move there: the polish of
    `bench_plan_speed.py --random 8 --seed 3`'s r0 (74 units) stops at 1.3647 s with 1x-10x its
    local work; the 2-step MILP reaches 1.3477 s and the polish after it 1.3190, the 10x search's
    (r1, 74 units: 12.2868 -> 12.2782, the 10x's)."""

    def narrow(self, p: Problem) -> int:
        """The narrowed launch window of the lead grouping's MILP (0: full window, or none)."""
        steps = max(2, self.lead_launches // (2 * p.n))
        return steps if self.lead_units * self.scale < p.n <= self.narrow_units * self.scale else 0

    light_units: int = 8
    """Groupings of more units (at scale 1) get a light MILP: no strong branching (HiGHS's
    `mip_pscost_minreliable` = 0), no restart and no presolve ([Note: no restart]). There only the
    lead grouping gets a MILP, and its 100 nodes end at the root's heuristics (RINS, RENS) around
    the polished start. It was 20 units, for strong branching only (half the root's time at
    25-29 units, the same schedules and bounds); the full-window leads of 18-20 units then took
    4.8-8.1 CPU s with HiGHS's defaults, 2.1-3.8 s light, ending at the same schedule on two of four
    (`bench_plan_speed.py --random 8`, seeds 6-9, r0), a faster one on one (0.5448 -> 0.5403 s) and
    0.3% slower on one (0.8856 -> 0.8882 s, before the polish after it)."""

    def light(self, p: Problem) -> bool:
        return p.n > self.light_units * self.scale

    def reliable(self, p: Problem) -> int:
        return 0 if self.light(p) else 8

    local_work: int = 400_000
    """Unit-evaluations of the local search (`solve.local`) per polish at scale 1: a polish of
    a grouping of n units may replay up to local_work / n schedules (each replay is O(n)),
    up to about 2 s on the 2-core machine whatever n. It was 60,000 before evaluations got
    ~8x cheaper (`solve.replay`; the peak only for moves that are faster): the 24-layer GPT of
    bench/bench_plan_speed.py reaches the 10x search's 0.2013 s at 400,000, 0.2050 s at 240,000."""

    def local_evals(self, p: Problem) -> int:
        return int(self.local_work * self.scale) // max(1, p.n)

    bound_units: int = 40
    """Groupings of up to this many units (at scale 1) that got no full-window MILP (the other
    groupings, a narrowed lead) are bounded by the LP relaxation over the whole window, last and
    only while it can raise the plan's bound ([Note: bounds last]; `milp.relaxation_bound`,
    0.05-0.4 CPU s). It was a root-only MILP for the narrowed lead (1-4 CPU s): its bound was the
    relaxation's (the 24-layer GPT: gap 0.02% instead of 19% from `milp.lower_bound`)."""

    halve_units: int = 40
    """A lead grouping of more units that gets a narrowed MILP gets half the local work per
    polish: that MILP's root takes 4-6 CPU s (41-64 units) and the 10 s target needs the rest
    (s7: the same plans on the 41-64-unit cases of `bench_plan_speed.py --random 8`, seeds 0-2)."""

    contend: float = 0.01
    """Groupings whose start is within this fraction of the best start are contenders for the
    lead (`search._contend`): starts are heuristics, and 1% between them says little about
    where a search from them ends (`bench_plan_speed.py --random 8 --seed 0`, r2: the best
    start, a partitioned 22-unit grouping, ends at 0.5770 s with a bound of 0.5749; the 23-unit
    grouping 0.8% behind it ends at 0.5651 s, the 10x search's)."""
    tie: float = 0.001
    """Contenders whose polished starts are within this fraction of the best are tied, and the
    one of most units leads ([Note: contenders for the lead]): finer units leave the MILP and
    the moves more to change."""
    contenders: int = 3
    """At most this many contenders, best start first; none when one of them has more than
    `CONTEND_UNITS` units (it was `FULL_WINDOW_UNITS`: a half polish is about 1 CPU s whatever
    the units, and seed 1's r2 needed a 55-unit contender, [Note: contenders for the lead])."""

    least_starts: bool = True
    """Whether a grouping with a fitting seed still gets the starts from its least-memory schedule
    (`_start`). The budget ladder's rungs (`solve.ladder.rung_effort`) skip them: the rung below
    passed up its schedule of that grouping, grown from the same starts."""

    def lead_effort(self, p: Problem) -> Effort:
        halve = p.n > self.halve_units * self.scale and self.narrow(p) > 0
        return self._replace(local_work=self.local_work // 2) if halve else self


TENFOLD = Effort(scale=10, milp_units=20, light_units=20)
"""The "10x longer search" of bench/bench_plan_speed.py: 10x the nodes, local work and unit
sizes, and, as the quick search had them before s10, a MILP with HiGHS's defaults on every
grouping of up to 200 units (the reference the quick search is measured against must not
shrink with it)."""


def ahead_for(n: int) -> int:
    return n if n <= FULL_WINDOW_UNITS else max(2, 1000 // n)


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
        if least_ok and least.peak <= budget:
            pool.append(_polished(p, least, budget=budget))
            pool.append(score("greedy", p, hoisted_least(p, budget=budget)))
    pool = [s for s in pool if s.peak <= budget]
    best = min(pool, key=lambda s: (s.seconds, s.peak), default=None)
    return _polished(p, best, budget=budget) if best is not None and any(best.choice.ckpt) else best


def _least_scored(p: Problem) -> Scored:
    return score("greedy", p, prefetched_least(p))  # budget-independent: `once` per grouping


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
