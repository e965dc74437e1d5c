"""One call from a Scenario to the predictions a Plan carries."""
from __future__ import annotations

from typing import NamedTuple

from shardsched.cost.memory import shard_numel, shards
from shardsched.core.types import GradSync, Predicted
from shardsched.sim.memory import StepMemory, step_memory
from shardsched.sim.scenario import Scenario
from shardsched.sim.timeline import Timeline, replay


class SimResult(NamedTuple):
    timeline: Timeline
    memory: list[StepMemory]
    predicted: Predicted


def simulate(sc: Scenario) -> SimResult:
    sc.validate()
    tl = replay(sc)
    mem = step_memory(sc)
    top = max(mem, key=lambda m: m.total)
    states = sum(_unit_states(u, s, sc) for u, s in zip(sc.units, sc.strategies))
    step, compute, comm = accumulated_seconds(sc, tl)
    pred = Predicted(
        peak_bytes=top.total, step_seconds=step, compute_seconds=compute,
        exposed_comm_seconds=max(0.0, step - compute),
        lower_bound_seconds=max(compute, comm),
        model_states_bytes=states, memory=top.breakdown, peak_at=top.name,
        comm_seconds=comm)
    return SimResult(tl, mem, pred)


def accumulated_seconds(sc: Scenario, tl: Timeline) -> tuple[float, float, float]:
    """(step, compute, communication) seconds of one optimizer step of `sc.accumulation`
    micro-batches, the timeline being one micro-batch and the optimizer: K forward-backward
    passes, each gathering as the schedule says; reductions after every one (GradSync.EVERY)
    or only the last (LAST: the others replayed without them); the optimizer once. The
    micro-batches run one after another (the next forward waits for the optimizer-free end
    of the previous one, as `runtime.accum.forward_backward` runs them)."""
    k = sc.accumulation
    if k <= 1:
        return tl.step_seconds, tl.compute_seconds, tl.comm_seconds
    opt = tl.compute[-1]
    micro, opt_seconds = opt.start, opt.end - opt.start
    quiet = replay(sc, reduce=False) if sc.grad_sync is GradSync.LAST else tl
    earlier = quiet.compute[-1].start
    compute = k * (tl.compute_seconds - opt_seconds) + opt_seconds
    return (k - 1) * earlier + micro + opt_seconds, compute, (k - 1) * quiet.comm_seconds + tl.comm_seconds


def _unit_states(u, strategy, sc: Scenario) -> int:
    """ZeRO's model states of one unit per worker (`cost.memory.model_states_bytes`); its frozen
    part has parameters only ([Note: frozen parameters] in sim/memory.py)."""
    sb = sc.state
    n = shard_numel(u.params, u.dims, shards(strategy, sc.cluster.world, local=sc.cluster.local))
    return n * sb.param + u.trainable(n, bucket=sc.on_ddp) * sb.grad + u.trainable(n) * sb.optimizer
