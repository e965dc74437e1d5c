"""The op policies of selective activation checkpointing (`Checkpoint.SELECTIVE`, `+sac`, and
`Checkpoint.SELECTIVE_ALL`, `+sac-all`), in one place.

[Note: the selective checkpointing policy]
Selective checkpointing (torch/utils/checkpoint.py, `create_selective_checkpoint_contexts`)
asks a policy, op by op, whether the op's output is saved or recomputed in backward. Its
forward runs under `_CachingTorchDispatchMode`, which stores the (detached) outputs of every
MUST_SAVE op whether or not autograd would save them; its recomputation runs under
`_CachedTorchDispatchMode`, which returns those stored outputs instead of running the op
again, and runs every other op.

`+sac` is torchtitan's op policy, the default its users run (pytorch/torchtitan,
torchtitan/distributed/activation_checkpoint.py: `_apply_op_sac`'s `_custom_policy` with
the models' `_op_sac_save_list`, e.g. torchtitan/models/llama3/parallelize.py, up to
#2357; since then `SelectiveAC._wrap_block`'s `wrapped_policy` with `_get_default_save_ops`,
the same rule):
- the saved ops: `get_default_op_list().compute_intensive_ops` (mm, addmm, bmm, convolution,
  `_scaled_mm`, the flash and efficient attention kernels), aten.linear, the SDPA kernels
  (cuDNN, math, overrideable; here also the CPU flash kernel, which plays their part on a
  CPU), flex attention, topk, and the functional reduce-scatter and all-to-all;
- the mm counter: per checkpointed call, one counter for forward and one for recomputation
  (`meta["forward_mm_count"]`, `meta["recompute_mm_count"]`), incremented on every aten.mm
  or aten.linear; a mm whose count is even is recomputed ("Saves output of all compute ops,
  except every second mm/linear"). Of a Llama block's seven mms (q, k, v, o, gate, up, down)
  the 1st, 3rd, 5th and 7th (q, v, gate, down) are kept, k, o and up recomputed. addmm and
  bmm are not counted: always kept.
Not taken: `aten.max.default` (kept for float8 scaling; no float8 here), the CUDA->CPU
`_to_copy` rule (MoE metadata) and `force_recompute_mm_shapes_by_fqns` (MoE router gates).

`+sac-all` keeps every matmul's output (what `+sac` was before issue 28): more memory, less
recomputation. The profiler (`profile.trace`) runs the same `Policy` objects, so the
planner's model of what a selective layer keeps and recomputes is these policies'. They live
here, below both, with the contexts that hand them to `create_selective_checkpoint_contexts`
(`selective_contexts`), so the profiler, the calibration and the runtime read one definition.
"""
from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from shardsched.core.types import Checkpoint

_aten = torch.ops.aten


def _ops(*specs) -> frozenset:
    out = set()
    for root, path in specs:
        obj = root
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            continue
        out.add(getattr(obj, "overloadpacket", obj))
    return frozenset(out)


def torch_compute_intensive() -> frozenset:
    """`get_default_op_list().compute_intensive_ops` as packets: what SAVED copies by name.
    Not read at import: its module imports torch._dynamo and inductor, 2.7 s of every `plan`
    (measured, -X importtime); a test checks SAVED still covers it."""
    try:
        from torch._functorch.partitioners import get_default_op_list
        return frozenset(getattr(op, "overloadpacket", op) for op in get_default_op_list().compute_intensive_ops)
    except Exception:  # noqa: BLE001  (an older or newer torch without it: the list below)
        return frozenset()


SAVED = frozenset({
    _aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten._scaled_mm, _aten.convolution, _aten._convolution,
    _aten.linear, _aten.topk,
    *(getattr(_aten, name) for name in dir(_aten)
      if name.startswith("_scaled_dot_product_") and "attention" in name and not name.endswith("_backward")),
    *_ops((_aten, "_grouped_mm"), (_aten, "_flash_attention_forward"), (_aten, "_efficient_attention_forward"),
          (torch.ops, "_c10d_functional.reduce_scatter_tensor"), (torch.ops, "_c10d_functional.all_to_all_single")),
})
"""Op packets whose outputs a selective layer keeps (every second mm of them under `+sac`)."""
NOT_SAVED = frozenset({_aten.convolution_backward, _aten.upsample_bilinear2d})
"""`compute_intensive_ops` also names these: the first never runs in forward, the second is
memory-bound; left out."""

MATMULS = frozenset({_aten.mm, _aten.linear})
"""What torchtitan's mm counter counts (`mm_ops`)."""


def _packet(func):
    return getattr(func, "overloadpacket", func)


class Policy:
    """One checkpointed call's decisions, op by op, in order (the mm counter is state)."""

    def __init__(self, mode: Checkpoint):
        if not mode.selective:
            raise ValueError(f"{mode} is not selective checkpointing")
        self.every_second_mm = mode is Checkpoint.SELECTIVE
        self.mm_count = 0

    def reset(self) -> None:
        """A new call of the checkpointed module: the counter starts again (torchtitan's
        `meta` is made per call by its `context_fn`)."""
        self.mm_count = 0

    def saves(self, func) -> bool:
        """Whether `func`'s outputs (an OpOverload or its packet) are kept; counts matmuls."""
        packet = _packet(func)
        if packet not in SAVED:
            return False
        if packet in MATMULS:
            self.mm_count += 1
            return not (self.every_second_mm and self.mm_count % 2 == 0)
        return True


MODES = (Checkpoint.SELECTIVE, Checkpoint.SELECTIVE_ALL)
"""The selective modes, each with its policy."""


def saves(func) -> bool:
    """Whether an op is among those either policy may keep (stateless: `+sac-all`'s answer)."""
    return _packet(func) in SAVED


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
