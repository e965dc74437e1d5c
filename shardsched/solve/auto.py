"""`--strategy auto`: per-unit strategies, grouping, checkpointing and AllGather launch points.

Pipeline (all judged by the simulator, `sim.simulate`, the ground truth):
  1. baselines: every uniform configuration as `make_plan` plans it (`solve.baselines`);
  2. the whole-space search (`solve.search`): every candidate grouping (`solve.candidates`)
     scheduled greedily (`solve.greedy`, DeepCompile-style: always feasible when anything
     is), bounded, and the promising ones given to the MILP (`solve.milp`, HiGHS) warm-started
     from their best schedule, within a deterministic node limit: cold, big-M deadlines give
     weak LP bounds; warm-started HiGHS proves most small groupings optimal at once; the
     best grouping's schedule is polished move by move before and after (`solve.local`);
  3. the fastest fitting schedule of all, re-simulated, with the least bound over the
     whole space: "optimal" only when the plan meets it (docs/design.md, "Plans you can trust").
"""
from __future__ import annotations

import dataclasses
import math
import time

from shardsched._fmt import fmt_bytes
from shardsched.cost.device import Cluster, DeviceSpec
from shardsched.errors import UsageError
from shardsched.solve.baselines import Scored, score, uniform_baselines
from shardsched.solve.candidates import Choice, Problem, candidate_problems, finest_problem
from shardsched.solve.direct import direct_plan, plan_from_scenario
from shardsched.solve.effort import CONTEND_UNITS, FULL_WINDOW_UNITS, Effort, ahead_for
from shardsched.solve.greedy import least_memory
from shardsched.solve.named import one_override_plans
from shardsched.solve.search import Search, local_polish, search, with_baseline_groupings
from shardsched.plan.spec import StrategySpec, exact_spec, parse_strategy_spec
from shardsched.core.types import Checkpoint, GradSync, Optimizer, Plan, Precision, SolverInfo, Strategy
from shardsched.profile.types import Profile
from shardsched.sim.memory import step_memory

GiB = 1 << 30
NAMED_PLANS = ("every uniform --strategy word (each strategy; none, +ckpt, +sac) as make_plan plans it, and each "
               "with one unit or one layer overridden to another strategy and/or checkpointing")


class InfeasibleBudget(UsageError):
    """No plan fits the memory budget; the message gives the smallest that would."""


def auto_search(profile: Profile, cluster: Cluster, *, spec: StrategySpec, precision: Precision,
                optimizer: Optimizer, budget: int, effort: Effort = Effort(), time_limit: float = math.inf,
                seeds: tuple[Scored, ...] = (), accumulation=None) -> tuple[Search, list[Scored], list[Problem], dict]:
    """The search of `auto_plan` (the sweep calls it directly to pass `seeds` along)."""
    base, problems, pins = declared_space(profile, cluster, spec=spec, precision=precision, optimizer=optimizer,
                                          accumulation=accumulation)
    kw = dict(pins=pins, precision=precision, optimizer=optimizer)
    found = search(problems, budget=budget, base=base, seeds=seeds, effort=effort, time_limit=time_limit)
    if found is None:
        raise InfeasibleBudget(infeasible_message(profile, cluster, budget=budget, problems=problems, **kw))
    found = never_beaten(found, profile, cluster, budget=budget, effort=effort, accumulation=accumulation,
                         word_peaks={s.name: s.peak for s in base}, **kw)
    return found, base, problems, pins


def declared_space(profile: Profile, cluster: Cluster, *, spec: StrategySpec, precision: Precision,
                   optimizer: Optimizer, accumulation=None) -> tuple[list[Scored], list[Problem], dict]:
    """The uniform baselines, the groupings searched and the spec's pins (none depends on the budget)."""
    pins = {k: v for k, v in spec.for_layers([layer.name for layer in profile.layers]).items() if v is not None}
    kw = dict(pins=pins, precision=precision, optimizer=optimizer)
    base = uniform_baselines(profile, cluster, **kw)
    problems = [p._replace(checkpointable=True) for p in candidate_problems(profile, cluster, **kw)]
    # The smallest units there are (what the message below measures) are always in the
    # space: partitioning can buy speed too (less sharding fits), and a space that changed
    # with the budget would break monotonicity.
    problems.append(finest_problem(profile, cluster, **kw)._replace(checkpointable=True))
    if accumulation:  # (K, GradSync): every schedule priced for K micro-batches per step
        base, problems = accumulating(base, problems, accumulation)
    return base, with_baseline_groupings(problems, base, pins), pins


