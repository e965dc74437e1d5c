"""The memory/speed trade-off: for a sweep of budgets, the auto plan and every uniform configuration.

For each per-worker budget: the automatic plan (`solve.auto`, strategies, grouping,
launch points and checkpointing chosen jointly) and each uniform configuration
(`solve.baselines.uniform_configs`: every strategy this cluster offers, with and
without checkpointing) that fits. The automatic sweep runs from the least-memory
plan's peak (nothing smaller fits) to the largest uniform configuration's peak
(from there on every configuration fits, so nothing changes).
"""
from __future__ import annotations

import csv
import io
import math
import time
from typing import NamedTuple

from shardsched.cost.bytes import BYTES_FORMS, parse_bytes
from shardsched.cost.device import Cluster
from shardsched.cost.strategy import strategies_for
from shardsched.core.types import Optimizer, Plan, Precision
from shardsched.errors import UsageError
from shardsched.profile.types import Profile
from shardsched.solve.auto import InfeasibleBudget, auto_search, least_memory_peak, plan_of
from shardsched.solve.search import Effort
from shardsched.solve.baselines import Scored, uniform_baselines
from shardsched.plan.spec import parse_strategy_spec

RANGE_FORMS = f"accepted: LO:HI:N with LO < HI and N >= 2 (e.g. 16GiB:80GiB:12), or LO:LO:1; sizes {BYTES_FORMS}"


class Point(NamedTuple):
    """One budget of the sweep."""

    budget: int
    auto: Plan | None
    """None when no plan fits."""
    uniform: dict[str, Scored]
    """Every uniform configuration, fitting or not (`fits` says which)."""

    def fits(self, name: str) -> bool:
        return self.uniform[name].peak <= self.budget


def parse_budgets(text: str) -> list[int]:
    """'16GiB:80GiB:12' -> 12 budgets evenly spaced from 16 to 80 GiB inclusive."""
    parts = text.split(":")
    if len(parts) != 3:
        raise UsageError(f"--budgets {text!r} is not LO:HI:N; {RANGE_FORMS}")
    lo, hi = parse_bytes(parts[0]), parse_bytes(parts[1])
    try:
        n = int(parts[2])
    except ValueError:
        raise UsageError(f"--budgets {text!r}: N must be an integer; {RANGE_FORMS}") from None
    if n < 1 or hi < lo or (hi == lo and n != 1) or (hi > lo and n < 2):
        raise UsageError(f"--budgets {text!r} is an empty or reversed range; {RANGE_FORMS}")
    return spread(lo, hi, n)


def spread(lo: int, hi: int, n: int) -> list[int]:
    return [lo] if n == 1 else [lo + (hi - lo) * k // (n - 1) for k in range(n)]


def auto_budgets(profile: Profile, cluster: Cluster, *, precision: Precision, optimizer: Optimizer,
                 n: int) -> list[int]:
    """From the least-memory plan to where every uniform configuration fits."""
    lo = least_memory_peak(profile, cluster, precision=precision, optimizer=optimizer)
    hi = max(s.peak for s in uniform_baselines(profile, cluster, pins={}, precision=precision,
                                               optimizer=optimizer))
    return spread(lo, max(hi, lo + 1), n)


def sweep(profile: Profile, cluster: Cluster, budgets: list[int], *, precision: Precision,
          optimizer: Optimizer, time_limit: float = math.inf, effort: Effort = Effort()) -> list[Point]:
    """Auto plans for `budgets` (in the order given), solved in ascending budget order, each
    search seeded with every schedule the smaller budgets found (they fit the larger one:
    `solve.search`, [Note: monotone]), so the step time never rises with the budget."""
    uniform = {s.name: s for s in uniform_baselines(profile, cluster, pins={}, precision=precision,
                                                    optimizer=optimizer)}
    spec, plans, seeds = parse_strategy_spec("auto"), {}, ()
    for b in sorted(set(budgets)):
        t0 = time.perf_counter()
        try:
            found, base, problems, pins = auto_search(profile, cluster, spec=spec, precision=precision,
                                                      optimizer=optimizer, budget=b, effort=effort,
                                                      time_limit=time_limit, seeds=seeds)
        except InfeasibleBudget:
            plans[b] = None
            continue
        seeds = tuple(o.best for o in found.outcomes.values() if o.best) + (found.best,)
        plans[b] = plan_of(found, profile, base=base, problems=problems, pins=pins, effort=effort,
                           memory_budget_bytes=b, precision=precision, optimizer=optimizer, t0=t0)
    return [Point(b, plans[b], uniform) for b in budgets]


def composition(plan: Plan | None, cluster: Cluster) -> dict[str, int]:
    """Units per strategy and how many are checkpointed (zeros when no plan)."""
    counts = {f"n_{s.value}": 0 for s in strategies_for(cluster)}
    counts["n_ckpt"] = 0
    for u in plan.units if plan else ():
        counts[f"n_{u.strategy.value}"] = counts.get(f"n_{u.strategy.value}", 0) + 1
        counts["n_ckpt"] += bool(u.checkpoint)
    return counts


def mix_label(plan: Plan | None) -> str:
    """A short text of the auto plan's mix, e.g. 'hybrid_shard 30, full_shard 4, ckpt 2'."""
    if plan is None:
        return "none fits"
    counts: dict[str, int] = {}
    for u in plan.units:
        counts[u.strategy.label] = counts.get(u.strategy.label, 0) + 1
    ck = sum(bool(u.checkpoint) for u in plan.units)
    return ", ".join([f"{k} {v}" for k, v in counts.items()] + ([f"ckpt {ck}"] if ck else []))


def csv_text(points: list[Point], cluster: Cluster) -> str:
    names = list(points[0].uniform) if points else []
    buf = io.StringIO()
    w = csv.writer(buf)
    comp_keys = list(composition(None, cluster))
    w.writerow(["budget_bytes", "budget_gib", "auto_step_seconds", "auto_peak_bytes", "auto_units", *comp_keys,
                "auto_solver", "auto_gap", *[f"{n}_step_seconds" for n in names], "auto_verified_peak_bytes"])
    for p in points:
        a = p.auto
        comp = composition(a, cluster)
        w.writerow([p.budget, f"{p.budget / 2**30:.4f}",
                    f"{a.predicted.step_seconds:.6g}" if a else "", a.predicted.peak_bytes if a else "",
                    len(a.units) if a else "", *[comp[k] for k in comp_keys],
                    a.solver.name if a else "", "" if a is None or a.solver.gap is None else f"{a.solver.gap:.3g}",
                    *[f"{p.uniform[n].seconds:.6g}" if p.fits(n) else "" for n in names],
                    a.verified.peak_bytes if a and a.verified else ""])
    return buf.getvalue()
