"""The MILP's memory rows: one row per moment `sim.memory.step_memory` evaluates, in GiB,
at most the budget (`_MemoryRows`, mixed into `decisions._Build`).

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
"""
from __future__ import annotations

import math

from shardsched.sim.unit_cost import code_held_terms, outside_backward_bytes
from shardsched.sim.memory import extra_gather, forward_gathers, holds_root_grad
from shardsched.solve.milp.costs import _sac
from shardsched.solve.milp.model import REP, GiB, _add
from shardsched.core.types import GradSync
from shardsched.cost.strategy import all_reduces

MEMORY_MARGIN_GIB = 0.5 / GiB
"""Rows are in GiB; keep half a byte below the budget (simulated bytes are integers) so solver tolerances never
let a schedule that the simulator rejects through."""


class _MemoryRows:
    """The memory rows of `_Build` (see the module docstring); reads its columns and constants."""

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
            if len(unit.layers) > 1 or unit.repeats:  # its last module (a later call) starts, gathering again
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
        inp = c.input_bytes + (c.root_grad if holds_root_grad(i, c.tied_unit) else 0)  # `sim.memory.root_grad_bytes`
        start = _add(_add(_add(pend, u), held_rs), self._ck_term(i, c.ck_start[i] - c.bwd_own[i],
                                                                 _sac(c, i, "start", c.bwd_own[i]) - c.bwd_own[i]))
        self._mem(s, start, k0 + (c.bwd_own[i] + inp) * g, cap)
        outside = outside_backward_bytes(self.p.costs, i)
        if outside:  # the loss's backward before the unit gathers (`sim.memory` [Note: the loss ...])
            held = self.zexpr(i, {k: c.held[i][k] * g for k in self.z[i]})
            root = c.root_grad if holds_root_grad(i, c.tied_unit, outside=True) else 0
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
            base = _add(_add(_add(_add(live, a1), self._pending(s, inclusive=False)), held_rs), own)
            big = self._bytes_bound() * g  # more than any moment can hold
            for more, extra in self._accumulation(s):
                terms, const = _add(base, more), k1 + (inp + c.grad_in[i]) * g + extra
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

    def _accumulation(self, s: int) -> list[tuple[dict, float]]:
        """The gradients of earlier micro-batches at step s (`sim.memory.accumulation_bytes`):
        all units' reduced gradients (every) or unsharded ones (last), less what the
        moments of step s count already (G[i+1] in unit i's backward); accumulating 2 under
        last, in a backward step, the first micro-batch's and the last's: one row each."""
        n, p = self.n, self.p
        if p.accumulation <= 1 or s >= 2 * n:
            return [({}, 0.0)]
        counted = {self.G[2 * n - s]: -1.0} if s >= n else {}  # G[i+1], i = 2n-1-s
        if p.grad_sync is GradSync.EVERY:  # and the all-reducing units' kept buffers (`_Live.all_reduce_held`)
            held = {}
            for j in (j for j in range(2 * n - s, n) if any(map(all_reduces, self.z[j]))) if s >= n else ():
                held = _add(held, self.zexpr(j, {k: self.c.shard[j][k] * self.c.state.reduce / GiB if all_reduces(k)
                                                 else 0.0 for k in self.z[j]}))
            return [(_add(_add({self.G[0]: 1.0}, counted), held), 0.0)]
        total = sum(u.params for u in p.costs) * self.c.state.reduce / GiB
        if p.accumulation == 2 and s >= n:
            ended = sum(u.params for u in p.costs[2 * n - s:]) * self.c.state.reduce / GiB
            return [(counted, ended), ({}, total - ended)]
        return [(counted, total)]

    def _mem(self, s: int, terms: dict, const: float, cap: float) -> None:
        for more, extra in self._accumulation(s):  # [Note: accumulation memory] in sim/memory.py
            row, k = _add(terms, more), const + extra
            self.m.row(row, hi=cap - k)  # terms + const <= cap
            self.mem_rows.append((s, row, k, None))
