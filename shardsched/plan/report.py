"""Human-readable views of a Plan: the per-unit table and the summary.

By default the table fits 80 columns: the columns a reader needs first, and
runs of identical consecutive units (same strategy, size and prefetch offsets)
folded into one row ("blocks.0-95  full_shard x96"), with a one-line legend.
`--wide` shows every column and every unit.
"""
from __future__ import annotations

import re

from rich import box
from rich.console import Console
from rich.table import Table

from shardsched._fmt import console as default_console
from shardsched._fmt import fmt_bytes, fmt_count, fmt_seconds, periodic_runs, readable_note, short_name, span_name
from shardsched.cost.comm import Collective
from shardsched.cost.device import Cluster
from shardsched.cost.memory import state_bytes
from shardsched.core.types import Plan, Strategy
from shardsched.profile.types import Profile
from shardsched.cost.strategy import reduce_kind, shard_count
from shardsched.sim.timeline import collective_time, gather_bytes, reduce_bytes

NARROW_COLUMNS = ("unit", "strategy", "params", "at rest", "comm", "prefetch")
WIDE_COLUMNS = ("unit", "layers", "params", "strategy", "at rest", "unsharded", "fwd", "bwd",
                "AllGather", "ReduceScatter", "AllReduce", "prefetch")
LEGEND = "at rest: param+grad+optim per worker; comm: collectives/step; prefetch: +k ahead"
LEFT = ("unit", "strategy", "prefetch")


def _unit_rows(plan: Plan, profile: Profile, cluster: Cluster) -> list[dict]:
    """Every column of every unit, formatted, plus a `key` that identical units share."""
    from shardsched.plan.schedule import scenario_for  # local: schedule imports report's siblings
    sc = scenario_for(plan, profile, cluster)
    sb = state_bytes(plan.precision, plan.optimizer)
    index = {u.name: i for i, u in enumerate(plan.units)}
    rows = []
    for i, (u, c) in enumerate(zip(plan.units, sc.units)):
        shards = shard_count(u.strategy, cluster)
        n_ag = 0 if u.strategy is Strategy.REPLICATE else (2 if u.strategy.gathers_for_backward else 1)
        kind = reduce_kind(u.strategy)
        ag_f = collective_time(sc, Collective.ALL_GATHER, i)
        ag_bw = collective_time(sc, Collective.ALL_GATHER, i, backward=True) if n_ag == 2 else 0.0
        red_s = collective_time(sc, kind, i)
        ag_b, red_b = gather_bytes(sc, i), reduce_bytes(sc, i)  # dim 0 padded to the shard count
        ag_s = fmt_seconds(ag_f)
        if u.strategy is Strategy.FULL_SHARD_NODE:  # the backward one is intra-node
            ag_s += "+" + fmt_seconds(ag_bw)
        red = f"{fmt_bytes(red_b)} {fmt_seconds(red_s)}"
        offsets = (tuple(index[n] - i for n in u.forward_prefetch), tuple(index[n] - i for n in u.backward_prefetch))
        label = u.strategy.label + u.checkpoint.suffix
        rows.append({
            "unit": u.name, "layers": str(len(u.layers)), "params": fmt_count(u.params), "strategy": label,
            "at rest": fmt_bytes(sb.at_rest * c.shard_numel(shards)), "unsharded": fmt_bytes(ag_b),
            "fwd": fmt_seconds(c.forward_seconds), "bwd": fmt_seconds(sc.backward_seconds(i)),
            "AllGather": f"{n_ag}x {fmt_bytes(ag_b)} {ag_s}" if n_ag else "-",
            "ReduceScatter": red if kind is Collective.REDUCE_SCATTER else "-",
            "AllReduce": red if kind is Collective.ALL_REDUCE else "-",
            "comm": fmt_seconds(ag_f + ag_bw + red_s),
            "prefetch": f"{','.join(u.forward_prefetch) or '-'} / {','.join(u.backward_prefetch) or '-'}",
            "offsets": f"{_offsets(offsets[0])} / {_offsets(offsets[1])}",
            "key": (u.strategy, u.checkpoint, u.params, len(u.layers), offsets, c.forward_seconds,
                    c.backward_seconds),
        })
    return rows


def _offsets(offsets: tuple[int, ...]) -> str:
    return ",".join(f"{k:+d}" for k in offsets) or "-"


def _folded(rows: list[dict]) -> list[dict]:
    """A pattern of units repeated 3 or more times (one block, or a block's attention and
    MLP units) becomes one row per unit of the pattern, named by its span."""
    out = []
    for a, period, reps in periodic_runs(rows, key=lambda r: r["key"]):
        if reps < 3:
            out.extend({**r, "unit": short_name(r["unit"]), "prefetch": r["offsets"]}
                       for r in rows[a:a + period * reps])
            continue
        last = a + period * (reps - 1)
        out.extend({**rows[a + k], "unit": short_name(span_name(rows[a + k]["unit"], rows[last + k]["unit"])),
                    "strategy": f"{rows[a + k]['strategy']} x{reps}", "prefetch": rows[a + k]["offsets"]}
                   for k in range(period))
    return out


