"""Chrome trace (chrome://tracing, Perfetto) of a simulated step.

Two tracks, as a profiler would show a real step: the compute stream and the
communication channel, plus a counter track with memory at each compute step.
Times in microseconds, as the Trace Event Format wants them.
"""
from __future__ import annotations

from shardsched.sim.memory import StepMemory
from shardsched.sim.scenario import Scenario
from shardsched.sim.timeline import Timeline

_US = 1e6


def trace_events(sc: Scenario, tl: Timeline, memory: list[StepMemory]) -> list[dict]:
    events: list[dict] = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": n}}
                          for t, n in ((0, "compute"), (1, "communication"))]
    for c in tl.compute:
        events.append({"name": c.name, "ph": "X", "pid": 0, "tid": 0, "ts": c.start * _US,
                       "dur": (c.end - c.start) * _US})
    for c in tl.comm:
        events.append({"name": f"{c.kind.value}:{sc.units[c.unit].name}", "ph": "X", "pid": 0, "tid": 1,
                       "ts": c.start * _US, "dur": (c.end - c.start) * _US,
                       "args": {"issued_at": sc.step_name(c.issued_step)}})
    for c, m in zip(tl.compute, memory):
        b = m.breakdown
        events.append({"name": "memory (MiB)", "ph": "C", "pid": 0, "ts": c.start * _US,
                       "args": {k: getattr(b, k) / 2**20 for k in
                                ("params", "grads", "optimizer", "activations", "comm_buffers")}})
    return events
