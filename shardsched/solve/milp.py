"""The schedule MILP for one grouping: strategies and AllGather launch points.

Decisions (binary): z[i,k] unit i takes strategy k (replicate, shard_grad_op,
full_shard, and across nodes full_shard_node, hybrid_shard, hybrid_shard_grad_op);
ck[i] unit i is activation-checkpointed (when the Problem allows it); xf[i,l] its
forward AllGather is launched at step l; xb[i,l] its backward AllGather (strategies
that gather for backward: full_shard, full_shard_node, hybrid_shard; sum_l xb[i,l] =
sum of their z[i,k]) at step l. Times (continuous, in units of `tscale` seconds), one set per
compute step s = 0..2n (`sim.scenario` indexing):
  S[s] issue start of step s's AllGathers = max(Z[s-1], E[s-1])
  Z[s] channel free after step s's collectives (AllGathers, then its reduction)
  E[s] end of compute step s
They mirror `sim.timeline.replay` exactly: program order is fixed by the launch
steps, the channel is FIFO, and an AllGather launched at l with use u ends at
S[l] + (durations of the AllGathers launched at l with use <= u): FSDP2 issues a
step's own unsharding first, then its prefetch list in use order. That sum is
linear in the binaries; the "compute u waits for it" constraint holds only when
u's AllGather is launched at l, hence big-M. Every constraint is ">=" of a max-
plus recurrence, so for fixed binaries the minimal E[2n] is the replay's step
time (tests/solve/test_milp_vs_brute.py and test_levers_vs_brute.py check
objective == replay == brute force).

Strategy-dependent durations: an AllGather runs over the world or only the node
(`cost.strategy`), so a launch's duration is sum_k sec[k] * xf[i,l] * z[i,k]. Each
distinct duration gets one continuous y >= xf[i,l] + sum_{k in K} z[i,k] - 1 (K: the
strategies with that duration); durations only ever delay (every time row is ">="),
so at the optimum y sits on its bound, the product. Recomputation: unit i's backward
step lasts bwd[i] + ck[i] * fwd[i] (in the E recurrence, the deadlines and the
blocking rows).

Memory: every moment `sim.memory.step_memory` evaluates (forward copy-out and
compute; backward compute, reduce and full_shard copy-out; optimizer) is a
linear expression of z, ck and x, constrained <= budget. Running sums (persistent
states, reduced gradients, bytes held between forward and backward: the unsharded
copy, hpZ's node-sized slice or nothing; retained activations A[i] = A[i-1] + act[i]
- ck[i] (act[i] - input[i])) are auxiliary variables so rows stay short. A
checkpointed unit's backward-start row counts its last layer recomputed
(`UnitCost.checkpointed_start`, a ck[i] term), a fused unit's later moments one row each
where it binds ([Note: inner moments as rows]), its forward row for the start
of its last module the other layers' kept inputs (`checkpointed_lead_bytes`); its
backward copy-out row (gated by big-M on the gathering strategies' z) only its inputs
and, for full_shard_node, its slice.

Objective: the step, (1 - share) E[2n] + share (compute + recomputation + communication +
optimizer), where share is what a collective takes from the compute beside it
(`DeviceSpec.comm_sm_share`; [Note: collectives slow the compute beside them] in
sim/timeline.py): E[2n] is the unslowed step, the rest a constant and terms on z and ck/sc,
so it is the replay's step for every choice (0 share: E[2n] alone).

Big-M: with the warm start's step time T_ub as an upper bound on E[2n] (a
schedule worse than the start is useless), every AllGather ends by T_ub, so
M = T_ub - (compute before u) is valid and as tight as we know how to make it.
Big-M deadlines give weak LP bounds; the warm start is what makes HiGHS fast.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import NamedTuple

import highspy
import numpy as np

from shardsched._stdout import native_quiet
from shardsched.cost.strategy import gather_seconds, held_after_forward, reduce_seconds, shard_count
from shardsched.sim.scenario import code_held_terms
from shardsched.sim.memory import (extra_gather, forward_gathers, holds_root_grad, in_place_held, in_place_reduce_bytes,
                                   own_grad_bytes, root_grad_bytes)
from shardsched.solve.candidates import Choice, Problem, once
from shardsched.plan.schedule import optimizer_seconds_per_param
from shardsched.core.types import Checkpoint, GradSync, Strategy

FS, SGO, REP = Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP, Strategy.REPLICATE
FSN, HS, HSGO = Strategy.FULL_SHARD_NODE, Strategy.HYBRID_SHARD, Strategy.HYBRID_SHARD_GRAD_OP
GiB = float(1 << 30)
MEMORY_MARGIN_GIB = 0.5 / GiB
"""Rows are in GiB; keep half a byte below the budget (simulated bytes are integers) so solver tolerances never
let a schedule that the simulator rejects through."""


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


class _Model:
    """Columns and rows accumulated in Python, passed to HiGHS once (rowwise)."""

    def __init__(self):
        self.lb, self.ub, self.integer, self.cost, self.rows = [], [], [], [], []
        self.offset = 0.0
        """The objective's constant term."""

    def var(self, lb=0.0, ub=1.0, *, integer=False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        self.cost.append(0.0)
        return len(self.lb) - 1

    def row(self, terms: dict[int, float], lo=-math.inf, hi=math.inf) -> None:
        self.rows.append(({k: v for k, v in terms.items() if v != 0.0}, lo, hi))

    def ge(self, lhs: dict, rhs: dict, const: float = 0.0) -> None:
        """sum(lhs) >= sum(rhs) + const."""
        self.row(_add(lhs, rhs, -1.0), lo=const)

    def lp(self) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(self.lb), len(self.rows)
        lp.col_cost_ = np.array(self.cost)
        lp.offset_ = self.offset
        lp.col_lower_, lp.col_upper_ = np.array(self.lb), np.array(self.ub)
        lp.row_lower_ = np.array([lo for _, lo, _ in self.rows], dtype=float)
        lp.row_upper_ = np.array([hi for _, _, hi in self.rows], dtype=float)
        starts, index, value = [0], [], []
        for terms, _, _ in self.rows:
            index += list(terms)
            value += list(terms.values())
            starts.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=float)
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in self.integer]
        return lp


