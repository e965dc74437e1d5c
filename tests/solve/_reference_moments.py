"""The evaluator's moments before its per-unit tables (test-only reference).

A verbatim copy of `shardsched.solve.greedy.Evaluator`'s `moments`, `_pending` and
`_backward` as they were before [Note: the evaluator's per-unit tables]: the tables must give
the same floats, bit for bit (tests/solve/test_evaluator_tables.py).
"""
from __future__ import annotations

import numpy as np

from shardsched.core.types import Strategy
from shardsched.sim.memory import extra_gather, forward_gathers, holds_root_grad
from shardsched.sim.unit_cost import code_held_terms, outside_backward_bytes
from shardsched.solve.candidates import Choice, Problem
from shardsched.solve.greedy import _mode, _own, with_accumulation
from shardsched.solve.milp import costs_of


class ReferenceEvaluator:
    """Peak bytes of Choices of one Problem, the old way."""

    def __init__(self, p: Problem):
        self.p, self.c = p, costs_of(p)
        c = self.c
        self.unsh = np.array(c.unsharded, dtype=np.float64)
        # earlier outputs the calling code holds beside each unit's forward (`sim.scenario.code_held_terms`)
        self.code = [code_held_terms(p.costs, i) for i in range(p.n)]

    def peak(self, ch: Choice) -> int:
        return int(max(self.moments(ch)))

    def _pending(self, ch: Choice, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Pending AllGather bytes per step, launched-here included / excluded."""
        inc, exc = np.zeros(2 * n + 2), np.zeros(2 * n + 2)
        for j in range(n):
            for launch, use in ((ch.fwd[j], j), (ch.bwd[j], 2 * n - 1 - j)):
                if launch is None or launch >= use or ch.strategies[j] is Strategy.REPLICATE:
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
            code = unit.code_held_bytes + sum((0, full, sel)[modes[j]] for j, full, sel, _ in self.code[i])
            out.append(pers + U[i] + code + max(unsh[i] + ag[i] + prev + self.act[i] + entry + exc[i],
                                         u + extra + self.act[i] + inc[i],
                                         u + self.act[i] + _own(c, i, x, *c.fwd_own[i], "fwd_own") + inc[i],
                                         held[i] + ag[i] + self.act[i + 1] + inc[i]
                                         + _own(c, i, x, after, after, "loss") if after else 0))
        rs = [(c.rs_by[i][s], c.rs_kept_by[i][s]) for i, s in enumerate(ch.strategies)]
        for s in range(n, 2 * n):
            out.append(self._backward(ch, s, pers, U, G, inc, exc, unsh, rs, held))
        out.append(pers + G[0] + int(c.opt_factor * shard.sum() * sb.param))
        return with_accumulation(self.p, G, out, ch.strategies)

    def _backward(self, ch, s, pers, U, G, inc, exc, unsh, rs, held) -> float:
        c, n = self.c, self.p.n
        i = 2 * n - 1 - s
        held_rs = rs[i + 1][1] if i + 1 < n else 0
        base = pers + U[i] + G[i + 1] + (c.root_grad if holds_root_grad(i, c.tied_unit) else 0)
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
        outside = outside_backward_bytes(self.p.costs, i)  # the loss's backward, before it gathers
        if outside:
            # `base` counts the root's gradient as held at unit i; the loss runs before the head's
            root = c.root_grad * (holds_root_grad(i, c.tied_unit, outside=True) - holds_root_grad(i, c.tied_unit))
            m = max(m, held[i] + self.act[i + 1] + outside + held_rs + exc[s] + root)
        for gt, (plain, full) in zip((1, 0), c.recall[i]):  # a repeated layer's earlier call
            if plain or full:  # gathered again, then computing (`UnitCost.recall_bytes`)
                sac = c.sac[i].recall[1 - gt] if c.sac[i] is not None else full
                m = max(m, u + gt * forward_gathers(self.p.costs[i], k) * u + self.act[i]
                        + (plain, full, sac)[x] + held_rs + inc[s])
        if ch.strategies[i].gathers_for_backward:  # copy-out, its post-forward slice still live
            m = max(m, 2 * u + held[i] + self.act[i + 1] + c.grad_in[i] + held_rs + exc[s])
        return base + m
