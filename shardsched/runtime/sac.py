"""Selective activation checkpointing at run time: the contexts that apply the op policies of
`core.sac_policy` ([Note: the selective checkpointing policy]) to one checkpointed call."""
from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from shardsched.core.sac_policy import Policy
from shardsched.core.types import Checkpoint


def _profiler_ops() -> set:
    ops = set()
    for name in ("_record_function_enter", "_record_function_enter_new", "_record_function_exit"):
        packet = getattr(torch.ops.profiler, name, None)
        for overload in (packet.overloads() if packet is not None else ()):
            ops.add(getattr(packet, overload))
    return ops


# [Note: profiler ranges in a selective recomputation]
# On torch 2.13, bf16-mixed `+sac` failed in backward with "profiler._record_function_enter_new
# ... encountered during backward but not found in storage" (pytorch/pytorch#182580; torch 2.11
# ran it): in recomputation FSDP2's pre-forward hook runs inside the checkpointed region and
# opens a `record_function` range around casting the inputs (`FSDPState._cast_forward_inputs`,
# a no-op on inputs already in bf16), which the original forward ran outside SAC's caching
# mode, and 2.13's cached mode refuses any op it has no entry for. A profiler range is a
# marker, not a result: its ops join SAC's own ignored set (`SAC_IGNORED_OPS`, which already
# holds detach and the like), so both modes run them as they come.
_ignored = getattr(torch.utils.checkpoint, "SAC_IGNORED_OPS", None)
if isinstance(_ignored, set):
    _ignored.update(_profiler_ops())


def selective_contexts(mode: Checkpoint = Checkpoint.SELECTIVE):
    """(forward context, recompute context) of selective checkpointing under `mode`'s policy,
    for one call of the checkpointed module: forward and recomputation count their own mms."""
    forward, recompute = Policy(mode), Policy(mode)

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        p = recompute if ctx.is_recompute else forward
        return CheckpointPolicy.MUST_SAVE if p.saves(func) else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
