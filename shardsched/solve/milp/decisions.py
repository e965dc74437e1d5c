"""The MILP's decisions for one grouping and their columns: `_Build` makes them, has its
mixins write the rows (`times`, `memory`, `objective`), and turns a `Choice` into column
values (`start`) and column values back into a `Choice` (`choice`).

Decisions (binary): z[i,k] unit i takes strategy k (replicate, shard_grad_op,
full_shard, and across nodes full_shard_node, hybrid_shard, hybrid_shard_grad_op);
ck[i] unit i is activation-checkpointed (when the Problem allows it); xf[i,l] its
forward AllGather is launched at step l; xb[i,l] its backward AllGather (strategies
that gather for backward: full_shard, full_shard_node, hybrid_shard; sum_l xb[i,l] =
sum of their z[i,k]) at step l.
"""
from __future__ import annotations

import math

import numpy as np

from shardsched.solve.candidates import Choice, Problem
from shardsched.solve.milp.costs import costs_of
from shardsched.solve.milp.memory import _MemoryRows
from shardsched.solve.milp.model import _Model, _add
from shardsched.solve.milp.objective import _Objective
from shardsched.solve.milp.times import _TimeRows
from shardsched.core.types import Checkpoint, Strategy


def windows(n: int, ahead: int) -> tuple[list[range], list[range]]:
    """Launch windows at most `ahead` steps before use (`sim.scenario` bounds).
    Why a window: an AllGather launched K steps early holds its buffer K steps;
    beyond a few steps the channel is already saturated (a one-ahead prefetch
    keeps a FIFO channel busy whenever communication is the bottleneck), so for
    large models we cap K and trade exactness for a smaller model (`auto`)."""
    fwin = [range(max(0, i - ahead), i + 1) for i in range(n)]
    bwin = [range(max(n, 2 * n - 1 - i - ahead), 2 * n - i) for i in range(n)]
    return fwin, bwin


