"""The MILP's objective, the step it minimises (`_Objective`, mixed into `decisions._Build`), and
`lower_bound`, a bound on it with no solve.

Objective: the step, (1 - share) E[2n] + share (compute + recomputation + communication +
optimizer), where share is what a collective takes from the compute beside it
(`DeviceSpec.comm_sm_share`; [Note: collectives slow the compute beside them] in
sim/timeline.py): E[2n] is the unslowed step, the rest a constant and terms on z and ck/sc,
so it is the replay's step for every choice (0 share: E[2n] alone).
"""
from __future__ import annotations

import math

from shardsched.solve.candidates import Problem, once
from shardsched.solve.milp.costs import Costs, costs_of
from shardsched.solve.milp.model import _add


class _Objective:
    """The objective of `_Build` (see the module docstring)."""

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
