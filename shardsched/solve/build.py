"""make_plan: profile + cluster + strategy spec -> Plan with predictions.

Uniform, override and exact specs are planned directly (`solve.direct`: block-size fusion,
FSDP2's default one-ahead prefetch). "auto" is delegated to the budget ladder
(`solve.ladder`, monotone in the budget by construction: [Note: the budget ladder]), or with
`one_search`, a time limit or gradient accumulation to one search at the budget (`solve.auto`);
both search strategies, grouping and launch points together.
"""
from __future__ import annotations

import math

from shardsched.cost.device import Cluster
from shardsched.plan.spec import parse_strategy_spec
from shardsched.core.types import GradSync, Optimizer, Plan, Precision, Strategy
from shardsched.profile.types import Profile
from shardsched.solve.direct import direct_plan, exact_scenario, plan_from_scenario


def make_plan(profile: Profile, cluster: Cluster, *, strategy: str = "full_shard",
              precision: str | Precision = Precision.FP32, optimizer: str | Optimizer = Optimizer.ADAM,
              memory_budget_bytes: int | None = None, fuse: bool = True,
              prefetch_ahead: int = 1, time_limit: float = math.inf,
              accumulation: tuple[int, GradSync] | None = None, one_search: bool = False) -> Plan:
    """The plan for `strategy` (see `plan.spec`); "auto" needs a memory budget.
    `time_limit` only cuts the auto planner short (its answer never depends on it otherwise).
    `accumulation`: (micro-batches per step, GradSync), priced in memory and time (`solve.batch`).
    `one_search`: auto makes one search at the budget, not the budget ladder."""
    precision, optimizer = Precision(precision), Optimizer(optimizer)
    spec = parse_strategy_spec(strategy)
    if spec.auto and not one_search and accumulation is None and not math.isfinite(time_limit):
        from shardsched.solve.ladder import ladder_plan  # the MILP is heavier: import on demand
        return ladder_plan(profile, cluster, spec=spec, precision=precision, optimizer=optimizer,
                           memory_budget_bytes=memory_budget_bytes)
    if spec.auto:
        from shardsched.solve.auto import auto_plan
        return auto_plan(profile, cluster, spec=spec, precision=precision, optimizer=optimizer,
                         memory_budget_bytes=memory_budget_bytes, time_limit=time_limit,
                         accumulation=accumulation)
    return direct_plan(profile, cluster, spec, precision=precision, optimizer=optimizer,
                       memory_budget_bytes=memory_budget_bytes, fuse=fuse, prefetch_ahead=prefetch_ahead,
                       accumulation=accumulation)


__all__ = ["make_plan", "plan_from_scenario", "exact_scenario", "Strategy"]
