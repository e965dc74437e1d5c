"""All-replicate plans on PyTorch's DDP engine instead of FSDP2.

A plan whose every unit is `replicate` asks for plain data parallelism. FSDP2
can express it (a (world, 1) mesh, see parallelize.py), but then every
parameter is a DTensor: the optimizer step dispatches through DTensor and a
size-1 AllGather still copies the parameters out, so a measured step was
1.17-1.23x DDP's (issue 8). Such a plan therefore runs on
`torch.distributed._composable.replicate`, which is DistributedDataParallel
applied in place: parameters stay plain tensors, gradients are all-reduced in
DDP's buckets while backward runs, and module paths (hence state-dict keys
and DCP checkpoints) are those of the bare model, so a checkpoint of a
replicate run loads into a sharded plan and back, at any world size.

[Note: bf16-mixed stays on FSDP2]
DDP has no public mixed-precision policy matching FSDP2's (bf16 compute copy,
fp32 master weights and reductions), so an all-replicate plan in bf16-mixed
keeps running on FSDP2, whose memory and time the model predicts.
"""
from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from shardsched.core.types import Plan, Precision, Strategy
from shardsched.profile.unused import drops_at_random


def runs_on_ddp(plan: Plan) -> bool:
    """True when `plan` is run by DDP (every unit replicate, fp32, none checkpointed); see
    the module note. A checkpointed plan stays on FSDP2, whose memory with recomputation
    is the one modelled and measured (`sim.memory`)."""
    return (plan.precision is Precision.FP32 and all(u.strategy is Strategy.REPLICATE for u in plan.units)
            and not any(u.checkpoint for u in plan.units))


def finds_unused(plan: Plan, model: nn.Module) -> bool:
    """[Note: parameters without a gradient] DDP waits for every parameter's gradient before it
    finishes a step's reduction; a parameter the loss never reaches (DINOv2's `mask_token`)
    fails the second step ("Expected to have finished reduction in the prior iteration").
    `find_unused_parameters` walks the autograd graph every step to mark such parameters
    ready; it costs that walk, so it is on only where a step can leave a parameter without a
    gradient: verification saw one (`Verified.unused_params`), or the model skips parts of
    itself at random, which two verified steps need not see (`drops_at_random`). An
    unverified plan of a model that does neither keeps DDP's own default, off."""
    return (plan.verified is not None and bool(plan.verified.unused_params)) or drops_at_random(model)


def replicate_with_ddp(model: nn.Module, *, mesh: DeviceMesh, find_unused_parameters: bool = False) -> nn.Module:
    """DDP over `mesh`'s group, in place (composable replicate); returns `model`.

    Parameters are broadcast from rank 0 at the first forward, as DDP does."""
    from torch.distributed._composable.replicate import replicate
    device_ids = [next(model.parameters()).device.index] if mesh.device_type == "cuda" else None
    # gradient_as_bucket_view: gradients live in DDP's reduction buckets instead of
    # beside them, so the all-reduce needs no second copy of the gradients.
    return replicate(model, process_group=mesh.get_group(), device_ids=device_ids,
                     gradient_as_bucket_view=True, find_unused_parameters=find_unused_parameters)
