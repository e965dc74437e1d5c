"""`--strategy auto`: per-unit strategies, grouping and AllGather launch points.

Pipeline (all judged by the simulator, `sim.simulate`, the ground truth):
  1. baselines: every uniform strategy as `make_plan` plans it (`solve.baselines`);
  2. grouping candidates (`solve.candidates`), each scheduled greedily
     (`solve.greedy`, DeepCompile-style): always feasible when anything is;
  3. the MILP (`solve.milp`, HiGHS) on the most promising groupings, warm-started
     from the best schedule of that grouping: cold, big-M deadlines give weak LP
     bounds and HiGHS did worse than greedy in 60 s on 2,000-8,000 binaries;
     warm-started it proved optimality in 0.3-2.2 s;
  4. the fastest fitting schedule of all, re-simulated; a MILP schedule the
     simulator says exceeds the budget is a bug and is dropped (and noted).
"""
from __future__ import annotations

import math
import time

from shardsched._fmt import fmt_bytes
from shardsched.cost.device import Cluster
from shardsched.errors import UsageError
from shardsched.solve import milp
from shardsched.solve.baselines import Scored, score, uniform_baselines
from shardsched.solve.candidates import Problem, candidate_problems, finest_problem
from shardsched.solve.greedy import greedy, least_memory
from shardsched.plan.spec import StrategySpec
from shardsched.core.types import Optimizer, Plan, Precision, SolverInfo, Strategy
from shardsched.profile.types import Profile
from shardsched.sim.memory import step_memory

GiB = 1 << 30
FULL_WINDOW_UNITS = 40
"""Up to this many units every launch point is allowed (exact); above, the
window is capped so the MILP keeps ~2,000 launch binaries (`milp.windows`)."""
MILP_SHARE = 0.6
"""Fraction of the time limit the MILPs may use (the rest: candidates, greedy, plan)."""


class InfeasibleBudget(UsageError):
    """No plan fits the memory budget; the message gives the smallest that would."""