def _add(a: dict, b: dict, sign: float = 1.0) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + sign * v
    return out


class Costs(NamedTuple):
    """Per-unit constants of one Problem (seconds and bytes); dicts are by strategy."""

    agf: list[dict]
    """Forward AllGather seconds."""
    agb: list[dict]
    """Backward AllGather seconds (0 for strategies that keep their parameters)."""
    red: list[dict]
    fwd: list[float]
    bwd: list[float]
    """Backward seconds without recomputation (a checkpointed unit adds `rec`)."""
    rec: list[float]
    """Seconds a checkpointed unit recomputes in its backward (`UnitCost.recompute`: its
    forward, or a selective unit's recomputed ops)."""
    shard: list[dict]
    held: list[dict]
    """Bytes held from the end of forward to the backward copy-out (`cost.strategy`)."""
    unsharded: list[int]
    """AllGather output bytes padded over the world (pending prefetches: an upper bound for
    every strategy, linear in the launch variables)."""
    ugrad: list[int]
    rsbuf: list[int]
    unsh_by: list[dict]
    """Unsharded parameter bytes per strategy (dim 0 padded to its shard count)."""
    rs_by: list[dict]
    """Reduction input bytes per strategy: the largest module's (`UnitCost.module_reduce_numel`)."""
    root_grad: int
    """Unsharded gradients of the root unit, live through backward (`sim.memory.root_grad_bytes`)."""
    act: list[int]
    inp: list[int]
    """Activations a checkpointed unit retains (its layers' inputs)."""
    ws: list[int]
    ck_start: list[int]
    """A checkpointed unit's own bytes as its backward starts (`Scenario.backward_start`)."""
    fwd_own: list[tuple[int, int]]
    """A unit's own bytes at the peak of its forward, plain and checkpointed (`Scenario.forward_bytes`)."""
    bwd_own: list[int]
    """A unit's own bytes as its backward starts, not checkpointed (`UnitCost.backward_peak`)."""
    last_end: list
    """A fused unit: its own bytes at the end of its last layer's backward, plain and
    checkpointed (`UnitCost.last_end`); None for a unit of one module."""
    inner: list
    """A fused unit: the moments after its last layer's end (`UnitCost.inner_moments`), each
    (plain bytes or None, checkpointed bytes or None, bytes per strategy: the ReduceScatter
    input, the sharded gradients and the AllGather output it holds); None otherwise."""
    inner_most: list
    """Per fused unit and strategy: (plain, checkpointed) the most of `inner` (greedy's)."""

    # [Note: inner moments as rows]
    # Inside a fused unit's backward, moment k holds bytes that depend on checkpointing (the
    # activations before layer k) and on the strategy (layer k+1's ReduceScatter input padded
    # to the shard count, the sharded gradients of the layers done), so the most over k is
    # not linear in the unit's binaries. Each moment alone is (a constant, a term on the
    # checkpointing binary, one on the strategy's); a row for every moment that is the
    # largest for some (strategy, checkpointing) makes the rows' maximum exact at every choice.

    rs_kept_by: list[dict]
    """Reduction input retained after its backward, per strategy (`UnitCost.module_reduce_numel`)."""
    lead: list[int]
    cklead: list[int]
    """Activations live when a unit's last module starts, plain and checkpointed."""
    state: object
    input_bytes: int
    opt_factor: float
    opt_per_param: float
    """Optimizer seconds per persistent (sharded) parameter (`plan.schedule.make_scenario`)."""
    sac: list
    """Per unit, its selective form's numbers (`Selective`), or None where the Problem offers
    no selective checkpointing ([Note: three checkpointing modes in the MILP])."""
    recall: list[tuple]
    """Per unit, its own bytes in the backward of a repeated layer's earlier call, as it is
    gathered again and as it computes, each (plain, checkpointed) (`UnitCost.recall_bytes`;
    0: no layer repeats)."""


class Selective(NamedTuple):
    """A unit's selective form (`Problem.selective`), read as checkpointed: the checkpointed
    counterparts of `Costs`' per-unit fields ([Note: selective checkpointing as kept bytes])."""

    inp: int
    start: int
    fwd_own: int
    lead: int
    last_end: int | None
    loss: int
    """The outside code's forward transient after it (`UnitCost.after_forward`)."""
    inner: list | None
    """Own bytes of each of `Costs.inner`'s rows (same keys), None where it has no such moment."""
    rec: float
    recall: tuple[int, int] = (0, 0)
    """`UnitCost.recall_bytes` of its selective form: gathered, computing."""


# [Note: three checkpointing modes in the MILP]
# Per unit, checkpointing is none, full or selective: two binaries ck[i] (full) and sc[i]
# (selective), ck + sc <= 1. A selective unit's every moment is its checkpointed moment with
# its selective cost (plan/units.py), so each term that was `ck * (checkpointed - plain)` is
# now `ck * (full - plain) + sc * (selective - plain)`: still linear, and exact at each of the
# three choices. The inner moments of a fused unit stay one row each where they bind for some
# (strategy, mode).