def unit_table(plan: Plan, profile: Profile, cluster: Cluster, *, wide: bool = False) -> Table:
    rows = _unit_rows(plan, profile, cluster)
    columns = WIDE_COLUMNS if wide else NARROW_COLUMNS
    t = Table(title=f"plan for {plan.model} on {plan.world} x {plan.device}, {shape_words(plan)}"
                    f"{accumulation_words(plan)}: "
                    f"{plural(len(plan.units), 'unit')}",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=not wide)
    shown = rows if wide else _folded(rows)
    if not wide:  # unit names break after a ".", in the room the other columns leave
        room = unit_room(shown, columns)
        shown = [{**r, "unit": wrap_name(r["unit"], room)} for r in shown]
    name_width = max(len(line) for r in shown for line in r["unit"].split("\n"))
    for col in columns:
        t.add_column(col, justify="left" if col in LEFT else "right", overflow="fold",
                     no_wrap=col not in FOLDED,
                     min_width=name_width if col == "unit" and not wide else None)
    for r in shown:
        t.add_row(*(r[c] for c in columns))
    return t


FOLDED = ("unit", "prefetch")
"""Columns rich may fold; the others never break."""


def unit_room(rows: list[dict], columns: tuple[str, ...], width: int = 80) -> int:
    """Characters left for the unit column when every other column takes its widest cell
    (prefetch lists no wider than the header: they fold) and cells are 2 apart (collapsed padding)."""
    def widest(c: str) -> int:
        return max(len(c), *(len(r[c]) for r in rows))
    others = sum(min(widest(c), len(c)) if c == "prefetch" else widest(c) for c in columns if c != "unit")
    return max(12, width - others - 2 * (len(columns) - 1) - 2)


def wrap_name(name: str, width: int) -> str:
    """A unit name broken into lines of at most `width` after a "." (never inside a
    module name, which rich's folding would cut mid-word); a part longer than
    `width` alone is left to fold."""
    lines, line = [], ""
    for part in re.findall(r"[^.]+\.*|\.+", name):
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
    return "\n".join(lines + [line])


def shape_words(plan: Plan) -> str:
    """What one worker's step holds, as the plan assumed it: "micro-batch 4 x seq 1024", or
    "inputs as built (...)" for inputs with no batch dimension (`profile.measure.inputs_words`)."""
    if plan.extra.get("inputs"):
        return plan.extra["inputs"]
    return f"micro-batch {plan.micro_batch}" + (f" x seq {plan.seq}" if plan.seq else "")


def accumulation_words(plan: Plan) -> str:
    """", 4 accumulated per step (grad sync last)" when the plan accumulates, else ""."""
    if plan.accumulation <= 1:
        return ""
    return f", {plan.accumulation} accumulated per step (grad sync {plan.grad_sync.value})"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def budget_words(plan: Plan) -> str:
    """The budget as the plan states it: "budget 40 GiB, usable 37 GiB after 3 GiB headroom"."""
    given = fmt_bytes(plan.memory_budget_bytes) if plan.memory_budget_bytes else "none"
    if plan.usable_budget_bytes is None:
        return f"budget {given}"
    usable = f"usable {fmt_bytes(plan.usable_budget_bytes)}"
    if plan.memory_budget_bytes is None:
        usable = f"usable device memory {fmt_bytes(plan.usable_budget_bytes)}"
    return f"budget {given}, {usable} after {fmt_bytes(plan.headroom_bytes)} headroom"


def verified_line(plan: Plan) -> str:
    """The engine's peak beside the prediction (`shardsched.verify`), or why there is none."""
    v = plan.verified
    if v is None:
        return "verified peak per worker: not verified (see the notes)"
    err = (plan.predicted.peak_bytes / v.peak_bytes - 1) * 100 if v.peak_bytes else 0.0
    return (f"verified peak per worker: {fmt_bytes(v.peak_bytes)} ({v.engine}, {v.tensors} tensors; predicted "
            f"{err:+.1f}%) at {v.peak_at}")


def summary_lines(plan: Plan) -> list[str]:
    p, m, s = plan.predicted, plan.predicted.memory, plan.solver
    lines = [
        f"predicted peak per worker: {fmt_bytes(p.peak_bytes)} ({budget_words(plan)}) at {p.peak_at}",
        f"  params {fmt_bytes(m.params)}, grads {fmt_bytes(m.grads)}, optimizer {fmt_bytes(m.optimizer)},",
        f"  activations {fmt_bytes(m.activations)}, comm buffers {fmt_bytes(m.comm_buffers)}",
        f"  model states (ZeRO's definition) {fmt_bytes(p.model_states_bytes)}",
        verified_line(plan),
        f"predicted step: {fmt_seconds(p.step_seconds)} = compute {fmt_seconds(p.compute_seconds)} "
        f"+ exposed communication {fmt_seconds(p.exposed_comm_seconds)}",
        f"  lower bound max(compute, communication {fmt_seconds(p.comm_seconds)}) = {fmt_seconds(p.lower_bound_seconds)}",
        f"solver: {s.name}, status {s.status}, gap {_gap(s)}, {s.seconds:.3f} s",
    ]
    return lines + [f"note: {readable_note(n)}" for n in plan.notes]


def _gap(s) -> str:
    """A gap only where a solver bounded it (a given uniform plan has none to report)."""
    return "n/a" if s.gap is None or s.status == "given" else f"{s.gap:.2%}"


def print_plan(plan: Plan, profile: Profile, cluster: Cluster, *, console: Console | None = None,
               wide: bool = False) -> None:
    console = console or default_console(wide=wide)
    console.print(unit_table(plan, profile, cluster, wide=wide))
    if not wide:
        console.print(LEGEND, highlight=False, markup=False, style="dim")
    for line in summary_lines(plan):
        console.print(line, highlight=False, markup=False)