def accumulating(base: list, problems: list, accumulation: tuple[int, GradSync]) -> tuple[list, list]:
    """The auto planner's baselines and problems priced for K micro-batches per step
    (`auto_search`): the Problems carry K and the mode into every scenario, the MILP rows and
    greedy's evaluator (the micro-batch and K are chosen in `solve.batch`)."""
    k, sync = accumulation
    problems = [p._replace(accumulation=k, grad_sync=sync) for p in problems]
    base = [score(s.name, s.problem._replace(accumulation=k, grad_sync=sync), s.choice) for s in base]
    return base, problems


def never_beaten(found: Search, profile: Profile, cluster: Cluster, *, pins: dict, precision: Precision,
                 optimizer: Optimizer, budget: int, effort: Effort, accumulation=None,
                 word_peaks: dict[str, int] | None = None) -> Search:
    """The search's plan, or the fastest fitting plan `--strategy` can name (a uniform word with at
    most one override: [Note: plans a user can name] in `solve/named.py`) where one is faster,
    polished (`search.local_polish`) in its grouping. Either way no such plan is faster. Under
    gradient accumulation the named plans are not scored (left: `Replay` prices one micro-batch)."""
    if accumulation:
        return found
    named, count = one_override_plans(profile, cluster, pins=pins, precision=precision, optimizer=optimizer,
                                      budget=budget, best=found.best.seconds, word_peaks=word_peaks)
    found = found._replace(named=count)
    if named is None:
        return found
    better = local_polish(named.problem, named, budget=budget, effort=effort)
    return found._replace(best=better, bound=min(found.bound, better.seconds),
                          notes=found.notes + (f"started from --strategy '{named.name}' ({named.seconds:.6g} s), "
                                               f"faster than the search's plan ({found.best.seconds:.6g} s)",))


def search_space(problems: list[Problem], effort: Effort, pins: dict, named: int = 0) -> dict:
    """What `solver.search_space` records: enough to say what "optimal" was over."""
    largest = max(p.n for p in problems)
    return {"groupings": len(problems), "units": sorted({p.n for p in problems}),
            "named_plans": {"plans": named, "what": NAMED_PLANS},
            "strategies": sorted({k.label for p in problems for a in p.allowed for k in a}),
            "checkpointing": ("none, selective or full per unit, never the root"
                              if any(p.selective for p in problems) else "none or full per unit, never the root"),
            "launch_window": "every step" if largest <= FULL_WINDOW_UNITS else
            f"every step up to {FULL_WINDOW_UNITS} units; {ahead_for(largest)} steps at {largest} units",
            "pinned_layers": len(pins),
            "work_limit": {"mip_nodes": effort.node_limit(), "milp_up_to_units": int(effort.milp_units * effort.scale),
                           "milp_best_grouping_up_to_units": int(effort.lead_units * effort.scale),
                           "milp_best_grouping_narrowed_up_to_units": int(effort.narrow_units * effort.scale),
                           "milp_light_above_units": int(effort.light_units * effort.scale),
                           "lp_relaxation_bound_up_to_units": int(effort.bound_units * effort.scale),
                           "local_search_unit_evaluations": int(effort.local_work * effort.scale),
                           "lead_contenders": {"within": effort.contend, "at_most": effort.contenders,
                                               "up_to_units": CONTEND_UNITS, "tied_within": effort.tie},
                           "threads": 1, "random_seed": 0}}


def auto_plan(profile: Profile, cluster: Cluster, *, spec: StrategySpec, precision: Precision,
              optimizer: Optimizer, memory_budget_bytes: int | None, time_limit: float = math.inf,
              effort: Effort = Effort(), seeds: tuple[Scored, ...] = (), accumulation=None) -> Plan:
    """The fastest plan that fits `memory_budget_bytes` (default: device memory).
    `time_limit` (seconds) is a safety cut-off only (`solve.search`, [Note: determinism])."""
    t0 = time.perf_counter()
    budget = memory_budget_bytes if memory_budget_bytes is not None else cluster.device.memory_bytes
    found, base, problems, pins = auto_search(profile, cluster, spec=spec, precision=precision, optimizer=optimizer,
                                              budget=budget, effort=effort, time_limit=time_limit, seeds=seeds,
                                              accumulation=accumulation)
    return plan_of(found, profile, base=base, problems=problems, pins=pins, effort=effort,
                   memory_budget_bytes=memory_budget_bytes, precision=precision, optimizer=optimizer, t0=t0)


