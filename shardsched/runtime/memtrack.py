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

from typing import Callable, NamedTuple

import torch
import torch.nn as nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule

from shardsched.runtime.fast_tracker import FastFSDPMemTracker, FastMemTracker


class TrackedPeak(NamedTuple):
    """A tracked run's peak: bytes by kind (+ "Total") and where it happened."""

    by_kind: dict[str, int]
    at: str
    """"forward of blocks.3" / "backward of blocks.3" (the innermost module whose own peak
    is the run's), or "outside every module" (the optimizer step, the loss)."""


def tracked_peak_bytes(model: nn.Module, optimizer: torch.optim.Optimizer,
                       step: Callable[[int], None], *, steps: int = 2,
                       inputs: tuple = ()) -> dict[str, int]:
    """Run `step(i)` for i < steps under FSDPMemTracker (MemTracker for a model that
    is no FSDPModule); peak bytes by kind + "Total"."""
    return tracked_peak(model, optimizer, step, steps=steps, inputs=inputs).by_kind


def tracked_peak(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                 step: Callable[[int], None], *, steps: int = 2, inputs: tuple = ()) -> TrackedPeak:
    """`tracked_peak_bytes` with the moment of the peak.

    The tracker refuses a second iteration unless its per-module stats are
    reset in between (`reset_mod_stats`); the global peak survives the reset, so
    the moment is read after every step, before the reset."""
    if isinstance(model, FSDPModule):
        tracker = FastFSDPMemTracker(model, optimizer)
        if inputs:
            tracker.track_inputs(inputs)
    else:  # a DDP-replicated model (runtime/ddp.py), or a plain one standing for it
        tracker = FastMemTracker()
        tracker.track_external(model, *([optimizer] if optimizer is not None else []), *inputs)
    _skip_frozen(tracker, model)
    at, best = "outside every module", -1
    with tracker:
        for i in range(steps):
            step(i)
            total = _total(tracker)
            if total > best:
                best, at = total, _peak_module(tracker, total) or "outside every module"
            tracker.reset_mod_stats()
    snap = tracker.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return TrackedPeak({str(getattr(k, "value", k)): int(v) for k, v in snap[dev].items()}, at)


def _total(tracker: MemTracker) -> int:
    snap = tracker.get_tracker_snapshot("peak")
    return max((int(v.get("Total", 0)) for v in snap.values()), default=0)


def _peak_module(tracker: MemTracker, total: int) -> str | None:
    """The innermost module (longest path) whose forward or backward peak is `total`."""
    found = None
    for stats in tracker.memory_tracking.values():
        for states, words in (({"Peak-Forward", "Peak Forward"}, "forward"),
                              ({"Peak-Backward", "Peak Backward"}, "backward")):
            for snap in (s for key, snaps in stats.snapshots.items() if key.value in states for s in snaps):
                if any(int(v.get("Total", 0)) == total for v in snap.values()):
                    name = stats.mod_fqn.split(".", 1)[1] if "." in stats.mod_fqn else "(root)"
                    if found is None or name.count(".") > found[1].count(".") or found[1] == "(root)":
                        found = (words, name)
    return f"{found[0]} of {found[1]}" if found else None


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
