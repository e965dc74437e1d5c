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
step starts after its reduction. On a device whose collectives hold SMs
(`DeviceSpec.comm_sm_share`), compute beside a collective runs slower
([Note: collectives slow the compute beside them]).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import NamedTuple

from shardsched.core.types import Strategy
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


# [Note: a shard group of one issues no AllGather]
# FSDP2's `FSDPParamGroup.unshard` on a shard group of one (replicate) records an event on the
# current stream and issues no collective; `wait_for_unshard` copies the shards into the
# unsharded parameters there (torch 2.13). So a replicate unit never waits for the channel,
# wherever its "AllGather" is launched, and a launch before its use holds no buffer until that
# copy-in (FSDPMemTracker: nothing at the prefetch; a CNN alternating replicate and full_shard
# was 3.8% over charging the world-padded output from the launch). The launch point of a
# replicate unit changes neither time nor memory (`sim.memory.pending_gathers`, the MILP's
# deadlines and warm start, `solve.replay`).


def launches_at(sc: Scenario) -> dict[int, list[tuple[int, int]]]:
    """step -> [(unit, use step)] AllGathers issued there, in FSDP2's issue order:
    the step's own unit first (its `unshard` precedes the prefetch loop), then by use."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i, s in enumerate(sc.strategies):
        if s is Strategy.REPLICATE:  # [Note: a shard group of one issues no AllGather]
            continue
        out.setdefault(sc.forward_launch[i], []).append((i, sc.f_step(i)))
        if sc.backward_launch[i] is not None:
            out.setdefault(sc.backward_launch[i], []).append((i, sc.b_step(i)))
    for lst in out.values():
        lst.sort(key=lambda unit_use: unit_use[1])
    return out


def replay(sc: Scenario, *, reduce: bool = True, exact: bool = False) -> Timeline:
    """Event times of one step under the schedule `sc` (reduce=False: a micro-batch whose
    gradients are kept unsharded, `GradSync.LAST`: no reductions). `exact`: compute beside a
    collective runs at (1 - share) of its speed while the collective runs, the reference the
    planner's first-order step is measured against ([Note: collectives slow the compute beside
    them]); nothing plans with it."""
    n, launches = sc.n, launches_at(sc)
    blocking = not sc.cluster.device.overlap
    share = sc.cluster.device.overlap_share
    compute, comm, lost = [], [], []
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
        seconds = _compute_seconds(sc, s)
        prev_end = start + (beside(seconds, channel_free - start, share) if exact else seconds)
        compute.append(ComputeEvent(s, sc.step_name(s), start, prev_end))
        lost.append(share * overlapped(start, prev_end, channel_free))
        if n <= s < 2 * n and reduce:
            i = 2 * n - 1 - s
            kind = reduce_kind(sc.strategies[i])
            rs_start = max(channel_free, prev_end)
            channel_free = rs_start + collective_time(sc, kind, i)
            comm.append(CommEvent(kind, i, s, rs_start, channel_free))
            if blocking:
                prev_end = channel_free
    return slowed(compute, comm, lost) if share and not exact else Timeline(tuple(compute), tuple(comm))


# [Note: collectives slow the compute beside them]
# An NCCL collective is a kernel: its CTAs hold SMs the whole time it runs and never share one
# with a compute kernel (NVIDIA/nccl#689), so compute overlapping it runs on the rest: an H100
# AllGather under FSDP-style prefetch holds 24 of 132 SMs (`DeviceSpec.comm_sm_share`, which
# cites the traces). Compute beside a collective for o seconds therefore finishes share x o of
# its work late. The replay charges that to first order: it schedules the step as if nothing
# slowed, takes each compute step's overlap o_s with the channel, lengthens that step by
# share x o_s and moves everything after it later by as much (`slowed`). Then
#   step = T0 + share x sum_s o_s = (1 - share) T0 + share (compute + communication),
# T0 being the unslowed step, because the replay never leaves both streams idle (a collective
# starts at its issue or when the channel frees, and everything queued was issued by the time
# the compute beside it starts), so overlap = compute + communication - T0. That is linear in
# T0 and in the plan's choices, so the MILP prices it exactly (`solve.milp`, its objective).
# What the first order leaves out: the late work could itself run beside a later collective
# (slowed again) or under communication that outlasts it (hidden). `replay(exact=True)` runs the
# step at (1 - share) speed beside the channel, event by event (`beside`): not linear (a step
# the channel outlasts takes seconds / (1 - share), one it does not seconds + share x busy), so
# it only measures the first order: on every published configuration of
# `bench/bench_gpu_presets.py` the two agree within 0.02% (its `exact` column); they part where
# compute is short beside long collectives (tests/sim/test_timeline.py).
# The overlap of step s is closed form: the channel is busy from the step's start until it frees
# (everything queued was issued by then, and what the step issues starts after it ends), so
# o_s = min(channel free, end) - start, if positive.


def beside(seconds: float, busy: float, share: float) -> float:
    """Exact: how long `seconds` of compute take when the channel stays busy for `busy` more
    seconds and computes run at (1 - share) of their speed meanwhile."""
    if busy <= 0 or not share:
        return seconds
    slow = seconds / (1 - share)
    return slow if slow <= busy else seconds + share * busy


def overlapped(start: float, end: float, channel_free: float) -> float:
    """Seconds compute [start, end] runs beside the channel, which is busy from `start` until
    `channel_free` (the AllGathers issued up to this step, before its reduction)."""
    return max(0.0, min(channel_free, end) - start)


def slowed(compute: list[ComputeEvent], comm: list[CommEvent], lost: list[float]) -> Timeline:
    """The timeline with compute step s lengthened by `lost[s]` and every event after it moved
    later by as much ([Note: collectives slow the compute beside them]); a collective keeps its
    duration and moves with the last compute step that ended before it started."""
    ends, delays, delay = [], [], 0.0
    out = []
    for ev, extra in zip(compute, lost):
        start = ev.start + delay
        delay += extra
        out.append(ev._replace(start=start, end=ev.end + delay))
        ends.append(ev.end)
        delays.append(delay)

    def moved(c: CommEvent) -> CommEvent:
        k = bisect_right(ends, c.start)
        d = delays[k - 1] if k else 0.0
        return c._replace(start=c.start + d, end=c.end + d)
    return Timeline(tuple(out), tuple(moved(c) for c in comm))


def _compute_seconds(sc: Scenario, s: int) -> float:
    n = sc.n
    if s < n:
        return sc.units[s].forward_seconds
    if s < 2 * n:
        return sc.backward_seconds(2 * n - 1 - s)
    return sc.optimizer_seconds
