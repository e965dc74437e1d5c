"""The simulated step as a picture (`shardsched plan --png`).

Top: the compute lane (forward, backward with recomputation, optimizer step) and
the communication lane (one FIFO channel, `sim.timeline`), each collective labelled
with its unit. Bottom: memory at every compute step's largest moment
(`sim.memory.step_memory`), stacked by kind, with the budget line. Agg backend.
"""
from __future__ import annotations

from shardsched.cost.comm import Collective
from shardsched.sim.memory import StepMemory
from shardsched.sim.scenario import Scenario
from shardsched.sim.timeline import Timeline

COLORS = {"F": "#4c72b0", "B": "#dd8452", "opt": "#55a868", Collective.ALL_GATHER: "#8172b3",
          Collective.REDUCE_SCATTER: "#c44e52", Collective.ALL_REDUCE: "#937860"}
KINDS = ("params", "grads", "optimizer", "activations", "comm_buffers")


def _label(ax, x0: float, w: float, y: float, text: str, span: float, *, least: float = 0.02) -> None:
    if w > span * least:  # only where it can be read
        ax.text(x0 + w / 2, y, text, ha="center", va="center", fontsize=6, clip_on=True, rotation=90 if
                w < span * 0.06 else 0)


def step_png(path: str, sc: Scenario, tl: Timeline, memory: list[StepMemory], *, budget: int | None,
             title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = tl.step_seconds or 1.0
    ms = 1e3
    fig, (lanes, mem) = plt.subplots(2, 1, figsize=(12, 6.5), dpi=100, sharex=True,
                                     gridspec_kw={"height_ratios": [1, 1.4]})
    for c in tl.compute:
        kind = "opt" if c.name == "opt" else c.name[0]
        lanes.broken_barh([(c.start * ms, (c.end - c.start) * ms)], (1.1, 0.8), facecolor=COLORS[kind],
                          edgecolor="white", linewidth=0.5)
        _label(lanes, c.start * ms, (c.end - c.start) * ms, 1.5, c.name.split(":")[-1], span * ms)
    for e in tl.comm:
        lanes.broken_barh([(e.start * ms, (e.end - e.start) * ms)], (0.1, 0.8), facecolor=COLORS[e.kind],
                          edgecolor="white", linewidth=0.3)
        short = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR"}[e.kind.value]
        _label(lanes, e.start * ms, (e.end - e.start) * ms, 0.5, f"{short} {sc.units[e.unit].name}", span * ms,
               least=0.003)
    lanes.set_yticks([0.5, 1.5], ["communication", "compute"])
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in COLORS]
    lanes.legend(handles, ["forward", "backward", "optimizer", "AllGather", "ReduceScatter", "AllReduce"],
                 fontsize=7, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.suptitle(title)
    _memory(mem, tl, memory, budget=budget, ms=ms)
    mem.set_xlabel("time in the step (ms)")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _memory(ax, tl: Timeline, memory: list[StepMemory], *, budget: int | None, ms: float) -> None:
    """Stacked memory by kind, as a step function over each compute step."""
    top = max([m.total for m in memory] + [budget or 0])
    unit, size = ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)
    xs, stacks = [], {k: [] for k in KINDS}
    for c, m in zip(tl.compute, memory):
        for x in (c.start, c.end):
            xs.append(x * ms)
            for k in KINDS:
                stacks[k].append(getattr(m.breakdown, k) / size)
    ax.stackplot(xs, *[stacks[k] for k in KINDS], labels=[k.replace("_", " ") for k in KINDS], alpha=0.8)
    if budget is not None:
        ax.axhline(budget / size, color="red", linestyle="--", linewidth=1.5, label="budget")
    ax.set_ylabel(f"memory per worker ({unit})")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, alpha=0.3)
