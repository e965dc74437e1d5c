"""A tied Hugging Face LM inside a wrapper whose own code adds an auxiliary loss on its last
hidden state: the LM's loss and tied head run as code between two layers (`ln_f`, the
wrapper's `aux`), not after the last. Predicted as FSDP2 on fake tensors measures it
(`verify_plan`). Before, at world 8: full_shard +17.5%, shard_grad_op+sac +21.1%,
full_shard+ckpt +23.7%, replicate +7.7%. Three causes, each a moment:
- the head's backward ran with the fused unit gathered; FSDP2 had resharded it after `aux`'s
  backward (`Inner.resharded` of the ("code", k) moment: [Note: the code between a fused
  unit's layers] in plan/units.py);
- the embedding's tied gradient was charged from the first backward moment; it appears at the
  head's backward ([Note: where the root's tied gradient appears] in profile/trace.py);
- the logits the wrapper's `out` holds as `aux` starts were charged at the whole fused unit's
  forward, `ln_f`'s too, where they are the loss's transient (`plan.units.LayerBytes.code`)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardsched.cost.device import DEVICES
from shardsched.profile.trace import trace_profile

from ._predicted import predicted_and_verified

VOCAB, T, B = 5000, 48, 2


class WrappedLM(nn.Module):
    """A tied GPT-2 and an auxiliary 3-way classifier over its mean-pooled last hidden state."""

    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, use_cache=False,
                         bos_token_id=0, eos_token_id=0)
        self.lm = GPT2LMHeadModel(cfg)
        self.aux = nn.Linear(64, 3)

    def forward(self, ids, y):
        out = self.lm(input_ids=ids, labels=ids, output_hidden_states=True)
        return out.loss + F.cross_entropy(self.aux(out.hidden_states[-1].mean(1)), y)


@pytest.fixture(scope="module")
def wrapped():
    torch.manual_seed(0)
    model, inputs = WrappedLM(), (torch.randint(0, VOCAB, (B, T)), torch.randint(0, 3, (B,)))
    return model, inputs, trace_profile(model, inputs, name="wrapped", device=DEVICES["cpu"])


def test_the_tied_gradient_is_made_after_ln_f(wrapped):
    *_, profile = wrapped
    assert profile.root_tied_numel == VOCAB * 64
    assert [layer.name for layer in profile.layers if layer.makes_tied_grad] == ["lm.transformer.ln_f"]


CASES = [("full_shard", True), ("full_shard", False), ("shard_grad_op+sac", True), ("full_shard+ckpt", True),
         ("replicate", True), ("replicate", False)]


@pytest.mark.parametrize("strategy,fuse", CASES, ids=[f"{s}-{'fused' if f else 'per-layer'}" for s, f in CASES])
def test_a_loss_between_layers_is_predicted_as_verified(wrapped, strategy, fuse):
    predicted, verified = predicted_and_verified(*wrapped, strategy, fuse=fuse, world=8)
    assert abs(predicted / verified - 1) <= 0.015, (predicted, verified)
