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

import numpy as np

from shardsched.core.types import Checkpoint, GradSync
from shardsched.cost.memory import state_bytes
from shardsched.solve.candidates import Choice, Problem
from shardsched.sim.memory import extra_gather, forward_gathers, holds_root_grad
from shardsched.sim.scenario import code_held_terms
from shardsched.solve.milp import FS, FSN, HS, HSGO, REP, SGO, costs_of
from shardsched.solve.replay import Replay

PER_AG_HOIST_UNITS = 20
"""Above this many units, hoist all AllGathers together (see module docstring). 20, the
MILP's size at scale 1 (`search.Effort`): on Llama-7B's 33-34 units per-AllGather hoisting
took 4-5x longer (3-17 s of a 10 s target) for the same plans (worlds 64 and 256)."""
MIN_FIRST = (FS, FSN, HS, SGO, HSGO, REP)
"""Least persistent-plus-held memory first (upgrades only move right)."""


class Evaluator:
    """Step seconds and peak bytes of Choices of one Problem."""

    def __init__(self, p: Problem):
        self.p, self.c = p, costs_of(p)
        c = self.c
        self.unsh = np.array(c.unsharded, dtype=np.float64)
        self.replay = Replay(p)
        # earlier outputs the calling code holds beside each unit's forward (`sim.scenario.code_held_terms`)
        self.code = [code_held_terms(p.costs, i) for i in range(p.n)]

    def seconds(self, ch: Choice) -> float:
        return self.replay.seconds(ch)

    def peak(self, ch: Choice) -> int:
        return int(max(self.moments(ch)))

    def _pending(self, ch: Choice, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Pending AllGather bytes per step, launched-here included / excluded."""
        inc, exc = np.zeros(2 * n + 2), np.zeros(2 * n + 2)
        for j in range(n):
            for launch, use in ((ch.fwd[j], j), (ch.bwd[j], 2 * n - 1 - j)):
                if launch is None or launch >= use:
                    continue
                inc[launch] += self.unsh[j]
                inc[use] -= self.unsh[j]
                exc[launch + 1] += self.unsh[j]
                exc[use] -= self.unsh[j]
        return np.cumsum(inc), np.cumsum(exc)

    def moments(self, ch: Choice) -> list[float]:
        """The largest moment of every compute step, as `sim.memory.step_memory`."""
        c, n = self.c, self.p.n
        sb = c.state
        shard = np.array([c.shard[i][s] for i, s in enumerate(ch.strategies)], dtype=np.float64)
        pers = shard.sum() * (sb.param + sb.optimizer) + c.input_bytes
        unsh = np.array([c.unsh_by[i][s] for i, s in enumerate(ch.strategies)], dtype=np.float64)
        ag = np.array([forward_gathers(u, s) for u, s in zip(self.p.costs, ch.strategies)], dtype=np.float64) * unsh
        held = np.array([c.held[i][s] for i, s in enumerate(ch.strategies)], dtype=np.float64)
        U = np.concatenate([[0], np.cumsum(held)])
        G = np.concatenate([np.cumsum((shard * sb.grad)[::-1])[::-1], [0]])
        modes = [_mode(ch, i) for i in range(n)]
        kept = [_own(c, i, modes[i], c.act[i], c.inp[i], "inp") for i in range(n)]
        for i in range(n - 1):  # [Note: the output a recomputed unit hands over]
            if modes[i] and not modes[i + 1]:
                kept[i] += self.p.costs[i + 1].handed_over_bytes()
        self.act = np.concatenate([[0], np.cumsum(kept)]).astype(np.float64)
        inc, exc = self._pending(ch, n)
        out = []
        for i in range(n):
            u, prev = unsh[i] + ag[i], ag[i - 1] if i else 0.0  # each holds its own AllGather output
            unit = self.p.costs[i]
            x = modes[i]
            lead = _own(c, i, x, unit.lead_activation_bytes, unit.checkpointed_lead_bytes, "lead")
            extra = extra_gather(unit, ch.strategies[i]) * unsh[i] + (lead if len(unit.layers) > 1 else 0)
            after = unit.after_forward()  # the code after it (the loss), after the unit reshards
            entry = unit.entry_after_checkpointed() if i and modes[i - 1] and modes[i] else unit.entry_bytes
            code = unit.code_held_bytes + sum((0, full, sel)[modes[j]] for j, full, sel in self.code[i])
            out.append(pers + U[i] + code + max(unsh[i] + ag[i] + prev + self.act[i] + entry + exc[i],
                                         u + extra + self.act[i] + inc[i],
                                         u + self.act[i] + _own(c, i, x, *c.fwd_own[i], "fwd_own") + inc[i],
                                         held[i] + ag[i] + self.act[i + 1] + inc[i]
                                         + _own(c, i, x, after, after, "loss") if after else 0))
        rs = [(c.rs_by[i][s], c.rs_kept_by[i][s]) for i, s in enumerate(ch.strategies)]
        for s in range(n, 2 * n):
            out.append(self._backward(ch, s, pers, U, G, inc, exc, unsh, rs, held))
        out.append(pers + G[0] + int(c.opt_factor * shard.sum() * sb.param))
        return with_accumulation(self.p, G, out)

    def _backward(self, ch, s, pers, U, G, inc, exc, unsh, rs, held) -> float:
        c, n = self.c, self.p.n
        i = 2 * n - 1 - s
        held_rs = rs[i + 1][1] if i + 1 < n else 0
        base = pers + U[i] + G[i + 1] + (c.root_grad if holds_root_grad(i, n) else 0)
        u = unsh[i]
        x = _mode(ch, i)
        k = ch.strategies[i]
        own = _own(c, i, x, c.bwd_own[i], c.ck_start[i], "start")  # `Scenario.backward_start`
        m = u + self.act[i] + own + held_rs + inc[s]  # backward starts (checkpointed: recomputed)
        if c.last_end[i] is None:
            m = max(m, u + c.ugrad[i] + self.act[i] + c.ws[i] + held_rs + inc[s],  # backward ends
                    c.ugrad[i] + self.act[i] + rs[i][0] + inc[s])  # reduce
        else:  # module by module (`UnitCost.last_end`, `UnitCost.inner_moments`)
            m = max(m, u + self.act[i] + _own(c, i, x, *c.last_end[i], "last_end") + held_rs + inc[s],
                    u + self.act[i] + c.inner_most[i][k][x] + inc[s])
        outside = self.p.costs[i].outside_workspace_bytes  # the loss's backward, before it gathers
        if outside:
            # `base` counts the root's gradient as held at unit i; the loss runs before the head's
            root = c.root_grad * (holds_root_grad(i, n, outside=True) - holds_root_grad(i, n))
            m = max(m, held[i] + self.act[i + 1] + outside + held_rs + exc[s] + root)
        for gt, (plain, full) in zip((1, 0), c.recall[i]):  # a repeated layer's earlier call
            if plain or full:  # gathered again, then computing (`UnitCost.recall_bytes`)
                sac = c.sac[i].recall[1 - gt] if c.sac[i] is not None else full
                m = max(m, u + gt * forward_gathers(self.p.costs[i], k) * u + self.act[i]
                        + (plain, full, sac)[x] + held_rs + inc[s])
        if ch.strategies[i].gathers_for_backward:  # copy-out, its post-forward slice still live
            m = max(m, 2 * u + held[i] + self.act[i + 1] + self.p.costs[i].grad_in_bytes() + held_rs + exc[s])
        return base + m


def _mode(ch: Choice, i: int) -> int:
    """Unit i's checkpointing as an index: 0 none, 1 full, 2 selective (`Costs.inner_most`)."""
    mode = ch.ckpt[i] if ch.ckpt else False  # a bool or a `Checkpoint` (`Choice.ckpt`)
    return 2 if mode is Checkpoint.SELECTIVE else int(bool(mode))


def _own(c, i: int, x: int, plain, full, field: str):
    """A unit's own bytes of one moment under checkpointing index x (`_mode`)."""
    return (plain, full, getattr(c.sac[i], field) if c.sac[i] is not None else full)[x]


def with_accumulation(p: Problem, G: np.ndarray, moments: list[float]) -> list[float]:
    """The moments of every compute step plus the gradients of earlier micro-batches
    (`sim.memory.accumulation_bytes`, [Note: accumulation memory]); G[i]: reduced gradients of
    units i.. (the moments count G[i+1] in unit i's backward, nothing in forward)."""
    if p.accumulation <= 1:
        return moments
    n = p.n
    counted = np.concatenate([np.zeros(n), G[1:][::-1], [0.0]])  # forward, backward of n-1 .. 0, optimizer
    held = G[0] if p.grad_sync is GradSync.EVERY else sum(u.params for u in p.costs) * state_bytes(
        p.precision, p.optimizer).reduce
    extra = held - counted
    extra[-1] = 0.0
    return list(np.array(moments) + extra)


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
