"""Human-readable views of a Plan: the per-unit table and the summary."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from shardsched._fmt import console as default_console
from shardsched._fmt import fmt_bytes, fmt_count, fmt_seconds
from shardsched.cost.comm import Collective
from shardsched.cost.device import Cluster
from shardsched.cost.memory import state_bytes
from shardsched.core.types import Plan, Strategy
from shardsched.profile.types import Profile
from shardsched.cost.strategy import reduce_kind, shard_count
from shardsched.sim.timeline import collective_time


def unit_table(plan: Plan, profile: Profile, cluster: Cluster) -> Table:
    from shardsched.plan.schedule import scenario_for  # local: schedule imports report's siblings
    sc = scenario_for(plan, profile, cluster)
    sb = state_bytes(plan.precision, plan.optimizer)
    t = Table(title=f"plan for {plan.model} on {plan.world} x {plan.device}", title_justify="left")
    for col in ("unit", "layers", "params", "strategy", "at rest", "unsharded", "fwd", "bwd",
                "AllGather", "ReduceScatter", "AllReduce", "prefetch fwd/bwd"):
        t.add_column(col, justify="left" if col in ("unit", "strategy", "prefetch fwd/bwd") else "right")
    for i, (u, c) in enumerate(zip(plan.units, sc.units)):
        shards = shard_count(u.strategy, cluster)
        ag_b = u.params * sb.unsharded_param
        red_b = u.params * sb.reduce
        n_ag = 0 if u.strategy is Strategy.REPLICATE else (2 if u.strategy.gathers_for_backward else 1)
        kind = reduce_kind(u.strategy)
        ag_s = fmt_seconds(collective_time(sc, Collective.ALL_GATHER, i))
        if u.strategy is Strategy.FULL_SHARD_NODE:  # the backward one is intra-node
            ag_s += "+" + fmt_seconds(collective_time(sc, Collective.ALL_GATHER, i, backward=True))
        ag = f"{n_ag}x {fmt_bytes(ag_b)} {ag_s}" if n_ag else "-"
        red = f"{fmt_bytes(red_b)} {fmt_seconds(collective_time(sc, kind, i))}"
        t.add_row(u.name, str(len(u.layers)), fmt_count(u.params), u.strategy.label + ("+ckpt" if u.checkpoint else ""),
                  fmt_bytes(sb.at_rest * -(-u.params // shards)), fmt_bytes(ag_b),
                  fmt_seconds(c.forward_seconds), fmt_seconds(sc.backward_seconds(i)), ag,
                  red if kind is Collective.REDUCE_SCATTER else "-",
                  red if kind is Collective.ALL_REDUCE else "-",
                  f"{','.join(u.forward_prefetch) or '-'} / {','.join(u.backward_prefetch) or '-'}")
    return t


def summary_lines(plan: Plan) -> list[str]:
    p, m, s = plan.predicted, plan.predicted.memory, plan.solver
    budget = fmt_bytes(plan.memory_budget_bytes) if plan.memory_budget_bytes else "none"
    lines = [
        f"predicted peak per worker: {fmt_bytes(p.peak_bytes)} (budget {budget}) at {p.peak_at}",
        f"  params {fmt_bytes(m.params)}, grads {fmt_bytes(m.grads)}, optimizer {fmt_bytes(m.optimizer)}, "
        f"activations {fmt_bytes(m.activations)}, comm buffers {fmt_bytes(m.comm_buffers)}",
        f"  model states (ZeRO's definition) {fmt_bytes(p.model_states_bytes)}",
        f"predicted step: {fmt_seconds(p.step_seconds)} = compute {fmt_seconds(p.compute_seconds)} "
        f"+ exposed communication {fmt_seconds(p.exposed_comm_seconds)}; "
        f"lower bound max(compute, communication {fmt_seconds(p.comm_seconds)}) = {fmt_seconds(p.lower_bound_seconds)}",
        f"solver: {s.name}, status {s.status}, gap {'n/a' if s.gap is None else f'{s.gap:.2%}'}, {s.seconds:.3f} s",
    ]
    return lines + [f"note: {n}" for n in plan.notes]


def print_plan(plan: Plan, profile: Profile, cluster: Cluster, *, console: Console | None = None) -> None:
    console = console or default_console()
    console.print(unit_table(plan, profile, cluster))
    for line in summary_lines(plan):
        console.print(line, highlight=False, markup=False)
