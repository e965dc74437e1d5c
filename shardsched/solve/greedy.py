"""Greedy schedule, DeepCompile-style: always feasible when anything is.

DeepCompile (Tanaka et al. 2025, "DeepCompile: A Compiler-Driven Approach to
Optimizing Distributed Deep Learning Training") schedules ZeRO-3 passes
greedily under a memory limit: start from the most sharded program, then
spend the free memory on (1) unsharding parameters that pay most per byte
("selective unsharding") and (2) launching AllGathers earlier ("proactive
prefetching"). Here:
  1. every unit full_shard (or its pinned strategy), no prefetch: the
     schedule with the least memory at every moment (`sim.memory`);
  2. upgrades to less sharded strategies by communication seconds saved per
     byte, kept when the simulated step is not slower and the peak fits;
  3. hoists every AllGather earlier, one step at a time, while it fits and the
     step is not slower (uniformly for big models: per-AllGather hoisting costs
     O(units x window) replays).
Its result is the MILP's warm start and the fallback when HiGHS times out.
`fast_peak` evaluates `sim.memory.step_memory`'s peak with prefix sums (O(n)
instead of O(n^2)); tests check it against the simulator.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shardsched.core.types import Checkpoint, GradSync, Strategy
from shardsched.cost.memory import state_bytes
from shardsched.cost.strategy import all_reduces
from shardsched.solve.candidates import Choice, Problem, once
from shardsched.sim.memory import extra_gather, forward_gathers, holds_root_grad
from shardsched.sim.unit_cost import code_held_terms, outside_backward_bytes
from shardsched.solve.milp import FS, FSN, HS, HSGO, REP, SGO, costs_of
from shardsched.solve.replay import Replay

PER_AG_HOIST_UNITS = 20
"""Above this many units, hoist all AllGathers together (see module docstring). 20, the
MILP's size at scale 1 (`effort.Effort`): on Llama-7B's 33-34 units per-AllGather hoisting
took 4-5x longer (3-17 s of a 10 s target) for the same plans (worlds 64 and 256)."""
MIN_FIRST = (FS, FSN, HS, SGO, HSGO, REP)
"""Least persistent-plus-held memory first (upgrades only move right)."""


class Evaluator:
    """Step seconds and peak bytes of Choices of one Problem.

    [Note: the evaluator's per-unit tables]
    The local search calls `peak` thousands of times, so every term of a moment that depends
    only on (unit i, its strategy k, its checkpointing index x: `_mode`) is a table built once
    here (`_Tables`: [i, k], [i, x] or [i, k, x]), and a call gathers them with the Choice's
    index arrays and adds them elementwise. Each moment adds the same float64 operands in the
    same order as the per-unit loop it replaced (integers become floats where that loop added
    them to a float, and sums of integers stay integer sums), so the results are bitwise the
    loop's (tests/solve/test_evaluator_tables.py checks them against a copy of it). Terms that
    only some units have (`outside`, `Costs.recall`, the code-held outputs) are masks or short
    loops over those units."""

    def __init__(self, p: Problem):
        self.p, self.c = p, once(p, costs_of)
        self.replay = Replay(p)
        # earlier outputs the calling code holds beside each unit's forward (`sim.scenario.code_held_terms`)
        self.code = [code_held_terms(p.costs, i) for i in range(p.n)]
        self.t = _Tables(p, self.c, self.code)

    def seconds(self, ch: Choice) -> float:
        return self.replay.seconds(ch)

    def peak(self, ch: Choice) -> int:
        out, G = self._moments(ch)
        return int(out.max() if self.p.accumulation <= 1 else max(with_accumulation(self.p, G, list(out), ch.strategies)))

    def moments(self, ch: Choice) -> list[float]:
        """The largest moment of every compute step, as `sim.memory.step_memory`."""
        out, G = self._moments(ch)
        return with_accumulation(self.p, G, list(out), ch.strategies)

    def _pending(self, ch: Choice, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Pending AllGather bytes per step, launched-here included / excluded: per unit its forward
        then its backward AllGather adds its bytes at the launch and takes them off at the use, in
        that order (`np.bincount` adds its weights in order, from 0.0)."""
        t = self.t
        bwd = np.array([-1 if b is None else b for b in ch.bwd])
        launch = np.empty((n, 2, 2), dtype=np.intp)  # per unit, forward/backward, launch/use
        launch[:, 0, 0], launch[:, 1, 0], launch[:, :, 1] = ch.fwd, bwd, t.use
        ok = (launch[:, :, 0] < t.use)
        ok[:, 1] &= bwd >= 0
        ok &= np.array([k is not Strategy.REPLICATE for k in ch.strategies])[:, None]  # (sim.memory.pending_gathers)
        ok = np.repeat(ok, 2).reshape(n, 2, 2)
        inc, w = launch[ok], t.signed[ok]
        launch[:, :, 0] += 1
        return (np.cumsum(np.bincount(inc, weights=w, minlength=2 * n + 2)),
                np.cumsum(np.bincount(launch[ok], weights=w, minlength=2 * n + 2)))

    def _moments(self, ch: Choice) -> tuple[np.ndarray, np.ndarray]:
        """The moments without accumulation, and G (`with_accumulation`)."""
        t, c, n = self.t, self.c, self.p.n
        sb = c.state
        k = np.array(list(map(t.index.__getitem__, ch.strategies)))
        x = np.array(list(map(t.mode.__getitem__, ch.ckpt))) if ch.ckpt else t.none
        shard = t.shard[t.rows, k]
        pers = shard.sum() * (sb.param + sb.optimizer) + c.input_bytes
        unsh = t.unsh[t.rows, k]
        ag = t.fg[t.rows, k] * unsh
        held = t.held[t.rows, k]
        U = np.concatenate([[0], np.cumsum(held)])
        G = np.concatenate([np.cumsum((shard * sb.grad)[::-1])[::-1], [0]])
        kept = t.kept[t.rows, x]
        kept[:-1] += np.where((x[:-1] != 0) & (x[1:] == 0), t.handed, 0)  # [Note: the output a recomputed unit hands over]
        act = np.concatenate([[0], np.cumsum(kept)]).astype(np.float64)
        inc, exc = self._pending(ch, n)
        held_rs = np.concatenate([t.rs_kept[t.rows, k][1:], [0.0]])  # the next unit's kept reduce-scatter
        v = _Call(k, x, unsh, ag, held, U, act, inc, exc, pers, held_rs)
        fwd = self._forward(v)
        bwd = self._backward(v, G)
        opt = pers + G[0] + int(c.opt_factor * shard.sum() * sb.param)
        return np.concatenate([fwd, bwd[::-1], [opt]]), G

    def _forward(self, v: _Call) -> np.ndarray:
        """Forward moments of units 0..n-1 (`sim.memory._forward_moments`)."""
        t, n = self.t, self.p.n
        rows, x, act, inc = t.rows, v.x, v.act[:-1], v.inc[:n]
        u = v.unsh + v.ag  # each holds its own AllGather output
        prev = np.concatenate([[0.0], v.ag[:-1]])
        both = np.concatenate([[False], (x[:-1] != 0) & (x[1:] != 0)])
        entry = np.where(both, t.entry_ck, t.entry)
        extra = t.eg[rows, v.k] * v.unsh + t.lead[rows, x]
        loss = np.where(t.has_after, v.held + v.ag + v.act[1:] + inc + t.loss[rows, x], 0.0)  # the loss after it
        m = np.maximum(np.maximum(v.unsh + v.ag + prev + act + entry + v.exc[:n], u + extra + act + inc),
                       np.maximum(u + act + t.fwd_own[rows, x] + inc, loss))
        return v.pers + v.U[:-1] + self._code(x) + m

    def _code(self, x: np.ndarray) -> np.ndarray:
        """Bytes the calling code holds beside each unit's forward: integer sums, as floats."""
        code = self.t.code_held.copy()
        for i in self.t.code_units:
            code[i] = self.p.costs[i].code_held_bytes + sum((0, full, sel)[x[j]] for j, full, sel, _ in self.code[i])
        return code

    def _backward(self, v: _Call, G: np.ndarray) -> np.ndarray:
        """Backward moments of units 0..n-1 (step 2n-1-i; `sim.memory._backward`)."""
        t, c, n = self.t, self.c, self.p.n
        rows, x, k, u, act, hrs = t.rows, v.x, v.k, v.unsh, v.act[:-1], v.held_rs
        inc, exc = v.inc[2 * n - 1 - rows], v.exc[2 * n - 1 - rows]
        base = v.pers + v.U[:-1] + G[1:] + t.root
        m = u + act + t.start[rows, x] + hrs + inc  # backward starts (checkpointed: recomputed)
        ends = np.maximum(u + t.ugrad + act + t.ws + hrs + inc,  # backward ends, reduce
                          t.ugrad + act + t.rs[rows, k] + inc)
        fused = np.maximum(u + act + t.last_end[rows, x] + hrs + inc,  # module by module (`UnitCost.last_end`)
                           u + act + t.inner_most[rows, k, x] + inc)
        m = np.maximum(m, np.where(t.fused, fused, ends))
        loss = v.held + v.act[1:] + t.outside + hrs + exc + t.outside_root  # the loss's backward, before it gathers
        m = np.where(t.has_outside, np.maximum(m, loss), m)
        for gt, has, own in ((1, t.has_recall[0], t.recall[0]), (0, t.has_recall[1], t.recall[1])):
            again = u + gt * t.fg[rows, k] * u + act + own[rows, x] + hrs + inc  # a repeated layer's earlier call
            m = np.where(has, np.maximum(m, again), m)
        copy = 2 * u + v.held + v.act[1:] + t.grad_in + hrs + exc  # copy-out, its post-forward slice still live
        m = np.where(t.gfb[k], np.maximum(m, copy), m)
        return base + m


class _Call(NamedTuple):
    """One call's per-unit arrays (the Choice's strategies `k` and checkpointing `x`, as indices)."""

    k: np.ndarray
    x: np.ndarray
    unsh: np.ndarray
    ag: np.ndarray
    held: np.ndarray
    U: np.ndarray
    act: np.ndarray
    inc: np.ndarray
    exc: np.ndarray
    pers: float
    held_rs: np.ndarray


class _Tables:
    """[Note: the evaluator's per-unit tables]: per unit i, float64 arrays [i, k] over strategies
    (`Strategy`'s order), [i, x] over checkpointing indices (`_mode`), [i, k, x], or [i]; a term
    a unit does not have is 0 there, behind a mask."""

    def __init__(self, p: Problem, c, code: list):
        n, ks, costs = p.n, tuple(Strategy), p.costs
        self.index = {s: j for j, s in enumerate(ks)}
        self.rows, self.none = np.arange(n), np.zeros(n, dtype=np.intp)
        self.mode = {m: _mode(Choice((), (), (), (m,)), 0) for m in (False, True, *Checkpoint)}  # `_mode`'s index
        by_k = lambda f: np.array([[f(i, s) for s in ks] for i in range(n)], dtype=np.float64)  # noqa: E731
        self.shard, self.unsh = by_k(lambda i, s: c.shard[i][s]), by_k(lambda i, s: c.unsh_by[i][s])
        self.held, self.rs = by_k(lambda i, s: c.held[i][s]), by_k(lambda i, s: c.rs_by[i][s])
        self.rs_kept = by_k(lambda i, s: c.rs_kept_by[i][s])
        self.fg = by_k(lambda i, s: forward_gathers(costs[i], s))
        self.eg = by_k(lambda i, s: extra_gather(costs[i], s))
        self.gfb = np.array([s.gathers_for_backward for s in ks])
        # activations kept: integer sums, as the loop's `np.cumsum` of ints
        self.kept = np.array([[_own(c, i, x, c.act[i], c.inp[i], "inp") for x in range(3)] for i in range(n)],
                             dtype=np.int64)
        self.handed = np.array([costs[i].handed_over_bytes() for i in range(1, n)], dtype=np.int64)
        self._forward(p, c, code)
        self._backward(p, c)
        self.use = np.array([(j, 2 * n - 1 - j) for j in range(n)])
        u = np.array(c.unsharded, dtype=np.float64)[:, None, None]
        self.signed = np.concatenate([u, -u], axis=2).repeat(2, axis=1)  # [j, fwd/bwd, launch/use]

    def _forward(self, p: Problem, c, code: list) -> None:
        n, costs = p.n, p.costs
        self.entry = np.array([u.entry_bytes for u in costs], dtype=np.float64)
        self.entry_ck = np.array([u.entry_after_checkpointed() for u in costs], dtype=np.float64)
        self.lead = np.array([[_own(c, i, x, u.lead_activation_bytes, u.checkpointed_lead_bytes, "lead")
                               if len(u.layers) > 1 else 0 for x in range(3)] for i, u in enumerate(costs)],
                             dtype=np.float64)
        after = [u.after_forward() for u in costs]  # the code after it (the loss), after the unit reshards
        self.has_after = np.array([bool(a) for a in after])
        self.loss = np.array([[_own(c, i, x, a, a, "loss") if a else 0 for x in range(3)] for i, a in enumerate(after)],
                             dtype=np.float64)
        self.fwd_own = np.array([[_own(c, i, x, *c.fwd_own[i], "fwd_own") for x in range(3)] for i in range(n)],
                                dtype=np.float64)
        self.code_held = np.array([u.code_held_bytes for u in costs], dtype=np.float64)
        self.code_units = [i for i in range(n) if code[i]]

    def _backward(self, p: Problem, c) -> None:
        n, costs, ks = p.n, p.costs, tuple(Strategy)
        f64 = lambda v: np.array([np.nan if a is None else a for a in v], dtype=np.float64)  # noqa: E731
        self.root = f64(c.root_grad if holds_root_grad(i, c.tied_unit) else 0 for i in range(n))
        self.start = np.array([[_own(c, i, x, c.bwd_own[i], c.ck_start[i], "start") for x in range(3)]
                               for i in range(n)], dtype=np.float64)
        self.ugrad, self.ws, self.grad_in = f64(c.ugrad), f64(c.ws), f64(c.grad_in)
        self.fused = np.array([e is not None for e in c.last_end])
        self.last_end = np.array([f64(_own(c, i, x, *c.last_end[i], "last_end") for x in range(3))
                                  if c.last_end[i] is not None else np.zeros(3) for i in range(n)])
        self.inner_most = np.array([[f64(c.inner_most[i][s]) for s in ks] if c.inner_most[i] is not None
                                    else np.zeros((len(ks), 3)) for i in range(n)])
        self.outside = f64(outside_backward_bytes(costs, i) for i in range(n))
        self.has_outside = np.array([bool(u.outside_workspace_bytes) for u in costs])
        # `base` counts the root's gradient as held at unit i; the loss runs before the head's
        self.outside_root = f64(c.root_grad * (holds_root_grad(i, c.tied_unit, outside=True)
                                               - holds_root_grad(i, c.tied_unit)) for i in range(n))
        # a repeated layer's earlier call, gathered again (gt 1) then computing (gt 0)
        self.has_recall = [np.array([bool(c.recall[i][g][0] or c.recall[i][g][1]) for i in range(n)])
                           for g in (0, 1)]
        self.recall = [np.array([f64((*c.recall[i][g], c.sac[i].recall[g] if c.sac[i] is not None
                                      else c.recall[i][g][1])) for i in range(n)]) for g in (0, 1)]


def _mode(ch: Choice, i: int) -> int:
    """Unit i's checkpointing as an index: 0 none, 1 full, 2 selective (`Costs.inner_most`)."""
    mode = ch.ckpt[i] if ch.ckpt else False  # a bool or a `Checkpoint` (`Choice.ckpt`)
    return 2 if mode is Checkpoint.SELECTIVE else int(bool(mode))


def _own(c, i: int, x: int, plain, full, field: str):
    """A unit's own bytes of one moment under checkpointing index x (`_mode`)."""
    return (plain, full, getattr(c.sac[i], field) if c.sac[i] is not None else full)[x]


def with_accumulation(p: Problem, G: np.ndarray, moments: list[float], strategies=()) -> list[float]:
    """The moments of every compute step plus the gradients of earlier micro-batches
    (`sim.memory.accumulation_bytes`, [Note: accumulation memory]); G[i]: reduced gradients of
    units i.. (the moments count G[i+1] in unit i's backward, nothing in forward); reducing every
    micro-batch, the buffers all-reducing units reduced earlier in this backward hold (`strategies`)."""
    if p.accumulation <= 1:
        return moments
    n = p.n
    counted = np.concatenate([np.zeros(n), G[1:][::-1], [0.0]])  # forward, backward of n-1 .. 0, optimizer
    held = G[0] if p.grad_sync is GradSync.EVERY else sum(u.params for u in p.costs) * state_bytes(
        p.precision, p.optimizer).reduce
    extra = held - counted
    if p.grad_sync is GradSync.LAST and p.accumulation == 2:  # the first micro-batch's or the last's
        ended = np.cumsum([0.0] + [u.params for u in p.costs[::-1]])[:n] * state_bytes(p.precision, p.optimizer).reduce
        extra[n:2 * n] = np.maximum(ended - G[1:][::-1], held - ended)  # unit n-1 .. 0: its backward
    if p.grad_sync is GradSync.EVERY and any(map(all_reduces, strategies)):
        extra = extra + np.concatenate([np.zeros(n), all_reduce_held(p, strategies)[1:][::-1], [0.0]])
    extra[-1] = 0.0
    return list(np.array(moments) + extra)


def all_reduce_held(p: Problem, strategies) -> np.ndarray:
    """R[i]: the reduce outputs units i.. keep when they all-reduce (`sim.memory._Live.all_reduce_held`)."""
    c = once(p, costs_of)
    mine = np.array([c.shard[i][k] * c.state.reduce if all_reduces(k) else 0 for i, k in enumerate(strategies)],
                    dtype=np.float64)
    return np.concatenate([np.cumsum(mine[::-1])[::-1], [0.0]])


def fewer_gathers(ev: Evaluator, ch: Choice) -> Choice:
    """shard_grad_op instead of full_shard for units of several modules where that lowers
    the peak (such a unit gathers twice in forward: `sim.memory.extra_gather`)."""
    for i, unit in enumerate(ev.p.costs):
        if ch.strategies[i] is FS and SGO in ev.p.allowed[i] and extra_gather(unit, FS):
            cand = _with(ch, i, SGO)
            if ev.peak(cand) < ev.peak(ch):
                ch = cand
    return ch


def least_memory(p: Problem) -> Choice:
    """Most sharded allowed strategy everywhere, checkpointed where allowed, every
    AllGather at its use."""
    n = p.n
    strat = tuple(next(k for k in MIN_FIRST if k in p.allowed[i]) for i in range(n))
    return Choice(strat, tuple(range(n)),
                  tuple(2 * n - 1 - i if s.gathers_for_backward else None for i, s in enumerate(strat)),
                  p.all_checkpointed() if p.checkpointable else ())


def _with(ch: Choice, i: int, strategy) -> Choice:
    """Unit i switched to `strategy` (None: checkpointing switched off instead; SELECTIVE:
    checkpointed selectively instead)."""
    n = len(ch.strategies)
    if strategy is None or strategy is Checkpoint.SELECTIVE:  # checkpointing off, or selective
        ck = ch.ckpt or (False,) * n
        ckpt = ck[:i] + (strategy or False,) + ck[i + 1:]
        return ch._replace(ckpt=ckpt if any(ckpt) else ())
    strat = ch.strategies[:i] + (strategy,) + ch.strategies[i + 1:]
    bwd = ch.bwd[:i] + ((2 * n - 1 - i) if strategy.gathers_for_backward else None,) + ch.bwd[i + 1:]
    return ch._replace(strategies=strat, bwd=bwd)


def _moves(ev: Evaluator, ch: Choice) -> list[tuple[float, int, object, object]]:
    """(seconds saved per byte, unit, from, to), best first (DeepCompile's ranking);
    `to` None: stop checkpointing the unit (saves its recomputation); SELECTIVE: checkpoint it
    selectively instead of fully (saves most of it)."""
    c = ev.c
    out = []
    for i, allowed in enumerate(ev.p.allowed):
        comm = {k: c.agf[i][k] + c.agb[i][k] + c.red[i][k] for k in allowed}
        cost_of = {k: c.held[i][k] + c.shard[i][k] * c.state.at_rest for k in allowed}
        for a in allowed:
            for b in allowed:
                saved = comm[a] - comm[b]
                if MIN_FIRST.index(b) > MIN_FIRST.index(a) and saved > 0:
                    out.append((saved / max(cost_of[b] - cost_of[a], 1), i, a, b))
        if ch.ckpt and ch.ckpt[i]:
            out.append((c.rec[i] / max(c.act[i] - c.inp[i], 1), i, None, None))
        if _mode(ch, i) == 1 and ev.p.can_select(i):  # full to selective: most recompute per byte
            out.append(((c.rec[i] - c.sac[i].rec) / max(c.sac[i].inp - c.inp[i], 1), i, None, Checkpoint.SELECTIVE))
    return sorted(out, key=lambda m: -m[0])


def upgrade(ev: Evaluator, ch: Choice, *, budget: int) -> Choice:
    """Step 2: spend free memory on less sharding and less recomputation, best
    saving per byte first."""
    t = ev.seconds(ch)
    for _, i, a, b in _moves(ev, ch):
        if a is not None and ch.strategies[i] is not a:
            continue
        ch, t = _kept(ev, ch, t, _with(ch, i, b), budget)
    return ch


def _kept(ev: Evaluator, ch: Choice, t: float, cand: Choice, budget: int) -> tuple[Choice, float]:
    """`cand` and its seconds when it fits and is not slower; else `ch`, `t`."""
    if ev.peak(cand) <= budget:
        tc = ev.seconds(cand)
        if tc <= t:
            return cand, tc
    return ch, t


def _hoisted(ch: Choice, *, fwd: dict | None = None, bwd: dict | None = None) -> Choice:
    f, b = list(ch.fwd), list(ch.bwd)
    for i, l in (fwd or {}).items():
        f[i] = l
    for i, l in (bwd or {}).items():
        b[i] = l
    return ch._replace(fwd=tuple(f), bwd=tuple(b))


def hoist_each(ev: Evaluator, ch: Choice, *, budget: int, ahead: int) -> Choice:
    """Step 3: every AllGather as early as memory allows, if the step is not slower."""
    n, t = ev.p.n, ev.seconds(ch)
    gathers = [(i, True) for i in range(n)] + [(i, False) for i in reversed(range(n)) if ch.bwd[i] is not None]
    for i, forward in gathers:
        lo = max(0, i - ahead) if forward else max(n, 2 * n - 1 - i - ahead)
        while True:
            cur = ch.fwd[i] if forward else ch.bwd[i]
            if cur <= lo:
                break
            cand = _hoisted(ch, fwd={i: cur - 1}) if forward else _hoisted(ch, bwd={i: cur - 1})
            if ev.peak(cand) > budget:
                break
            tc = ev.seconds(cand)
            if tc > t:
                break
            ch, t = cand, tc
    return ch


def hoist_uniform(ev: Evaluator, ch: Choice, *, budget: int, ahead: int) -> Choice:
    """Step 3 for big models: all AllGathers k steps ahead, the best fitting k."""
    n, best, t = ev.p.n, ch, ev.seconds(ch)
    for k in range(1, ahead + 1):
        cand = _hoisted(ch, fwd={i: max(0, i - k) for i in range(n)},
                        bwd={i: max(n, 2 * n - 1 - i - k) for i in range(n) if ch.bwd[i] is not None})
        if ev.peak(cand) > budget:
            break
        tc = ev.seconds(cand)
        if tc < t:
            best, t = cand, tc
    return best


def greedy(p: Problem, *, budget: int, ahead: int | None = None) -> Choice | None:
    """Steps 1-3; None when even the least-memory schedule does not fit.

    [Note: two starts when checkpointing is allowed]
    Upgrades are ranked per byte, so from an all-checkpointed start memory goes to
    less sharding first and recomputation may never be switched off, though that
    would be faster (GPT-3 175B at 80 GiB: every unit checkpointed and full_shard/node,
    where no checkpointing fits). When the unchecked start fits too, both are run and
    the faster kept (up to PER_AG_HOIST_UNITS units: beyond, a second climb costs
    seconds of a 10 s budget, and there the MILP is not run to fix it either way)."""
    ev = Evaluator(p)
    least = least_memory(p)
    if ev.peak(least) > budget:
        least = fewer_gathers(ev, least)
        if ev.peak(least) > budget:
            return None
    ahead = p.n if ahead is None else ahead
    unchecked = least._replace(ckpt=())
    starts = [least] + ([unchecked] if least.ckpt and p.n <= PER_AG_HOIST_UNITS and ev.peak(unchecked) <= budget
                        else [])
    # selective wherever offered (full elsewhere): recomputing little, it frees memory that
    # climbing from the all-full start, one unit at a time, never finds (a start, when it fits)
    selective = least._replace(ckpt=tuple(Checkpoint.SELECTIVE if p.can_select(i) else c
                                          for i, c in enumerate(least.ckpt)))
    if p.selective and least.ckpt and ev.peak(selective) <= budget:
        starts.append(selective)
    return min((_climb(ev, ch, budget=budget, ahead=ahead) for ch in starts), key=ev.seconds)


def recompute_less(ev: Evaluator, ch: Choice, *, budget: int) -> Choice:
    """Switch checkpointing off where it still fits, most recompute seconds per byte first,
    else to selective checkpointing where the Problem offers it and that fits.
    `upgrade` ranks these moves among the strategy moves and tries each once, so memory
    freed later (or never wanted by a strategy move) was left unused: Llama-2-70B at 40 GiB
    kept every unit checkpointed at a 25 GiB peak."""
    c, t = ev.c, ev.seconds(ch)
    for _, i, src, dst in _recompute_moves(ev, ch):
        if _mode(ch, i) == src:
            ch, t = _kept(ev, ch, t, _with(ch, i, None) if dst == 0 else ch._replace(
                ckpt=ch.ckpt[:i] + (Checkpoint.SELECTIVE,) + ch.ckpt[i + 1:]), budget)
    return ch


def _recompute_moves(ev: Evaluator, ch: Choice) -> list[tuple[float, int, int, int]]:
    """(recompute seconds saved per byte it costs, unit, from mode, to mode: `_mode`'s index),
    best first: full to none, and where offered full to selective and selective to none. Full to
    selective frees most of the recomputation for few bytes (a SwiGLU MLP: its matmuls' outputs
    of the activations), so it is often worth more per byte than switching a unit off."""
    c, out = ev.c, []
    for i in range(ev.p.n):
        if not (ch.ckpt and ch.ckpt[i]):
            continue
        out.append((c.rec[i] / max(c.act[i] - c.inp[i], 1), i, 1, 0))
        sac = c.sac[i]
        if sac is not None and ev.p.can_select(i):
            out.append(((c.rec[i] - sac.rec) / max(sac.inp - c.inp[i], 1), i, 1, 2))
            out.append((sac.rec / max(c.act[i] - sac.inp, 1), i, 2, 0))
    return sorted(out, key=lambda m: (-m[0], m[1], m[2], m[3]))


def _climb(ev: Evaluator, ch: Choice, *, budget: int, ahead: int) -> Choice:
    ch = recompute_less(ev, upgrade(ev, ch, budget=budget), budget=budget)
    if ev.p.n > PER_AG_HOIST_UNITS:
        return hoist_uniform(ev, ch, budget=budget, ahead=ahead)
    return hoist_each(ev, ch, budget=budget, ahead=ahead)