def costs_of(p: Problem) -> Costs:
    cl = p.cluster
    sc = p.scenario(Choice(tuple(REP for _ in p.allowed), tuple(range(p.n)), (None,) * p.n))
    sb = sc.state
    ks = tuple(Strategy)
    # FSDP2 pads dim 0 to the strategy's shard count (`UnitCost.padded_numel`,
    # `cost.strategy.shard_count`): every size that depends on the strategy is per strategy.
    unsh_by = [{k: c.padded_numel(shard_count(k, cl)) * sb.unsharded_param for k in ks} for c in p.costs]
    # The reduction moves the whole unit (time); its largest buffer is one module's (memory).
    msg_by = [{k: c.padded_numel(shard_count(k, cl)) * sb.reduce for k in ks} for c in p.costs]
    rs_by = [{k: c.module_reduce_numel(shard_count(k, cl), last=False) * sb.reduce for k in ks} for c in p.costs]
    rs_kept_by = [{k: c.module_reduce_numel(shard_count(k, cl), last=True) * sb.reduce for k in ks} for c in p.costs]
    inner = [_inner(c, sb, cl, unsh_by[i], sc.accumulates_in_place) if len(c.layers) > 1 and c.layer_bytes else None
             for i, c in enumerate(p.costs)]
    plain, ckpt = sc, dataclasses.replace(sc, checkpoint=(True,) * sc.n)  # for `Scenario.forward_bytes`
    sac = _selective(p, sb, cl, inner) if p.selective else [None] * p.n
    return Costs(agf=[{k: gather_seconds(k, b[k], cl, backward=False) for k in ks} for b in unsh_by],
                 agb=[{k: gather_seconds(k, b[k], cl, backward=True) if k.gathers_for_backward else 0.0 for k in ks}
                      for b in unsh_by],
                 red=[{k: reduce_seconds(k, r[k], cl) for k in ks} for r in msg_by],
                 # from the scenario: it adds the device's per-unit host overhead
                 fwd=[c.forward_seconds for c in sc.units], bwd=[c.backward_seconds for c in sc.units],
                 rec=[c.recompute() for c in sc.units],
                 shard=[{k: c.shard_numel(shard_count(k, cl)) for k in ks} for c in p.costs],
                 held=[{k: held_after_forward(k, b[k], cl) for k in ks} for b in unsh_by],
                 unsharded=[c.padded_numel(cl.world) * sb.unsharded_param for c in p.costs],
                 ugrad=[own_grad_bytes(c, sc) for c in sc.units],
                 rsbuf=[c.padded_numel(cl.world) * sb.reduce for c in p.costs],
                 unsh_by=unsh_by, rs_by=rs_by, root_grad=root_grad_bytes(sc),
                 act=[c.activation_bytes for c in p.costs], inp=[c.input_bytes for c in p.costs],
                 ws=[c.workspace_bytes for c in p.costs],
                 ck_start=[ckpt.backward_start(i) for i in range(sc.n)],
                 fwd_own=[(plain.forward_bytes(i), ckpt.forward_bytes(i)) for i in range(sc.n)],
                 bwd_own=[c.backward_peak() for c in p.costs], rs_kept_by=rs_kept_by,
                 recall=[tuple(tuple(c.recall_bytes(sb.unsharded_grad, checkpointed=ck, gathered=gt)
                                     for ck in (False, True)) for gt in (True, False)) for c in p.costs],
                 last_end=[tuple(c.last_end(sb.unsharded_grad, checkpointed=ck, in_place=sc.accumulates_in_place)
                                 for ck in (False, True))
                           if plain.fused(i) else None for i, c in enumerate(p.costs)],
                 inner=inner, inner_most=[_inner_most(rows, s.inner if s else None) for rows, s in zip(inner, sac)],
                 lead=[c.lead_activation_bytes for c in p.costs], cklead=[c.checkpointed_lead_bytes for c in p.costs],
                 # every moment holds these: the inputs, the buffers, the loss, Adam's step scalars
                 input_bytes=sc.input_bytes + sc.buffer_bytes + sc.loss_bytes + sc.optimizer_scalar_bytes,
                 state=sb, opt_factor=sc.optimizer_workspace_factor,
                 opt_per_param=optimizer_seconds_per_param(sb, cl), sac=sac)


def _selective(p: Problem, sb, cl, inner: list) -> list:
    """`Costs.sac`: the selective forms of the units, read as checkpointed."""
    sc = p.scenario(Choice(tuple(REP for _ in p.allowed), tuple(range(p.n)), (None,) * p.n,
                           (Checkpoint.SELECTIVE,) * p.n))
    out = []
    for i, c in enumerate(sc.units):
        if not p.can_select(i):
            out.append(None)
            continue
        fused = inner[i] is not None
        moments = c.inner_moments(sb.unsharded_grad, checkpointed=True, in_place=sc.accumulates_in_place) if fused else {}
        keys = sorted(set(p.costs[i].inner_moments(sb.unsharded_grad, checkpointed=False)) | set(moments)) \
            if fused else []
        out.append(Selective(inp=c.input_bytes, start=sc.backward_start(i), fwd_own=sc.forward_bytes(i),
                             lead=c.checkpointed_lead_bytes,
                             last_end=c.last_end(sb.unsharded_grad, checkpointed=True, in_place=sc.accumulates_in_place)
                             if sc.fused(i) else None,
                             loss=c.after_forward(),
                             inner=[moments[k].own if k in moments else None for k in keys] if fused else None,
                             rec=c.recompute(), recall=tuple(c.recall_bytes(sb.unsharded_grad, checkpointed=True, gathered=gt)
                                                                for gt in (True, False))))
    return out


