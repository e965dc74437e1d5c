"""Discrete-event replay of one training step: compute stream + one comm channel.

Program order is what FSDP2 issues on the CPU thread: at the start of step s the
AllGathers launched at s (the step's own unit first, then its prefetch list),
then step s's compute, then, after a backward step, that unit's ReduceScatter /
AllReduce. The communication channel is serial and first-in-first-out, so a
prefetch issued at B_i queues behind the reduction of B_{i+1} (as in FSDP2, whose
post-backward of one unit precedes the pre-backward of the next).
A collective cannot start before the compute step at whose start it is issued
begins; compute of a step waits for its own AllGather; the optimizer step waits
for every reduction. Step time = end of the optimizer step.
On a device without overlap (gloo on CPU, `DeviceSpec.overlap`), every
collective blocks compute: a step computes after all it issued, and the next
step starts after its reduction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from shardsched.cost.comm import Collective
from shardsched.cost.strategy import gather_seconds, reduce_kind, reduce_seconds, shard_count
from shardsched.sim.scenario import Scenario


class CommEvent(NamedTuple):
    kind: Collective
    unit: int
    issued_step: int
    start: float
    end: float


class ComputeEvent(NamedTuple):
    step: int
    name: str
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    compute: tuple[ComputeEvent, ...]
    comm: tuple[CommEvent, ...]

    @property
    def step_seconds(self) -> float:
        return max([self.compute[-1].end] + [c.end for c in self.comm])

    @property
    def compute_seconds(self) -> float:
        return sum(c.end - c.start for c in self.compute)

    @property
    def comm_seconds(self) -> float:
        return sum(c.end - c.start for c in self.comm)


def gather_bytes(sc: Scenario, i: int) -> float:
    """AllGather output bytes: dim 0 of every parameter padded to the strategy's shard
    count (FSDP2; `cost.strategy.shard_count`: world, or the node for hybrid_*)."""
    return sc.units[i].padded_numel(shard_count(sc.strategies[i], sc.cluster)) * sc.state.unsharded_param


def reduce_bytes(sc: Scenario, i: int) -> float:
    """ReduceScatter input (AllReduce buffer for replicate), padded as `gather_bytes`."""
    return sc.units[i].padded_numel(shard_count(sc.strategies[i], sc.cluster)) * sc.state.reduce


def collective_time(sc: Scenario, kind: Collective, i: int, *, backward: bool = False) -> float:
    """Wire time of unit i's collective (`cost.strategy`: which group it runs over)."""
    if kind is Collective.ALL_GATHER:
        return gather_seconds(sc.strategies[i], gather_bytes(sc, i), sc.cluster, backward=backward)
    return reduce_seconds(sc.strategies[i], reduce_bytes(sc, i), sc.cluster)


def launches_at(sc: Scenario) -> dict[int, list[tuple[int, int]]]:
    """step -> [(unit, use step)] AllGathers issued there, in FSDP2's issue order:
    the step's own unit first (its `unshard` precedes the prefetch loop), then by use."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i, s in enumerate(sc.strategies):
        # Replicate units gather too: FSDP2 on a (world, 1) mesh copies the
        # parameters out of a size-1 AllGather (no wire time, same buffers).
        out.setdefault(sc.forward_launch[i], []).append((i, sc.f_step(i)))
        if sc.backward_launch[i] is not None:
            out.setdefault(sc.backward_launch[i], []).append((i, sc.b_step(i)))
    for lst in out.values():
        lst.sort(key=lambda unit_use: unit_use[1])
    return out


def replay(sc: Scenario, *, reduce: bool = True) -> Timeline:
    """Event times of one step under the schedule `sc` (reduce=False: a micro-batch whose
    gradients are kept unsharded, `GradSync.LAST`: no reductions)."""
    n, launches = sc.n, launches_at(sc)
    blocking = not sc.cluster.device.overlap
    compute, comm = [], []
    channel_free, prev_end = 0.0, 0.0
    ready: dict[int, float] = {}  # use step -> end of its AllGather
    for s in range(2 * n + 1):
        for i, use in launches.get(s, []):
            start = max(channel_free, prev_end)
            channel_free = start + collective_time(sc, Collective.ALL_GATHER, i, backward=use >= n)
            comm.append(CommEvent(Collective.ALL_GATHER, i, s, start, channel_free))
            ready[use] = channel_free
        start = max(prev_end, channel_free if blocking else ready.get(s, 0.0))
        if s == 2 * n:
            start = max([start] + [c.end for c in comm if c.kind is not Collective.ALL_GATHER])
        prev_end = start + _compute_seconds(sc, s)
        compute.append(ComputeEvent(s, sc.step_name(s), start, prev_end))
        if n <= s < 2 * n and reduce:
            i = 2 * n - 1 - s
            kind = reduce_kind(sc.strategies[i])
            rs_start = max(channel_free, prev_end)
            channel_free = rs_start + collective_time(sc, kind, i)
            comm.append(CommEvent(kind, i, s, rs_start, channel_free))
            if blocking:
                prev_end = channel_free
    return Timeline(tuple(compute), tuple(comm))


def _compute_seconds(sc: Scenario, s: int) -> float:
    n = sc.n
    if s < n:
        return sc.units[s].forward_seconds
    if s < 2 * n:
        return sc.backward_seconds(2 * n - 1 - s)
    return sc.optimizer_seconds
