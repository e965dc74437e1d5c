"""One call from a Scenario to the predictions a Plan carries."""
from __future__ import annotations

from typing import NamedTuple

from shardsched.cost.memory import model_states_bytes
from shardsched.core.types import Predicted
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
    states = sum(model_states_bytes(u.params, s, sc.cluster.world, sc.state, u.dims,
                                    local=sc.cluster.local)
                 for u, s in zip(sc.units, sc.strategies))
    step = tl.step_seconds
    pred = Predicted(
        peak_bytes=top.total, step_seconds=step, compute_seconds=tl.compute_seconds,
        exposed_comm_seconds=max(0.0, step - tl.compute_seconds),
        lower_bound_seconds=max(tl.compute_seconds, tl.comm_seconds),
        model_states_bytes=states, memory=top.breakdown, peak_at=top.name,
        comm_seconds=tl.comm_seconds)
    return SimResult(tl, mem, pred)
