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
    _skip_frozen(tracker, model)
    with tracker:
        for i in range(steps):
            step(i)
            tracker.reset_mod_stats()
    snap = tracker.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return {str(getattr(k, "value", k)): int(v) for k, v in snap[dev].items()}


class _NoHook:
    def remove(self) -> None:
        pass


def _skip_frozen(tracker: MemTracker, model: nn.Module) -> None:
    """MemTracker registers a gradient hook on every parameter of a module it enters
    (torch/distributed/_tools/mem_tracker.py `_track_module_params_and_buffers`), which
    raises for a frozen one (Whisper's sinusoidal `embed_positions`: "cannot register a hook
    on a tensor that doesn't require gradient"). It skips parameters it already hooked, so
    frozen ones are entered as hooked, with handles that remove nothing; they never get a
    gradient to track."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
