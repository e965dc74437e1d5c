"""Scalar parameters: kept out of sharding, their gradients averaged by one all-reduce.

[Note: scalar parameters]
FSDP2 shards every parameter on dim 0 and refuses a 0-dim one ("fully_shard doesn't support
scalar parameters"): CLIP's `logit_scale`, a learned temperature, a ReZero gate. A scalar is
4 bytes, so sharding it buys nothing: `fully_shard(..., ignored_params=...)` leaves it a plain
tensor, replicated on every worker, and a post-accumulate-grad hook averages its gradient
over the data-parallel group with `dist.all_reduce`, as DDP would. Under gradient
accumulation the hook runs after every micro-batch; the average of an already averaged
gradient plus the next micro-batch's is still the average of the sum, so the result is the
same whichever micro-batch reduces. The optimizer gets such parameters in a param group of
their own (`optimizer_param_groups`): foreach kernels refuse a list mixing DTensors and
plain tensors.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor


def scalar_params(module: nn.Module) -> set[nn.Parameter]:
    """The 0-dim parameters under `module` (the root included)."""
    return {p for p in module.parameters() if p.dim() == 0}


def average_scalar_grads(params: set[nn.Parameter], group) -> None:
    """See [Note: scalar parameters]: each gradient averaged over `group` once it is accumulated."""
    world = dist.get_world_size(group)

    def average(p: torch.Tensor) -> None:
        dist.all_reduce(p.grad, group=group)  # SUM: gloo has no AVG
        p.grad.div_(world)

    for p in params:
        if p.requires_grad and not getattr(p, "_shardsched_averaged", False):
            p.register_post_accumulate_grad_hook(average)
            p._shardsched_averaged = True


def optimizer_param_groups(model: nn.Module) -> list[dict]:
    """The model's trainable parameters as optimizer param groups: sharded (DTensor) ones and
    plain ones apart ([Note: scalar parameters]); one group when all are alike."""
    params = [p for p in model.parameters() if p.requires_grad]
    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": g} for g in (sharded, plain) if g]