class _Build(_TimeRows, _MemoryRows, _Objective):
    """Columns and rows of the MILP for one Problem (see this module's docstring and its mixins')."""

    def __init__(self, p: Problem, *, budget: int, ahead: int, t_ub: float | None):
        self.p, self.c, self.n, self.m = p, costs_of(p), p.n, _Model()
        self.fwin, self.bwin = windows(p.n, ahead)
        comp = self.c.fwd + self.c.bwd[::-1]
        self.tscale = max(sum(comp), 1e-12)  # times ~1: tolerances are relative to the step
        self.comp = [t / self.tscale for t in comp]
        self.aux_defs: list[tuple[int, dict, float]] = []
        self.products: list[tuple[int, int, tuple[int, ...]]] = []  # (column, launch col, z cols)
        self._decisions()
        self.t_ub = (t_ub / self.tscale) * (1 + 1e-7) + 1e-9 if t_ub is not None else self._serial_bound()
        self._times()
        self._memory(budget)

    def _decisions(self) -> None:
        m, p = self.m, self.p
        self.z = [{k: m.var(integer=True) for k in p.allowed[i]} for i in range(self.n)]
        for i in range(self.n):
            m.row({v: 1.0 for v in self.z[i].values()}, 1.0, 1.0)
        self.ck = [m.var(integer=True) if p.can_checkpoint(i) else None for i in range(self.n)]
        self.sc = [m.var(integer=True) if p.can_select(i) else None for i in range(self.n)]
        for i in range(self.n):  # one of none, full, selective ([Note: three checkpointing modes in the MILP])
            if self.sc[i] is not None:
                m.row({self.ck[i]: 1.0, self.sc[i]: 1.0}, 0.0, 1.0)
        self._handed_over()
        self.xf = [{l: m.var(integer=True) for l in self.fwin[i]} for i in range(self.n)]
        for i in range(self.n):
            m.row({v: 1.0 for v in self.xf[i].values()}, 1.0, 1.0)
        gathering = [[k for k in self.z[i] if k.gathers_for_backward] for i in range(self.n)]
        self.xb = [{l: m.var(integer=True) for l in self.bwin[i]} if gathering[i] else {} for i in range(self.n)]
        for i in range(self.n):
            if self.xb[i]:
                m.row(_add({v: 1.0 for v in self.xb[i].values()}, {self.z[i][k]: -1.0 for k in gathering[i]}),
                      0.0, 0.0)
        self.fdur = [self._durations(i, self.xf[i], self.c.agf[i]) for i in range(self.n)]
        self.bdur = [self._durations(i, self.xb[i], self.c.agb[i]) for i in range(self.n)]

    def _recomputes(self, i: int) -> dict:
        """x_i = ck_i + sc_i: unit i recomputes (full or selective); {} where it cannot."""
        return {v: 1.0 for v in (self.ck[i], self.sc[i]) if v is not None}

    def _handed_over(self) -> None:
        """handed[j] = x_{j-1} (1 - x_j), exact for binaries by its three bounds (McCormick):
        unit j-1 recomputes and unit j does not, so j-1 retains its output ([Note: the output a
        recomputed unit hands over] in sim/scenario.py); None where it cannot be 1."""
        m, self.handed = self.m, [None] * self.n
        for j in range(1, self.n):
            prev, own = self._recomputes(j - 1), self._recomputes(j)
            if not prev or not self.p.costs[j].handed_over_bytes():
                continue
            y = self.handed[j] = m.var(0.0, 1.0)
            m.row(_add({y: 1.0}, {v: -1.0 for v in prev}), -math.inf, 0.0)           # y <= x_{j-1}
            m.row(_add(_add({y: 1.0}, {v: -1.0 for v in prev}), own), 0.0, math.inf)   # y >= x_{j-1} - x_j
            if own:
                m.row(_add({y: 1.0}, own), -math.inf, 1.0)                               # y <= 1 - x_j

    def zexpr(self, i: int, coef: dict) -> dict:
        return {v: coef[k] for k, v in self.z[i].items()}

    # ---------------------------------------------------------------- start and result

    def start(self, ch: Choice) -> np.ndarray:
        """Column values of a Choice: binaries, then the tight (replay) times and aux sums."""
        x = np.zeros(len(self.m.lb))
        for i in range(self.n):
            x[self.z[i][ch.strategies[i]]] = 1.0
            # a replicate unit launched at its use: the same time and memory, and no
            # prefetch for the memory rows to count ([Note: a shard group of one issues no AllGather])
            x[self.xf[i][i if ch.strategies[i] is Strategy.REPLICATE else ch.fwd[i]]] = 1.0
            if ch.bwd[i] is not None:
                x[self.xb[i][ch.bwd[i]]] = 1.0
            mode = Checkpoint(ch.ckpt[i]) if ch.ckpt else Checkpoint.NONE
            if self.sc[i] is not None and mode is Checkpoint.SELECTIVE:
                x[self.sc[i]] = 1.0
            elif self.ck[i] is not None and mode:
                x[self.ck[i]] = 1.0
        for y, launch, zs in self.products:
            x[y] = max(0.0, x[launch] + sum(x[v] for v in zs) - 1.0)
        for j, y in enumerate(self.handed):
            if y is not None:
                x[y] = sum(x[v] for v in self._recomputes(j - 1)) * (1.0 - sum(x[v] for v in self._recomputes(j)))
        for v, terms, const in self.aux_defs:
            x[v] = const + sum(c * x[k] for k, c in terms.items())
        self._start_times(x)
        return x

    def choice(self, x: np.ndarray) -> Choice:
        strat = tuple(max(self.z[i], key=lambda k: x[self.z[i][k]]) for i in range(self.n))
        fwd = tuple(max(self.xf[i], key=lambda l: x[self.xf[i][l]]) for i in range(self.n))
        bwd = tuple(max(self.xb[i], key=lambda l: x[self.xb[i][l]]) if strat[i].gathers_for_backward else None
                    for i in range(self.n))
        # full and none stay booleans, as every solver writes them (`Choice.ckpt`)
        ckpt = tuple(Checkpoint.SELECTIVE if s is not None and x[s] > 0.5 else bool(c is not None and x[c] > 0.5)
                     for c, s in zip(self.ck, self.sc))
        return Choice(strat, fwd, bwd, ckpt if any(ckpt) else ())

