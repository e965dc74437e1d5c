"""Code outside every layer, as a model's own forward runs it between its layers: what it makes
and holds, and what it saves of a layer's output, predicted as FSDP2 on fake tensors measures
it (`verify_plan`). Before: fused full_shard -3.2%, shard_grad_op -2.7% (the last residual sum
held by a local through the head, [Note: results of outside code the caller holds] in
profile/held.py), `+sac` +8.8% / +11.3% (each GELU's saved input, a Linear's output, counted
again as what selective checkpointing keeps: `profile.trace._shared_output`), fused replicate
and replicate+ckpt +2.9% (each GELU's saved input charged in its Linear's backward window, which
opens after the GELU's backward freed it: `plan.units.LayerBytes.backward_own`)."""
from __future__ import annotations

import pytest

from shardsched.cost.device import DEVICES
from shardsched.profile.trace import trace_profile

from . import user_models as um
from ._predicted import predicted_and_verified

CASES = [("full_shard", True), ("full_shard", False), ("shard_grad_op", True), ("shard_grad_op+sac", True),
         ("shard_grad_op+sac", False), ("full_shard+ckpt", True), ("replicate", True), ("replicate+ckpt", True)]


@pytest.fixture(scope="module")
def mixer():
    model, inputs = um.build_outside_mixer()
    return model, inputs, trace_profile(model, inputs, name="mixer", device=DEVICES["cpu"])


@pytest.mark.parametrize("strategy,fuse", CASES, ids=[f"{s}-{'fused' if f else 'per-layer'}" for s, f in CASES])
def test_outside_code_between_layers_is_predicted_as_verified(mixer, strategy, fuse):
    predicted, verified = predicted_and_verified(*mixer, strategy, fuse=fuse, world=4)
    assert abs(predicted / verified - 1) <= 0.005, (predicted, verified)


def test_the_held_residual_is_the_heads_alone(mixer):
    """The last residual sum (8 x 16 x 48 fp32) is held as the head starts; at every other
    layer's start the stream is that layer's input or saved by it."""
    *_, profile = mixer
    held = {layer.name: layer.code_held_bytes for layer in profile.layers if layer.code_held_bytes}
    assert held == {"head": 8 * 16 * 48 * 4}