def plan_of(found: Search, profile: Profile, *, base: list[Scored], problems: list[Problem], pins: dict,
            effort: Effort, memory_budget_bytes: int | None, precision: Precision, optimizer: Optimizer,
            t0: float) -> Plan:
    best = found.best
    budget = memory_budget_bytes if memory_budget_bytes is not None else best.problem.cluster.device.memory_bytes
    solver = SolverInfo(name="highs" if best.name == "highs" else "greedy", status=found.status(),
                        gap=found.gap, bound=found.bound, seconds=time.perf_counter() - t0,
                        search_space=search_space(problems, effort, pins, found.named))
    notes = explain(best, baselines=base, budget=budget, candidates=len(problems), pins=pins) + list(found.notes)
    plan = plan_from_scenario(best.problem.scenario(best.choice), profile=profile,
                              memory_budget_bytes=memory_budget_bytes, solver=solver, precision=precision,
                              optimizer=optimizer, notes=tuple(notes))
    return dataclasses.replace(plan, strategy_spec=spec_of(best.problem, best.choice))


def spec_of(p: Problem, ch: Choice) -> str:
    """The `--strategy` that gives this schedule back (`plan.spec.exact_spec`)."""
    owner = {c.name: layer.name for layer in p.profile.layers for c in layer.children}
    ckpt = ch.ckpt or (False,) * p.n
    return exact_spec([(c.layers, k, Checkpoint(m), f, b) for c, k, m, f, b
                       in zip(p.costs, ch.strategies, ckpt, ch.fwd, ch.bwd)], owner)


def least_memory_peak(profile: Profile, cluster: Cluster, *, precision: Precision, optimizer: Optimizer,
                      accumulation=None) -> int:
    """Predicted peak of the least-memory plan: full_shard everywhere, no prefetch, smallest units
    (`accumulation`: (K, GradSync) micro-batches per step, `solve.batch`)."""
    finest = finest_problem(profile, cluster, pins={}, precision=precision, optimizer=optimizer)
    if accumulation:
        finest = finest._replace(accumulation=accumulation[0], grad_sync=accumulation[1])
    return max(m.total for m in step_memory(finest.scenario(least_memory(finest._replace(checkpointable=True)))))


def default_budget(profile: Profile, cluster: Cluster, *, precision: Precision, optimizer: Optimizer,
                   accumulation=None) -> int:
    """Midway between the least-memory plan and the least memory shard_grad_op
    everywhere can take (no prefetch): neither replicate nor shard_grad_op fits
    everywhere, so some units must be fully sharded while others need not be,
    and the plan shows the trade-off (the budget of `shardsched train`'s default)."""
    least = least_memory_peak(profile, cluster, precision=precision, optimizer=optimizer, accumulation=accumulation)
    sgo = min(direct_plan(profile, cluster, parse_strategy_spec("shard_grad_op"), precision=Precision(precision),
                          optimizer=Optimizer(optimizer), prefetch_ahead=0, fuse=fuse,
                          accumulation=accumulation).predicted.peak_bytes
              for fuse in (True, False))
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
    given, headroom = given_budget(need, cluster.device)
    return (f"no plan fits the memory budget of {fmt_bytes(budget)}: the least-memory plan "
            f"(full_shard everywhere, checkpointed, no prefetch, smallest units) needs {need} bytes ({fmt_bytes(need)}) "
            f"at {best.name}, dominated by {kind} ({fmt_bytes(size)}); use --memory-budget {given} or more "
            f"({_round_up(need)} usable after the device's default --headroom {headroom.text}), "
            f"a larger world, or a smaller micro-batch")


def given_budget(need: int, device: DeviceSpec) -> tuple[str, "Headroom"]:
    """The `--memory-budget` text whose usable part under the device's default headroom
    (`cost.headroom`) is at least `need` (issue 27: the message quoted the usable figure, and
    passing it was refused again), and that headroom."""
    from shardsched.cost.bytes import parse_bytes
    from shardsched.cost.headroom import headroom_for

    headroom = headroom_for(None, device)
    usable = lambda x: x - headroom.bytes_of(x)  # noqa: E731 (`cost.headroom.usable_budget`)
    x = math.ceil((need + headroom.fixed_bytes) / (1 - headroom.fraction))
    while usable(x) < need:
        x += 1
    text = _round_up(x)
    while usable(parse_bytes(text)) < need:  # the text rounds up; parsing it back must not lose bytes
        x = parse_bytes(text) + max(1, x // 10_000)
        text = _round_up(x)
    return text, headroom


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
        sac = sum(c is Checkpoint.SELECTIVE for c in ch.ckpt)
        notes.append(f"{sum(map(bool, ch.ckpt))} of {p.n} units checkpointed"
                     + (f" ({sac} selectively: matmul and attention outputs kept)" if sac else "")
                     + " (activations recomputed in backward to fit)")
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
