"""`sim.timeline.replay`'s step seconds from per-unit tables: the search's inner loop.

The local search (`solve.local`) and the greedy re-score thousands of schedules of one
grouping. `replay` rebuilds a `Scenario` and prices every collective from the cost model
on each call (shard counts, padding, ring formulas): on a 26-unit GPT that was 78% of a
polish. Here each unit's AllGather (forward, backward), reduction and compute seconds are
priced once per (unit, strategy) with the same functions, and the event loop is
`replay`'s, operation for operation, so the result is the same float (tests/solve/
test_replay.py asserts equality). Used by `greedy.Evaluator.seconds`.

[Note: one replay] The simulator stays the definition: a plan's predicted step is
`replay`'s, and a schedule the search keeps is re-scored by it (`baselines.score`). A
plan that runs on DDP (`Scenario.on_ddp`: no FSDP2 host work) takes `replay` itself.
"""
from __future__ import annotations

from shardsched.core.types import Checkpoint, Strategy
from shardsched.cost.memory import state_bytes
from shardsched.cost.strategy import gather_seconds, reduce_seconds, shard_count
from shardsched.plan.schedule import optimizer_seconds_per_param, with_host_overhead
from shardsched.sim.timeline import overlapped, replay
from shardsched.solve.candidates import Choice, Problem


