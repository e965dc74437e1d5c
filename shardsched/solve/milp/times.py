"""The MILP's time rows: the replay's recurrence of compute steps, channel and AllGather
deadlines (`_TimeRows`, mixed into `decisions._Build`), and the tight times of a warm start.

Times (continuous, in units of `tscale` seconds), one set per
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

Big-M: with the warm start's step time T_ub as an upper bound on E[2n] (a
schedule worse than the start is useless), every AllGather ends by T_ub, so
M = T_ub - (compute before u) is valid and as tight as we know how to make it.
Big-M deadlines give weak LP bounds; the warm start is what makes HiGHS fast.
"""
from __future__ import annotations

import numpy as np

from shardsched.solve.milp.model import REP, _add


class _TimeRows:
    """The time rows of `_Build` (see the module docstring); reads its columns and constants."""

    def _serial_bound(self) -> float:
        c = self.c
        worst = sum(max(c.agf[i][k] + c.agb[i][k] + c.red[i][k] for k in self.z[i]) for i in range(self.n))
        opt = sum(s[REP] for s in c.shard) * c.opt_per_param
        recompute = sum(max(r, s.rec if s else 0.0) for r, s in zip(c.rec, c.sac)) if self.p.checkpointable else 0.0
        return (sum(self.comp) + (worst + opt + recompute) / self.tscale) * 1.01 + 1e-9

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
        big = max(self.t_ub - before, 0.0)
        # a replicate unit waits for nothing ([Note: a shard group of one issues no AllGather])
        free = {self.z[i][REP]: big} if REP in self.z[i] else {}
        for l, x in launches.items():
            end = _add(_add({self.S[l]: 1.0}, self._ag_at(l, u)), rc)
            self.m.ge(_add(_add({self.E[u]: 1.0}, {x: -big}), free), end, self.comp[u] - big)

    def _all_comm(self) -> dict:
        out, c, ts = {}, self.c, self.tscale
        for i in range(self.n):
            out = _add(out, self.zexpr(i, {k: (c.agf[i][k] + c.agb[i][k] + c.red[i][k]) / ts for k in self.z[i]}))
        return out

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
        """End of the AllGather used at u (0 when it has none: a replicate unit's)."""
        i = u if u < self.n else 2 * self.n - 1 - u
        if REP in self.z[i] and x[self.z[i][REP]] > 0.5:
            return 0.0
        for l in range(u + 1):
            col = self._launch_col(u, l)
            if col is not None and x[col] > 0.5:
                return x[self.S[l]] + sum(c * x[k] for k, c in self._ag_at(l, u).items())
        return 0.0
