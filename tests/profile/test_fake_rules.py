"""profile/fake_rules.py against the CPU kernels it stands for: [Note: a loss reduced in its own
buffer] (the scalar of an MSE-like loss keeps as many bytes as the real kernel leaves it)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardsched.profile.fake_rules import FakeRules, cold_fake_mode

X, T = torch.randn(4, 3, 8, 8), torch.rand(4, 3, 8, 8)
LOSSES = {
    "mse": lambda x, t: F.mse_loss(x, t), "mse_sum": lambda x, t: F.mse_loss(x, t, reduction="sum"),
    "mse_none": lambda x, t: F.mse_loss(x, t, reduction="none"), "smooth_l1": lambda x, t: F.smooth_l1_loss(x, t, beta=0.5),
    "bce": lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), t),
    "bce_weight": lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), t, weight=t),
    "soft_margin": lambda x, t: F.soft_margin_loss(x, t.sign()), "l1": lambda x, t: F.l1_loss(x, t),
    "mse_bf16": lambda x, t: F.mse_loss(x.bfloat16(), t.bfloat16()),
}


@pytest.mark.parametrize("name", LOSSES)
def test_a_fake_loss_keeps_the_bytes_its_kernel_keeps(name):
    real = LOSSES[name](X.clone().requires_grad_(), T)
    mode = cold_fake_mode(allow_non_fake_inputs=False)
    with mode, FakeRules():
        x, t = mode.from_tensor(X).requires_grad_(), mode.from_tensor(T)
        fake = LOSSES[name](x, t)
        (fake.sum() if fake.dim() else fake).backward()  # still a loss autograd can run
    assert fake.shape == real.shape and fake.dtype == real.dtype
    assert fake.untyped_storage().nbytes() == real.untyped_storage().nbytes(), name
