"""The micro-batch and the accumulation steps, chosen with everything else (issue 18, part 2).

A user fixes the global batch N (rows per optimizer step, all workers together); each
worker runs N/W rows per step as K micro-batches of m rows, m a divisor of N/W. Smaller
micro-batches hold fewer activations but run K passes (K gathers of full_shard units, and
K reductions unless gradients are kept until the last micro-batch, which holds them
unsharded: [Note: accumulation memory] in sim/memory.py). `plan_global_batch` is an outer
loop: for every divisor m (ascending) a profile at m, and for every GradSync mode the best
plan under the budget (`make_plan` with the accumulation priced in memory and time); the
fastest per global batch wins, ties to the smaller micro-batch then `every`: deterministic,
a function of the inputs only.

`max_micro_batch` answers `plan --max-batch`: the largest micro-batch whose plan fits,
by doubling then bisection (the peak grows with the micro-batch: activations do).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from shardsched.core.types import GradSync, Plan
from shardsched.cost.device import Cluster
from shardsched.errors import UsageError
from shardsched.profile.types import Profile

ProfileAt = Callable[[int], Profile]
"""micro_batch -> the model's profile at that many rows per worker."""
MAX_MICRO_BATCH = 1 << 16
"""Where `max_micro_batch` stops doubling."""


class BatchChoice(NamedTuple):
    """One (micro-batch, mode) the outer loop tried, with its plan (None: nothing fits)."""

    micro_batch: int
    accumulation: int
    grad_sync: GradSync
    plan: Plan | None


def divisors(n: int) -> list[int]:
    """Divisors of n, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def rows_per_worker(global_batch: int, world: int) -> int:
    """Rows per worker per step; UsageError unless the world divides the global batch."""
    if global_batch < 1 or global_batch % world:
        raise UsageError(f"--global-batch {global_batch} is not a multiple of the {world} workers; accepted: "
                         f"a positive multiple of --world, e.g. {world * max(1, round(global_batch / world))}")
    return global_batch // world


def fits(plan: Plan | None, budget: int | None) -> bool:
    return plan is not None and (budget is None or plan.predicted.peak_bytes <= budget)


def _plan_or_none(make: Callable[[], Plan]) -> Plan | None:
    """make(), or None when the auto planner finds nothing under the budget."""
    from shardsched.solve.auto import InfeasibleBudget
    try:
        return make()
    except InfeasibleBudget:
        return None


def plan_global_batch(profile_at: ProfileAt, cluster: Cluster, *, global_batch: int, strategy: str,
                      budget: int | None, micro_batch: int | None = None, grad_sync: GradSync | None = None,
                      **kw) -> tuple[Plan, list[BatchChoice]]:
    """The fastest plan per global batch over micro-batch sizes and GradSync modes (the
    ones given, else all); every choice tried, in order. kw: `make_plan`'s other arguments."""
    from shardsched.solve.build import make_plan
    rows = rows_per_worker(global_batch, cluster.world)
    if micro_batch is not None and rows % micro_batch:
        raise UsageError(f"--global-batch {global_batch} is not a multiple of {cluster.world} workers x "
                         f"--micro-batch {micro_batch}; accepted: a micro-batch dividing {rows}")
    tried, best = [], None
    for m in [micro_batch] if micro_batch else divisors(rows):
        profile, k = profile_at(m), rows // m
        for sync in [grad_sync] if grad_sync else list(GradSync):
            if k == 1 and sync is GradSync.LAST and not grad_sync:
                continue  # one micro-batch: the modes are the same plan
            plan = _plan_or_none(lambda: make_plan(profile, cluster, strategy=strategy, memory_budget_bytes=budget,
                                                   accumulation=(k, sync), **kw))
            tried.append(BatchChoice(m, k, sync, plan if fits(plan, budget) else None))
            if fits(plan, budget) and (best is None or plan.predicted.step_seconds < best.predicted.step_seconds):
                best = plan
    if best is None:
        raise UsageError(f"no micro-batch of {rows} rows per worker fits --memory-budget with --strategy {strategy} "
                         f"(tried {', '.join(f'{c.micro_batch}x{c.accumulation} {c.grad_sync.value}' for c in tried)}); "
                         f"accepted: a larger budget, another strategy, or a smaller --global-batch")
    return best, tried


def max_micro_batch(profile_at: ProfileAt, cluster: Cluster, *, strategy: str, budget: int,
                    **kw) -> Plan | None:
    """The plan at the largest micro-batch (no accumulation) that fits `budget`; None if
    not even micro-batch 1 does."""
    from shardsched.solve.build import make_plan

    def plan_at(m: int) -> Plan | None:
        plan = _plan_or_none(lambda: make_plan(profile_at(m), cluster, strategy=strategy,
                                               memory_budget_bytes=budget, **kw))
        return plan if fits(plan, budget) else None
    best = plan_at(1)
    if best is None:
        return None
    lo, hi = 1, 2
    while hi <= MAX_MICRO_BATCH and (plan := plan_at(hi)) is not None:
        best, lo, hi = plan, hi, hi * 2
    hi = min(hi, MAX_MICRO_BATCH + 1)  # past the cap counts as not fitting
    while hi - lo > 1:  # lo fits, hi does not (or is past the cap)
        mid = (lo + hi) // 2
        plan = plan_at(mid)
        best, lo, hi = (plan, mid, hi) if plan is not None else (best, lo, mid)
    return best
