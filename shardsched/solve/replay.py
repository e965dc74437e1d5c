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

    def __init__(self, p: Problem):
        self.p, cl = p, p.cluster
        self.sb = state_bytes(p.precision, p.optimizer)
        self.units = [with_host_overhead(c, cl) for c in p.costs]
        # seconds a backward recomputes, per checkpointing mode (`Scenario.backward_seconds`): a
        # selective unit recomputes its selective form's share (`UnitCost.recompute`), not its forward
        sel = [with_host_overhead(c, cl).recompute() for c in p.selective] or [0.0] * p.n
        self.full = [u.backward_seconds + u.recompute() for u in self.units]
        self.sac = [u.backward_seconds + r for u, r in zip(self.units, sel)]
        self.per_param = optimizer_seconds_per_param(self.sb, cl)
        self.blocking = not cl.device.overlap
        # [Note: collectives slow the compute beside them] in sim/timeline.py
        self.share = cl.device.overlap_share
        self._tab: dict[tuple[int, Strategy], tuple[float, float, float, int]] = {}

    def _unit(self, i: int, k: Strategy) -> tuple[float, float, float, int]:
        """(forward AllGather s, backward AllGather s, reduction s, shard numel) of unit i under k,
        priced as `sim.timeline.collective_time` and `plan.schedule.make_scenario` price them."""
        got = self._tab.get((i, k))
        if got is None:
            u, cl = self.units[i], self.p.cluster
            n = shard_count(k, cl)
            gb, rb = u.padded_numel(n) * self.sb.unsharded_param, u.padded_numel(n) * self.sb.reduce
            got = (gather_seconds(k, gb, cl, backward=False), gather_seconds(k, gb, cl, backward=True),
                   reduce_seconds(k, rb, cl), u.shard_numel(n))
            self._tab[(i, k)] = got
        return got

    def _on_ddp(self, ch: Choice) -> bool:
        return (all(k is Strategy.REPLICATE for k in ch.strategies) and not any(ch.ckpt)
                and self.sb.unsharded_param == self.sb.param)

    def seconds(self, ch: Choice) -> float:
        if self._on_ddp(ch):
            return replay(self.p.scenario(ch)).step_seconds
        n, units = self.p.n, self.units
        tab = [self._unit(i, k) for i, k in enumerate(ch.strategies)]
        launches: list[list[tuple[int, float]]] = [[] for _ in range(2 * n + 1)]
        for i in range(n):  # `launches_at`: (use step, seconds), in use order per step
            launches[ch.fwd[i]].append((i, tab[i][0]))
            if ch.bwd[i] is not None:
                launches[ch.bwd[i]].append((2 * n - 1 - i, tab[i][1]))
        ckpt = ch.ckpt or (False,) * n
        channel_free = prev_end = last_reduce = delay = 0.0  # the channel is FIFO: its ends only grow
        share = self.share
        ready: dict[int, float] = {}
        for s in range(2 * n + 1):
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
                mode = ckpt[i]
                prev_end = start + (self.sac[i] if mode is Checkpoint.SELECTIVE else self.full[i] if mode
                                    else units[i].backward_seconds)
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