class Replay:
    """Step seconds of Choices of one Problem, as `replay(p.scenario(ch)).step_seconds`."""

    def __init__(self, p: Problem, shared: dict | None = None):
        """`shared`: a dict kept across Problems of one model and cluster (`solve.named`): each
        unit's figures and prices, by its layers, are computed once in it."""
        self.p, cl = p, p.cluster
        self.sb = state_bytes(p.precision, p.optimizer)
        self.shared = {} if shared is None else shared
        per = [self._figures(i) for i in range(p.n)]
        self.units = [u for u, _ in per]
        # seconds a backward recomputes, per checkpointing mode (`Scenario.backward_seconds`): a
        # selective unit recomputes its selective form's share (`UnitCost.recompute`), not its forward
        sel = [r for _, r in per] if p.selective else [0.0] * p.n
        self.full = [u.backward_seconds + u.recompute() for u in self.units]
        self.sac = [u.backward_seconds + r for u, r in zip(self.units, sel)]
        self.per_param = optimizer_seconds_per_param(self.sb, cl)
        self.blocking = not cl.device.overlap
        # [Note: collectives slow the compute beside them] in sim/timeline.py
        self.share = cl.device.overlap_share
        self._tab: dict[tuple[int, Strategy], tuple[float, float, float, int]] = {}

    def _figures(self, i: int):
        """Unit i with its host overhead, and its selective form's recomputed seconds (0.0: none)."""
        key = (self.p.costs[i].layers, self.p.costs[i].params)
        got = self.shared.get(key)
        if got is None:
            cl = self.p.cluster
            got = self.shared[key] = (with_host_overhead(self.p.costs[i], cl),
                                      with_host_overhead(self.p.selective[i], cl).recompute() if self.p.selective
                                      else 0.0)
        return got

    def _unit(self, i: int, k: Strategy) -> tuple[float, float, float, int]:
        """(forward AllGather s, backward AllGather s, reduction s, shard numel) of unit i under k,
        priced as `sim.timeline.collective_time` and `plan.schedule.make_scenario` price them."""
        got = self._tab.get((i, k))
        if got is None and self.shared:
            got = self.shared.get((self.p.costs[i].layers, self.p.costs[i].params, k))
        if got is None:
            u, cl = self.units[i], self.p.cluster
            n = shard_count(k, cl)
            gb, rb = u.padded_numel(n) * self.sb.unsharded_param, u.padded_numel(n) * self.sb.reduce
            got = (gather_seconds(k, gb, cl, backward=False), gather_seconds(k, gb, cl, backward=True),
                   reduce_seconds(k, rb, cl), u.shard_numel(n))
            self.shared[(self.p.costs[i].layers, self.p.costs[i].params, k)] = got
        self._tab[(i, k)] = got
        return got

    def _on_ddp(self, ch: Choice) -> bool:
        return (all(k is Strategy.REPLICATE for k in ch.strategies) and not any(ch.ckpt)
                and self.sb.unsharded_param == self.sb.param)

    def seconds(self, ch: Choice) -> float:
        if self._on_ddp(ch):
            return replay(self.p.scenario(ch)).step_seconds
        return self._run(ch, *self.durations(ch))

    def durations(self, ch: Choice) -> tuple[list, list]:
        """Per unit (AllGather forward, backward, reduction seconds, shard numel), and backward seconds."""
        tab = [self._unit(i, k) for i, k in enumerate(ch.strategies)]
        ckpt = ch.ckpt or (False,) * self.p.n
        return tab, [self.sac[i] if mode is Checkpoint.SELECTIVE else self.full[i] if mode
                     else self.units[i].backward_seconds for i, mode in enumerate(ckpt)]

    def prefix_delays(self, ch: Choice) -> list[float]:
        """The compute slowing (`overlap_share`) accumulated before each step of `ch`'s replay:
        steps before the first launch a change of one unit touches are the same in every such
        change, so their slowing adds to `relaxed`'s bound."""
        out: list[float] = []
        self._run(ch, *self.durations(ch), trace=out)
        return out

    def relaxed(self, ch: Choice, i: int, strategies, durations: tuple[list, list] | None = None,
                delays: list[float] | None = None) -> float:
        """A lower bound on `seconds` of every Choice that differs from `ch` only in unit i's
        strategy (one of `strategies`, its backward AllGather at `ch.bwd[i]` when it is the only
        one and gathers for backward, else at its default launch or none) and checkpointing, all
        else kept, on FSDP2 (not `_on_ddp`). Unit i's AllGathers, reduction, backward and optimizer
        shard take their least over the options, and its backward AllGather is left out unless
        kept as said; the event loop is max-plus in the durations, and a collective left out is
        never later than one of any length ([Note: plans a user can name] in `solve/named.py`), so
        nothing is faster than this. The collectives' slowing of compute (`overlap_share`) is left
        out too, but for the steps before unit i's forward launch, the same in every such Choice
        (`delays`: `prefix_delays(ch)`, when given). `durations`: `ch`'s (`durations`), when known."""
        tab, back = durations or self.durations(ch)
        opts = [self._unit(i, k) for k in strategies]
        keep = len(strategies) == 1 and strategies[0].gathers_for_backward and ch.bwd[i] is not None
        tab, back = list(tab), list(back)
        tab[i] = (min(o[0] for o in opts), opts[0][1] if keep else 0.0, min(o[2] for o in opts),
                  min(o[3] for o in opts))
        back[i] = min(self.units[i].backward_seconds, self.full[i], self.sac[i])
        bwd = ch.bwd if keep else ch.bwd[:i] + (None,) + ch.bwd[i + 1:]
        if Strategy.REPLICATE in strategies:  # no forward AllGather at all, as replicate issues none
            ch = ch._replace(strategies=ch.strategies[:i] + (Strategy.REPLICATE,) + ch.strategies[i + 1:])
        before = delays[ch.fwd[i]] if delays and min(ch.bwd[i] if ch.bwd[i] is not None else ch.fwd[i],
                                                     ch.fwd[i]) == ch.fwd[i] else 0.0
        return self._run(ch._replace(bwd=bwd), tab, back, share=0.0) + before

    def _run(self, ch: Choice, tab: list, back: list, share: float | None = None,
             trace: list | None = None) -> float:
        """`replay`'s event loop over per-unit (AllGather forward, backward, reduction seconds,
        shard numel) and backward seconds; `trace`: gets the slowing accumulated before each step."""
        n, units = self.p.n, self.units
        launches: list[list[tuple[int, float]]] = [[] for _ in range(2 * n + 1)]
        for i in range(n):  # `launches_at`: (use step, seconds), in use order per step
            if ch.strategies[i] is not Strategy.REPLICATE:  # [Note: a shard group of one issues no AllGather]
                launches[ch.fwd[i]].append((i, tab[i][0]))
            if ch.bwd[i] is not None:
                launches[ch.bwd[i]].append((2 * n - 1 - i, tab[i][1]))
        channel_free = prev_end = last_reduce = delay = 0.0  # the channel is FIFO: its ends only grow
        share = self.share if share is None else share
        ready: dict[int, float] = {}
        for s in range(2 * n + 1):
            if trace is not None:
                trace.append(delay)
            for use, t in sorted(launches[s]):
                start = max(channel_free, prev_end)
                channel_free = start + t
                ready[use] = channel_free
            start = max(prev_end, channel_free if self.blocking else ready.get(s, 0.0))
            if s < n:
                prev_end = start + units[s].forward_seconds
                if share:
                    delay += share * overlapped(start, prev_end, channel_free)
            elif s < 2 * n:
                i = 2 * n - 1 - s
                prev_end = start + back[i]
                if share:
                    delay += share * overlapped(start, prev_end, channel_free)
                rs_start = max(channel_free, prev_end)
                channel_free = rs_start + tab[2 * n - 1 - s][2]
                last_reduce = channel_free
                if self.blocking:
                    prev_end = channel_free
            else:
                start = max(start, last_reduce)
                prev_end = start + sum(t[3] for t in tab) * self.per_param
        if share:  # `sim.timeline.slowed`: the optimizer step ends the step, moved by every step's delay
            return prev_end + delay
        return max(prev_end, channel_free)
