"""The HiGHS driver: the MILP of one grouping solved within a deterministic work limit
(`solve`), its LP relaxation as a bound (`relaxation_bound`), and what HiGHS reports read back."""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import highspy
import numpy as np

from shardsched._stdout import native_quiet
from shardsched.solve.candidates import Choice, Problem
from shardsched.solve.milp.decisions import _Build


class MilpResult(NamedTuple):
    choice: Choice | None
    objective: float
    """Step seconds the MILP claims for `choice` (== replay)."""
    status: str
    gap: float | None
    """Relative gap; None when HiGHS knows no bound (never "optimal" with an infinite gap)."""
    seconds: float
    bound: float = 0.0
    """A proven lower bound on the step seconds of any schedule of this grouping that fits
    (+inf: none fits; 0: nothing proven)."""



NODES = 400
"""Branch-and-bound nodes per grouping (`mip_max_nodes`): the deterministic work limit."""


def _new_highs() -> highspy.Highs:
    """The one place a HiGHS object is made: quiet, one thread, a fixed seed, so the same
    model gives the same answer on any machine (no wall-clock limit decides anything).
    highspy >= 1.16 prints its banner on stdout (C stdio, descriptor 1) when the first
    `Highs` of a process is made, before any option can be set: that construction runs
    with descriptor 1 muted (`_stdout` [Note: why file descriptors])."""
    with native_quiet():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    return h


def solve(p: Problem, *, budget: int, ahead: int | None = None, start: Choice | None = None,
          start_seconds: float | None = None, nodes: int = NODES, time_limit: float = math.inf,
          gap: float = 1e-9, reliable: int = 8, restart: bool = True,
          presolve: bool = True) -> MilpResult:
    """Optimal schedule of one grouping under `budget` bytes (HiGHS, warm-started), within
    `nodes` branch-and-bound nodes. `time_limit` is a safety cut-off only: a run it stops
    reports status "time limit reached", and its answer may depend on the machine.
    `reliable`: HiGHS's `mip_pscost_minreliable` (8, its default: strong branching until a
    column's pseudo-costs rest on 8 branchings; 0: none, `effort.Effort.reliable`).
    `restart=False`: HiGHS's `mip_allow_restart` off (no second presolve and root node after
    root reduced-cost fixing: [Note: no restart] in `solve.search`); `presolve=False`: HiGHS's
    presolve off (the same note)."""
    t0 = time.perf_counter()
    b = _Build(p, budget=budget, ahead=p.n if ahead is None else ahead,
               t_ub=start_seconds if start is not None else None)
    h = _new_highs()
    h.setOptionValue("mip_max_nodes", int(nodes))
    h.setOptionValue("mip_pscost_minreliable", int(reliable))
    h.setOptionValue("mip_allow_restart", bool(restart))
    if not presolve:
        h.setOptionValue("presolve", "off")
    if math.isfinite(time_limit):
        h.setOptionValue("time_limit", max(0.05, time_limit - (time.perf_counter() - t0)))
    h.setOptionValue("mip_rel_gap", gap)
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    h.passModel(b.m.lp())
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(b.start(start))
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus()).lower()
    info = h.getInfo()
    bound = _bound(info, status) * b.tscale
    if info.primal_solution_status == 0:  # no feasible point
        return MilpResult(None, math.inf, status, None, time.perf_counter() - t0, bound)
    x = np.array(h.getSolution().col_value)
    return MilpResult(b.choice(x), info.objective_function_value * b.tscale, status,
                      _gap(status, float(info.mip_gap)), time.perf_counter() - t0, bound)


def relaxation_bound(p: Problem, *, budget: int, ahead: int | None = None, t_ub: float | None = None) -> float:
    """The MILP's LP relaxation (every binary in [0, 1]): a lower bound on the step of every
    fitting schedule of this grouping within the launch windows of `ahead` (+inf: none fits).

    [Note: the relaxation is the bound] At 100 nodes HiGHS's dual bound is mostly the root LP's:
    on the 18-34-unit leads measured (`bench_plan_speed.py --random 8`, seeds 5-9, r0 and r2) the
    bound after the root's cut rounds, sub-MIPs and 100 nodes was the plain relaxation's to 1e-6,
    which one LP solve gives in 0.05-0.4 CPU s against 3-8 s for the MILP. Cuts do lift it on some
    groupings (the 24-layer GPT of the bench: the plan's bound was 0.2226 s with its lead's root
    cuts, 0.2167 s with relaxations, a whole-space gap of 2.7% instead of 0.04%, for the same plan
    1.7 CPU s sooner); the bound stays a bound.
    `t_ub` (the best step known) caps the unslowed step as in `solve`, which tightens the rows'
    big-M terms; a schedule whose unslowed step exceeds it is slower than `t_ub`, so the bound is
    the lesser of the two."""
    b = _Build(p, budget=budget, ahead=p.n if ahead is None else ahead, t_ub=t_ub)
    lp = b.m.lp()
    lp.integrality_ = []
    h = _new_highs()
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    h.passModel(lp)
    h.run()
    status = h.modelStatusToString(h.getModelStatus()).lower()
    cap = math.inf if t_ub is None else t_ub
    if status == "infeasible":
        return cap
    if status != "optimal":
        return 0.0  # nothing proven
    return min(h.getInfo().objective_function_value * b.tscale, cap)



def _bound(info, status: str) -> float:
    """A proven lower bound on the grouping's step time (scaled): HiGHS's dual bound;
    +inf when the grouping is proven infeasible; 0 (no bound) when HiGHS has none."""
    if status == "infeasible":
        return math.inf
    if status == "optimal" and info.primal_solution_status:
        return info.objective_function_value
    d = float(info.mip_dual_bound)
    return d if math.isfinite(d) else 0.0


def _gap(status: str, mip_gap: float) -> float | None:
    """HiGHS reports mip_gap = inf when no branch-and-bound ran: for a model left with
    no integer columns (every binary fixed) "optimal" is then a proof, gap 0; any
    other status without a finite gap has no bound to report."""
    if math.isfinite(mip_gap):
        return mip_gap
    return 0.0 if status == "optimal" else None

