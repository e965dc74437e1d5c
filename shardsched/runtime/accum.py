"""Gradient accumulation: K micro-batches per optimizer step, averaged like one batch.

A step trains on global batch `step` (`train.data`): worker r takes its rows
[r*B/W, (r+1)*B/W) and runs them as K micro-batches of `micro_batch` rows,
K = B / (W * micro_batch). Each micro-batch loss is the mean over its rows and is
scaled by 1/K before backward, so the summed gradient is the mean over the
worker's rows, exactly as one micro-batch of B/W rows gives it; the data position
of a run is still its step number (one global batch per step).

[Note: when gradients are reduced]
`GradSync.EVERY` is FSDP2's default: each micro-batch's backward reduce-scatters
(all-reduces for replicate units) and the sharded gradients accumulate, K
reductions per step. `GradSync.LAST` calls `set_requires_gradient_sync(False)`
on the root before every micro-batch but the last (torchtitan does the same;
`FSDPModule.set_requires_gradient_sync` recurses into every unit, and the
composable `replicate` DDP runs on has the same method, its `no_sync`): FSDP2
then keeps each parameter's unsharded gradient (`FSDPParam.unsharded_accumulated_grad`)
until the last backward reduces the sum once. Less communication, more memory
(the model prices both: `sim.memory.accumulation_bytes`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from shardsched.core.types import GradSync, Plan
from shardsched.errors import UsageError

GRAD_SYNC_CHOICES = tuple(g.value for g in GradSync)


class Accumulation(NamedTuple):
    """How one worker runs one optimizer step."""

    micro_batch: int
    """Rows per micro-batch on each worker."""
    steps: int
    """Micro-batches per optimizer step (K)."""
    grad_sync: GradSync
    """When gradients are reduced (only matters when steps > 1)."""


def resolve(*, batch: int, world: int, micro_batch: int | None, grad_sync: str | None,
            plan: Plan | None = None) -> Accumulation:
    """The accumulation of a run: the flags, else what the plan chose (when it accumulates),
    else one micro-batch of batch/world rows. UsageError (one line) when it does not divide."""
    rows = batch // world
    from_plan = micro_batch is None and plan is not None and plan.accumulation > 1
    mb = plan.micro_batch if from_plan else (micro_batch or rows)
    if mb < 1 or batch % world or rows % mb:
        where = f"the plan's micro-batch {mb}" if from_plan else f"--micro-batch {mb}"
        raise UsageError(f"--global-batch {batch} is not a multiple of {world} workers x {where} "
                         f"(= {world * mb}); accepted: a global batch that is a multiple of workers x micro-batch, "
                         f"e.g. --global-batch {world * mb * max(1, round(batch / (world * mb)))}")
    if grad_sync is not None and grad_sync not in GRAD_SYNC_CHOICES:
        raise UsageError(f"--grad-sync {grad_sync!r}: accepted {', '.join(GRAD_SYNC_CHOICES)}")
    sync = GradSync(grad_sync) if grad_sync else (plan.grad_sync if plan is not None else GradSync.EVERY)
    return Accumulation(micro_batch=mb, steps=rows // mb, grad_sync=sync)


def split_micro_batches(inputs: tuple, steps: int) -> list[tuple]:
    """`inputs` (one worker's rows of a step) as `steps` micro-batches, cut along dim 0;
    values without that leading dimension go to every micro-batch as they are."""
    if steps == 1:
        return [tuple(inputs)]
    rows = next(t.shape[0] for t in inputs if isinstance(t, torch.Tensor) and t.dim())
    parts = [t.chunk(steps) if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows else [t] * steps
             for t in inputs]
    return [tuple(p[i] for p in parts) for i in range(steps)]


def forward_backward(model: torch.nn.Module, micro_batches: list[tuple], *, grad_sync: GradSync,
                     loss_of=lambda x: x) -> torch.Tensor:
    """Forward and backward over the micro-batches of one step (gradients summed in
    `.grad`); returns the step's loss (the mean of the micro-batch losses), detached.

    `loss_of` turns the model's output into the scalar loss (the trainer's check)."""
    k = len(micro_batches)
    total = torch.zeros(())
    for i, inputs in enumerate(micro_batches):
        loss = micro_step(model, inputs, i, k, grad_sync=grad_sync, loss_of=loss_of)
        total = total.to(loss.device) + loss
    return total / k


def micro_step(model: torch.nn.Module, inputs: tuple, i: int, k: int, *, grad_sync: GradSync,
               loss_of=lambda x: x) -> torch.Tensor:
    """Forward and backward of micro-batch `i` of `k` (its gradient added to `.grad`); its loss,
    detached. Alone for memory trackers, which take each forward of the root as an iteration."""
    if k > 1 and grad_sync is GradSync.LAST:
        model.set_requires_gradient_sync(i == k - 1)  # see [Note: when gradients are reduced]
    loss = loss_of(model(*inputs))
    (loss / k).backward()  # 1/K: the mean over all K*micro_batch rows, as one big batch
    return loss.detach()
