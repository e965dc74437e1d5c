"""LARS: one step recomputed by hand (trust ratio, weight decay, excluded parameters, momentum)."""
from __future__ import annotations

import math

import torch

from shardsched.optim import LARS, warmup_poly


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2)).double()


def test_two_steps_match_hand_computation():
    model = _model()
    lr, mom, wd, eta, eps = 0.1, 0.9, 1e-2, 1e-3, 1e-9
    opt = LARS(model.parameters(), lr=lr, momentum=mom, weight_decay=wd, eta=eta, eps=eps)
    x = torch.randn(8, 5, dtype=torch.float64)
    bufs = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        expected = {}
        for n, p in model.named_parameters():
            w, g = p.detach().double(), p.grad.double()
            if p.ndim < 2:  # bias / LayerNorm: plain momentum SGD, no decay, no trust ratio
                upd = lr * g
            else:
                wn, gn = math.sqrt(float((w * w).sum())), math.sqrt(float((g * g).sum()))
                upd = lr * (eta * wn / (gn + wd * wn + eps)) * (g + wd * w)
            bufs[n] = mom * bufs[n].double() + upd
            expected[n] = w - bufs[n]
        opt.step()
        for n, p in model.named_parameters():
            assert torch.allclose(p.detach().double(), expected[n], atol=1e-7, rtol=0), n
    # the trust ratio really scaled the weights' step: it differs from plain SGD by orders of magnitude
    assert opt.state[model[0].weight]["momentum_buffer"].abs().max() < 1e-2 * \
        opt.state[model[0].bias]["momentum_buffer"].abs().max()


def test_warmup_then_polynomial_decay():
    assert warmup_poly(0, total=100, peak=1.0, warmup=10) == 0.1
    assert warmup_poly(9, total=100, peak=1.0, warmup=10) == 1.0
    assert warmup_poly(55, total=100, peak=1.0, warmup=10) == (1 - 45 / 90) ** 2
    assert warmup_poly(100, total=100, peak=1.0, warmup=10) == 0.0
