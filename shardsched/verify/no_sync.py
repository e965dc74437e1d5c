"""DDP's `no_sync` on the plain model that stands for DDP in verification.

[Note: DDP's no_sync beside its buckets]
Verification runs an all-replicate fp32 plan on the plain model with every gradient allocated
up front and zeroed in place: with `gradient_as_bucket_view` DDP's buckets are the gradients
([Note: plans that run on DDP, verified without DDP] in verify/engine.py). Accumulating with
`--grad-sync last` is not that: the trainer's `zero_grad(set_to_none=True)` leaves `.grad`
None, and under `no_sync` the reducer's hooks do nothing, so autograd accumulates the
micro-batches before the last in fresh `.grad` tensors beside the buckets DDP keeps; in the
last micro-batch's backward each parameter's hook copies its gradient into the bucket and
points `.grad` at it, freeing the fresh one (torch/csrc/distributed/c10d/reducer.cpp,
`mark_variable_ready`, `copy_grad_to_bucket`). A stand-in without this verified a 2-layer
GPT-2 accumulating 4 at 4.70 MB where the trainer measured 5.50 MB and the model predicted it.

`with_no_sync(model)` gives the stand-in `set_requires_gradient_sync` with that effect:
`False` moves each gradient (the bucket) aside, held, and leaves `.grad` None; `True` makes
the next accumulation of each parameter copy into its bucket and put the bucket back.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def with_no_sync(model: nn.Module) -> nn.Module:
    """`model` (the DDP stand-in, every gradient allocated) with `set_requires_gradient_sync`
    as DDP's `no_sync` behaves ([Note: DDP's no_sync beside its buckets]); returns `model`."""
    buckets: dict[nn.Parameter, torch.Tensor] = {}

    def back_to_bucket(p: nn.Parameter) -> None:
        if syncing[0] and p in buckets:
            bucket = buckets.pop(p)
            bucket.copy_(p.grad)
            p.grad = bucket

    syncing = [True]
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.register_post_accumulate_grad_hook(back_to_bucket)

    def set_requires_gradient_sync(flag: bool) -> None:
        syncing[0] = flag
        if flag:
            return
        for p in params:
            if p.grad is not None and p not in buckets:
                buckets[p] = p.grad
                p.grad = None

    model.set_requires_gradient_sync = set_requires_gradient_sync
    return model