def _inner(c, sb, cl, unsh: dict, in_place: bool = False) -> list[tuple]:
    """`Costs.inner` of one fused unit: its moments plain and checkpointed, paired by key,
    with what each holds per strategy (`sim.memory._Live.inner`; `in_place`:
    `Scenario.accumulates_in_place`, what `sim.memory.in_place_reduce_bytes` holds instead)."""
    ks = tuple(Strategy)
    rs = {k: c.layer_reduce_bytes(shard_count(k, cl), sb.reduce) for k in ks}
    done = {k: c.done_grad_bytes(shard_count(k, cl), sb.grad) for k in ks}
    held = {k: in_place_reduce_bytes(c, rs[k], c.shard_numel(shard_count(k, cl)) * sb.grad, sb.reduce)
            for k in ks} if in_place else None
    plain, ck = (c.inner_moments(sb.unsharded_grad, checkpointed=x, in_place=in_place) for x in (False, True))
    out = []
    for key in sorted(set(plain) | set(ck)):
        m = plain.get(key) or ck[key]
        per = {k: (in_place_held(*held[k], m, len(c.layers) - 1) if held else rs[k][m.reducing] + done[k][m.done])
               + (forward_gathers(c, k) * unsh[k] if m.gathered else 0) for k in ks}
        out.append((plain[key].own if key in plain else None, ck[key].own if key in ck else None, per))
    return out


def _inner_most(rows, sac: list | None = None) -> dict | None:
    """Per strategy, (plain, checkpointed, selective) the most of a fused unit's inner moments
    (selective: the checkpointed one where the unit has no selective form)."""
    if rows is None:
        return None
    owns = [(r[0], r[1], sac[j] if sac is not None else r[1]) for j, r in enumerate(rows)]
    return {k: tuple(max((o[x] + r[2][k] for o, r in zip(owns, rows) if o[x] is not None), default=0)
                     for x in (0, 1, 2)) for k in Strategy}


def windows(n: int, ahead: int) -> tuple[list[range], list[range]]:
    """Launch windows at most `ahead` steps before use (`sim.scenario` bounds).
    Why a window: an AllGather launched K steps early holds its buffer K steps;
    beyond a few steps the channel is already saturated (a one-ahead prefetch
    keeps a FIFO channel busy whenever communication is the bottleneck), so for
    large models we cap K and trade exactness for a smaller model (`auto`)."""
    fwin = [range(max(0, i - ahead), i + 1) for i in range(n)]
    bwin = [range(max(n, 2 * n - 1 - i - ahead), 2 * n - i) for i in range(n)]
    return fwin, bwin


