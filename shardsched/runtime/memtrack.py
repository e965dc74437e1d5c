"""Measured peak memory per worker, next to the plan's prediction.

On CPU (and on any device with a fake process group) FSDP2 memory is measured
with PyTorch's own `FSDPMemTracker`, which attributes every live tensor storage to
params, grads, optimizer state, activations, gather/reduce buffers. It costs a
lot of Python per op, so trainers run it around a couple of steps only. On CUDA
the allocator's own `max_memory_allocated` is used instead. A model that runs on
DDP (all-replicate fp32 plans, `runtime/ddp.py`) is no FSDPModule, which
FSDPMemTracker refuses: PyTorch's generic `MemTracker` measures it instead.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule


def tracked_peak_bytes(model: nn.Module, optimizer: torch.optim.Optimizer,
                       step: Callable[[int], None], *, steps: int = 2,
                       inputs: tuple = ()) -> dict[str, int]:
    """Run `step(i)` for i < steps under FSDPMemTracker (MemTracker for a model that
    is no FSDPModule); peak bytes by kind + "Total".

    The tracker refuses a second iteration unless its per-module stats are
    reset in between (`reset_mod_stats`); the global peak survives the reset.
    """
    if isinstance(model, FSDPModule):
        tracker = FSDPMemTracker(model, optimizer)
        if inputs:
            tracker.track_inputs(inputs)
    else:  # a DDP-replicated model (runtime/ddp.py)
        tracker = MemTracker()
        tracker.track_external(model, optimizer, *inputs)
    with tracker:
        for i in range(steps):
            step(i)
            tracker.reset_mod_stats()
    snap = tracker.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return {str(getattr(k, "value", k)): int(v) for k, v in snap[dev].items()}
