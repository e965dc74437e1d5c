"""LARS: layer-wise adaptive rate scaling (You, Gitman and Ginsburg, "Large Batch
Training of Convolutional Networks", 2017, Algorithm 1), as a torch.optim.Optimizer.

For every parameter tensor w with gradient g (the reference rule, also that of
Yeosangho/crossover-sgd lars.py):
    trust = eta * ||w|| / (||g|| + wd * ||w|| + eps)     (1 when ||w|| or ||g|| is 0)
    buf   = momentum * buf + lr * trust * (g + wd * w)
    w     = w - buf
Biases and normalisation parameters (every tensor with fewer than 2 dimensions,
the rule of that lars.py) get neither the trust ratio nor weight decay:
    buf = momentum * buf + lr * g.
"""
from __future__ import annotations

import torch


def excluded(p: torch.Tensor) -> bool:
    """Biases and norm gains/shifts: 0-D or 1-D tensors."""
    return p.ndim < 2


class LARS(torch.optim.Optimizer):
    def __init__(self, params, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001, eps: float = 1e-9):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta < 0:
            raise ValueError("lr, momentum, weight_decay and eta must be non-negative")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, eps=eps))

    @staticmethod
    def _scaled_update(p: torch.Tensor, g: torch.Tensor, group: dict) -> torch.Tensor:
        """lr * trust * (g + wd * w), or lr * g for excluded parameters."""
        if excluded(p):
            return g * group["lr"]
        wd = group["weight_decay"]
        w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
        trust = group["eta"] * w_norm / (g_norm + wd * w_norm + group["eps"])
        trust = torch.where((w_norm > 0) & (g_norm > 0), trust, torch.ones_like(trust))
        return (g + wd * p) * (trust * group["lr"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = self._scaled_update(p, p.grad, group)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(update)
                p.sub_(buf)
        return loss