class _Build:
    """Columns and rows of the MILP for one Problem (see module docstring)."""

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

    def _serial_bound(self) -> float:
        c = self.c
        worst = sum(max(c.agf[i][k] + c.agb[i][k] + c.red[i][k] for k in self.z[i]) for i in range(self.n))
        opt = sum(s[REP] for s in c.shard) * c.opt_per_param
        recompute = sum(max(r, s.rec if s else 0.0) for r, s in zip(c.rec, c.sac)) if self.p.checkpointable else 0.0
        return (sum(self.comp) + (worst + opt + recompute) / self.tscale) * 1.01 + 1e-9

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

    def _durations(self, i: int, launches: dict, seconds: dict) -> dict:
        """launch step -> {column: scaled seconds}: the AllGather's duration when it is
        launched there. Strategies gather over different groups, so the duration is
        seconds[k] * x[l] * z[k]: one continuous y >= x + sum(z[K]) - 1 per distinct
        duration (exact at the optimum: durations only ever delay, so y sits on its bound)."""
        classes: dict[float, list] = {}
        for k in self.z[i]:
            if seconds[k] > 0:
                classes.setdefault(seconds[k], []).append(k)
        out = {}
        for l, x in launches.items():
            out[l] = {}
            for sec, ks in classes.items():
                if len(ks) == len(self.z[i]) or (launches is self.xb[i] and
                                                 set(ks) == {k for k in self.z[i] if k.gathers_for_backward}):
                    out[l][x] = sec / self.tscale  # every strategy that launches it: no product needed
                    continue
                y = self.m.var()
                zs = tuple(self.z[i][k] for k in ks)
                self.m.row(_add({y: 1.0, x: -1.0}, {v: -1.0 for v in zs}), lo=-1.0)
                self.products.append((y, x, zs))
                out[l][y] = sec / self.tscale
        return out

    def zexpr(self, i: int, coef: dict) -> dict:
        return {v: coef[k] for k, v in self.z[i].items()}

    def _ag_at(self, l: int, max_use: int) -> dict:
        """Durations of the AllGathers launched at l with use <= max_use."""
        n, out = self.n, {}
        for j in range(n):
            if l in self.fdur[j] and j <= max_use:
                out = _add(out, self.fdur[j][l])
            if l in self.bdur[j] and 2 * n - 1 - j <= max_use:
                out = _add(out, self.bdur[j][l])
        return out

    def _recompute(self, s: int) -> dict:
        """A checkpointed unit's backward step also recomputes (`Costs.rec`)."""
        n = self.n
        if s < n or s >= 2 * n or self.ck[2 * n - 1 - s] is None:
            return {}
        i = 2 * n - 1 - s
        sac = self.c.sac[i]
        return _add({self.ck[i]: self.c.rec[i] / self.tscale}, {self.sc[i]: sac.rec / self.tscale} if sac else {})

    def _opt_seconds(self) -> dict:
        out = {}
        for i in range(self.n):
            out = _add(out, self.zexpr(i, {k: s * self.c.opt_per_param / self.tscale
                                           for k, s in self.c.shard[i].items()}))
        return out

    def _times(self) -> None:
        m, n, ub = self.m, self.n, self.t_ub
        self.S = [m.var(0.0, ub) for _ in range(2 * n)]
        self.Z = [m.var(0.0, ub) for _ in range(2 * n)]
        self.E = [m.var(0.0, ub) for _ in range(2 * n + 1)]
        for s in range(2 * n):
            rc = self._recompute(s)
            if s > 0:
                m.ge({self.S[s]: 1.0}, {self.Z[s - 1]: 1.0})
                m.ge({self.S[s]: 1.0}, {self.E[s - 1]: 1.0})
                m.ge({self.E[s]: 1.0}, _add({self.E[s - 1]: 1.0}, rc), self.comp[s])
            else:
                m.ge({self.E[0]: 1.0}, {}, self.comp[0])
            self._channel(s)
            self._deadlines(s)
            if not self.p.cluster.device.overlap:  # blocking collectives: compute after the whole batch
                m.ge({self.E[s]: 1.0}, _add(_add({self.S[s]: 1.0}, self._ag_at(s, 2 * n)), rc), self.comp[s])
        opt = self._opt_seconds()
        m.ge({self.E[2 * n]: 1.0}, _add({self.E[2 * n - 1]: 1.0}, opt))
        m.ge({self.E[2 * n]: 1.0}, _add({self.Z[2 * n - 1]: 1.0}, opt))
        m.ge({self.E[2 * n]: 1.0}, _add(self._all_comm(), opt))  # a valid cut: the channel is serial
        self._objective(opt)

    def _objective(self, opt: dict) -> None:
        """The step: E[2n], the replay's step before compute is slowed, plus the compute a collective
        beside it slows, share x (compute + communication - E[2n]) ([Note: collectives slow the
        compute beside them] in sim/timeline.py): linear, so exact for every choice."""
        m, n, share = self.m, self.n, self.p.cluster.device.overlap_share
        m.cost[self.E[2 * n]] = 1.0 - share
        if not share:
            return
        work = _add(self._all_comm(), opt)
        for s in range(n, 2 * n):
            work = _add(work, self._recompute(s))
        for col, coef in work.items():
            m.cost[col] += share * coef
        m.offset = share * sum(self.comp)

    def _channel(self, s: int) -> None:
        n, m = self.n, self.m
        batch = _add({self.S[s]: 1.0}, self._ag_at(s, 2 * n))
        if s < n:
            m.ge({self.Z[s]: 1.0}, batch)
            return
        i = 2 * n - 1 - s
        red = self.zexpr(i, {k: v / self.tscale for k, v in self.c.red[i].items()})
        m.ge({self.Z[s]: 1.0}, _add(batch, red))
        m.ge({self.Z[s]: 1.0}, _add({self.E[s]: 1.0}, red))

    def _deadlines(self, u: int) -> None:
        """Compute u starts after its AllGather: E[u] - comp[u] >= end of that AllGather."""
        n = self.n
        i = u if u < n else 2 * n - 1 - u
        launches = self.xf[i] if u < n else self.xb[i]
        before = sum(self.comp[:u])
        rc = self._recompute(u)
        for l, x in launches.items():
            big = max(self.t_ub - before, 0.0)
            end = _add(_add({self.S[l]: 1.0}, self._ag_at(l, u)), rc)
            self.m.ge(_add({self.E[u]: 1.0}, {x: -big}), end, self.comp[u] - big)

    def _all_comm(self) -> dict:
        out, c, ts = {}, self.c, self.tscale
        for i in range(self.n):
            out = _add(out, self.zexpr(i, {k: (c.agf[i][k] + c.agb[i][k] + c.red[i][k]) / ts for k in self.z[i]}))
        return out

    def _aux(self, terms: dict, const: float = 0.0) -> int:
        """A continuous variable equal to `terms + const` (keeps memory rows short)."""
        v = self.m.var(-math.inf, math.inf)
        self.m.row(_add({v: 1.0}, terms, -1.0), const, const)
        self.aux_defs.append((v, terms, const))
        return v

    def _running_sums(self) -> None:
        c, n, g = self.c, self.n, 1.0 / GiB
        sb = c.state
        pp, po = {}, {}
        for i in range(n):
            pp = _add(pp, self.zexpr(i, {k: s * sb.param * g for k, s in c.shard[i].items()}))
            po = _add(po, self.zexpr(i, {k: s * sb.optimizer * g for k, s in c.shard[i].items()}))
        self.PP, self.PO = self._aux(pp), self._aux(po)
        # G[i+1]: reduced gradients of units after i (backward of i runs after theirs).
        self.G = [None] * (n + 1)
        self.G[n] = self._aux({})
        for i in reversed(range(n)):
            self.G[i] = self._aux(_add({self.G[i + 1]: 1.0},
                                       self.zexpr(i, {k: s * sb.grad * g for k, s in c.shard[i].items()})))
        # U[i]: bytes units before i hold between their forward and their backward.
        self.U = [self._aux({})]
        for i in range(n - 1):
            live = {k: c.held[i][k] * g for k in self.z[i]}
            self.U.append(self._aux(_add({self.U[-1]: 1.0}, self.zexpr(i, live))))
        # A[i+1]: activations retained by units 0..i (a checkpointed unit keeps its inputs).
        self.A = [({}, 0.0)]
        for i in range(n):
            terms, const = self.A[-1]
            if self.ck[i] is not None:
                terms = {self._aux(_add(terms, self._ck_term(i, (c.inp[i] - c.act[i]),
                                                             _sac(c, i, "inp", c.act[i]) - c.act[i]))): 1.0}
            if i + 1 < n and self.handed[i + 1] is not None:  # its output, handed over
                terms = _add(terms, {self.handed[i + 1]: self.p.costs[i + 1].handed_over_bytes() * g})
            self.A.append((terms, const + c.act[i] * g))

    def _pending(self, s: int, *, inclusive: bool) -> dict:
        """AllGather outputs launched (before / at) s and used after s."""
        n, g, out = self.n, 1.0 / GiB, {}
        for j in range(n):
            for use, launches in ((j, self.xf[j]), (2 * n - 1 - j, self.xb[j])):
                if use <= s:
                    continue
                for l, x in launches.items():
                    if l < s or (l == s and inclusive):
                        out[x] = out.get(x, 0.0) + self.c.unsharded[j] * g
        return out

    def _memory(self, budget: int) -> None:
        """One row per moment of `sim.memory.step_memory`, in GiB, <= budget."""
        self._running_sums()
        c, n, g = self.c, self.n, 1.0 / GiB
        cap = budget * g - MEMORY_MARGIN_GIB
        self.mem_rows: list[tuple] = []  # (step, terms, const, gate column or None), for tests
        base = {self.PP: 1.0, self.PO: 1.0}
        # the AllGather output each unit holds in its forward: its own (`sim.memory`
        # [Note: the held AllGather output])
        held_ag = [self.zexpr(i, {k: forward_gathers(u, k) * c.unsh_by[i][k] * g for k in self.z[i]})
                   for i, u in enumerate(self.p.costs)]
        for i in range(n):
            # Its unsharded parameters and its AllGather output while it runs; at its copy-out
            # its AllGather output next to the one held before.
            unit = self.p.costs[i]
            # the earlier outputs the calling code holds, in every forward row ([Note: outputs the
            # caller's code holds] in profile/held.py): linear in those units' binaries
            code = {}
            for j, full, sel, _ in code_held_terms(self.p.costs, i):  # auto offers `+sac` only
                code = _add(code, self._ck_term(j, full, sel))
            fbase = _add(base, code)
            code_const = unit.code_held_bytes * g
            unsh = self.zexpr(i, {k: c.unsh_by[i][k] * g for k in self.z[i]})
            ag = held_ag[i]
            extra = self.zexpr(i, {k: extra_gather(unit, k) * c.unsh_by[i][k] * g for k in self.z[i]})
            extra = _add(extra, self._ck_term(i, c.cklead[i] - c.lead[i], _sac(c, i, "lead", c.lead[i]) - c.lead[i]))
            prev = held_ag[i - 1] if i else {}
            live = _add(_add(fbase, {self.U[i]: 1.0}), _add(unsh, ag))
            (a0, k0), (a1, k1) = self.A[i], self.A[i + 1]
            copyout = _add(_add(fbase, {self.U[i]: 1.0}), _add(unsh, ag))
            # when unit i-1 recomputes, its whole input, the part unit i-1 retains (handed) aside
            d = unit.handed_over_bytes()
            after_ck = _add(self._ck_term(i - 1, d, d), {self.handed[i]: -d * g} if self.handed[i] is not None else {}) \
                if i else {}
            self._mem(i, _add(_add(_add(copyout, prev), a0), _add(self._pending(i, inclusive=False), after_ck)),
                      k0 + code_const + (unit.entry_bytes + c.input_bytes) * g, cap)
            if len(unit.layers) > 1:  # its last module starts (and gathers again when it reshards)
                self._mem(i, _add(_add(_add(live, extra), a0), self._pending(i, inclusive=True)),
                          k0 + code_const + (c.lead[i] + c.input_bytes) * g, cap)
            tail = unit.after_forward()
            if tail:  # the code after it, the unit resharded (`sim.memory`, [Note: exit windows])
                after = _add(self.zexpr(i, {k: c.held[i][k] * g for k in self.z[i]}), ag)
                # a selective form's is less (`_sac`): it keeps the loss's input
                self._mem(i, _add(_add(_add(_add(fbase, {self.U[i]: 1.0}), after), _add(a1, self._pending(i, inclusive=True))),
                                  self._ck_term(i, 0.0, _sac(c, i, "loss", tail) - tail)),
                          k1 + code_const + (tail + c.input_bytes) * g, cap)
            fplain, fck = c.fwd_own[i]  # its own forward peak (`Scenario.forward_bytes`)
            self._mem(i, _add(_add(_add(live, a0), self._pending(i, inclusive=True)),
                              self._ck_term(i, fck - fplain, _sac(c, i, "fwd_own", fplain) - fplain)),
                      k0 + code_const + (fplain + c.input_bytes) * g, cap)
        for s in range(n, 2 * n):
            self._backward_rows(s, base, cap)
        opt = {self.PP: 1.0 + c.opt_factor, self.PO: 1.0, self.G[0]: 1.0}
        self._mem(2 * n, opt, c.input_bytes * g, cap)

    def _backward_rows(self, s: int, base: dict, cap: float) -> None:
        """Backward of unit i frees its activations as it makes its gradients:
        start (earlier units' retained activations and its own in full: recomputed
        when checkpointed; + workspace), end (gradients), reduce, and the copy-out of
        its backward AllGather when its strategy gathers for backward."""
        c, n, g = self.c, self.n, 1.0 / GiB
        i = 2 * n - 1 - s
        held_rs = self.zexpr(i + 1, {k: v * g for k, v in c.rs_kept_by[i + 1].items() if k in self.z[i + 1]}) \
            if i + 1 < n else {}
        u = self.zexpr(i, {k: c.unsh_by[i][k] * g for k in self.z[i]})
        live = _add(base, {self.U[i]: 1.0, self.G[i + 1]: 1.0})
        (a0, k0), (a1, k1) = self.A[i], self.A[i + 1]
        pend = _add(_add(live, a0), self._pending(s, inclusive=True))
        inp = c.input_bytes + (c.root_grad if holds_root_grad(i, n) else 0)  # `sim.memory.root_grad_bytes`
        start = _add(_add(_add(pend, u), held_rs), self._ck_term(i, c.ck_start[i] - c.bwd_own[i],
                                                                 _sac(c, i, "start", c.bwd_own[i]) - c.bwd_own[i]))
        self._mem(s, start, k0 + (c.bwd_own[i] + inp) * g, cap)
        outside = self.p.costs[i].outside_workspace_bytes
        if outside:  # the loss's backward before the unit gathers (`sim.memory` [Note: the loss ...])
            held = self.zexpr(i, {k: c.held[i][k] * g for k in self.z[i]})
            root = c.root_grad if holds_root_grad(i, n, outside=True) else 0
            self._mem(s, _add(_add(_add(_add(live, a1), held), held_rs), self._pending(s, inclusive=False)),
                      k1 + (outside + c.input_bytes + root) * g, cap)
        if c.last_end[i] is None:  # backward ends, reduce
            self._mem(s, _add(_add(pend, u), held_rs), k0 + (c.ugrad[i] + c.ws[i] + inp) * g, cap)
            self._mem(s, _add(pend, self.zexpr(i, {k: c.rs_by[i][k] * g for k in self.z[i]})),
                      k0 + (c.ugrad[i] + inp) * g, cap)
        else:  # module by module (`UnitCost.last_end`, `UnitCost.inner_moments`)
            pl, ck = c.last_end[i]
            self._mem(s, _add(_add(_add(pend, u), held_rs), self._ck_term(i, ck - pl, _sac(c, i, "last_end", pl) - pl)),
                      k0 + (pl + inp) * g, cap)
            for pl, ck, per, sac in self._binding(i):
                held = self.zexpr(i, {k: per[k] * g for k in self.z[i]})
                self._mem(s, _add(_add(_add(pend, u), held), self._ck_term(i, (ck or 0) - (pl or 0), (sac or 0) - (pl or 0))),
                          k0 + ((pl or 0) + inp) * g, cap)
        for gt, (plain, full) in zip((1, 0), c.recall[i]):  # [Note: a repeated module's later calls]
            if plain or full:  # a repeated layer's earlier call: gathered again, then computing
                ag = self.zexpr(i, {k: gt * forward_gathers(None, k) * c.unsh_by[i][k] * g for k in self.z[i]})
                sac = c.sac[i].recall[1 - gt] if c.sac[i] is not None else plain
                self._mem(s, _add(_add(_add(_add(pend, u), held_rs), ag), self._ck_term(i, full - plain, sac - plain)),
                          k0 + (plain + inp) * g, cap)
        gate = [self.z[i][k] for k in self.z[i] if k.gathers_for_backward]
        if gate:  # counts only for those strategies: gate with big-M on their z
            own = self.zexpr(i, {k: ((2 * c.unsh_by[i][k] + c.held[i][k]) * g if k.gathers_for_backward else 0.0)
                                 for k in self.z[i]})
            terms = _add(_add(_add(_add(live, a1), self._pending(s, inclusive=False)), held_rs), own)
            more, extra = self._accumulation(s)
            terms, const = _add(terms, more), k1 + (inp + self.p.costs[i].grad_in_bytes()) * g + extra
            big = self._bytes_bound() * g  # more than any moment can hold
            self.m.row(_add(terms, {v: big for v in gate}), hi=cap - const + big)
            self.mem_rows.append((s, terms, const, tuple(gate)))

    def _ck_term(self, i: int, delta: float, selective: float = 0.0) -> dict:
        """`delta` bytes (in GiB) when unit i is checkpointed, `selective` when it is checkpointed
        selectively: terms on its binaries ([Note: three checkpointing modes in the MILP])."""
        out = {self.ck[i]: delta / GiB} if self.ck[i] is not None and delta else {}
        if self.sc[i] is not None and selective:
            out[self.sc[i]] = selective / GiB
        return out

    def _binding(self, i: int) -> list[tuple]:
        """The inner moments of fused unit i that are the largest for some strategy and
        checkpointing, each (plain, checkpointed, per strategy, selective): a row each is exact
        ([Note: inner moments as rows])."""
        sac = self.c.sac[i].inner if self.c.sac[i] else [None] * len(self.c.inner[i])
        rows = [(*r, sv) for r, sv in zip(self.c.inner[i], sac)]
        modes = (0,) + ((1,) if self.ck[i] is not None else ()) + ((3,) if self.sc[i] is not None else ())
        keep = set()
        for k in self.z[i]:
            for x in modes:
                vals = [(r[x] + r[2][k], j) for j, r in enumerate(rows) if r[x] is not None]
                if vals:
                    keep.add(max(vals)[1])
        return [rows[j] for j in sorted(keep)]

    def _bytes_bound(self) -> float:
        c = self.c
        return (sum(sh[REP] for sh in c.shard) * c.state.at_rest + 3 * sum(c.unsharded) + sum(c.act)
                + max(c.ws) + max(c.rsbuf) + max(c.ugrad) + c.input_bytes)

    def _accumulation(self, s: int) -> tuple[dict, float]:
        """The gradients of earlier micro-batches at step s (`sim.memory.accumulation_bytes`):
        all units' reduced gradients (every) or unsharded ones (last), less what the
        moments of step s count already (G[i+1] in unit i's backward)."""
        n, p = self.n, self.p
        if p.accumulation <= 1 or s >= 2 * n:
            return {}, 0.0
        counted = {self.G[2 * n - s]: -1.0} if s >= n else {}  # G[i+1], i = 2n-1-s
        if p.grad_sync is GradSync.EVERY:
            return _add({self.G[0]: 1.0}, counted), 0.0
        return counted, sum(u.params for u in p.costs) * self.c.state.reduce / GiB

    def _mem(self, s: int, terms: dict, const: float, cap: float) -> None:
        more, extra = self._accumulation(s)  # [Note: accumulation memory] in sim/memory.py
        terms, const = _add(terms, more), const + extra
        self.m.row(terms, hi=cap - const)  # terms + const <= cap
        self.mem_rows.append((s, terms, const, None))

    # ---------------------------------------------------------------- start and result

    def start(self, ch: Choice) -> np.ndarray:
        """Column values of a Choice: binaries, then the tight (replay) times and aux sums."""
        x = np.zeros(len(self.m.lb))
        for i in range(self.n):
            x[self.z[i][ch.strategies[i]]] = 1.0
            x[self.xf[i][ch.fwd[i]]] = 1.0
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

    def _start_times(self, x: np.ndarray) -> None:
        n = self.n
        val = lambda terms: sum(c * x[k] for k, c in terms.items())  # noqa: E731
        z_prev = e_prev = 0.0
        for s in range(2 * n + 1):
            if s == 2 * n:
                x[self.E[s]] = max(e_prev, z_prev) + val(self._opt_seconds())
                break
            x[self.S[s]] = st = max(z_prev, e_prev)
            z = st + val(self._ag_at(s, 2 * n))
            ready = z if not self.p.cluster.device.overlap else self._ready(x, s)
            x[self.E[s]] = e_prev = max(e_prev, ready) + self.comp[s] + val(self._recompute(s))
            if s >= n:
                i = 2 * n - 1 - s
                red = val(self.zexpr(i, {k: v / self.tscale for k, v in self.c.red[i].items()}))
                z = max(z, e_prev) + red
            x[self.Z[s]] = z_prev = z

    def _launch_col(self, u: int, l: int):
        n = self.n
        launches = self.xf[u] if u < n else self.xb[2 * n - 1 - u]
        return launches.get(l)

    def _ready(self, x: np.ndarray, u: int) -> float:
        """End of the AllGather used at u (0 when it has none)."""
        for l in range(u + 1):
            col = self._launch_col(u, l)
            if col is not None and x[col] > 0.5:
                return x[self.S[l]] + sum(c * x[k] for k, c in self._ag_at(l, u).items())
        return 0.0

    def choice(self, x: np.ndarray) -> Choice:
        strat = tuple(max(self.z[i], key=lambda k: x[self.z[i][k]]) for i in range(self.n))
        fwd = tuple(max(self.xf[i], key=lambda l: x[self.xf[i][l]]) for i in range(self.n))
        bwd = tuple(max(self.xb[i], key=lambda l: x[self.xb[i][l]]) if strat[i].gathers_for_backward else None
                    for i in range(self.n))
        # full and none stay booleans, as every solver writes them (`Choice.ckpt`)
        ckpt = tuple(Checkpoint.SELECTIVE if s is not None and x[s] > 0.5 else bool(c is not None and x[c] > 0.5)
                     for c, s in zip(self.ck, self.sc))
        return Choice(strat, fwd, bwd, ckpt if any(ckpt) else ())


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
    column's pseudo-costs rest on 8 branchings; 0: none, `search.Effort.reliable`).
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


