"""The op policy of selective activation checkpointing (`Checkpoint.SELECTIVE`), in one place.

[Note: the selective checkpointing policy]
Selective checkpointing (torch/utils/checkpoint.py, `create_selective_checkpoint_contexts`)
asks a policy, op by op, whether the op's output is saved or recomputed in backward. Its
forward runs under `_CachingTorchDispatchMode`, which stores the (detached) outputs of every
MUST_SAVE op whether or not autograd would save them; its recomputation runs under
`_CachedTorchDispatchMode`, which returns those stored outputs instead of running the op
again, and runs every other op. The policy is torchtitan's default in spirit
(torchtitan/distributed/activation_checkpoint.py, `_save_list` and `_custom_policy`): keep
the outputs of the ops that cost FLOPs (matmuls, attention, convolutions) and recompute the
cheap, memory-bound rest (norms, activations, residual adds, copies). torchtitan saves every
other mm; here every one is saved, so that what a layer keeps is a property of its ops
alone. The profiler (`profile.trace`) reads `saves` too, so the planner's model of what a
selective layer keeps and recomputes is this policy's.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten

SAVED = frozenset({_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten._scaled_mm, _aten._grouped_mm,
                   _aten.convolution, _aten._convolution,
                   *(getattr(_aten, name) for name in dir(_aten)
                     if name.startswith("_scaled_dot_product_") and "attention" in name
                     and not name.endswith("_backward"))})
"""Op packets whose outputs a selective layer keeps: matmuls, convolutions, and the forward
`_scaled_dot_product_*_attention` kernels (flash, efficient, cuDNN, CPU flash, math)."""


def saves(func) -> bool:
    """Whether the policy keeps `func`'s outputs (an OpOverload or its OpOverloadPacket)."""
    return getattr(func, "overloadpacket", func) in SAVED


def _policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if saves(func) else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts():
    """(forward context, recompute context) of selective checkpointing with this policy."""
    return create_selective_checkpoint_contexts(_policy)

