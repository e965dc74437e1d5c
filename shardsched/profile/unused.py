"""Parameters a traced step gives no gradient, though they need one.

[Note: parameters a step never uses]
A parameter with `requires_grad=True` that the loss never reaches (a Linear the forward never
calls, DINOv2's `mask_token` when no mask is passed, an unused head) gets no gradient, and the
engine allocates nothing for it: FSDP2 reduces only the parameters that have one
(`foreach_reduce` over `fsdp_params_with_grad`), DDP's reducer leaves a globally unused
parameter's `.grad` untouched (its bucket slot exists, and is all-reduced as zeros), and
AdamW skips a parameter whose `.grad` is None, so it never gets `exp_avg` or `exp_avg_sq`.
Charged like the others, a model with unused Linears (tests/verify/user_models.py
`build_spare`) was +5.2% over its measured peak under full_shard, +28% under replicate.

The trace runs one step, and which parameters it reached holds for every step of that shape
only when nothing in the model chose its path from a value: on fake tensors no Python branch
can read one (a data-dependent op raises, and the model is traced on real tensors instead,
where every parameter is charged), and a model that skips parts of itself at random (LayerDrop,
SpecAugment's `masked_spec_embed`: `drops_at_random`) may use in one step what it skipped in
another, so none of its parameters counts as unused. The figure is the profile's
`LayerProfile.unused_params`; the simulator counts such parameters as frozen for gradients and
optimizer state, and DDP's bucket still holds them (`UnitCost.trainable(bucket=True)`).
"""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
import torch.nn as nn

# Hugging Face's names for per-step random structure in training: LayerDrop (Wav2Vec2, Whisper,
# BART, ...: `config.layerdrop`, fairseq's `layerdrop` attribute) skips whole layers;
# SpecAugment (`mask_time_prob`, `mask_feature_prob`) uses `masked_spec_embed` only on the
# steps it masks. Either leaves some steps' gradients without those parameters.
RANDOM_STRUCTURE = ("layerdrop", "mask_time_prob", "mask_feature_prob")


def drops_at_random(model: nn.Module) -> bool:
    """True when a module of `model`, or its Hugging Face config, sets a `RANDOM_STRUCTURE`
    probability above 0."""
    for m in model.modules():
        for holder in (m, getattr(m, "config", None)):
            if any(_positive(getattr(holder, name, None)) for name in RANDOM_STRUCTURE):
                return True
    return False


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def no_gradient(state: Mapping[str, torch.Tensor], accumulated: set[int]) -> frozenset[str]:
    """Names in the traced `state` that need a gradient and had none accumulated (`accumulated`:
    ids of the tensors whose gradient autograd stored)."""
    return frozenset(n for n, t in state.items() if t.requires_grad and id(t) not in accumulated)


def unused_ids(model: nn.Module, names: frozenset[str], source) -> set[int]:
    """ids of `model`'s parameters the traced step left without a gradient ([Note: parameters a
    step never uses]); `source(name)`: the traced parameter that stands for an untraced one (a
    stack's middle entries, [Note: one trace per repeated block]), or None."""
    if not names or drops_at_random(model):
        return set()
    return {id(p) for n, p in model.named_parameters(remove_duplicate=False)
            if p.requires_grad and (source(n) or n) in names}


def unused_numel(params: Iterable[torch.Tensor], ids: set[int]) -> int:
    """Elements of `params` among `ids` (`LayerProfile.unused_params`)."""
    return sum(int(p.numel()) for p in params if id(p) in ids)