def lower_bound(p: Problem, budget: float = math.inf) -> float:
    """A bound no fitting schedule of this grouping beats, whatever its strategies,
    checkpointing or launches: the compute stream with the least recomputation that lets
    the activations fit (`_least_recompute`), or the serial channel alone (both rows of
    the MILP, `_times`), then the optimizer step at its cheapest. Seconds, O(n log n)."""
    c = once(p, costs_of)
    comm = sum(min(c.agf[i][k] + c.agb[i][k] + c.red[i][k] for k in p.allowed[i]) for i in range(p.n))
    opt = sum(min(c.shard[i][k] for k in p.allowed[i]) for i in range(p.n)) * c.opt_per_param
    compute = sum(c.fwd) + sum(c.bwd) + _least_recompute(p, c, budget)
    if not math.isfinite(compute):
        return math.inf
    # the step is (1 - share) T0 + share (compute + communication), T0 >= either ([Note:
    # collectives slow the compute beside them]); every term grows with what it is taken at
    share, unslowed = p.cluster.device.overlap_share, max(compute, comm)
    return unslowed + share * (compute + comm - unslowed) + opt if share else unslowed + opt


def _least_recompute(p: Problem, c: Costs, budget: float) -> float:
    """Fractional knapsack: when the last unit's forward runs, the persistent states (at
    their most sharded), every unit's retained activations and the input are live (the
    MILP's forward row of unit n-1, all other terms >= 0). Activations beyond what fits
    must be dropped by checkpointing; the cheapest seconds per byte first, fractions
    allowed, is a lower bound on the recomputation any fitting schedule pays
    (+inf: not even checkpointing everything fits)."""
    sb = c.state
    states = sum(min(c.shard[i][k] for k in p.allowed[i]) for i in range(p.n)) * (sb.param + sb.optimizer)
    excess = states + sum(c.act) + c.input_bytes - (budget + 4096)  # 4 KiB: the rows match the simulator to 64 B
    if excess <= 0:
        return 0.0
    saves = sorted(item for i in range(p.n) if p.can_checkpoint(i) and c.act[i] > c.inp[i]
                   for item in _recompute_items(c, i))
    seconds = 0.0
    for per_byte, size in saves:
        take = min(size, excess)
        seconds, excess = seconds + take * per_byte, excess - take
        if excess <= 0:
            return seconds
    return math.inf


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


def _sac(c: Costs, i: int, field: str, plain: float) -> float:
    """Unit i's selective `field` (`Selective`), or `plain` where it has no selective form (no term)."""
    return getattr(c.sac[i], field) if c.sac[i] is not None else plain


def _recompute_items(c: Costs, i: int) -> list[tuple[float, int]]:
    """(seconds per byte, bytes) of the activations unit i can drop, for `_least_recompute`:
    the lower convex envelope of its recompute seconds against the bytes it drops, through
    none (0, 0), selective (act - its kept bytes, its seconds) and full (act - inputs, forward).
    Every choice costs at least the envelope, and a fractional knapsack takes a unit's cheaper
    segment first, so the bound stays a bound with three modes."""
    drop = c.act[i] - c.inp[i]
    sac = c.sac[i]
    if sac is not None and 0 < c.act[i] - sac.inp < drop:
        part = c.act[i] - sac.inp
        first, second = sac.rec / part, (c.rec[i] - sac.rec) / (drop - part)
        if first <= second:  # selective lies below the line from none to full
            return [(first, part), (second, drop - part)]
    return [(c.rec[i] / drop, drop)]