def ahead_for(n: int) -> int:
    return n if n <= FULL_WINDOW_UNITS else max(2, 1000 // n)


def _partitioned(p: Problem) -> bool:
    names = {layer.name for layer in p.profile.layers}
    return any(name not in names for c in p.costs for name in c.layers)


def _greedy_pool(problems: list[Problem], *, budget: int, deadline: float) -> list[Scored]:
    """Greedy schedule of every candidate; partitioned ones only for small models or
    when nothing else fits (partitioning buys memory, never speed, and big
    partitioned problems cost seconds of greedy replays)."""
    pool = []
    for p in sorted(problems, key=_partitioned):
        if _partitioned(p) and (pool and p.n > 2 * FULL_WINDOW_UNITS or time.perf_counter() > deadline):
            continue
        ch = greedy(p, budget=budget, ahead=ahead_for(p.n))
        if ch is not None:
            pool.append(score("greedy", p, ch))
    return pool


def _key(p: Problem) -> tuple:
    return tuple(c.layers for c in p.costs)


def _milp_pool(pool: list[Scored], *, budget: int, deadline: float, notes: list) -> tuple[list[Scored], dict]:
    """MILP on each grouping with a fitting start, best start first, while time lasts."""
    best: dict[tuple, Scored] = {}
    for s in pool:
        if s.peak <= budget and (_key(s.problem) not in best or s.seconds < best[_key(s.problem)].seconds):
            best[_key(s.problem)] = s
    starts = sorted(best.values(), key=lambda s: s.seconds)
    out, info = [], {}
    for k, start in enumerate(starts):
        left = deadline - time.perf_counter()
        if left < 0.05:
            break
        p = start.problem
        r = milp.solve(p, budget=budget, ahead=ahead_for(p.n), start=start.choice,
                       start_seconds=start.seconds, time_limit=left / (1 if p.n > FULL_WINDOW_UNITS else
                                                                       max(1, len(starts) - k)))
        if r.choice is None:
            continue
        s = score("highs", p, r.choice)
        if s.peak > budget:  # a bug in the MILP's memory rows: never trust it over the simulator
            notes.append(f"MILP schedule rejected: simulated peak {s.peak} > budget {budget}")
            continue
        out.append(s)
        info[id(s)] = r
    return out, info


def auto_plan(profile: Profile, cluster: Cluster, *, spec: StrategySpec, precision: Precision,
              optimizer: Optimizer, memory_budget_bytes: int | None, time_limit: float = 10.0) -> Plan:
    """The fastest plan that fits `memory_budget_bytes` (default: device memory)."""
    from shardsched.solve.build import plan_from_scenario  # build imports us on demand

    t0 = time.perf_counter()
    budget = memory_budget_bytes if memory_budget_bytes is not None else cluster.device.memory_bytes
    pins = {k: v for k, v in spec.for_layers([layer.name for layer in profile.layers]).items() if v is not None}
    kw = dict(pins=pins, precision=precision, optimizer=optimizer)
    base = uniform_baselines(profile, cluster, **kw)
    problems = [p._replace(checkpointable=True) for p in candidate_problems(profile, cluster, **kw)]
    pool = [s for s in base if s.peak <= budget]
    pool += _greedy_pool(problems, budget=budget, deadline=t0 + 0.4 * time_limit)
    if not pool:  # last resort: the smallest units there are (what the message below measures)
        finest = finest_problem(profile, cluster, **kw)._replace(checkpointable=True)
        problems.append(finest)
        pool += _greedy_pool([finest], budget=budget, deadline=math.inf)
    if not pool:
        raise InfeasibleBudget(infeasible_message(profile, cluster, budget=budget, problems=problems, **kw))
    notes: list[str] = []
    highs, info = _milp_pool(pool, budget=budget, deadline=t0 + MILP_SHARE * time_limit, notes=notes)
    # Ties go to the MILP's schedule (it carries a proof), then to the smaller peak.
    best = min(pool + highs, key=lambda s: (s.seconds, s.name != "highs", s.peak))
    r = info.get(id(best))
    # `MilpResult.gap` is None when HiGHS has no bound ("unknown"), as greedy's is.
    solver = SolverInfo(name="highs" if r else "greedy", status=r.status if r else "feasible",
                        gap=r.gap if r else None, seconds=time.perf_counter() - t0)
    notes = explain(best, baselines=base, budget=budget, candidates=len(problems), pins=pins) + notes
    sc = best.problem.scenario(best.choice)
    return plan_from_scenario(sc, profile=profile, memory_budget_bytes=memory_budget_bytes, solver=solver,
                              precision=precision, optimizer=optimizer, notes=tuple(notes))


def least_memory_peak(profile: Profile, cluster: Cluster, *, precision: Precision, optimizer: Optimizer) -> int:
    """Predicted peak of the least-memory plan: full_shard everywhere, no prefetch, smallest units."""
    finest = finest_problem(profile, cluster, pins={}, precision=precision, optimizer=optimizer)
    return max(m.total for m in step_memory(finest.scenario(least_memory(finest._replace(checkpointable=True)))))


def default_budget(profile: Profile, cluster: Cluster, *, precision: Precision, optimizer: Optimizer) -> int:
    """Midway between the least-memory plan and the least memory shard_grad_op
    everywhere can take (no prefetch): neither replicate nor shard_grad_op fits
    everywhere, so some units must be fully sharded while others need not be,
    and the plan shows the trade-off (the budget of `shardsched train`'s default)."""
    from shardsched.solve.build import make_plan

    least = least_memory_peak(profile, cluster, precision=precision, optimizer=optimizer)
    sgo = min(make_plan(profile, cluster, strategy="shard_grad_op", precision=precision, optimizer=optimizer,
                        prefetch_ahead=0, fuse=fuse).predicted.peak_bytes for fuse in (True, False))
    return least + max(0, sgo - least) // 2


def infeasible_message(profile: Profile, cluster: Cluster, *, budget: int, problems: list[Problem],
                       pins: dict, precision: Precision, optimizer: Optimizer) -> str:
    """One line: the smallest budget any candidate needs, and what dominates it."""
    best = None
    for p in problems:
        mem = step_memory(p.scenario(least_memory(p)))
        top = max(mem, key=lambda m: m.total)
        if best is None or top.total < best.total:
            best = top
    parts = best.breakdown
    kind, size = max(((k, getattr(parts, k)) for k in ("params", "grads", "optimizer", "activations",
                                                        "comm_buffers")), key=lambda kv: kv[1])
    need = best.total
    return (f"no plan fits the memory budget of {fmt_bytes(budget)}: the least-memory plan "
            f"(full_shard everywhere, checkpointed, no prefetch, smallest units) needs {need} bytes ({fmt_bytes(need)}) "
            f"at {best.name}, dominated by {kind} ({fmt_bytes(size)}); use --memory-budget {_round_up(need)} "
            f"or more, a larger world, or a smaller micro-batch")


def _round_up(n: int) -> str:
    """A budget flag value >= n in the largest unit that keeps 2 decimals honest."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{math.ceil(n / size * 100) / 100:.2f}{unit}"
    return str(n)


def _runs(strategies) -> list[tuple[int, int]]:
    runs, a = [], 0
    for i in range(1, len(strategies) + 1):
        if i == len(strategies) or strategies[i] is not strategies[a]:
            runs.append((a, i - 1))
            a = i
    return runs


def _peak_if(s: Scored, a: int, b: int, strategy: Strategy) -> int:
    """Simulated peak had units a..b kept `strategy` (no backward gather) instead."""
    ch = s.choice
    strategies = tuple(strategy if a <= i <= b else x for i, x in enumerate(ch.strategies))
    bwd = tuple(None if a <= i <= b else x for i, x in enumerate(ch.bwd))
    return max(m.total for m in step_memory(s.problem.scenario(ch._replace(strategies=strategies, bwd=bwd))))


def _why(s: Scored, a: int, b: int, budget: int, pins: dict) -> str:
    p, strat = s.problem, s.choice.strategies[a]
    sb = p.scenario(s.choice).state
    params = sum(c.params for c in p.costs[a:b + 1])
    gathered = fmt_bytes(params * sb.unsharded_param)
    k = b - a + 1
    if strat.multi_node:
        return {Strategy.HYBRID_SHARD: "hybrid_shard (AllGathers stay inside the node; gradients cross nodes once, "
                                       "as a 1/gpus_per_node shard)",
                Strategy.HYBRID_SHARD_GRAD_OP: "hybrid_shard_grad_op (one intra-node AllGather; gradients cross "
                                               "nodes once, as a 1/gpus_per_node shard)",
                Strategy.FULL_SHARD_NODE: f"full_shard/node (keeps a node-sized slice of its {gathered} after "
                                          "forward, so its backward AllGather stays inside the node)"}[strat]
    if strat is Strategy.REPLICATE:
        return f"replicate (fits; no AllGathers of its {gathered} and no sharded optimizer step)"
    if strat is Strategy.SHARD_GRAD_OP:
        return f"shard_grad_op (fits; saves {k} backward AllGather(s) of {gathered} in all)"
    if all(name in pins for c in p.costs[a:b + 1] for name in c.layers):
        return "full_shard (as --strategy pins it)"
    # The counterfactual is the reason: keeping the gathered copy through backward would not fit.
    other = _peak_if(s, a, b, Strategy.SHARD_GRAD_OP)
    verdict = (f"over the budget of {fmt_bytes(budget)}" if other > budget
               else f"within the budget of {fmt_bytes(budget)}, but the step would be slower")
    return (f"full_shard (frees its {gathered} gathered copy between forward and backward; with "
            f"shard_grad_op here the peak would be {fmt_bytes(other)}: {verdict})")


def _grouping_words(units: int, layers: int) -> str:
    if units > layers:
        return f"{layers} layers planned as {units} units (layers above the block size split into their children)"
    if units < layers:
        return f"{layers} layers planned as {units} units (layers below the block size fused)"
    return f"{layers} layers planned as {units} units, one per layer"


def explain(best: Scored, *, baselines: list[Scored], budget: int, candidates: int, pins: dict) -> list[str]:
    """Which units got which strategy and why, the prefetch depth, and the margin over baselines."""
    p, ch = best.problem, best.choice
    notes = []
    for a, b in _runs(ch.strategies):
        label = p.costs[a].name if a == b else f"{p.costs[a].layers[0]}..{p.costs[b].layers[-1]}"
        notes.append(f"{label}: {_why(best, a, b, budget, pins)}")
    if any(ch.ckpt):
        notes.append(f"{sum(ch.ckpt)} of {p.n} units checkpointed (activations recomputed in backward to fit)")
    early = sum(1 for i in range(p.n) if ch.fwd[i] < i - 1)
    early += sum(1 for i in range(p.n) if ch.bwd[i] is not None and ch.bwd[i] < 2 * p.n - 2 - i)
    notes.append(f"{_grouping_words(p.n, len(p.profile.layers))} ({candidates} groupings considered); "
                 f"{early} AllGathers launched more than one step ahead")
    fitting = [s for s in baselines if s.peak <= budget]
    if fitting:
        ref = min(fitting, key=lambda s: s.seconds)
        notes.append(f"predicted {best.seconds:.4g} s vs {ref.seconds:.4g} s for the best fitting uniform "
                     f"strategy ({ref.name}): {best.seconds / ref.seconds:.3f}x")
    else:
        notes.append("no uniform strategy fits this budget")
    return notes


__all__ = ["auto_plan", "InfeasibleBudget", "Strategy"]
